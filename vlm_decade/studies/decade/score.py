"""The score stage (Study A): cosine similarity of each description to the image's gold standard.

Models are scored on their description of the full image; the human reference groups
`human:top` and `human:bottom` get, per image, the mean similarity of their descriptions to the
gold standard (as the paper draws them as bands). One metric per encoder (e.g. SBERT-SI, GPT-SI).
Each image's rows carry the hash of what they were computed from, so a run with images added scores
only the new and changed images and keeps the others' rows (`core.reuse`).
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter, deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import json_strings, run_starts, sha256_hex, stripped
from vlm_decade.core.reuse import INPUTS, inputs_head, reusable
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage, StudyRun, Written
from vlm_decade.core.spill import HOLD_FILES_BYTES, Spill, key_buckets
from vlm_decade.models.encoders import text_keys
from vlm_decade.models.metrics import build_metric
from vlm_decade.stages.embed import EMBEDDINGS_SCHEMA, encoder_key
from vlm_decade.stats import SCORES_SCHEMA
from vlm_decade.studies.decade.config import StudyConfig

HUMAN_GROUPS = {"top": "human:top", "bottom": "human:bottom"}
# The scores table: each row with the hash of the inputs it was computed from (`image_inputs`).
SCORED_SCHEMA = SCORES_SCHEMA.append(pa.field(INPUTS, pa.string()))
SIMILARITY_FORMAT = 1  # part of each image's inputs: bump it when how a similarity row is computed changes
EMBEDDING_BATCH = 4096  # vectors read at a time (a Parquet list column decodes at several times its size)
# Images scored at a time: what is built per pair (keys, the inputs' hashes) and the vectors the
# pairs need (about seven per image) exist for one shard only.
SHARD_IMAGES = 4096
FIRST_PASS_THREADS = 2  # shards whose pairs and inputs are worked out at once (`score_batches`)
PAIR_ROWS = 4096  # pairs whose cosines are taken at a time (their vectors as float64)
NEEDS_SCHEMA = pa.schema([("text_sha256", pa.string()), ("shard", pa.int32())])
VECTORS_SCHEMA = pa.schema([EMBEDDINGS_SCHEMA.field(c) for c in ("text_sha256", "dim", "vector")])
PYTHON_ROWS = 65_536  # rows spread over the shards at a time
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


def said(texts: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Whether each text says something: not null, not blank (the embed stage encodes no blank text)."""
    return pc.fill_null(pc.greater(pc.binary_length(stripped(texts)), 0), False)


def full_answers(responses: pa.Table) -> pa.Array | pa.ChunkedArray:
    """Which responses are ok answers about the full image (those scored, when they say something)."""
    return pc.and_(pc.equal(responses.column("status"), "ok"), pc.equal(responses.column("variant"), "full"))


def blank_answers(responses: pa.Table) -> Counter:
    """Per model, its ok full-image answers with no text (a backend or an imported file that answered
    nothing): they have no vector, so they are not scored."""
    blank = pc.and_(full_answers(responses), pc.invert(said(responses.column("text"))))
    return Counter(responses.column("subject").filter(blank).to_pylist())


def scoring_pairs(references: pa.Table, responses: pa.Table, texts: bool = True) -> pa.Table:
    """(subject, image_id, candidate, gold, candidate_key, gold_key) for every model's full-image
    description and every member of a human reference group; a group's value per image is the mean
    over its members. A blank text is in no pair (`blank_answers`). `texts` False: the two text
    columns are left out (only pairwise metrics need them; cosines need only the keys)."""
    full = references.filter(pc.and_(pc.equal(references.column("condition"), "full"), said(references.column("text"))))
    gold = (
        full.filter(pc.equal(full.column("role"), "gold"))
        .select(["image_id", "text"])
        .rename_columns(["image_id", "gold"])
    )
    gold = gold.append_column("gold_key", text_keys(gold.column("gold")))  # once per image, not per pair
    ok = pc.and_(full_answers(responses), said(responses.column("text")))
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
    pairs = pairs.append_column("candidate_key", text_keys(pairs.column("candidate")))
    pairs = pairs.select(["subject", "image_id", "candidate", "gold", "candidate_key", "gold_key"])
    return pairs if texts else pairs.drop_columns(["candidate", "gold"])


def _rows(source: pa.Table | RunFolder, name: str, columns: list[str] | None = None, batch_size: int = EMBEDDING_BATCH):
    """Table `name`'s rows a batch at a time: from `source` itself when it is a table, or streamed
    from the run folder's file (which may be too big to read whole)."""
    if isinstance(source, pa.Table):
        return (source if columns is None else source.select(columns)).to_batches(max_chunksize=batch_size)
    return source.batches(name, columns=columns, batch_size=batch_size)


def by_image_shard(
    source: pa.Table | RunFolder, name: str, columns: list[str], images: pa.Table, folder: Path
) -> Spill:
    """Table `name`'s rows (`_rows`) spread over buckets on disk by their image's shard: the
    position of their image in `images` over `SHARD_IMAGES`; the rows of other images are left out.
    Each shard's rows keep the table's order, so that they are what filtering the table would give.
    The buckets are held in memory when the run folder's file is small (`HOLD_FILES_BYTES`)."""
    ids = images.column("image_id")
    held = isinstance(source, RunFolder) and source.stored_bytes(name) <= HOLD_FILES_BYTES
    spill = None
    # Each batch's lookup builds a hash table of every image id: in batches of PYTHON_ROWS, not
    # EMBEDDING_BATCH (the texts' tables hold no vectors), it is built 16 times less often.
    for batch in _rows(source, name, columns, PYTHON_ROWS):
        at = pc.index_in(batch.column("image_id"), value_set=ids)
        rows = pa.Table.from_batches([batch]).filter(pc.is_valid(at))
        spill = spill or Spill(folder / name, rows.schema, held)
        spill.add(rows, pc.drop_null(at).to_numpy(zero_copy_only=False) // SHARD_IMAGES)
    if spill is None:  # a table without rows
        schema = source.schema if isinstance(source, pa.Table) else source.schema(name)
        spill = Spill(folder / name, pa.schema([schema.field(c) for c in columns]))
    spill.close()
    return spill


def _row_groups(embeddings: pa.Table | RunFolder):
    """The embeddings' rows a group at a time, each group as a function of the columns to read of
    it (`RunFolder.row_groups`, the newest segment first; a table's are its batches), so that a
    group's vectors are read only when its keys are needed."""
    if isinstance(embeddings, RunFolder):
        yield from embeddings.row_groups("embeddings", newest_first=True)
        return
    for batch in _rows(embeddings, "embeddings"):
        yield lambda columns, batch=batch: pa.Table.from_batches([batch.select(columns)])


class ShardVectors:
    """Each shard's vectors of one encoder, gathered in one pass over the embeddings, so that the
    table is read once per encoder whatever the number of shards. The keys each shard needs are
    spread over 256 key buckets on disk (`need`); the embeddings, each segment sorted by key within
    an encoder, are read newest segment first, a row group's keys first, each run of rows of one
    bucket matched against that bucket's needs; the vectors of a group that holds needed keys are
    read and spread over buckets by the shard that needs them. Once every need is met the rest is
    not read: when only images were added, their texts' vectors are in the newest segment, and
    the older segments' keys (most of the table) are passed over."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.needs = Spill(folder / "needs", NEEDS_SCHEMA)
        self.wanted = 0  # rows of `needs`: (key, shard) pairs, each met by one vector (one per text and encoder)
        self.gathered = 0  # encoders gathered so far: each gets a folder of its own

    def need(self, shard: int, keys: pa.Array | pa.ChunkedArray) -> None:
        keys = pc.unique(keys)
        table = pa.table({"text_sha256": keys, "shard": pa.array(np.full(len(keys), shard, np.int32))})
        self.needs.add(table, key_buckets(table.column("text_sha256")))
        self.wanted += table.num_rows

    def gather(self, embeddings: pa.Table | RunFolder, encoder: str) -> Spill:
        """Each shard's vectors of `encoder` (text_sha256, dim, vector): a bucket per shard."""
        self.needs.close()  # closing again, for a second encoder, is allowed
        self.gathered += 1
        vectors = Spill(self.folder / f"vectors-{self.gathered}", VECTORS_SCHEMA)
        loaded, need, met = None, None, 0
        try:
            for read in _row_groups(embeddings):
                if met >= self.wanted:
                    break  # every need met: the older segments are not read
                keys = read(["text_sha256", "encoder"])
                keys = keys.append_column("row", pa.array(np.arange(keys.num_rows)))
                keys = keys.filter(pc.equal(keys.column("encoder"), encoder))
                buckets = key_buckets(keys.column("text_sha256"))
                found = []  # (the group's rows needed, by which shards)
                for bucket in np.unique(buckets).tolist():
                    if bucket != loaded:  # runs of one bucket follow each other in a sorted segment
                        loaded, need = bucket, self.needs.read(bucket).sort_by("text_sha256")
                        need_keys = need.column("text_sha256").to_numpy(zero_copy_only=False)
                    rows = keys.filter(pa.array(buckets == bucket))
                    # Only the needs within the group's keys are looked up: a sorted segment's group
                    # spans a sliver of a bucket, and looking up the whole bucket's needs for every
                    # group grows with the square of the study (a million images: 4,000 groups
                    # against 66,000 needs each).
                    least, most = pc.min_max(rows.column("text_sha256")).values()
                    lo, hi = (
                        np.searchsorted(need_keys, least.as_py()),
                        np.searchsorted(need_keys, most.as_py(), "right"),
                    )
                    near = need.slice(lo, hi - lo)
                    at = pc.index_in(near.column("text_sha256"), rows.column("text_sha256"))
                    found.append((rows.column("row").take(pc.drop_null(at)), near.filter(pc.is_valid(at))))
                    met += len(at) - at.null_count
                if any(len(row) for row, _ in found):  # only then are the group's vectors read
                    group = read(VECTORS_SCHEMA.names)
                    for row, needed in found:
                        vectors.add(group.take(row).cast(VECTORS_SCHEMA), needed.column("shard").to_numpy())
        finally:
            vectors.close()
        return vectors


def cosine_values(pairs: pa.Table, vectors: pa.Table, encoder: str) -> np.ndarray:
    """Each pair's cosine (float64) under one encoder, from `vectors` (text_sha256, dim, vector:
    those the pairs need), `PAIR_ROWS` pairs at a time."""
    keys = vectors.column("text_sha256").combine_chunks()
    matrix = vector_matrix(vectors) if vectors.num_rows else np.zeros((0, 0), np.float32)
    candidate = pc.index_in(pairs.column("candidate_key"), keys)
    gold = pc.index_in(pairs.column("gold_key"), keys)
    found = np.flatnonzero(pc.and_(pc.is_valid(candidate), pc.is_valid(gold)).to_numpy(zero_copy_only=False))
    # pairs without their candidate's vector or their gold standard's
    if len(found) < pairs.num_rows:
        raise RuntimeError(
            f"{pairs.num_rows - len(found)} pairs have no {encoder} vector: the embeddings table does not match the texts"
        )
    candidate, gold = candidate.to_numpy(zero_copy_only=False), gold.to_numpy(zero_copy_only=False)
    values = np.empty(pairs.num_rows)
    for at in range(0, pairs.num_rows, PAIR_ROWS):
        c = matrix[candidate[at : at + PAIR_ROWS]].astype(np.float64)
        g = matrix[gold[at : at + PAIR_ROWS]].astype(np.float64)
        values[at : at + PAIR_ROWS] = np.einsum("ij,ij->i", c, g) / (
            np.linalg.norm(c, axis=1) * np.linalg.norm(g, axis=1)
        )
    return values


def image_inputs(pairs: pa.Table, images: pa.Table, settings) -> pa.Table:
    """Per image with pairs to score: image_id and `inputs_sha256`, the hash of the `settings`, the
    image's dataset, its gold standard and the (subject, candidate) of each of its pairs (their
    keys, or with pairwise metrics their texts): everything its rows of scores are computed from,
    as `unit_inputs` hashes it, its JSON put together on the columns. `pairs` sorted by image_id,
    subject and candidate."""
    texts = "candidate" in pairs.column_names
    candidate, gold = ("candidate", "gold") if texts else ("candidate_key", "gold_key")
    n = pairs.num_rows
    if not n:
        return pa.table({"image_id": pa.array([], pa.string()), INPUTS: pa.array([], pa.string())})
    ids = pairs.column("image_id").combine_chunks()
    first = run_starts(ids)  # each image's first pair
    subjects = pc.dictionary_encode(pairs.column("subject").combine_chunks())
    subject = json_strings(subjects.dictionary, ensure_ascii=False).take(subjects.indices)
    each = pc.binary_join_element_wise(
        "[", subject, ",", json_strings(pairs.column(candidate), ensure_ascii=False), "]", ""
    )
    of_image = pc.binary_join(pa.ListArray.from_arrays(pa.array(np.append(first, n), pa.int64()), each), ",")
    image_ids = ids.take(pa.array(first))
    dataset = images.column("dataset").take(pc.index_in(image_ids, images.column("image_id")))
    row = pc.binary_join_element_wise(
        "[" + json.dumps(inputs_head(settings), ensure_ascii=False) + ",[",
        json_strings(dataset, ensure_ascii=False),
        ",",
        json_strings(pairs.column(gold).take(pa.array(first)), ensure_ascii=False),
        ",[",
        of_image,
        "]]]",
        "",
    )
    return pa.table({"image_id": image_ids, INPUTS: sha256_hex(row)})


def similarity_scores(*args, **kwargs) -> pa.Table:
    """`score_batches(*args, **kwargs)` as one table, for a caller that holds it."""
    return pa.Table.from_batches(list(score_batches(*args, **kwargs)), SCORED_SCHEMA)


def score_batches(
    images: pa.Table,
    references: pa.Table | RunFolder,
    responses: pa.Table | RunFolder,
    embeddings: pa.Table | RunFolder,
    metrics: list[str],
    pair_metrics=(),
    previous: pa.Table | RunFolder | None = None,
    settings=None,
    unscored: Counter | None = None,
):
    """Cosine to the gold standard for each encoder in `metrics`, and each loaded pairwise metric in `pair_metrics` (e.g. BERTScore,
    `vlm_decade.models.metrics`), with each row's `inputs_sha256` (`image_inputs` under `settings`,
    what decides the vectors and metrics), as record batches in `SCORE_ORDER`. The rows of
    `previous` (the last scores) of the images whose inputs are unchanged are kept; only the other
    images are scored (`core.reuse`). The images are scored `SHARD_IMAGES` at a time, so that what
    is built per pair exists for one shard only; an image's rows do not depend on the others of its
    shard. The references, responses and embeddings are tables, or the run folder, whose tables are
    streamed (they may be too big to hold): the texts are spread over the shards in one pass, and
    wait with the shards' pairs and vectors in a temporary folder (the run folder's `.spill/`, for
    a run folder) between the passes; the rows, kept and new, wait there too, spread by metric and
    subject, and come out a metric and subject at a time, sorted by image (`_Ordered`). Each model's
    ok answers that say nothing are counted in `unscored` (`blank_answers`), not scored."""
    schema = previous.schema("scores") if isinstance(previous, RunFolder) else getattr(previous, "schema", None)
    if schema is not None and schema.remove_metadata() != SCORED_SCHEMA.remove_metadata():
        previous = None  # a table of an earlier version: nothing of it is kept (`reusable`)
    sources = (references, responses, embeddings, previous)
    spill = next((s.root / ".spill" for s in sources if isinstance(s, RunFolder)), None)
    if spill is not None:
        spill.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="scores-", dir=spill) as folder:
        folder = Path(folder)
        # The three tables are spread at once, on threads: most of it is Arrow's reading and lookups.
        with ThreadPoolExecutor(3) as pool:
            spreads = [
                pool.submit(by_image_shard, *source, images, folder)
                for source in (
                    (references, "references", ["image_id", "condition", "role", "text"]),
                    (responses, "responses", ["subject", "image_id", "variant", "status", "text"]),
                    *([(previous, "scores", SCORED_SCHEMA.names)] if previous is not None else []),
                )
            ]
            spread = [future.result() for future in spreads]
        texts, kept_rows = spread[:2], spread[2] if previous is not None else None
        rows, todo = _Ordered(folder / "rows"), {}  # every row; the shards with images to score, and their images
        vectors = ShardVectors(folder)

        def first_pass(shard: int) -> tuple[Counter, pa.Table, pa.Table | None, pa.ChunkedArray | None]:
            """A shard's blank answers (`blank_answers`) and rows kept; and of the images to score (if
            any), which they are (with their dataset) and the keys of the vectors their pairs need,
            the pairs written to disk."""
            of_shard = images.slice(shard * SHARD_IMAGES, SHARD_IMAGES).select(["image_id", "dataset"])
            shard_texts = [t.read(shard) for t in texts]
            blank = blank_answers(shard_texts[1])
            pairs = scoring_pairs(*shard_texts, bool(pair_metrics))
            # One order of each image's pairs, so that a group's mean adds its members in the same
            # order whether the image is scored alone or with every other.
            pairs = pairs.sort_by([("image_id", "ascending"), ("subject", "ascending"), ("candidate_key", "ascending")])
            wanted = image_inputs(pairs, of_shard, settings)
            kept = reusable(None if kept_rows is None else kept_rows.read(shard), wanted, ["image_id"], SCORED_SCHEMA)
            kept = kept.select(SCORED_SCHEMA.names).cast(SCORED_SCHEMA)
            new = wanted.filter(pc.invert(pc.is_in(wanted.column("image_id"), kept.column("image_id"))))
            if not new.num_rows:
                return blank, kept, None, None
            if new.num_rows < wanted.num_rows:
                pairs = pairs.filter(pc.is_in(pairs.column("image_id"), new.column("image_id")))
            _write(folder / f"pairs-{shard}.arrow", pairs)
            keys = pa.chunked_array(pairs.column("candidate_key").chunks + pairs.column("gold_key").chunks)
            return blank, kept, new.join(of_shard, "image_id", join_type="inner").sort_by("image_id"), keys

        # First pass: each shard's pairs, what of them is kept, and the vectors its other pairs need,
        # two shards at a time (their work is Arrow's and DuckDB's, mostly outside the GIL), taken
        # in shard order.
        shards = range(-(-images.num_rows // SHARD_IMAGES))
        with ThreadPoolExecutor(FIRST_PASS_THREADS) as pool:
            for shard, (blank, kept, new, keys) in zip(shards, _in_order(pool, first_pass, shards, FIRST_PASS_THREADS)):
                if unscored is not None:
                    unscored.update(blank)
                rows.add(kept)
                if new is not None:
                    todo[shard] = new
                    if metrics:
                        vectors.need(shard, keys)
        values: dict[str, dict[int, np.ndarray]] = {}
        for name in metrics if todo else ():  # second: one pass over each encoder's vectors
            gathered = vectors.gather(embeddings, name)
            values[name] = {
                shard: cosine_values(_read(folder / f"pairs-{shard}.arrow"), gathered.read(shard), name)
                for shard in todo
            }
        for shard, new in todo.items():  # third: each shard's rows
            rows.add(
                _shard_scores(
                    _read(folder / f"pairs-{shard}.arrow"), new, {n: v[shard] for n, v in values.items()}, pair_metrics
                )
            )
        yield from rows.batches()


def _in_order(pool: ThreadPoolExecutor, work, items, ahead: int):
    """`work` of each item on `pool`, the results in the items' order, no more than `ahead` items
    started past the one waited for (`pool.map` starts them all: their results would pile up)."""
    started: deque = deque()
    for item in items:
        started.append(pool.submit(work, item))
        if len(started) > ahead:
            yield started.popleft().result()
    while started:
        yield started.popleft().result()


class _Ordered:
    """The scores' rows spread over buckets on disk by (metric, subject), and read back in
    `SCORE_ORDER`: a bucket at a time in order of metric and subject, each sorted by image (one row
    per metric, subject and image), so that no more than one metric and subject's rows are held."""

    def __init__(self, folder: Path):
        self.spill = Spill(folder, SCORED_SCHEMA)
        self.bucket: dict[tuple[str, str], int] = {}

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        pairs = pa.table({"metric": table.column("metric"), "subject": table.column("subject")})
        for key in pairs.group_by(["metric", "subject"], use_threads=False).aggregate([]).to_pylist():
            self.bucket.setdefault((key["metric"], key["subject"]), len(self.bucket))
        keys = pa.array([f"{m}\x1f{s}" for m, s in self.bucket], pa.string())
        at = pc.index_in(pc.binary_join_element_wise(table.column("metric"), table.column("subject"), "\x1f"), keys)
        self.spill.add(table, np.asarray(at.to_numpy(zero_copy_only=False), np.int64))

    def batches(self):
        self.spill.close()
        for key in sorted(self.bucket):
            yield from self.spill.read(self.bucket[key]).sort_by("image_id").to_batches()


def _write(path: Path, table: pa.Table) -> None:
    with pa.ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table)


def _read(path: Path) -> pa.Table:
    with pa.ipc.open_stream(str(path)) as reader:
        return reader.read_all()


def _shard_scores(pairs: pa.Table, todo: pa.Table, cosines: dict[str, np.ndarray], pair_metrics) -> pa.Table:
    """The rows of one shard's images to score (`todo`: image_id, inputs_sha256, dataset) from
    their `pairs`: the mean per subject and image of each encoder's `cosines` and each pairwise metric."""
    tables = []
    for name in list(cosines) + [m.name for m in pair_metrics]:
        if name in cosines:
            values = cosines[name]
        else:
            metric = next(m for m in pair_metrics if m.name == name)
            values = np.asarray(
                metric.score(pairs.column("candidate").to_pylist(), pairs.column("gold").to_pylist()), np.float64
            )
        per_pair = pairs.select(["subject", "image_id"]).append_column("value", pa.array(values, pa.float64()))
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
    scores = scores.join(todo, "image_id", join_type="inner")
    return scores.select(SCORED_SCHEMA.names).cast(SCORED_SCHEMA)


def unscored_line(unscored: Counter) -> str:
    """What the scores lack, said: the ok answers with no text, per model."""
    each = ", ".join(f"{subject} {n}" for subject, n in sorted(unscored.items()))
    return f"{sum(unscored.values())} ok answers with no text are not scored ({each})"


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

    def compute(run: StudyRun) -> dict[str, Written]:
        images = run.table("images")
        metrics = [build_metric(m) for m in study.metrics]
        # The texts are streamed from the run folder, not held: at a million images they are gigabytes;
        # so is the table, written as its rows come.
        folder = run.folder
        previous = folder if folder.trusted("scores") else None

        unscored: Counter = Counter()

        def batches():
            yield from score_batches(images, folder, folder, folder, encoders, metrics, previous, per_image, unscored)
            if unscored:
                run.reporter.say(f"     scores       {unscored_line(unscored)}")
            if study.caption_metrics:  # against all human descriptions at once: these read the texts whole
                from vlm_decade.studies.decade.captions import caption_metric_scores

                texts = [run.table(n) for n in ("references", "responses")]
                yield from unkeyed(caption_metric_scores(images, *texts, study.caption_metrics)).to_batches()
            if study.judge_metrics:
                from vlm_decade.studies.decade.judging import judge_values

                yield from unkeyed(judge_values(study, run.table("judge_scores"), images)).to_batches()

        return {"scores": Written(*folder.write_batches("scores", SCORED_SCHEMA, batches()))}

    settings = [encoders, [m.fingerprint() for m in study.metrics]] + (
        [list(study.caption_metrics)] if study.caption_metrics else []
    )
    inputs = ("images", "references", "responses", "embeddings")
    if study.judge_metrics:  # a study without judges keeps the settings, and the scores, it had
        settings.append([j.fingerprint() for j in study.judge_metrics])
        inputs += ("judge_scores",)
    # Scores are computed in the driver (no Ray): the statistics' workers start beside them.
    return Stage("scores", inputs, settings, compute, frees_cluster=True)
