"""Local encoders in Ray actors: each actor loads its encoder once (as many actors as the cluster's
CPUs or GPUs allow, at most one per call of work); the texts go to them in batches of about one
length, and each finished batch's vectors are saved as a part, so a killed run keeps them.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.config import EncoderConfig, StudyBase
from vlm_decade.core.runner import StudyRun
from vlm_decade.core.runtime import LazyRay
from vlm_decade.models.encoders import EncodeActor, encoder_class
from vlm_decade.stages.embed.table import EMBEDDINGS_SCHEMA, vector_rows

# Texts per call to a local encoder actor. Each call costs the driver and the actor a few
# milliseconds of Ray's own (the texts out, the vectors back through the object store, the part's
# rows): at 128 a small encoder on CPU took 16% longer than at 512 for 170,000 texts, and 40% longer
# inside a whole run (benchmarks/RESULTS.md, "Embedding throughput"); the encoder still batches its
# `batch_size` at a time within a call.
TEXT_BATCH = 512
PART_ROWS, PART_S = 8192, 10.0  # save vectors as a part this often
# A local encoder's texts are sorted by length (for its batches) this many at least at a time: a study
# with fewer is batched exactly as if they were sorted whole.
CHUNK_TEXTS = 65_536


def length_batches(tables):
    """Texts to encode (`tables` of text_sha256, text) in batches of `TEXT_BATCH` of about one length,
    as SentenceTransformer.encode makes them (a batch is padded to its longest text, so mixed lengths
    waste most of the work on padding): sorted by length a chunk of at least `CHUNK_TEXTS` (or all) at
    a time, so only one chunk is held, and a study of fewer texts is batched as if sorted whole."""
    chunk, count = [], 0
    for table in tables:
        chunk.append(table)
        count += table.num_rows
        if count >= CHUNK_TEXTS:
            yield from _by_length(pa.concat_tables(chunk))
            chunk, count = [], 0
    if chunk:
        yield from _by_length(pa.concat_tables(chunk))


def _by_length(todo: pa.Table):
    # The order is taken a batch at a time, so the texts are never held twice; from one chunk, as a
    # take from a chunked column joins its chunks first, every time (of 250 chunks: 35 times slower).
    todo = todo.combine_chunks()
    order = pc.sort_indices(pc.utf8_length(todo.column("text")))
    for start in range(0, todo.num_rows, TEXT_BATCH):
        yield todo.take(order.slice(start, TEXT_BATCH))


def local_encoders(encoders) -> list[EncoderConfig]:
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


def start_actors(study: StudyBase, cfg: EncoderConfig, lazy: LazyRay) -> list:
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
    """Ray and the first local encoder's actors (`start_actors`), started on `lazy`'s thread while
    the caller goes on (`LazyRay.start_soon`); None for a study with no local encoder."""
    local = local_encoders(study.encoders)
    return lazy.start_soon(lambda ray: start_actors(study, local[0], lazy)) if local else None


def embed_local(
    study: StudyBase, cfg: EncoderConfig, work, n_texts: int, run: StudyRun, advance, started: list = ()
) -> None:
    """Batches of texts (`work`: `EmbedPlan.local_batches`, `n_texts` in all, taken as the actors are ready
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
        make = lambda: started.pop() if started else actor_cls.remote(cfg)  # noqa: E731
        for done in run.actor_pool(rt, make, n_actors, work, call, f"embed ({cfg.name})"):
            if done.error is not None:
                raise done.error
            parts.add(vector_rows(done.work.column("text_sha256"), done.value, cfg))
            advance(done.work.num_rows)
