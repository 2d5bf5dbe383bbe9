"""The gateway: one per provider at a time, the only place that sends requests.

It answers from the cache when it can. Otherwise the request takes one of `max_concurrency` slots
and keeps it through all its attempts; before each attempt it reserves the attempt's worst-case
cost against the budget, waits for the rate limiter (a retry goes ahead of requests not tried yet),
writes `sent` to the spend log and sends through the provider with a timeout. An answer is priced,
written to the spend log and the cache at once, and returned as the fields of a `responses` row;
what failed is retried with tenacity (never sooner than Retry-After, else exponential backoff with
jitter) when it is worth retrying.

The budget (`budget.py`) covers the run folder: what the gateways before this one paid (its spend
log: earlier stages, models and runs), what this gateway paid, and the reservations of the
attempts in flight; this gateway and its batcher (`batch/`) hold the same one. The requests those
gateways started in the last window count against this one's rate limits.

An answer is recorded (spend log, then cache) the moment it arrives, before it is handed back and
whether or not anyone still waits for it. When the driver that started the run is gone (killed),
no new attempt leaves: only answers already on their way are still received and recorded.

`Gateway` is plain asyncio, so the benchmark and tests can drive it directly; `GatewayActor` wraps
it as an async Ray actor (`num_cpus=0`, pinned to the driver's node, where the cache and run
folders are, and detached, so that on a cluster it outlives a killed driver until its answers in
flight are in), and `gateway_actor` gets or creates a named one.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import random
import select
import time
import uuid
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from vlm_decade.core.config import APIConfig, api_of
from vlm_decade.core.errors import error_text
from vlm_decade.models.api.adaptive import ConcurrencyGate
from vlm_decade.models.api.answers import cached_answer, failed_answer, unfinished_answer
from vlm_decade.models.api.batch import Batcher
from vlm_decade.models.api.budget import Budget, BudgetStop
from vlm_decade.models.api.cache import ResponseCache, entry_vector, vector_entry
from vlm_decade.models.api.endpoints import cache_revision, prices_field
from vlm_decade.models.api.keys import Secret, scrub
from vlm_decade.models.api.limits import RateLimiter
from vlm_decade.models.api.providers import ChatRequest, chat_key, cost, embed_key, provider_class, text_tokens
from vlm_decade.models.api.retries import refused, retry_delay
from vlm_decade.models.api.spend import SpendLog, read_spend

ACTOR_CONCURRENCY = 10_000  # asyncio tasks an actor accepts; the provider's own cap is inside


class DriverGone(Exception):
    """The run's driver process has ended: nothing new is sent."""


class DriverWatch:
    """Whether the process that started the run still lives, asked before every attempt. On Linux
    a pidfd (readable once the process has ended, zombie or reaped); elsewhere a signal-0 probe."""

    def __init__(self, pid: int | None):
        self.pid, self.fd, self.gone = pid, None, False
        if pid is not None and hasattr(os, "pidfd_open"):
            try:
                self.fd = os.pidfd_open(pid)
            except ProcessLookupError:
                self.gone = True
            except OSError:
                self.fd = None  # not permitted here: fall back to the probe

    def alive(self) -> bool:
        if self.gone or self.pid is None:
            return not self.gone
        if self.fd is not None:
            self.gone = bool(select.select([self.fd], [], [], 0)[0])
        else:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.gone = True
            except PermissionError:
                pass
        return not self.gone


class Gateway:
    def __init__(
        self,
        provider: str,
        cfg: APIConfig,
        key: Secret,
        cache_dir: str | Path,
        window_s: float = 60.0,
        spend_log: str | Path | None = None,
        driver_pid: int | None = None,
        run_root: str | Path | None = None,
        batch_wait: bool = True,
    ):
        """`window_s` is the limits' window: a minute, shorter only in tests. `spend_log` is the run
        folder's log (none: this gateway's spend is all there is); `driver_pid` the process whose
        end stops new requests. In batch mode (`cfg.mode`), `run_root` gets a copy of each batch's
        record, and `batch_wait` false answers `pending` for a batch not finished."""
        self.name, self.cfg, self.key = provider, cfg, key
        self.provider = provider_class(api_of(provider, cfg))(cfg, key)
        self.limiter = RateLimiter(cfg.rpm, cfg.tpm, window_s)
        self.slots = ConcurrencyGate(cfg.max_concurrency, cfg.adaptive)
        # what an endpoint says it serves: part of its cache keys (a cloud provider's keys have none)
        self.revision = cache_revision(cfg)
        self.cache = ResponseCache(cache_dir)
        self.log = SpendLog(spend_log) if spend_log is not None else None
        before = read_spend(spend_log) if spend_log is not None else None
        self.budget = Budget(provider, cfg.budget_usd, before)  # held by the batcher too
        if before:  # their requests of the last window count against this one's limits
            now, wall = time.monotonic(), time.time()
            self.limiter.preload(
                [(now - (wall - t), min(n, cfg.tpm or n)) for t, n in before.sent if wall - t < self.limiter.window]
            )
        self.driver = DriverWatch(driver_pid)
        self.on_the_wire = 0  # attempts sent whose answer (or failure) is not recorded yet
        self.sending: dict[str, asyncio.Future] = {}  # chat key -> the row of the call sending it
        self.stats: Counter = Counter()
        self.backoff = wait_exponential_jitter(initial=0.5, max=8.0, jitter=0.5)
        self.jitter = random.Random(f"{provider}:{cache_dir}")  # seeded by the gateway's identity
        gateway_id = uuid.uuid4().hex[:12]  # attempts of gateways of earlier runs keep their own ids
        self.attempt_ids = (f"{gateway_id}-{n}" for n in itertools.count())
        # Every gateway can batch: a model may choose batch mode alone, and a request that an earlier
        # run left in a pending batch is collected from it, whatever the mode now.
        self.batch = Batcher(self, cache_dir, run_root, batch_wait)

    @property
    def spent(self) -> float:
        """US$ paid through this gateway."""
        return self.budget.spent

    @property
    def spent_before(self) -> float:
        """US$ the folder's earlier gateways spent (their unresolved attempts at worst case)."""
        return self.budget.spent_before

    def price(self, model_id: str):
        """The price of `model_id`; LookupError when the config has none."""
        price = self.cfg.price(self.name, model_id)
        if price is None:
            raise LookupError(
                f"no price for {self.name} model '{model_id}'; add it under {prices_field(self.name, self.cfg)}"
            )
        return price

    # sending ----------------------------------------------------------------------------------
    def _wait(self, state) -> float:
        """The wait the provider asked for, wherever it said so (`retries.retry_delay`: never
        sooner; a little jitter so retries do not arrive together), else exponential backoff with
        jitter."""
        after = retry_delay(state.outcome.exception())
        if after is not None:
            return after + self.jitter.random() * 0.25
        return self.backoff(state)

    def _retryable(self, exc: BaseException) -> bool:
        return not isinstance(exc, (BudgetStop, DriverGone)) and self.provider.retryable(exc)

    async def _attempt(self, call, tokens: int, worst: float, price_of, keep, urgent: bool):
        """One attempt: budget, limiter, send. An answer is recorded the moment it arrives, whoever
        still waits for it: its cost to the spend log, then `keep(result, paid, latency)` writes it
        to the cache (so a recorded answer is never missing from the spend)."""
        if not self.driver.alive():
            raise DriverGone("the run's driver has ended; not sent")
        await self.budget.reserve(worst)
        paid = 0.0
        try:
            entry = await self.limiter.acquire(tokens, urgent=urgent)
            if not self.driver.alive():
                raise DriverGone("the run's driver has ended; not sent")
            attempt = next(self.attempt_ids)
            if self.log:
                self.log.write(a=attempt, e="sent", worst=worst, t=round(time.time(), 3), tok=tokens)
            self.stats["attempts"] += 1
            start = time.monotonic()
            self.on_the_wire += 1
            ticket = self.slots.ticket()
            try:
                try:
                    # A guard above the client's own timeout, for a connection that never closes.
                    result = await asyncio.wait_for(call(), timeout=self.cfg.timeout_s + 5)
                except BaseException as exc:
                    if self.provider.overload(exc):
                        self.slots.overloaded(ticket)
                    if refused(exc):  # turned away unworked: the provider counts none of its tokens
                        self.limiter.reconcile(entry, 0)
                    self.stats[f"failed:{type(exc).__name__}"] += 1
                    if self.log:
                        self.log.write(a=attempt, e="failed")
                    raise
                latency = time.monotonic() - start
                await self.slots.answered(ticket, latency)
                paid, used = price_of(result)
                if self.log:
                    self.log.write(a=attempt, e="paid", usd=paid, tok=used)
                keep(result, paid, latency)
            finally:
                self.on_the_wire -= 1
            self.limiter.reconcile(entry, used)
            return result, paid, latency
        finally:
            self.budget.release(worst, paid)

    async def _send(self, call, tokens: int, worst: float, price_of, keep):
        """One logical request, holding its concurrency slot through every attempt: (result, US$
        paid, seconds queued, seconds the answering attempt took)."""
        arrived = time.monotonic()
        retrying = AsyncRetrying(
            retry=retry_if_exception(self._retryable),
            stop=stop_after_attempt(self.cfg.max_attempts),
            wait=self._wait,
            reraise=True,
        )
        async with self.slots:
            async for attempt in retrying:
                with attempt:
                    urgent = attempt.retry_state.attempt_number > 1
                    result, paid, latency = await self._attempt(call, tokens, worst, price_of, keep, urgent)
        return result, paid, time.monotonic() - arrived - latency, latency

    def error_text(self, exc: BaseException) -> str:
        """An error as a row records it (`core.errors.error_text`), scrubbed of the key."""
        return scrub(error_text(exc), self.key)

    def failure(self, exc: BaseException) -> tuple[str, str]:
        """(status, error) of a request that got no answer, counted."""
        if isinstance(exc, BudgetStop):
            self.stats["skipped"] += 1
            return "skipped", str(exc)
        self.stats["errors"] += 1
        return "error", str(exc) if isinstance(exc, DriverGone) else self.error_text(exc)

    # chat -------------------------------------------------------------------------------------
    async def submit(self, req: ChatRequest, hold: bool = False) -> dict:
        """Batch mode: the answer at once (cache, budget, price), else {"status": "queued", "key"}
        (`hold`: grouped until `flush` or a full batch)."""
        return await self.batch.submit(req, hold)

    async def result(self, key: str) -> dict:
        """Batch mode: the answer to a queued request, when its batch is finished."""
        return await self.batch.result(key)

    async def flush(self) -> None:
        """Batch mode: submit the requests grouped so far now."""
        await self.batch.flush()

    async def chat(self, req: ChatRequest, batch: bool | None = None) -> dict:
        """The fields of one `responses` row: text, status (ok, error, skipped), error, latency_s
        (the answering attempt), queued_s (the rest: limits, slots, earlier attempts and their
        waits), input_tokens, output_tokens, cost_usd (what the answer cost when it was bought),
        paid_usd (what this call paid: 0 from the cache), model_version, cached. `batch`: through
        the batch interface (none: as the provider's `mode` says). A request an earlier run left in
        a pending batch is collected from that batch in either mode, never bought again. A request
        identical to one on its way is not sent: it waits for that one and shares its row, as a
        cache hit (`cached`, nothing paid) when it is an answer, as it is when it failed."""
        key = chat_key(self.name, req, self.revision)
        if (self.cfg.mode == "batch" if batch is None else batch) or self.batch.holds(key):
            return await self.batch.chat(req)
        arrived = time.monotonic()
        while True:
            hit = self.cache.get("chat", key)
            if hit is not None:
                self.stats["cache_hits"] += 1
                return cached_answer(hit)
            sending = self.sending.get(key)
            if sending is None:
                return await self._send_once(req, key)
            try:
                row = await asyncio.shield(sending)  # a sharer cancelled leaves the sender alone
            except asyncio.CancelledError:
                if sending.cancelled() and not asyncio.current_task().cancelling():
                    continue  # the sender was cancelled, not this call: it sends the request itself
                raise
            self.stats["shared"] += 1
            if row["status"] != "ok":
                return {**row, "paid_usd": 0.0}  # paid once, by the request that was sent
            return {**cached_answer(row), "queued_s": max(0.0, time.monotonic() - arrived - row["latency_s"])}

    async def _send_once(self, req: ChatRequest, key: str) -> dict:
        """Send a request that no call is sending, its row offered to the identical ones that arrive
        meanwhile (`sending`); cancelled, it leaves them to send it themselves."""
        sending = asyncio.get_running_loop().create_future()
        self.sending[key] = sending
        try:
            row = await self._send_chat(req, key)
        except BaseException:
            sending.cancel()
            raise
        finally:
            del self.sending[key]
        sending.set_result(row)
        return row

    async def _send_chat(self, req: ChatRequest, key: str) -> dict:
        """The row of a request the cache does not hold, bought now."""
        try:
            price = self.price(req.model_id)
        except LookupError as exc:
            return failed_answer("error", str(exc))
        est_in = self.provider.estimate_input(req)
        cap = req.settings["max_output_tokens"]

        def price_of(reply):
            return cost(price, reply.input_tokens, reply.output_tokens), reply.input_tokens + reply.output_tokens

        entry: dict = {}

        def keep(reply, paid: float, latency: float) -> None:
            entry.update(
                text=reply.text,
                input_tokens=reply.input_tokens,
                output_tokens=reply.output_tokens,
                cost_usd=paid,
                model_version=reply.model_version,
                latency_s=latency,
                mode="sync",
            )
            if not reply.unfinished:  # no answer is cached: the next run asks again
                self.cache.put("chat", key, entry)

        try:
            worst = cost(price, est_in, cap)
            reply, paid, queued, _ = await self._send(
                partial(self.provider.chat, req), est_in + cap, worst, price_of, keep
            )
        except Exception as exc:  # noqa: BLE001 - recorded as the row's error, never raised
            return failed_answer(*self.failure(exc))
        self.stats["requests"] += 1
        if reply.unfinished:
            self.stats["errors"] += 1
            return unfinished_answer(entry, reply.unfinished, paid, queued)
        return {**entry, "status": "ok", "error": "", "queued_s": queued, "paid_usd": paid, "cached": False}

    # embeddings -------------------------------------------------------------------------------
    async def submit_embeds(self, model_id: str, texts: list[str]) -> None:
        """Batch mode: queue the texts the cache lacks, held until `flush` (or a full batch); `embed`
        then collects them."""
        for text in texts:
            await self.batch.submit_embed(model_id, text, hold=True)

    async def embed(self, model_id: str, texts: list[str], batch: bool | None = None) -> dict:
        """{"ok": one bool per text, "vectors": (texts ok, dim) float32 or None, "modes" (sync or
        batch) per text ok, "failures": (status, error) per text not ok (status error, skipped or
        pending), "model_version", "paid_usd"}.
        Texts the cache holds are not sent; in sync mode the rest go in one request; with `batch`
        (none: as the provider's `mode` says) each goes through the batch interface, and one failed
        line fails only its text. A text an earlier run left in a pending batch is collected from
        that batch in either mode."""
        keys = [embed_key(self.name, model_id, t, self.revision) for t in texts]
        found = {k: self.cache.get("embed", k) for k in keys}
        batch = self.cfg.mode == "batch" if batch is None else batch
        todo = {k: t for k, t in zip(keys, texts) if found[k] is None}
        in_batches = {k: t for k, t in todo.items() if batch or k in self.batch.batch_of}
        missing = sorted((k, t) for k, t in todo.items() if k not in in_batches)
        self.stats["cache_hits"] += len(texts) - len(todo)
        failed: dict[str, tuple[str, str]] = {}
        paid = 0.0
        if in_batches:
            answers = await asyncio.gather(*[self.batch.embed(model_id, t) for t in in_batches.values()])
            for k, answer in zip(in_batches, answers):
                if answer["status"] == "ok":
                    found[k] = answer["entry"]
                    paid += answer["paid_usd"]
                else:
                    failed[k] = (answer["status"], answer["error"])
        if missing:
            entries, sent_paid, failure = await self._embed_sync(model_id, missing)
            paid += sent_paid
            found.update(entries)
            failed.update({k: failure for k, _ in missing} if failure is not None else {})
        ok = [k not in failed for k in keys]
        done = [k for k in keys if k not in failed]
        vectors = np.stack([entry_vector(found[k]) for k in done]) if done else None
        return {
            "ok": ok,
            "vectors": vectors,
            "failures": [failed[k] for k in keys if k in failed],
            "modes": [
                found[k].get("mode", "sync") for k in done
            ],  # entries cached before modes existed were bought in sync
            "model_version": found[done[0]]["model_version"] if done else "",
            "paid_usd": paid,
        }

    async def _embed_sync(self, model_id: str, missing: list[tuple[str, str]]):
        """One embeddings request for the (key, text) pairs `missing`: ({key: cache entry}, US$ paid,
        None), cached as the answer arrives, or ({}, 0, (status, error)) when it failed."""
        try:
            price = self.price(model_id)
        except LookupError as exc:
            return {}, 0.0, ("error", str(exc))
        texts = [t for _, t in missing]
        est = sum(map(text_tokens, texts))
        entries: dict[str, dict] = {}

        def price_of(answer):
            return cost(price, answer[1], 0), answer[1]

        def keep(answer, paid: float, latency: float) -> None:
            vectors, _, version = answer
            for i, (k, _) in enumerate(missing):
                # the request's cost, split over its texts
                entries[k] = vector_entry(vectors[i], version, paid / len(missing), "sync")
                self.cache.put("embed", k, entries[k])

        try:
            call = partial(self.provider.embed, model_id, texts)
            _, paid, _, _ = await self._send(call, est, cost(price, est, 0), price_of, keep)
        except Exception as exc:  # noqa: BLE001 - reported to the stage
            return {}, 0.0, self.failure(exc)
        self.stats["requests"] += 1
        return entries, paid, None

    async def outlive_driver(self, poll_s: float = 0.5) -> None:
        """Return once the driver is gone and every answer on its way has been recorded (or its
        attempt has failed or timed out); batches being downloaded are collected first."""
        while self.driver.alive() or self.on_the_wire or self.batch.collecting:
            await asyncio.sleep(poll_s)

    def report(self) -> dict:
        batches = {f"batch_{k}": v for k, v in self.batch.stats.items()}
        return {"spent_usd": self.spent, "spent_before_usd": self.spent_before, **self.stats, **batches}


class GatewayActor:
    """The gateway as an async Ray actor: many calls in flight, one limiter for the cluster.

    It is detached from the driver, so that on a cluster it outlives a driver that dies: it sends
    nothing new, records every answer still on its way, and then ends itself (`watch`). A local
    Ray ends with its driver, and the actor with it (docs/api.md says what that loses)."""

    def __init__(
        self,
        provider: str,
        cfg: APIConfig,
        key: Secret,
        cache_dir: str,
        spend_log: str | None,
        driver_pid: int | None,
        run_root: str | None,
        batch_wait: bool,
    ):
        self.gateway = Gateway(
            provider,
            cfg,
            key,
            cache_dir,
            spend_log=spend_log,
            driver_pid=driver_pid,
            run_root=run_root,
            batch_wait=batch_wait,
        )
        self.ending: asyncio.Task | None = None

    async def watch(self) -> None:
        """Start ending this actor once its driver is gone and nothing it sent is on its way."""
        if self.ending is None:
            self.ending = asyncio.get_running_loop().create_task(self._end_after_driver())

    async def _end_after_driver(self) -> None:
        import ray

        await self.gateway.outlive_driver()
        ray.kill(ray.get_runtime_context().current_actor)

    async def chat(self, req: ChatRequest, batch: bool | None = None) -> dict:
        return await self.gateway.chat(req, batch)

    async def submit(self, req: ChatRequest, hold: bool = False) -> dict:
        return await self.gateway.submit(req, hold)

    async def result(self, key: str) -> dict:
        return await self.gateway.result(key)

    async def flush(self) -> None:
        await self.gateway.flush()

    async def submit_embeds(self, model_id: str, texts: list[str]) -> None:
        await self.gateway.submit_embeds(model_id, texts)

    async def embed(self, model_id: str, texts: list[str], batch: bool | None = None) -> dict:
        return await self.gateway.embed(model_id, texts, batch)

    async def report(self) -> dict:
        return self.gateway.report()


def gateway_actor(
    ray,
    provider: str,
    cfg: APIConfig,
    key: Secret,
    cache_dir: Path,
    run_id: str,
    spend_log: Path | None = None,
    driver_pid: int | None = None,
    run_root: Path | None = None,
    batch_wait: bool = True,
):
    """The gateway actor named `run_id` for `provider`, created on this (the driver's) node if it is
    not there yet: everything sent under that name shares its limits and budget. Detached, it is
    ended by its session, or by itself once the driver is gone (`GatewayActor.watch`)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = f"vlm_decade-api-{provider}-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}"
    actor = (
        ray.remote(GatewayActor)
        .options(
            name=name,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=ACTOR_CONCURRENCY,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
        )
        .remote(
            provider,
            cfg,
            key,
            str(cache_dir),
            None if spend_log is None else str(spend_log),
            driver_pid,
            None if run_root is None else str(run_root),
            batch_wait,
        )
    )
    actor.watch.remote()
    return actor
