"""Study B's tidy table (`vlm-decade export`): one row per model x image x prompt, with every column
of the image's row in `images`, `labels` (its label, granularity and accepted names) and `metadata`
(the user's own columns of the labels table), the model's response, and what scoring made of it:
every column of its row in `predictions` (TI, LI, SS, CS, the best-matching concept, the judge's
answer, the outcome); a response that failed has none."""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.reuse import INPUTS
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.studies.export import METADATA, columns, connect, identifier, metadata_columns

# Columns `predictions` repeats from the responses (`prediction` is the response's text) or images, and
# the run's own bookkeeping (a row's inputs hash); of those it shares with labels (`accepted`, text there,
# a list in labels) the labels' are kept.
REPEATED = ("subject", "image_id", "prompt_id", "dataset", "prediction", INPUTS)
RESPONSE = ("prompt_id", "response", "response_status", "response_error")


def tidy(folder: RunFolder) -> pa.Table:
    db = connect(folder, ("images", "labels", "responses", "predictions"), (METADATA,))
    images = [c for c in columns(db, "images") if c != "image_id"]
    image_columns = "".join(f", i.{identifier(c)}" for c in images)
    labels = [c for c in columns(db, "labels") if c not in columns(db, "images")]
    label_columns = "".join(f", l.{identifier(c)}" for c in labels)
    predicted = [c for c in columns(db, "predictions") if c not in REPEATED and c not in labels]
    scored = "".join(f", p.{identifier(c)}" for c in predicted)
    meta, meta_join = metadata_columns(db, ["model", "image_id", *images, *labels, *RESPONSE, *predicted])
    query = f"""
        SELECT r.subject AS model, r.image_id{image_columns}{label_columns}{meta}, r.prompt_id,
               r.text AS response, r.status AS response_status, r.error AS response_error{scored}
        FROM responses r
        JOIN images i ON i.image_id = r.image_id
        LEFT JOIN labels l ON l.image_id = r.image_id
        {meta_join}
        LEFT JOIN predictions p ON p.subject = r.subject AND p.image_id = r.image_id AND p.prompt_id = r.prompt_id
        ORDER BY model, r.image_id, r.prompt_id
    """
    return db.sql(query).to_arrow_table()
