"""The embed stage: each distinct text (human or model) is encoded once per encoder.

Vectors are keyed by the sha256 of the stripped text, so a description shared by several rows, or
by two runs, costs one encoding. Encoding runs in a Ray actor that loads the encoder once; each
finished batch is saved as a part, so a killed run keeps what it finished. API encoders (`remote`)
send their batches through the provider's gateway actor instead, several at once; it caches every
vector, so a text is paid for once across runs. In batch mode every API encoder's texts are
submitted as batches before any is waited on (`stages.gateways`), so the stage waits one batch
turnaround for all its encoders.
"""

from __future__ import annotations

import hashlib
import shutil
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import first_per_key
from vlm_decade.core.config import EncoderConfig, StudyBase
from vlm_decade.core.dispatch import batches, bounded, pool_map
from vlm_decade.core.errors import Problem
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage, StudyRun, Written
from vlm_decade.models.api.endpoints import endpoint_problems, sending_problems
from vlm_decade.models.api.keys import api_key, key_hint
from vlm_decade.models.api.session import APIStopped, BatchesPending, BudgetReached, RemoteSession
from vlm_decade.models.encoders import api_provider, encoder_class
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
TEXT_BATCH = 128
IN_FLIGHT_PER_ACTOR = 2  # batches in flight to each local encoder actor: the next is ready while one is saved
PART_ROWS, PART_S = 8192, 10.0  # save vectors as a part this often
VECTOR_BATCH = 4096  # rows read (or texts hashed) at a time
REMOTE_IN_FLIGHT = 8  # batches of texts in flight to an API encoder's gateway


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


def texts_to_embed(references: pa.Table, responses: pa.Table) -> pa.Table:
    """Every distinct non-empty text to score, stripped, with its key: (text_sha256, text), sorted
    by key. Columnar, so a study of any size holds no Python object per text."""
    ok = responses.filter(pc.equal(responses.column("status"), "ok"))
    texts = pa.chunked_array(references.column("text").chunks + ok.column("text").chunks, pa.string())
    keys, stripped = [], []
    for start in range(0, len(texts), VECTOR_BATCH):
        values = [t.strip() if t else "" for t in texts.slice(start, VECTOR_BATCH).to_pylist()]
        keys.append(
            pa.array([hashlib.sha256(t.encode("utf-8")).hexdigest() if t else None for t in values], pa.string())
        )
        stripped.append(pa.array(values, pa.string()))
    table = pa.table(
        {"text_sha256": pa.chunked_array(keys, pa.string()), "text": pa.chunked_array(stripped, pa.string())}
    )
    table = table.filter(pc.is_valid(table.column("text_sha256")))
    return first_per_key(table.sort_by("text_sha256"), "text_sha256")


class EncodeActor:
    def __init__(self, cfg: EncoderConfig):
        self.encoder = encoder_class(cfg.backend)(cfg)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encoder.encode(texts)


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


def _sources(folder: RunFolder, columns: list[str] | None = None):
    """The vectors this run may reuse, a table at a time (never all at once): the previous table
    (if it verifies) and the parts a killed run or this one saved; written before the `mode`
    column existed, they get it empty."""

    def whole(table: pa.Table) -> pa.Table:
        if columns is None and "mode" not in table.column_names:
            table = table.append_column("mode", pa.nulls(table.num_rows, pa.string()))
        return table.cast(pa.schema([EMBEDDINGS_SCHEMA.field(c) for c in table.column_names]))

    if folder.trusted("embeddings"):
        for batch in folder.batches("embeddings", columns=columns, batch_size=VECTOR_BATCH):
            yield whole(pa.Table.from_batches([batch]))
    for table in folder.iter_parts("embeddings", EMBEDDINGS_SCHEMA, columns):
        yield whole(table)


def _encoded(folder: RunFolder, keys: list[str]) -> pa.Table:
    """(text_sha256, encoder_key) of every vector the sources hold for these encoder keys."""
    found = [
        t.filter(pc.is_in(t.column("encoder_key"), pa.array(keys, pa.string())))
        for t in _sources(folder, ["text_sha256", "encoder_key"])
    ]
    return (
        pa.concat_tables(found)
        if found
        else pa.table({"text_sha256": pa.array([], pa.string()), "encoder_key": pa.array([], pa.string())})
    )


def run_embed(study: StudyBase, run: StudyRun) -> Written:
    """Encode the texts of the run's references and responses (`texts_to_embed`) that no encoder
    has a vector for yet, and write the embeddings table."""
    texts = texts_to_embed(run.table("references"), run.table("responses"))
    encoders = list(study.encoders)
    encoded = _encoded(run.folder, [encoder_key(cfg) for cfg in encoders])
    todo = {}
    for cfg in encoders:
        mine = encoded.filter(pc.equal(encoded.column("encoder_key"), encoder_key(cfg))).column("text_sha256")
        # An encoder with nothing encoded yet takes the texts themselves, not a copy of them.
        todo[cfg.name] = texts.filter(pc.invert(pc.is_in(texts.column("text_sha256"), mine))) if len(mine) else texts
    del encoded
    wanted = texts.column("text_sha256")
    del texts  # its text column lives on only in the encoders' work
    total = sum(t.num_rows for t in todo.values())
    if total < len(wanted) * len(encoders):
        run.reporter.say(f"     embeddings   {len(wanted) * len(encoders) - total} already encoded, kept")
    remote = {cfg.name: cfg for cfg in encoders if todo[cfg.name].num_rows and encoder_class(cfg.backend).remote}
    providers = sorted({api_provider(cfg.backend, cfg.endpoint) for cfg in remote.values()})
    stops: list[APIStopped] = []
    with (
        run.reporter.track("embed", total, {n: t.num_rows for n, t in todo.items()}) as advance,
        Gateways(run, study.providers, providers) as gateways,
    ):
        session = {name: gateways[api_provider(cfg.backend, cfg.endpoint)] for name, cfg in remote.items()}
        work = {}
        for name in remote:
            keys = todo[name].column("text_sha256").to_pylist()
            work[name] = (keys, dict(zip(keys, todo[name].column("text").to_pylist())))
        # Every batch-mode encoder's texts are handed over and submitted as batches before any is waited on.
        batched = [name for name, cfg in remote.items() if session[name].batch_for(cfg.mode)]
        for name in batched:
            _queue_embeds(gateways.ray, session[name], remote[name], *work[name])
        if batched:
            gateways.flush()
        for cfg in encoders:
            if cfg.name in remote:
                try:
                    _embed_remote(session[cfg.name], cfg, *work.pop(cfg.name), run, partial(advance, part=cfg.name))
                except APIStopped as exc:  # the other encoders go on; the stage stops after them, naming each
                    stops.append(exc)
            elif todo[cfg.name].num_rows:
                _embed_local(study, cfg, todo[cfg.name], run, partial(advance, part=cfg.name))
            del todo[cfg.name]  # its texts are let go once encoded
    raise_stops(stops)
    return _write_selected(run.folder, wanted, encoders)


def encoder_actors(study: StudyBase, ray) -> int:
    """How many encoder actors keep every CPU (or GPU) of the cluster busy."""
    rt, have = study.runtime, ray.cluster_resources()
    if rt.gpus_per_actor > 0:
        return max(1, int(have.get("GPU", 0) // rt.gpus_per_actor))
    return max(1, int(have.get("CPU", 1) // max(rt.cpus_per_actor, 1e-9)))


def _embed_local(study: StudyBase, cfg: EncoderConfig, todo: pa.Table, run: StudyRun, advance) -> None:
    """Batches of texts through encoder actors (as many as the cluster's CPUs or GPUs allow), the
    finished vectors saved as parts every few thousand rows."""
    ray, rt = run.ray(), study.runtime
    # Batches of texts of about one length, as SentenceTransformer.encode makes them: a batch is
    # padded to its longest text, so mixed lengths waste most of the work on padding.
    # The order is taken a batch at a time, so the texts are never held twice.
    order = pc.sort_indices(pc.utf8_length(todo.column("text")))
    n_batches = -(-todo.num_rows // TEXT_BATCH)
    actor_cls = ray.remote(EncodeActor).options(num_cpus=rt.cpus_per_actor, num_gpus=rt.gpus_per_actor)
    batches = (todo.take(order.slice(i, TEXT_BATCH)) for i in range(0, todo.num_rows, TEXT_BATCH))
    call = lambda actor, batch: actor.encode.remote(batch.column("text").to_pylist())  # noqa: E731
    with run.folder.parts("embeddings", EMBEDDINGS_SCHEMA, PART_ROWS, PART_S) as parts:
        for done in pool_map(
            ray,
            lambda: actor_cls.remote(cfg),
            min(encoder_actors(study, ray), n_batches),
            batches,
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


def _write_selected(folder: RunFolder, wanted: pa.ChunkedArray, encoders) -> Written:
    """Write the vectors the current texts (their keys, `wanted`) and encoders need, one row each,
    sorted by (encoder, text), without holding them all: the reusable rows are spread over buckets
    by encoder and the key's first two hex digits (256 spill files beside the tables: a bucket is
    1/256 of an encoder's vectors), then each bucket is sorted and written."""
    name_of = {encoder_key(cfg): cfg.name for cfg in encoders}
    order = {name: i for i, name in enumerate(sorted(set(name_of.values())))}
    spill = folder.root / ".spill" / "embeddings"
    shutil.rmtree(spill, ignore_errors=True)
    spill.mkdir(parents=True)
    writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
    try:
        for table in _sources(folder):
            table = table.filter(
                pc.and_(
                    pc.is_in(table.column("encoder_key"), pa.array(list(name_of), pa.string())),
                    pc.is_in(table.column("text_sha256"), wanted),
                )
            )
            if not table.num_rows:
                continue
            names = [name_of[k] for k in table.column("encoder_key").to_pylist()]
            table = table.set_column(1, "encoder", pa.array(names, pa.string()))
            digits = pc.utf8_slice_codeunits(table.column("text_sha256"), 0, 2).to_pylist()
            buckets = np.array([order[n] * 256 + int(d, 16) for n, d in zip(names, digits)])
            for bucket in np.unique(buckets):
                if bucket not in writers:
                    writers[bucket] = pa.ipc.new_stream(str(spill / f"{bucket:06d}.arrow"), EMBEDDINGS_SCHEMA)
                writers[bucket].write_table(table.filter(pa.array(buckets == bucket)))
        for writer in writers.values():
            writer.close()

        def sorted_batches():
            for bucket in sorted(writers):
                with pa.ipc.open_stream(str(spill / f"{bucket:06d}.arrow")) as reader:
                    table = reader.read_all()
                yield from first_per_key(table.sort_by("text_sha256"), "text_sha256").to_batches()

        fingerprint, record, rows = folder.write_batches(
            "embeddings", EMBEDDINGS_SCHEMA, sorted_batches(), row_group_rows=VECTOR_BATCH
        )
        return Written(fingerprint, record, rows)
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def stage(study: StudyBase) -> Stage:
    """The `embeddings` table: every distinct text of the references and the ok responses, per encoder."""

    def compute(run: StudyRun) -> dict[str, Written]:
        return {"embeddings": run_embed(study, run)}

    return Stage("embeddings", ("references", "responses"), [e.fingerprint() for e in study.encoders], compute)
