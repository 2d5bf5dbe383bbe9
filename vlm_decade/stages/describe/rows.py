"""The `responses` table's rows: its schema, a row made from a job and its answer (answers checked one
for one against their jobs), and the rows kept so far: what a stage still running, stopped or killed
left in its parts, read by the stage to resume and by `vlm-decade status` to count."""

from __future__ import annotations

import shutil
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import first_per_key
from vlm_decade.core.errors import error_text
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import StatusTally, Written
from vlm_decade.core.spill import HOLD_FILES_BYTES, Spill
from vlm_decade.models.api.answers import failed_answer
from vlm_decade.stages.describe.plan import Job

RESPONSES_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("variant", pa.string()),
        ("prompt_id", pa.string()),
        ("text", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("latency_s", pa.float64()),  # the provider's (or the local model's) time to answer
        ("queued_s", pa.float64()),  # API rows: time waiting for limits, slots and earlier attempts
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()),  # what the answer cost when it was bought (cached rows too)
        ("paid_usd", pa.float64()),  # what the run that wrote the row paid for it (0 from the cache)
        ("cached", pa.bool_()),  # the answer came from the API cache
        ("mode", pa.string()),  # API rows: how the answer was bought, sync or batch
        ("model_version", pa.string()),
        ("cache_key", pa.string()),
    ]
)
RESPONSE_KEY = ("subject", "image_id", "variant", "prompt_id")
JOBS_SCHEMA = pa.schema([(name, pa.string()) for name in (*RESPONSE_KEY, "cache_key")])  # what a row is matched on
ANSWER_FIELDS = (
    "text",
    "status",
    "error",
    "latency_s",
    "queued_s",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "paid_usd",
    "cached",
    "mode",
    "model_version",
)


class AnswerCountError(RuntimeError):
    """A backend or gateway call gave more or fewer answers than it was given jobs."""


def one_for_one(jobs: Sequence, answers: list, who: str) -> list:
    """`answers`, checked to hold one answer per job: matched by place, a short or long list would
    drop rows or give rows another job's answer, so it is refused whole."""
    if len(answers) != len(jobs):
        raise AnswerCountError(
            f"{who} gave {len(answers)} answers for a batch of {len(jobs)}; none of them is kept, "
            "and the next run tries the batch again"
        )
    return answers


def response_row(job: Job, answer: dict) -> dict:
    """A `responses` row: the job's key and cache key, and the answer's fields."""
    return {
        "subject": job.subject,
        "image_id": job.image_id,
        "variant": job.variant,
        "prompt_id": job.prompt_id,
        **{k: answer[k] for k in ANSWER_FIELDS},
        "cache_key": job.cache_key,
    }


def failed_batch(batch: list[Job], exc: BaseException) -> list[dict]:
    """Every job of a batch that failed as a whole, as an error row (tried again by the next run)
    saying the cause (`error_text`)."""
    return [response_row(job, failed_answer("error", error_text(exc))) for job in batch]


# the rows kept so far ---------------------------------------------------------------------------
def _composite(table: pa.Table, *extra: str) -> pa.ChunkedArray:
    """One string per row from its key columns (and `extra` columns), for set lookups."""
    return pc.binary_join_element_wise(*(table.column(c) for c in (*RESPONSE_KEY, *extra)), "\x1f")


def conform(table: pa.Table, schema: pa.Schema = RESPONSES_SCHEMA) -> pa.Table:
    """`table` in `schema`: a table written before a column existed gets it as nulls."""
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


MATCH_ROWS = 65_536  # rows whose cache keys are compared with their jobs' at a time


def _job_of(rows: pa.Table, jobs: pa.Table) -> np.ndarray:
    """Per row, the number of the current job it answers: the job with its key and its cache key
    (a row of other settings answers none); -1 where none."""
    at = pc.index_in(_composite(rows), value_set=_composite(jobs).combine_chunks())
    job = at.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    cache_keys = jobs.column("cache_key")
    for start in range(0, len(job), MATCH_ROWS):  # a slice at a time: jobs' keys are not copied whole
        part = job[start : start + MATCH_ROWS]
        known = np.flatnonzero(part >= 0)
        theirs = cache_keys.take(pa.array(part[known], pa.int64()))
        mine = rows.column("cache_key").slice(start, MATCH_ROWS).take(pa.array(known, pa.int64()))
        part[known[~pc.equal(mine, theirs).fill_null(False).to_numpy(zero_copy_only=False)]] = -1
    return job


def _best_rows(rows: pa.Table, jobs: pa.Table) -> np.ndarray:
    """Per job that has a row, its best row's number (the first ok row; else the latest attempt),
    in the order of the jobs' keys. Decided on row and job numbers, not on the rows' strings."""
    job = _job_of(rows, jobs)
    at = np.flatnonzero(job >= 0)
    job = job[at]
    ok = pc.equal(rows.column("status"), "ok").fill_null(False).to_numpy(zero_copy_only=False)[at]
    order = np.lexsort((np.where(ok, at, -at), ~ok, job))  # by job, ok first, then the first ok or the latest
    job, at = job[order], at[order]
    first = np.r_[True, job[1:] != job[:-1]] if len(job) else np.zeros(0, bool)
    best = np.full(jobs.num_rows, -1, np.int64)
    best[job[first]] = at[first]
    by_key = pc.sort_indices(jobs, sort_keys=[(c, "ascending") for c in RESPONSE_KEY]).to_numpy()
    best = best[by_key]
    return best[best >= 0]


COLLECT_IMAGES = 16_384  # images whose rows are chosen at a time, per model: a bucket of the spill (a few MB)


def _buckets(table: pa.Table, subjects: pa.Array, bounds: list[str]) -> np.ndarray:
    """Each row's bucket: its subject's place among `subjects` (sorted), then which of the image
    ranges that start at `bounds` (sorted) holds its image; -1 for a subject of no current job.
    The buckets' order is the rows' key order (subject, then image)."""
    subject = pc.index_in(table.column("subject"), value_set=subjects).fill_null(-1).to_numpy(zero_copy_only=False)
    image = table.column("image_id")
    shard = np.zeros(table.num_rows, np.int64)
    for bound in bounds[1:]:
        shard += pc.greater_equal(image, bound).to_numpy(zero_copy_only=False)
    return np.where(subject >= 0, subject.astype(np.int64) * len(bounds) + shard, -1)


def _table_rows(folder: RunFolder):
    """The previous table's rows, a batch at a time, in `RESPONSES_SCHEMA` (a table of before lacks
    some columns)."""
    for batch in folder.batches("responses"):
        yield conform(pa.Table.from_batches([batch]))


def _parts(folder: RunFolder, seen: set[str]):
    """The parts not in `seen` (added to it as read)."""
    for part in folder.iter_parts("responses", RESPONSES_SCHEMA, seen=seen):
        yield conform(part)


class RowsSoFar:
    """The rows so far (the previous table's, if trusted: `from_table`; then the parts') of the
    `subjects`' jobs, spread over buckets on
    disk (the run folder's `.spill/`) by subject and range of `COLLECT_IMAGES` of the images
    `image_ids`, in one pass, so that none is held whole (held in memory instead when their files
    are small: `HOLD_FILES_BYTES`); then read a bucket at a time against the jobs of any of the
    subjects as they are planned (`add_jobs`: which are still to do; `kept_keys`: the keys of the
    table's rows of some), one model's after another's.
    The parts saved since (the stage's own answers) are added after them by `catch_up`, so that the
    rows read first are not spread again. The jobs added are spread over the same buckets, so that
    `collect_rows` holds a bucket's, not a model's (at a million images, 4 million jobs a model:
    0.4 GB). A context: the spills are removed on leaving it."""

    def __init__(self, folder: RunFolder, subjects, image_ids: pa.Array | pa.ChunkedArray):
        self.folder = folder
        self.subjects = pa.array(sorted(set(subjects)), pa.string())
        images = pc.unique(image_ids).sort()
        self.bounds = images.take(pa.array(range(0, len(images), COLLECT_IMAGES), pa.int64())).to_pylist()
        self.root = folder.root / ".spill" / "responses"
        shutil.rmtree(self.root, ignore_errors=True)  # what a killed run left is of no use
        self.seen: set[str] = set()  # the parts spilled
        held = folder.stored_bytes("responses") <= HOLD_FILES_BYTES
        self.n_buckets = len(self.subjects) * max(len(self.bounds), 1)
        # Per bucket, the previous table's rows, the jobs added and those of them `kept`.
        self.table_rows, self.job_rows, self.kept_rows = (np.zeros(self.n_buckets, np.int64) for _ in range(3))
        self.from_table = folder.trusted("responses")
        self.spills = (
            [self._spill(self.root / "table", _table_rows(folder), held, self.table_rows)] if self.from_table else []
        )
        self.spills.append(self._spill(self.root / "0", _parts(folder, self.seen), held))
        self.jobs = Spill(self.root / "jobs", JOBS_SCHEMA)

    def _spill(self, root, sources, held: bool, counts: np.ndarray | None = None) -> Spill:
        """`sources`' rows spread over the buckets; their number per bucket added to `counts`."""
        spill = Spill(root, RESPONSES_SCHEMA, held=held)
        try:
            for rows in sources:
                bucket = _buckets(rows, self.subjects, self.bounds)
                _spread(spill, rows, bucket)
                if counts is not None:
                    counts += np.bincount(bucket[bucket >= 0], minlength=len(counts))
        finally:
            spill.close()
        return spill

    def catch_up(self) -> None:
        """Add the parts saved since the rows were spread (or last caught up), after them: held in
        memory only if those parts are small too (a fresh run's are every answer it has: at a
        million images, 8 million rows held took the driver to 4.4 GB)."""
        held = self.folder.parts_bytes("responses", besides=self.seen) <= HOLD_FILES_BYTES
        self.spills.append(self._spill(self.root / str(len(self.spills)), _parts(self.folder, self.seen), held))

    def __enter__(self) -> RowsSoFar:
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def add_jobs(self, jobs: pa.Table, kept: np.ndarray | None = None) -> tuple[pa.Table, int]:
        """Add current jobs (their key and cache key, kept for `collect_rows`; each job once), and
        say which have still to be done: the jobs without an ok row so far (still in plan order),
        and how many have one. Each job's bucket is found once, for both. The jobs `kept` (a mask)
        took their key from an ok row of the previous table (`kept_keys`): they are done, and
        not looked for again."""
        job_bucket = _buckets(jobs, self.subjects, self.bounds)
        _spread(self.jobs, jobs.select(JOBS_SCHEMA.names).cast(JOBS_SCHEMA), job_bucket)
        self.job_rows += np.bincount(job_bucket, minlength=len(self.job_rows))
        if kept is not None:
            self.kept_rows += np.bincount(job_bucket[kept], minlength=len(self.kept_rows))
        done = np.zeros(jobs.num_rows, bool) if kept is None else kept.copy()
        looked = job_bucket if kept is None else np.where(kept, -1, job_bucket)
        for bucket, theirs in _in_buckets(looked, self.n_buckets, self._held()):
            rows = self._rows(bucket)
            job = _job_of(rows, jobs.take(pa.array(theirs, pa.int64())))
            ok = pc.equal(rows.column("status"), "ok").fill_null(False).to_numpy(zero_copy_only=False)
            done[theirs[job[(job >= 0) & ok]]] = True
        n_done = int(done.sum())
        return (jobs.filter(pa.array(~done)) if n_done else jobs), n_done

    def kept_keys(self, asked: pa.Table) -> pa.Array:
        """Per job asked (its key columns, and a `text` column where its answer is a file's row), the
        cache key of its row in the previous table where that row is ok (and holds that text), else
        null. For jobs whose inputs are as the table's keys were made from (`keyed.KeyInputs`): the
        row's key is then the job's."""
        if not self.from_table:
            return pa.nulls(asked.num_rows, pa.string())
        table = self.spills[0]
        bucket = _buckets(asked, self.subjects, self.bounds)
        place, found = np.full(asked.num_rows, -1, np.int64), []
        n_found = 0
        for b, theirs in _in_buckets(bucket, self.n_buckets, table.buckets):
            rows, mine = table.read(b), asked.take(pa.array(theirs, pa.int64()))
            at = pc.index_in(_composite(mine), value_set=_composite(rows).combine_chunks())
            kept = pc.and_(pc.is_valid(at), pc.equal(rows.column("status").take(at), "ok"))
            if "text" in asked.column_names:
                kept = pc.and_(kept, pc.equal(rows.column("text").take(at), mine.column("text")))
            kept = pc.fill_null(kept, False)
            found.append(rows.column("cache_key").take(at.filter(kept)).combine_chunks())
            hits = np.flatnonzero(kept.to_numpy(zero_copy_only=False))
            place[theirs[hits]] = n_found + np.arange(len(hits))
            n_found += len(hits)
        if not n_found:
            return pa.nulls(asked.num_rows, pa.string())
        return pa.concat_arrays(found).take(pa.array(place, pa.int64(), mask=place < 0))

    def _held(self) -> set[int]:
        """The buckets that hold rows so far."""
        return set().union(*(spill.buckets for spill in self.spills))

    def _rows(self, bucket: int) -> pa.Table:
        return pa.concat_tables([spill.read(bucket) for spill in self.spills])

    def job_buckets(self) -> Iterator[tuple[pa.Table, pa.Table | None]]:
        """Per bucket (in key order) that holds jobs added and rows: its rows so far, in the order
        read, and its jobs; None for the jobs of a bucket whose rows are its jobs' rows as they are
        (every job `kept`, one for each row of the previous table there, no part there): the
        table's rows, in its order (the key's)."""
        self.jobs.close()
        held = self._held()
        parts = set().union(*(spill.buckets for spill in self.spills[1 if self.from_table else 0 :]))
        for bucket in self.jobs.buckets:
            if bucket not in held:
                continue
            as_they_are = (
                self.from_table
                and bucket not in parts
                and self.kept_rows[bucket] == self.job_rows[bucket] == self.table_rows[bucket]
            )
            yield self._rows(bucket), None if as_they_are else self.jobs.read(bucket)


def _in_buckets(bucket: np.ndarray, n_buckets: int, among) -> Iterator[tuple[int, np.ndarray]]:
    """Per bucket that `bucket` (one per row, of `n_buckets`; -1: none) names and `among` holds, in
    order, the numbers of its rows (in their order)."""
    order = np.argsort(bucket, kind="stable")
    starts = np.searchsorted(bucket[order], np.arange(n_buckets + 1))
    for b in sorted(set(np.unique(bucket).tolist()) & set(among)):
        yield b, order[starts[b] : starts[b + 1]]


def _spread(spill: Spill, table: pa.Table, bucket: np.ndarray) -> None:
    """`table`'s rows into `spill` by their `bucket`s, leaving out those of no bucket (-1)."""
    keep = np.flatnonzero(bucket >= 0)
    spill.add(table.take(pa.array(keep, pa.int64())), bucket[keep])


def collect_rows(folder: RunFolder, so_far: RowsSoFar) -> Written:
    """Write the `responses` table: for each current job (those added to `so_far`), its best row
    so far from the previous table and the parts a crash or this run left (the first ok row; else
    the latest attempt), sorted by key; rows of other settings (another cache key) are dropped.
    Never held whole: the rows so far (caught up with the parts saved since `so_far` was made) and
    the jobs are read a bucket at a time, and each bucket's rows are chosen against its jobs (on
    row numbers), tallied and written in turn."""
    so_far.catch_up()
    tally = StatusTally("responses")

    def chosen():
        for rows, jobs in so_far.job_buckets():
            best = rows if jobs is None else rows.take(pa.array(_best_rows(rows, jobs), pa.int64()))
            tally.add(best)
            yield from best.to_batches()

    fingerprint, record, n = folder.write_batches("responses", RESPONSES_SCHEMA, chosen())
    return Written(fingerprint, record, n, tally)


def response_states(folder: RunFolder) -> dict[str, Counter]:
    """Per subject, its responses by status so far (the table, and the parts of a stage still
    running or stopped), the best row of each response counted once (ok wins, else the latest)."""
    # Only the key and the status: the texts are most of a million images' responses.
    columns = [*RESPONSE_KEY, "status"]
    narrow = pa.schema([RESPONSES_SCHEMA.field(c) for c in columns])
    old = conform(folder.read("responses", columns), narrow) if folder.has("responses") else narrow.empty_table()
    parts = folder.read_parts("responses", RESPONSES_SCHEMA, columns, discard=False)  # a look changes nothing
    rows = pa.concat_tables([old, parts])
    ok = pc.equal(rows.column("status"), "ok")
    order = pa.array(np.arange(rows.num_rows), pa.int64())
    rows = rows.append_column("_ok", ok).append_column("_rank", pc.negate(order))
    rows = rows.sort_by([*((c, "ascending") for c in RESPONSE_KEY), ("_ok", "descending"), ("_rank", "ascending")])
    best = first_per_key(rows.append_column("_key", _composite(rows)), "_key")
    out: dict[str, Counter] = defaultdict(Counter)
    for r in best.group_by(["subject", "status"]).aggregate([("status", "count")]).to_pylist():
        out[r["subject"]][r["status"]] = r["status_count"]
    return out
