"""The embed stage: each distinct text (human or model) is encoded once per encoder.

Vectors are keyed by the sha256 of the stripped text, so a description shared by several rows, or
by two runs, costs one encoding. Encoding runs in a Ray actor that loads the encoder once; each
finished batch is saved as a part, so a killed run keeps what it finished. API encoders (`remote`)
send their batches through the provider's gateway actor instead, several at once; it caches every
vector, so a text is paid for once across runs. In batch mode every API encoder's texts are
submitted as batches before any is waited on (`stages.gateways`), so the stage waits one batch
turnaround for all its encoders.

The driver never holds a row per text of the whole study: the texts, the vectors already there and
then the vectors to write are spread over 256 buckets on disk by the key's first two hex digits, and
worked through a bucket at a time (a local encoder's texts a chunk of buckets at a time).

The table is a folder of segments (`RunFolder.write_segment`): a run keeps, file for file, each
segment of the last table whose every row it still wants, and writes one new segment of the rest
(the vectors it encoded, and the rows it keeps of a segment that also holds rows it no longer
wants), so images added to a run cost their own vectors, not a rewrite of every vector.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import first_per_key, run_starts, stripped
from vlm_decade.core.config import EncoderConfig, StudyBase
from vlm_decade.core.dispatch import batches, bounded, pool_map
from vlm_decade.core.errors import Problem
from vlm_decade.core.runfolder import SEGMENT, RunFolder, segments_record
from vlm_decade.core.runner import Stage, StudyRun, Written
from vlm_decade.core.runtime import LazyRay
from vlm_decade.core.spill import HOLD_FILES_BYTES, Spill, key_buckets
from vlm_decade.models.api.endpoints import endpoint_problems, sending_problems
from vlm_decade.models.api.keys import api_key, key_hint
from vlm_decade.models.api.session import APIStopped, BatchesPending, BudgetReached, RemoteSession
from vlm_decade.models.encoders import EncodeActor, api_provider, encoder_class, text_keys
from vlm_decade.stages.gateways import Gateways, raise_stops

EMBEDDINGS_SCHEMA = pa.schema(
    [
        ("text_sha256", pa.string()),
        ("encoder", pa.string()),
        ("encoder_key", pa.string()),
        ("dim", pa.int32()),
        # Variable-length so encoders of different widths share one table; `dim` says the width.
        ("vector", pa.list_(pa.float32())),
        # An API encoder's vector: sync or batch, the mode that bought it (a cached one: the mode of
        # its purchase); null for a local encoder, and in tables written before the column existed.
        ("mode", pa.string()),
    ]
)
# Texts per call to a local encoder actor. Each call costs the driver and the actor a few
# milliseconds of Ray's own (the texts out, the vectors back through the object store, the part's
# rows): at 128 a small encoder on CPU took 16% longer than at 512 for 170,000 texts, and 40% longer
# inside a whole run (benchmarks/RESULTS.md, "Embedding throughput"); the encoder still batches its
# `batch_size` at a time within a call.
TEXT_BATCH = 512
IN_FLIGHT_PER_ACTOR = 2  # batches in flight to each local encoder actor: the next is ready while one is saved
PART_ROWS, PART_S = 8192, 10.0  # save vectors as a part this often
VECTOR_BATCH = 4096  # rows read at a time
KEY_BATCH = 65_536  # rows read at a time without their vectors
REMOTE_IN_FLIGHT = 8  # batches of texts in flight to an API encoder's gateway
# A local encoder's texts are sorted by length (for its batches) this many at least at a time: a study
# with fewer is batched exactly as if they were sorted whole.
CHUNK_TEXTS = 65_536
TEXTS_SCHEMA = pa.schema([("text_sha256", pa.string()), ("text", pa.string())])
# The columns whose ranges in a row group's footer tell which buckets its rows may fall in.
RANGED = ["text_sha256", "encoder_key"]
# Writing the table: a spilled row (Arrow, uncompressed) against the same row in a part (Parquet),
# and the share of the free space the spill and the table may take.
SPILL_GROWTH, FREE_KEPT = 1.25, 0.9
# Sources (the parts and the segments not kept) up to this size are sorted in memory (about twice
# their size at the peak), not spread over buckets on disk first: what images added to a run encode.
SORT_IN_MEMORY_BYTES = 512 * 2**20


def encoder_key(cfg: EncoderConfig) -> str:
    """What decides an encoder's vectors (not its display name or batch size)."""
    return cfg.key(without=("name",))


def check_encoders(study: StudyBase) -> list[Problem]:
    """An API key and a price for every API encoder, before any work."""
    problems, wanted = [], {}
    for i, enc in enumerate(getattr(study, "encoders", ())):
        try:
            provider = api_provider(enc.backend)
        except KeyError as exc:
            problems.append(Problem("study file", exc.args[0], field=f"encoders.{i}.backend"))
            continue
        if provider is None:
            if enc.endpoint is not None:
                problems.append(
                    Problem(
                        "study file",
                        f"`endpoint` is for API encoders; {enc.backend} runs here",
                        field=f"encoders.{i}.endpoint",
                    )
                )
            continue
        mine = sending_problems(study.providers, provider, enc.endpoint, enc.model_id, f"encoders.{i}")
        problems += mine
        if enc.endpoint is not None:  # its key and the model it serves: `endpoint_problems`
            if not mine:
                wanted.setdefault(enc.endpoint, {}).setdefault(enc.model_id, f"encoders.{i}.model_id")
            continue
        if api_key(provider) is None:
            problems.append(
                Problem(
                    "environment",
                    f"encoder '{enc.name}' needs an API key: set {key_hint(provider)}",
                    field=f"encoders.{i}",
                )
            )
    return problems + endpoint_problems(study.providers, wanted)


def _rows(keys, vectors: np.ndarray, cfg: EncoderConfig, modes: list[str] | None = None) -> pa.Table:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim).cast(pa.list_(pa.float32()))
    return pa.table(
        {
            "text_sha256": pa.array(keys, pa.string()),
            "encoder": pa.array([cfg.name] * n, pa.string()),
            "encoder_key": pa.array([encoder_key(cfg)] * n, pa.string()),
            "dim": pa.array([dim] * n, pa.int32()),
            "vector": column,
            "mode": pa.array(modes if modes is not None else [None] * n, pa.string()),
        },
        schema=EMBEDDINGS_SCHEMA,
    )


def _previous(folder: RunFolder) -> list[tuple[Path, dict[str, Any] | None]]:
    """The last table's files, if it verifies (`folder.trusted`): its segments, each with its
    record, or the one file (no record) of a table written before tables had segments."""
    if not folder.trusted("embeddings"):
        return []
    record = folder.manifest()["files"]["embeddings"]
    if "segments" in record:
        return [(folder.segment_folder("embeddings") / s["name"], s) for s in record["segments"]]
    return [(folder.table_path("embeddings"), None)]


def _sources(
    folder: RunFolder,
    previous: list,
    columns: list[str] | None = None,
    skip: frozenset[int] = frozenset(),
    touches: Callable[[dict], bool] | None = None,
):
    """The vectors this run may reuse, as (source, table) a table at a time (never all at once):
    the `previous` table's files (source: their place in it), but those in `skip`, then the parts
    a killed run or this one saved (source: `len(previous)`). Rows written before the `mode`
    column existed get it empty. With `touches` (whether a row group, by the least and greatest
    of its `RANGED` columns, may hold rows wanted), the row groups and parts whose footers say it
    holds none are not read."""

    def whole(table: pa.Table) -> pa.Table:
        if columns is None and "mode" not in table.column_names:
            table = table.append_column("mode", pa.nulls(table.num_rows, pa.string()))
        return table.cast(pa.schema([EMBEDDINGS_SCHEMA.field(c) for c in table.column_names]))

    # Keys alone are read many row groups at a time: each table taken is spread over 256 buckets.
    rows = VECTOR_BATCH if columns is None or "vector" in columns else KEY_BATCH
    for source, (path, _) in enumerate(previous):
        if source not in skip:
            groups = None if touches is None else folder.touched_row_groups(path, RANGED, touches)
            for batch in folder.file_batches(path, columns=columns, batch_size=rows, row_groups=groups):
                yield source, whole(pa.Table.from_batches([batch]))
    keep = None if touches is None else partial(_touched, folder, touches)
    for table in folder.iter_parts("embeddings", EMBEDDINGS_SCHEMA, columns, keep=keep):
        yield len(previous), whole(table)


def _touched(folder: RunFolder, touches: Callable[[dict], bool], path: Path) -> bool:
    """Whether a part may hold rows `touches` wants: yes, unless its footer says none of its row
    groups does (a part whose footer cannot be read is read, and said to be damaged)."""
    groups = folder.touched_row_groups(path, RANGED, touches)
    return groups is None or bool(groups)


@contextmanager
def spill_folder(folder: RunFolder):
    """The folder beside the tables where the stage spreads its rows over buckets: emptied before
    and removed after (what a killed run left there is of no use)."""
    spill = folder.root / ".spill" / "embeddings"
    shutil.rmtree(spill, ignore_errors=True)
    try:
        yield spill
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def _hashed(texts: pa.Array) -> tuple[pa.Table, np.ndarray]:
    """The non-blank texts of a batch, stripped, with their keys (text_sha256, text), and each one's
    bucket (the key's first two hex digits)."""
    texts = stripped(texts)
    texts = texts.filter(pc.fill_null(pc.greater(pc.binary_length(texts), 0), False))
    table = pa.table({"text_sha256": text_keys(texts), "text": texts.cast(pa.string())})
    return table, key_buckets(table.column("text_sha256"))


@dataclass
class _Plan:
    """The stage's work, bucket by bucket on disk: each bucket's distinct texts (sorted by key) with
    a `source_<i>` column saying where encoder i's vector of it is (a file of the previous table,
    the parts: `_sources`' numbers; -1: to encode), the previous table's files and which of them are
    kept as they are (`clean`), and the counts."""

    encoders: list[EncoderConfig]
    texts: Spill
    wanted: int  # distinct texts
    todo: dict[str, int]  # texts to encode, per encoder name
    previous: list[tuple[Path, dict[str, Any] | None]]
    clean: frozenset[int]  # the previous table's segments whose every row is wanted as it is

    def todo_tables(self, i: int):
        """Encoder i's texts to encode, (text_sha256, text) a bucket at a time, in key order."""
        for bucket in self.texts.buckets:
            table = self.texts.read(bucket)
            table = table.filter(pc.equal(table.column(f"source_{i}"), -1)).select(["text_sha256", "text"])
            if table.num_rows:
                yield table

    def local_batches(self, i: int):
        """Encoder i's texts in batches of `TEXT_BATCH` of about one length, as SentenceTransformer.encode
        makes them (a batch is padded to its longest text, so mixed lengths waste most of the work
        on padding): sorted by length a chunk of at least `CHUNK_TEXTS` (or all) at a time, so only
        one chunk is held, and a study of fewer texts is batched as if sorted whole."""
        chunk, count = [], 0
        for table in self.todo_tables(i):
            chunk.append(table)
            count += table.num_rows
            if count >= CHUNK_TEXTS:
                yield from _by_length(pa.concat_tables(chunk))
                chunk, count = [], 0
        if chunk:
            yield from _by_length(pa.concat_tables(chunk))

    def written_keys(self, digits: int, i: int) -> pa.ChunkedArray:
        """The keys of bucket `digits` whose vector of encoder i goes into the new segment: those
        not in a segment kept as it is."""
        table = self.texts.read(digits)
        kept = pc.is_in(table.column(f"source_{i}"), pa.array(sorted(self.clean), pa.int32()))
        return table.column("text_sha256").filter(pc.invert(kept))


def _by_length(todo: pa.Table):
    # The order is taken a batch at a time, so the texts are never held twice; from one chunk, as a
    # take from a chunked column joins its chunks first, every time (of 250 chunks: 35 times slower).
    todo = todo.combine_chunks()
    order = pc.sort_indices(pc.utf8_length(todo.column("text")))
    for start in range(0, todo.num_rows, TEXT_BATCH):
        yield todo.take(order.slice(start, TEXT_BATCH))


HAVE_SCHEMA = pa.schema(
    [("text_sha256", pa.string()), ("encoder_key", pa.string()), ("encoder", pa.string()), ("source", pa.int32())]
)


def _plan(folder: RunFolder, encoders: list[EncoderConfig], spill: Path) -> _Plan:
    """Every distinct non-empty text of the references and the ok responses, stripped, keyed by
    its sha256, and where each encoder's vector of it is (the first the previous table or the parts
    hold), worked out a bucket of keys at a time: the texts and the (key, encoder) pairs the sources
    hold are first spread over 256 buckets by the key's first two hex digits. A segment of the
    previous table is kept as it is (`clean`) when each of its rows is such a first vector, under
    its encoder's current name. The buckets are held in memory when the texts' files are small
    (`HOLD_FILES_BYTES`; the vectors' keys, one per text and encoder, count once per encoder)."""
    held = (folder.stored_bytes("references") + folder.stored_bytes("responses")) * len(encoders) <= HOLD_FILES_BYTES
    with ThreadPoolExecutor(1) as checker:
        # The previous table's files are checked (hashed whole: gigabytes; or trusted by their recorded
        # size and time) on a thread while the texts are hashed here, a column at a time.
        checked = checker.submit(_previous, folder)
        raw = Spill(spill / "raw", TEXTS_SCHEMA, held)
        for batch in folder.batches("references", columns=["text"]):
            raw.add(*_hashed(batch.column("text")))
        for batch in folder.batches("responses", columns=["status", "text"]):
            raw.add(*_hashed(batch.filter(pc.equal(batch.column("status"), "ok")).column("text")))
        raw.close()
        previous = checked.result()
    keys = pa.array([encoder_key(cfg) for cfg in encoders], pa.string())
    have = Spill(spill / "have", HAVE_SCHEMA, held)
    for source, table in _sources(folder, previous, ["text_sha256", "encoder_key", "encoder"]):
        table = table.filter(pc.is_in(table.column("encoder_key"), keys))
        table = table.append_column("source", pa.array(np.full(table.num_rows, source, np.int32)))
        have.add(table, key_buckets(table.column("text_sha256")))
    have.close()
    texts = Spill(spill / "texts", _plan_schema(len(encoders)), held)
    wanted, todo = 0, dict.fromkeys([cfg.name for cfg in encoders], 0)
    in_place = np.zeros(len(previous) + 1, np.int64)  # per source, its rows chosen as they are
    for bucket in raw.buckets:
        table = first_per_key(raw.read(bucket).sort_by("text_sha256"), "text_sha256")
        encoded = have.read(bucket)
        for i, cfg in enumerate(encoders):
            mine = encoded.filter(pc.equal(encoded.column("encoder_key"), encoder_key(cfg)))
            mine = first_per_key(mine.sort_by("text_sha256"), "text_sha256")  # a stable sort: the first source's
            at = pc.index_in(table.column("text_sha256"), mine.column("text_sha256"))
            source = pc.fill_null(mine.column("source").take(at), -1)
            table = table.append_column(f"source_{i}", source)
            todo[cfg.name] += pc.sum(pc.equal(source, -1)).as_py() or 0
            chosen = pc.and_(
                pc.is_in(mine.column("text_sha256"), table.column("text_sha256")),
                pc.equal(mine.column("encoder"), cfg.name),
            )
            in_place += np.bincount(mine.column("source").filter(chosen).to_numpy(), minlength=len(in_place))
        texts.add(table, np.full(table.num_rows, bucket))
        wanted += table.num_rows
    raw.remove()
    have.remove()
    texts.close()
    clean = frozenset(
        i for i, (_, segment) in enumerate(previous) if segment is not None and in_place[i] == segment["rows"]
    )
    return _Plan(encoders, texts, wanted, todo, previous, clean)


def _plan_schema(n_encoders: int) -> pa.Schema:
    return pa.schema([*TEXTS_SCHEMA, *(pa.field(f"source_{i}", pa.int32()) for i in range(n_encoders))])


def run_embed(study: StudyBase, run: StudyRun) -> Written:
    """Encode the texts of the run's references and responses (`_plan`) that no encoder has a
    vector for yet, and write the embeddings table."""
    encoders = list(study.encoders)
    local = _local(encoders)
    with spill_folder(run.folder) as spill, ThreadPoolExecutor(1) as planner:
        # The plan is made on a thread while Ray and the first local encoder's actors start (their
        # imports take seconds), if they were not started ahead (`warm`): the vectors and texts to
        # keep are found meanwhile.
        planning = planner.submit(_plan, run.folder, encoders, spill)
        started = {local[0].name: run.warmed() or _start_actors(study, local[0], run.ray)} if local else {}
        plan = planning.result()
        todo, total = plan.todo, sum(plan.todo.values())
        if total < plan.wanted * len(encoders):
            run.reporter.say(f"     embeddings   {plan.wanted * len(encoders) - total} already encoded, kept")
        remote = {cfg.name: cfg for cfg in encoders if todo[cfg.name] and encoder_class(cfg.backend).remote}
        providers = sorted({api_provider(cfg.backend, cfg.endpoint) for cfg in remote.values()})
        stops: list[APIStopped] = []
        with (
            run.reporter.track("embed", total, todo) as advance,
            Gateways(run, study.providers, providers) as gateways,
        ):
            session = {name: gateways[api_provider(cfg.backend, cfg.endpoint)] for name, cfg in remote.items()}
            # An API encoder takes its whole to-do list at once: its texts are sent (and paid for) one
            # by one, not padded into batches by length, and batch mode submits them all before any wait.
            work = {}
            for i, cfg in enumerate(encoders):
                if cfg.name in remote:
                    keys, texts = [], {}
                    for table in plan.todo_tables(i):
                        keys += table.column("text_sha256").to_pylist()
                        texts.update(zip(table.column("text_sha256").to_pylist(), table.column("text").to_pylist()))
                    work[cfg.name] = (keys, texts)
            # Every batch-mode encoder's texts are handed over and submitted as batches before any is waited on.
            batched = [name for name, cfg in remote.items() if session[name].batch_for(cfg.mode)]
            for name in batched:
                _queue_embeds(gateways.ray, session[name], remote[name], *work[name])
            if batched:
                gateways.flush()
            for i, cfg in enumerate(encoders):
                if cfg.name in remote:
                    try:
                        _embed_remote(session[cfg.name], cfg, *work.pop(cfg.name), run, partial(advance, part=cfg.name))
                    except APIStopped as exc:  # the other encoders go on; the stage stops after them, naming each
                        stops.append(exc)
                elif todo[cfg.name]:
                    actors = started.pop(cfg.name, [])
                    _embed_local(
                        study, cfg, plan.local_batches(i), todo[cfg.name], run, partial(advance, part=cfg.name), actors
                    )
        for actors in started.values():  # started for an encoder that had nothing to encode
            for actor in actors:
                run.ray().kill(actor)
        raise_stops(stops)
        run.cluster_freed()  # the actors are gone: what comes next starts beside the writing
        return _write_selected(run.folder, plan, spill / "vectors")


def _local(encoders) -> list[EncoderConfig]:
    """The encoders that run in the cluster's actors (not an API's)."""
    return [cfg for cfg in encoders if not encoder_class(cfg.backend).remote]


def encoder_actors(study: StudyBase, ray) -> int:
    """How many encoder actors keep every CPU (or GPU) of the cluster busy."""
    rt, have = study.runtime, ray.cluster_resources()
    if rt.gpus_per_actor > 0:
        return max(1, int(have.get("GPU", 0) // rt.gpus_per_actor))
    return max(1, int(have.get("CPU", 1) // max(rt.cpus_per_actor, 1e-9)))


def actors_for(slots: int, n_texts: int) -> int:
    """Encoder actors for `n_texts` new texts: `slots` (`encoder_actors`), but no more than one per
    call of work (`TEXT_BATCH` texts): an actor's start (about 8 s of a core importing torch and
    sentence-transformers) outweighs a call's work."""
    return min(slots, -(-n_texts // TEXT_BATCH))


def _actor_class(study: StudyBase, ray):
    rt = study.runtime
    return ray.remote(EncodeActor).options(num_cpus=rt.cpus_per_actor, num_gpus=rt.gpus_per_actor)


def loading_at_once(slots: int, cpus: float, local: bool) -> int:
    """How many of an encoder's `slots` actors load it at once: on a local Ray, whose `cpus` the
    driver shares, no more than the CPUs the driver leaves (an actor's load is seconds of a core;
    two loads on the one core a 2-core machine leaves make both late); on a cluster, all."""
    return slots if not local else max(1, min(slots, int(cpus) - 1))


def _start_actors(study: StudyBase, cfg: EncoderConfig, lazy: LazyRay) -> list:
    """An encoder's actors, as many as the cluster fits (`encoder_actors`): those that load at once
    (`loading_at_once`), and the rest once the first has loaded (or failed to: the stage says why),
    unless the run ends meanwhile (`LazyRay.stopping`)."""
    ray = lazy()
    actor_cls, slots = _actor_class(study, ray), encoder_actors(study, ray)
    at_once = loading_at_once(slots, ray.cluster_resources().get("CPU", 1), lazy.local)
    actors = [actor_cls.remote(cfg) for _ in range(at_once)]
    if len(actors) < slots:
        _loaded(ray, actors[0], study.runtime.stall_timeout_s, lazy.stopping)
        if not lazy.stopping.is_set():
            actors += [actor_cls.remote(cfg) for _ in range(slots - len(actors))]
    return actors


def _loaded(ray, actor, timeout_s: float, stopping: threading.Event) -> None:
    """Wait until `actor` has loaded its encoder (or failed to), at most `timeout_s`, and not past
    `stopping`."""
    ready, deadline = actor.ready.remote(), time.monotonic() + timeout_s
    while not stopping.is_set() and time.monotonic() < deadline:
        if ray.wait([ready], timeout=0.25)[0]:
            return


def start_ahead(study: StudyBase, lazy: LazyRay) -> Future | None:
    """Ray and the first local encoder's actors (`_start_actors`), started on `lazy`'s thread while
    the caller goes on (`LazyRay.start_soon`); None for a study with no local encoder."""
    local = _local(study.encoders)
    return lazy.start_soon(lambda ray: _start_actors(study, local[0], lazy)) if local else None


def _embed_local(
    study: StudyBase, cfg: EncoderConfig, work, n_texts: int, run: StudyRun, advance, started: list = ()
) -> None:
    """Batches of texts (`work`: `_Plan.local_batches`, `n_texts` in all, taken as the actors are ready
    for them) through encoder actors (`actors_for`: as many as the cluster's CPUs or GPUs allow, at
    most one per call of work; those `started` already first), the finished vectors saved as parts
    every few thousand rows."""
    ray, rt = run.ray(), study.runtime
    actor_cls, started = _actor_class(study, ray), list(started)
    n_actors = actors_for(encoder_actors(study, ray), n_texts)
    for actor in started[n_actors:]:  # more than so few texts need
        ray.kill(actor)
    started = started[:n_actors]
    call = lambda actor, batch: actor.encode.remote(batch.column("text").to_pylist())  # noqa: E731
    with run.folder.parts("embeddings", EMBEDDINGS_SCHEMA, PART_ROWS, PART_S) as parts:
        for done in pool_map(
            ray,
            lambda: started.pop() if started else actor_cls.remote(cfg),
            n_actors,
            work,
            call,
            in_flight_per_actor=IN_FLIGHT_PER_ACTOR,
            max_lost=rt.max_restarts,
            stall_timeout_s=rt.stall_timeout_s,
            what=f"embed ({cfg.name})",
            needs={"CPU": rt.cpus_per_actor, "GPU": rt.gpus_per_actor},
            on_lost=run.actor_lost,
        ):
            if done.error is not None:
                raise done.error
            parts.add(_rows(done.work.column("text_sha256"), done.value, cfg))
            advance(done.work.num_rows)


def _queue_embeds(ray, session: RemoteSession, cfg: EncoderConfig, keys: list[str], texts: dict[str, str]) -> None:
    """Batch mode: every text the cache lacks handed to the gateway, grouped there into batches that
    the caller's `flush` submits."""
    queue = lambda chunk, _: session.actor.submit_embeds.remote(cfg.model_id, [texts[k] for k in chunk])  # noqa: E731
    for _ in bounded(ray, batches(keys, cfg.batch_size), queue, REMOTE_IN_FLIGHT):
        pass  # what could not be queued is answered as failed when collected


def _embed_remote(
    session: RemoteSession, cfg: EncoderConfig, keys: list[str], texts: dict[str, str], run: StudyRun, advance
) -> None:
    """Batches of texts through the provider's gateway. In batch mode (the encoder's or its
    provider's `mode`) every text was first queued for the provider's batch interface
    (`_queue_embeds`); the vectors are collected here as batches finish. A text that fails (after
    the gateway's retries, or as a failed batch line) is left out and the others go on; a budget
    stop ends the sending. The embeddings table has no error rows (every vector in it is whole):
    the texts left out make the stage stop after the rest are saved, saying how many and why (or,
    for texts still in pending batches, that a later run collects them); the next run encodes
    exactly those."""
    from collections import Counter

    ray = run.ray()
    failed: Counter = Counter()  # (status, error) -> texts
    stopped: list[str] = []
    encoded = 0

    def work():
        for i in range(0, len(keys), cfg.batch_size):
            if stopped:
                return
            yield keys[i : i + cfg.batch_size]

    batch = session.batch_for(cfg.mode)
    submit = lambda chunk, _: session.actor.embed.remote(cfg.model_id, [texts[k] for k in chunk], batch)  # noqa: E731
    # In batch mode every chunk waits on its batches at once; in sync mode a few requests go at a time.
    in_flight = max(1, -(-len(keys) // cfg.batch_size)) if batch else REMOTE_IN_FLIGHT
    for done in bounded(ray, work(), submit, in_flight):
        if done.error is not None:
            failed[("error", f"{type(done.error).__name__}: gateway call failed")] += len(done.work)
            continue
        value = done.value
        if value["vectors"] is not None:
            keys_ok = [k for k, ok in zip(done.work, value["ok"]) if ok]
            run.folder.append_part("embeddings", _rows(keys_ok, value["vectors"], cfg, value["modes"]))
            advance(len(value["vectors"]))
            encoded += len(value["vectors"])
        for status, error in value["failures"]:
            failed[(status, error)] += 1
            if status == "skipped" and not stopped:
                stopped.append(error)
        session.record()
    if encoded < len(keys):
        left = len(keys) - encoded  # failed, waiting in batches, and (after a budget stop) never sent
        pending = sum(n for (status, _), n in failed.items() if status == "pending")
        if pending == left:
            first = next(error for status, error in failed if status == "pending")
            raise BatchesPending(
                f"encoder {cfg.name}: {pending} texts wait in batches ({first}); run again to collect them"
            )
        (_, common), _ = max(((k, n) for k, n in failed.items() if k[0] != "pending"), key=lambda kn: kn[1])
        kind = BudgetReached if stopped else APIStopped
        raise kind(
            f"encoder {cfg.name}: {left} of {len(keys)} texts not encoded (most common: {common}); the vectors "
            "finished so far are kept, and the next run encodes just the rest"
        )


def _vector_blocks(vectors: pa.ChunkedArray, at: np.ndarray, rows: int):
    """Rows `at` of a vector column, `rows` at a time: where every vector has one width, gathered
    as rows of each chunk's float matrix into a block (neither a list take, which copies a vector
    at a time, nor one matrix of them all, whose fresh pages cost more than the copying: 0.8 s
    for 261 MB here); else by Arrow."""
    widths = pc.min_max(pc.list_value_length(vectors)).as_py()
    if widths["min"] != widths["max"]:
        for lo in range(0, len(at), rows):
            yield vectors.take(at[lo : lo + rows]).combine_chunks()
        return
    width = widths["min"]
    matrices = [chunk.flatten().to_numpy().reshape(-1, width) for chunk in vectors.chunks if len(chunk)]
    starts = np.cumsum([0, *(len(m) for m in matrices)])
    chunk_of = np.searchsorted(starts, at, side="right") - 1
    within = at - starts[chunk_of]
    for lo in range(0, len(at), rows):
        chunks, places = chunk_of[lo : lo + rows], within[lo : lo + rows]
        block = np.empty((len(chunks), width), np.float32)
        for k in np.unique(chunks).tolist():
            mine = chunks == k
            block[mine] = matrices[k][places[mine]]
        offsets = pa.array(np.arange(len(block) + 1, dtype=np.int32) * width)
        yield pa.ListArray.from_arrays(offsets, pa.array(block.reshape(-1)))


def write_passes(source_bytes: int, free_bytes: int, buckets: int) -> int:
    """How many passes over the sources `_write_selected` makes, each spilling a range of its
    buckets, so that the spill beside the table being written fits in the free space (the table
    takes about what its sources take): one when the whole spill fits, at most one per bucket."""
    room = FREE_KEPT * free_bytes - source_bytes
    if room <= 0:
        return buckets
    return max(1, min(buckets, math.ceil(SPILL_GROWTH * source_bytes / room)))


def _write_selected(folder: RunFolder, plan: _Plan, spill: Path) -> Written:
    """The table the current texts and encoders need, one vector each (the first the sources
    hold): the previous table's `clean` segments kept as they are, and one new segment of every
    other vector (sorted by encoder and text), written without holding them all: the sources' rows
    but those of the clean segments are spread over buckets by encoder and the key's first two hex
    digits (spill files under `spill`: a bucket is 1/256 of an encoder's vectors), then each bucket
    is kept to its texts (`plan.written_keys`), sorted and written. Where the disk has no room for
    the whole spill beside the segment, the buckets are spilled a range at a time, a pass over the
    sources each (`write_passes`). Vectors of texts no longer wanted, or of encoders no longer
    named, are left out. A new segment with no rows is written only when no segment is kept (the
    table then has none)."""
    name_of = {encoder_key(cfg): cfg.name for cfg in plan.encoders}
    order = {name: i for i, name in enumerate(sorted(set(name_of.values())))}
    index_of = {cfg.name: i for i, cfg in enumerate(plan.encoders)}
    keys = pa.array(list(name_of), pa.string())
    names = pa.array(list(name_of.values()), pa.string())
    rank = np.array([order[name] for name in name_of.values()], dtype=np.int64)
    by_rank = [index_of[name] for name in sorted(order)]  # the encoder of each rank
    buckets = len(order) * 256
    source_bytes = folder.parts_bytes("embeddings") + sum(
        path.stat().st_size for i, (path, _) in enumerate(plan.previous) if i not in plan.clean
    )
    passes = write_passes(source_bytes, shutil.disk_usage(folder.root).free, buckets)

    def in_range(first: int, end: int, ranges: dict) -> bool:
        # Whether a row group may hold rows of buckets [first, end): the plan hands each encoder's
        # texts out a few buckets of keys at a time, so a part's keys span few buckets, and a
        # segment's row groups fewer; a pass reads those alone, not every source again.
        text, encoder = ranges["text_sha256"], ranges["encoder_key"]
        low, high = (0, 255) if text is None else (int(text[0][:2], 16), int(text[1][:2], 16))
        ranks = {rank[i] for i, key in enumerate(name_of) if encoder is None or encoder[0] <= key <= encoder[1]}
        return any(r * 256 + low < end and r * 256 + high >= first for r in ranks)

    def spilled(first: int, end: int) -> Spill:
        vectors = Spill(spill / f"{first:06d}", EMBEDDINGS_SCHEMA)
        for _, table in _sources(folder, plan.previous, skip=plan.clean, touches=partial(in_range, first, end)):
            table = table.filter(pc.is_in(table.column("encoder_key"), keys))
            which = pc.index_in(table.column("encoder_key"), value_set=keys)
            table = table.set_column(1, "encoder", pc.take(names, which))
            bucket = rank[which.to_numpy(zero_copy_only=False)] * 256 + key_buckets(table.column("text_sha256"))
            mine = (bucket >= first) & (bucket < end)
            vectors.add(table.filter(pa.array(mine)), bucket[mine])
        vectors.close()
        return vectors

    def sorted_in_memory():
        # The rows the spill's buckets give, in their order (by encoder, then key; a key's first
        # source, as the stable sort keeps it), the vectors gathered a block at a time.
        tables = [table for _, table in _sources(folder, plan.previous, skip=plan.clean)]
        if not tables:
            return
        table = pa.concat_tables(tables)
        which = pc.index_in(table.column("encoder_key"), value_set=keys).to_numpy(zero_copy_only=False)
        which = np.nan_to_num(which, nan=-1).astype(np.int64)  # -1: a vector of an encoder no longer named
        for r, name in enumerate(sorted(order)):
            wanted = pa.concat_arrays([plan.written_keys(digits, by_rank[r]).combine_chunks() for digits in range(256)])
            mine = (which >= 0) & (rank[which] == r)
            mine &= pc.is_in(table.column("text_sha256"), value_set=wanted).to_numpy(zero_copy_only=False)
            at = np.flatnonzero(mine)
            at = at[pc.sort_indices(table.column("text_sha256").take(at)).to_numpy()]
            at = at[run_starts(table.column("text_sha256").take(at))]
            rows = table.drop_columns(["vector"]).take(at)
            rows = rows.set_column(1, "encoder", pa.repeat(pa.scalar(name, pa.string()), rows.num_rows))
            for lo, vectors in zip(range(0, len(at), VECTOR_BATCH), _vector_blocks(table["vector"], at, VECTOR_BATCH)):
                block = rows.slice(lo, VECTOR_BATCH).add_column(4, EMBEDDINGS_SCHEMA.field("vector"), vectors)
                yield from block.to_batches()

    def sorted_batches():
        if source_bytes <= SORT_IN_MEMORY_BYTES:
            yield from sorted_in_memory()
            return
        bounds = np.linspace(0, buckets, passes + 1).round().astype(int).tolist()
        for first, end in zip(bounds, bounds[1:]):
            vectors = spilled(first, end)
            for bucket in vectors.buckets:
                table = vectors.read(bucket)
                wanted = plan.written_keys(bucket % 256, by_rank[bucket // 256])
                table = table.filter(pc.is_in(table.column("text_sha256"), wanted))
                yield from first_per_key(table.sort_by("text_sha256"), "text_sha256").to_batches()
            vectors.remove()

    kept = [segment for i, (_, segment) in enumerate(plan.previous) if i in plan.clean]
    numbers = [int(SEGMENT.match(s["name"]).group(1)) for _, s in plan.previous if s is not None]
    new = folder.write_segment(
        "embeddings", max(numbers, default=0) + 1, EMBEDDINGS_SCHEMA, sorted_batches(), row_group_rows=VECTOR_BATCH
    )
    if not new["rows"] and kept:
        (folder.segment_folder("embeddings") / new["name"]).unlink()
    else:
        kept.append(new)
    return Written(**segments_record(kept))


def stage(study: StudyBase) -> Stage:
    """The `embeddings` table: every distinct text of the references and the ok responses, per encoder."""

    def compute(run: StudyRun) -> dict[str, Written]:
        return {"embeddings": run_embed(study, run)}

    return Stage(
        "embeddings",
        ("references", "responses"),
        [e.fingerprint() for e in study.encoders],
        compute,
        warm=(lambda run: start_ahead(study, run.ray)) if _local(study.encoders) else None,
    )
