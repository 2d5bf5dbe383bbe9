"""API encoders (`remote`) send their batches of texts through the provider's gateway actor, several
at once; it caches every vector, so a text is paid for once across runs. In batch mode every API
encoder's texts are first handed to its gateway (`queue_embeds`), and the stage has the gateways
submit them as batches before any is waited on (`models.api.gateways`), so it waits one batch
turnaround for all its encoders.
"""

from __future__ import annotations

from collections import Counter

from vlm_decade.core.config import EncoderConfig
from vlm_decade.core.dispatch import batches, bounded
from vlm_decade.core.runner import StudyRun
from vlm_decade.models.api.answers import gateway_call_failed
from vlm_decade.models.api.session import APIStopped, BatchesPending, BudgetReached, RemoteSession
from vlm_decade.stages.embed.table import vector_rows

REMOTE_IN_FLIGHT = 8  # batches of texts in flight to an API encoder's gateway


def texts_to_send(tables) -> tuple[list[str], dict[str, str]]:
    """An API encoder's whole to-do list at once (`tables`: `EmbedPlan.todo_tables`), its keys in
    order and each key's text: its texts are sent (and paid for) one by one, not padded into batches
    by length, and batch mode submits them all before any wait."""
    keys, texts = [], {}
    for table in tables:
        keys += table.column("text_sha256").to_pylist()
        texts.update(zip(table.column("text_sha256").to_pylist(), table.column("text").to_pylist()))
    return keys, texts


def queue_embeds(ray, session: RemoteSession, cfg: EncoderConfig, keys: list[str], texts: dict[str, str]) -> None:
    """Batch mode: every text the cache lacks handed to the gateway, grouped there into batches that
    the caller's `flush` submits."""
    queue = lambda chunk, _: session.actor.submit_embeds.remote(cfg.model_id, [texts[k] for k in chunk])  # noqa: E731
    for _ in bounded(ray, batches(keys, cfg.batch_size), queue, REMOTE_IN_FLIGHT):
        pass  # what could not be queued is answered as failed when collected


def embed_remote(
    session: RemoteSession, cfg: EncoderConfig, keys: list[str], texts: dict[str, str], run: StudyRun, advance
) -> None:
    """Batches of texts through the provider's gateway. In batch mode (the encoder's or its
    provider's `mode`) every text was first queued for the provider's batch interface
    (`queue_embeds`); the vectors are collected here as batches finish. A text that fails (after
    the gateway's retries, or as a failed batch line) is left out and the others go on; a budget
    stop ends the sending. The embeddings table has no error rows (every vector in it is whole):
    the texts left out make the stage stop after the rest are saved, saying how many and why (or,
    for texts still in pending batches, that a later run collects them); the next run encodes
    exactly those."""
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
            failed[("error", gateway_call_failed(done.error))] += len(done.work)
            continue
        value = done.value
        if value["vectors"] is not None:
            keys_ok = [k for k, ok in zip(done.work, value["ok"]) if ok]
            run.folder.append_part("embeddings", vector_rows(keys_ok, value["vectors"], cfg, value["modes"]))
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
