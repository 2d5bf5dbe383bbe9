"""The score stage (Study A): cosine similarity of each description to the image's gold standard.

Models are scored on their description of the full image; the human reference groups
`human:top` and `human:bottom` get, per image, the mean similarity of their descriptions to the
gold standard (as the paper draws them as bands). One metric per encoder (e.g. SBERT-SI, GPT-SI).
Each image's rows carry the hash of what they were computed from, so a run with images added scores
only the new and changed images and keeps the others' rows (`core.reuse`).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain, groupby

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.reuse import INPUTS, reuse, unit_inputs
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.models.encoders import text_key
from vlm_decade.models.metrics import build_metric
from vlm_decade.stages.embed import encoder_key
from vlm_decade.stats import SCORES_SCHEMA
from vlm_decade.studies.decade.config import StudyConfig

HUMAN_GROUPS = {"top": "human:top", "bottom": "human:bottom"}
# The scores table: each row with the hash of the inputs it was computed from (`image_inputs`).
SCORED_SCHEMA = SCORES_SCHEMA.append(pa.field(INPUTS, pa.string()))
SIMILARITY_FORMAT = 1  # part of each image's inputs: bump it when how a similarity row is computed changes
EMBEDDING_BATCH = 4096  # vectors read at a time (a Parquet list column decodes at several times its size)
# Images scored at a time: what is built per pair (keys, the inputs' hashes, gold vectors) exists for
# one shard only; each shard reads the embeddings twice per encoder (its gold standards', its candidates').
SHARD_IMAGES = 65_536
PYTHON_ROWS = 65_536  # rows turned into Python values at a time (texts hashed, pairs' inputs)
SCORE_ORDER = ["metric", "subject", "image_id"]  # orders the rows fully (one per metric, subject and image)


class EncoderVectors(Mapping):
    """text_sha256 -> vector of one encoder, over one (n, dim) float32 matrix (no object per vector)."""

    def __init__(self, keys: list[str], matrix: np.ndarray):
        self.row = {k: i for i, k in enumerate(keys)}
        self.matrix = matrix

    def __getitem__(self, key: str) -> np.ndarray:
        return self.matrix[self.row[key]]

    def __iter__(self):
        return iter(self.row)

    def __len__(self) -> int:
        return len(self.row)


def vector_matrix(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """The `vector` column of embeddings rows (one encoder, one width) as an (n, dim) float32 array."""
    column = table.column("vector")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    dim = table.column("dim")[0].as_py() if table.num_rows else 0
    return column.flatten().to_numpy(zero_copy_only=False).reshape(table.num_rows, dim)


def encoder_vectors(embeddings: pa.Table, encoder: str) -> EncoderVectors:
    """text_sha256 -> vector, for one encoder of the `embeddings` table."""
    table = embeddings.filter(pc.equal(embeddings.column("encoder"), encoder))
    return EncoderVectors(table.column("text_sha256").to_pylist(), vector_matrix(table))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _keyed(texts: pa.ChunkedArray, chunk: int = PYTHON_ROWS) -> pa.ChunkedArray:
    """Each text's key, hashed a slice at a time (no list of every text at once)."""
    return pa.chunked_array(
        [
            pa.array([text_key(t) for t in texts.slice(i, chunk).to_pylist()], pa.string())
            for i in range(0, len(texts), chunk)
        ]
        or [pa.array([], pa.string())],
        pa.string(),
    )


def scoring_pairs(references: pa.Table, responses: pa.Table, texts: bool = True) -> pa.Table:
    """(subject, image_id, candidate, gold, candidate_key, gold_key) for every model's full-image
    description and every member of a human reference group; a group's value per image is the mean
    over its members. `texts` False: the two text columns are left out (only pairwise metrics need
    them; cosines need only the keys)."""
    full = references.filter(pc.equal(references.column("condition"), "full"))
    gold = (
        full.filter(pc.equal(full.column("role"), "gold"))
        .select(["image_id", "text"])
        .rename_columns(["image_id", "gold"])
    )
    ok = pc.and_(pc.equal(responses.column("status"), "ok"), pc.equal(responses.column("variant"), "full"))
    models = responses.filter(ok).select(["subject", "image_id", "text"])
    humans = full.filter(pc.is_in(full.column("role"), pa.array(list(HUMAN_GROUPS))))
    humans = pa.table(
        {
            "subject": pc.replace_substring_regex(humans.column("role"), "^(.*)$", "human:\\1"),
            "image_id": humans.column("image_id"),
            "text": humans.column("text"),
        }
    )
    candidates = pa.concat_tables([models.cast(humans.schema), humans]).rename_columns(
        ["subject", "image_id", "candidate"]
    )
    pairs = candidates.join(gold, "image_id", join_type="inner").combine_chunks()
    pairs = pairs.append_column("candidate_key", _keyed(pairs.column("candidate"))).append_column(
        "gold_key", _keyed(pairs.column("gold"))
    )
    return pairs if texts else pairs.drop_columns(["candidate", "gold"])


def _batches(embeddings: pa.Table | RunFolder, encoder: str):
    """One encoder's rows of the embeddings, a batch at a time: from a table, or streamed from the
    run folder's file (which may be too big to read whole)."""
    source = (
        embeddings.to_batches()
        if isinstance(embeddings, pa.Table)
        else embeddings.batches("embeddings", batch_size=EMBEDDING_BATCH)
    )
    for batch in source:
        batch = pa.Table.from_batches([batch]).filter(pc.equal(batch.column("encoder"), encoder))
        if batch.num_rows:
            yield batch


def cosine_values(pairs: pa.Table, embeddings: pa.Table | RunFolder, encoder: str) -> np.ndarray:
    """Each pair's cosine (float64) under one encoder, in two passes over its vectors: the gold
    standards' first (one per image), then every candidate's, so the vectors are never all held."""
    gold_keys = pc.unique(pairs.column("gold_key"))
    gold_matrix, have = None, np.zeros(len(gold_keys), bool)  # one row per gold standard, filled as found
    for batch in _batches(embeddings, encoder):
        batch = batch.filter(pc.is_in(batch.column("text_sha256"), gold_keys))
        if not batch.num_rows:
            continue
        rows = pc.index_in(batch.column("text_sha256"), gold_keys).to_numpy(zero_copy_only=False)
        vectors = vector_matrix(batch)
        if gold_matrix is None:
            gold_matrix = np.zeros((len(gold_keys), vectors.shape[1]), vectors.dtype)
        gold_matrix[rows] = vectors
        have[rows] = True
    gold_of_pair = pc.index_in(pairs.column("gold_key"), gold_keys).to_numpy(zero_copy_only=False)
    values = np.full(pairs.num_rows, np.nan)
    for batch in _batches(embeddings, encoder):
        row = pc.index_in(pairs.column("candidate_key"), batch.column("text_sha256").combine_chunks())
        at = np.flatnonzero(row.is_valid().to_numpy(zero_copy_only=False) & have[gold_of_pair])
        if at.size:
            c = vector_matrix(batch)[row.take(at).to_numpy()].astype(np.float64)
            g = gold_matrix[gold_of_pair[at]].astype(np.float64)
            values[at] = np.einsum("ij,ij->i", c, g) / (np.linalg.norm(c, axis=1) * np.linalg.norm(g, axis=1))
    missing = int(np.isnan(values).sum())  # pairs without their candidate's vector or their gold standard's
    if missing:
        raise RuntimeError(f"{missing} pairs have no {encoder} vector: the embeddings table does not match the texts")
    return values


def image_inputs(pairs: pa.Table, images: pa.Table, settings) -> pa.Table:
    """Per image with pairs to score: image_id and `inputs_sha256`, the hash of the `settings`, the
    image's dataset, its gold standard and the (subject, candidate) of each of its pairs (their
    keys, or with pairwise metrics their texts): everything its rows of scores are computed from.
    `pairs` sorted by image_id, subject and candidate."""
    dataset = dict(zip(images.column("image_id").to_pylist(), images.column("dataset").to_pylist()))
    texts = "candidate" in pairs.column_names
    columns = ["image_id", "subject", "candidate" if texts else "candidate_key", "gold" if texts else "gold_key"]
    # The pairs a slice at a time, and their inputs hashed as they are put together: no Python value
    # per pair outlives its slice.
    slices = (pairs.slice(at, PYTHON_ROWS) for at in range(0, pairs.num_rows, PYTHON_ROWS))
    pair_rows = chain.from_iterable(zip(*(part.column(c).to_pylist() for c in columns)) for part in slices)
    ids, inputs, hashes, pending = [], [], [], 0
    for image_id, rows in groupby(pair_rows, key=lambda r: r[0]):
        rows = list(rows)
        ids.append(image_id)
        inputs.append([dataset.get(image_id), rows[0][3], [[r[1], r[2]] for r in rows]])
        pending += len(rows)
        if pending >= PYTHON_ROWS:
            hashes.append(unit_inputs(settings, inputs))
            inputs, pending = [], 0
    hashes.append(unit_inputs(settings, inputs))
    return pa.table({"image_id": pa.array(ids, pa.string()), INPUTS: pa.chunked_array(hashes, pa.string())})


def similarity_scores(
    images: pa.Table,
    references: pa.Table,
    responses: pa.Table,
    embeddings: pa.Table | RunFolder,
    metrics: list[str],
    pair_metrics=(),
    previous: pa.Table | None = None,
    settings=None,
) -> pa.Table:
    """Cosine to the gold standard for each encoder in `metrics` (from the embeddings: a table, or
    the run folder's, streamed), and each loaded pairwise metric in `pair_metrics` (e.g. BERTScore,
    `vlm_decade.models.metrics`), with each row's `inputs_sha256` (`image_inputs` under `settings`,
    what decides the vectors and metrics). The rows of `previous` (the last scores) of the images whose
    inputs are unchanged are kept; only the other images are scored (`core.reuse`). The images are
    scored `SHARD_IMAGES` at a time, so that what is built per pair exists for one shard only; an
    image's rows do not depend on the others of its shard."""
    references = references.select(["image_id", "condition", "role", "text"])
    responses = responses.select(["subject", "image_id", "variant", "status", "text"])
    if previous is not None and previous.schema.remove_metadata() != SCORED_SCHEMA.remove_metadata():
        previous = None  # a table of an earlier version: nothing of it is kept (`reusable`)
    parts = []
    for start in range(0, images.num_rows, SHARD_IMAGES):
        shard = images.slice(start, SHARD_IMAGES).select(["image_id", "dataset"])
        parts.append(
            _shard_scores(
                shard,
                *(_of_images(t, shard) for t in (references, responses)),
                embeddings,
                metrics,
                pair_metrics,
                None if previous is None else _of_images(previous, shard),
                settings,
            )
        )
    table = pa.concat_tables(parts) if parts else SCORED_SCHEMA.empty_table()
    return table.take(pc.sort_indices(table, sort_keys=[(c, "ascending") for c in SCORE_ORDER]))


def _of_images(table: pa.Table, images: pa.Table) -> pa.Table:
    """The rows of `table` of the `images`."""
    return table.filter(pc.is_in(table.column("image_id"), images.column("image_id")))


def _shard_scores(images, references, responses, embeddings, metrics, pair_metrics, previous, settings) -> pa.Table:
    """`similarity_scores` of one shard of images, from its own references, responses and last rows."""
    pairs = scoring_pairs(references, responses, texts=bool(pair_metrics))
    # One order of each image's pairs, so that a group's mean adds its members in the same order
    # whether the image is scored alone or with every other.
    pairs = pairs.sort_by([("image_id", "ascending"), ("subject", "ascending"), ("candidate_key", "ascending")])

    wanted = image_inputs(pairs, images, settings)

    def score(todo: pa.Table) -> pa.Table:
        """The rows of the images of `todo`."""
        if todo.num_rows == wanted.num_rows:  # every image of the shard: its pairs, not a copy of them
            todo_pairs = pairs
        else:
            todo_pairs = pairs.filter(pc.is_in(pairs.column("image_id"), todo.column("image_id")))
        tables = []
        for name in list(metrics) + [m.name for m in pair_metrics]:
            if name in metrics:
                values = cosine_values(todo_pairs, embeddings, name)
            else:
                metric = next(m for m in pair_metrics if m.name == name)
                values = np.asarray(
                    metric.score(todo_pairs.column("candidate").to_pylist(), todo_pairs.column("gold").to_pylist()),
                    np.float64,
                )
            per_pair = todo_pairs.select(["subject", "image_id"]).append_column("value", pa.array(values, pa.float64()))
            means = per_pair.group_by(["subject", "image_id"], use_threads=False).aggregate([("value", "mean")])
            n = means.num_rows
            tables.append(
                pa.table(
                    {
                        "subject": means.column("subject"),
                        "image_id": means.column("image_id"),
                        "variant": pa.array(["full"] * n, pa.string()),
                        "metric": pa.array([name] * n, pa.string()),
                        "value": means.column("value_mean"),
                    }
                )
            )
        scores = pa.concat_tables(tables) if tables else SCORES_SCHEMA.empty_table().drop_columns(["dataset"])
        return scores.join(images, "image_id", join_type="inner")

    table, _ = reuse(previous, wanted, ["image_id"], score, SCORED_SCHEMA, SCORE_ORDER)
    return table


def unkeyed(scores: pa.Table) -> pa.Table:
    """Rows of scores computed from all images at once (caption metrics, judges' values): no row's
    inputs of its own, so none is kept from the last table."""
    return scores.append_column(INPUTS, pa.nulls(scores.num_rows, pa.string())).cast(SCORED_SCHEMA)


def stage(study: StudyConfig) -> Stage:
    """The `scores` table: one metric per encoder, the study's pairwise `metrics`, its caption
    metrics (`caption_metrics`, against all human descriptions: studies/decade/captions.py) and its
    judge metrics (`judge_metrics`, from the `judge_scores` table: studies/decade/judging.py)."""
    encoders = [e.name for e in study.encoders]
    # What decides an image's similarity rows besides its texts: the encoders' vectors, the metrics.
    per_image = [
        SIMILARITY_FORMAT,
        {e.name: encoder_key(e) for e in study.encoders},
        [m.fingerprint() for m in study.metrics],
    ]

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        tables = [run.table(n) for n in ("images", "references", "responses")]
        metrics = [build_metric(m) for m in study.metrics]
        scores = similarity_scores(*tables, run.folder, encoders, metrics, run.folder.previous("scores"), per_image)
        if study.caption_metrics:
            from vlm_decade.studies.decade.captions import caption_metric_scores

            scores = pa.concat_tables([scores, unkeyed(caption_metric_scores(*tables, study.caption_metrics))])
        if study.judge_metrics:
            from vlm_decade.studies.decade.judging import judge_values

            scores = pa.concat_tables([scores, unkeyed(judge_values(study, run.table("judge_scores"), tables[0]))])
        return {"scores": scores}

    settings = [encoders, [m.fingerprint() for m in study.metrics]] + (
        [list(study.caption_metrics)] if study.caption_metrics else []
    )
    inputs = ("images", "references", "responses", "embeddings")
    if study.judge_metrics:  # a study without judges keeps the settings, and the scores, it had
        settings.append([j.fingerprint() for j in study.judge_metrics])
        inputs += ("judge_scores",)
    return Stage("scores", inputs, settings, compute)
