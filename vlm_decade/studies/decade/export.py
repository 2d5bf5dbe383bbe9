"""Study A's tidy table (`vlm-decade export`): one row per model x image x variant, with every
column of the image's row in `images` and in `metadata` (the user's own columns of the images
table), the model's response, each metric's score of that response (a column per metric, named
after it) and, for the full image, each error type's label (`error:<type>`: true, false, or null
when undecided; null for a masked variant, which the taxonomy does not label, and for a run without
the error analysis)."""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.runfolder import RunFolder
from vlm_decade.studies.decade.taxonomy.analysis import ERROR_TYPES
from vlm_decade.studies.export import METADATA, columns, connect, identifier, literal, metadata_columns

RESPONSE = ("variant", "prompt_id", "response", "response_status", "response_error")


def tidy(folder: RunFolder) -> pa.Table:
    db = connect(folder, ("images", "responses", "scores"), ("errors", METADATA))
    metrics = [r[0] for r in db.execute("SELECT DISTINCT metric FROM scores ORDER BY metric").fetchall()]
    per_metric = "".join(f", any_value(value) FILTER (WHERE metric = {literal(m)}) AS {identifier(m)}" for m in metrics)
    labelled = folder.has("errors")
    per_type = "".join(
        f", any_value(present) FILTER (WHERE error_type = {literal(t)}) AS {identifier('error:' + t)}"
        for t in ERROR_TYPES
    )
    errors = (
        f"SELECT subject, image_id{per_type} FROM errors GROUP BY ALL"
        if labelled
        else "SELECT NULL AS subject, NULL AS image_id"
    )
    images = [c for c in columns(db, "images") if c != "image_id"]
    image_columns = "".join(f", i.{identifier(c)}" for c in images)
    meta, meta_join = metadata_columns(
        db, ["model", "image_id", *images, *RESPONSE, *metrics, *(f"error:{t}" for t in ERROR_TYPES)]
    )
    score_columns = "".join(f", s.{identifier(m)}" for m in metrics)
    label_columns = "".join(
        f", {'e.' + identifier('error:' + t) if labelled else 'NULL::BOOLEAN AS ' + identifier('error:' + t)}"
        for t in ERROR_TYPES
    )
    query = f"""
        WITH s AS (SELECT subject, image_id, variant{per_metric} FROM scores GROUP BY ALL), e AS ({errors})
        SELECT r.subject AS model, r.image_id{image_columns}{meta}, r.variant, r.prompt_id,
               r.text AS response, r.status AS response_status, r.error AS response_error
               {score_columns}{label_columns}
        FROM responses r
        JOIN images i ON i.image_id = r.image_id
        {meta_join}
        LEFT JOIN s ON s.subject = r.subject AND s.image_id = r.image_id AND s.variant = r.variant
        LEFT JOIN e ON e.subject = r.subject AND e.image_id = r.image_id AND r.variant = 'full'
        ORDER BY model, r.image_id, r.variant
    """
    return db.sql(query).to_arrow_table()
