"""The gateway: one per provider, the only place that sends requests.

It answers from the cache when it can; otherwise it checks the budget, waits for the rate limiter
(requests and tokens per minute) and a concurrency slot, sends through the provider with a timeout,
and retries with tenacity (exponential backoff with jitter, never sooner than Retry-After) what is
worth retrying. What came back is priced, cached and returned as the fields of a `responses` row.

`Gateway` is plain asyncio, so the benchmark and tests can drive it directly; `GatewayActor` wraps
it as an async Ray actor (`num_cpus=0`, pinned to the driver's node, where the cache folder is), and
`gateway_actor` gets or creates the one named actor per provider and run.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import random
import time
from collections import Counter
from pathlib import Path

import numpy as np
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from vlm_decade.core.config import ProviderConfig
from vlm_decade.models.api.cache import ResponseCache
from vlm_decade.models.api.keys import Secret, scrub
from vlm_decade.models.api.limits import RateLimiter
from vlm_decade.models.api.providers import ChatRequest, chat_key, cost, embed_key, provider_class, text_tokens

ACTOR_CONCURRENCY = 10_000  # asyncio tasks an actor accepts; the provider's own cap is inside


class Gateway:
    def __init__(self, provider: str, cfg: ProviderConfig, key: Secret, cache_dir: str | Path, window_s: float = 60.0):
        """`window_s` is the limits' window: a minute, shorter only in tests."""
        self.name, self.cfg, self.key = provider, cfg, key
        self.provider = provider_class(provider)(cfg, key)
        self.limiter = RateLimiter(cfg.rpm, cfg.tpm, window_s)
        self.slots = asyncio.Semaphore(cfg.max_concurrency)
        self.cache = ResponseCache(cache_dir)
        self.spent = 0.0  # US$ paid in this gateway's life
        self.reserved = 0.0  # worst-case cost of requests in flight
        self.stats: Counter = Counter()
        self.backoff = wait_exponential_jitter(initial=0.5, max=8.0, jitter=0.5)
        self.jitter = random.Random(f"{provider}:{cache_dir}")  # seeded by the gateway's identity

    # budget -----------------------------------------------------------------------------------
    def _budget_blocks(self, worst: float) -> str | None:
        budget = self.cfg.budget_usd
        if budget is not None and self.spent + self.reserved + worst > budget:
            return f"budget ${budget:g} for {self.name} reached (spent ${self.spent:.4f}); raise providers.{self.name}.budget_usd to go on"
        return None

    def _price(self, model_id: str):
        price = self.cfg.price(self.name, model_id)
        if price is None:
            raise LookupError(f"no price for {self.name} model '{model_id}'; add it under providers.{self.name}.prices")
        return price

    # sending ----------------------------------------------------------------------------------
    def _wait(self, state) -> float:
        """Retry-After when the server gave one (never sooner; a little jitter so retries do not
        arrive together), else exponential backoff with jitter."""
        after = self.provider.retry_after(state.outcome.exception())
        if after is not None:
            return after + self.jitter.random() * 0.25
        return self.backoff(state)

    async def _send(self, call, est_tokens: int):
        """One logical request: attempts until success, a failure not worth retrying, or max_attempts."""
        retrying = AsyncRetrying(
            retry=retry_if_exception(self.provider.retryable),
            stop=stop_after_attempt(self.cfg.max_attempts),
            wait=self._wait,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                async with self.slots:
                    entry = await self.limiter.acquire(est_tokens)
                    self.stats["attempts"] += 1
                    try:
                        # A guard above the client's own timeout, for a connection that never closes.
                        result = await asyncio.wait_for(call(), timeout=self.cfg.timeout_s + 5)
                    except BaseException as exc:
                        self.stats[f"failed:{type(exc).__name__}"] += 1
                        raise
                return entry, result

    def _error(self, exc: BaseException) -> str:
        first = (str(exc).splitlines() or [""])[0][:300]
        return scrub(f"{type(exc).__name__}: {first}", self.key)

    # chat -------------------------------------------------------------------------------------
    async def chat(self, req: ChatRequest) -> dict:
        """The fields of one `responses` row: text, status (ok, error, skipped), error, latency_s,
        input_tokens, output_tokens, cost_usd, model_version; plus `cached`."""
        key = chat_key(self.name, req)
        hit = self.cache.get("chat", key)
        if hit is not None:
            self.stats["cache_hits"] += 1
            return {**hit, "status": "ok", "error": "", "cached": True}
        try:
            price = self._price(req.model_id)
        except LookupError as exc:
            return failed_answer("error", str(exc))
        est_in = self.provider.estimate_input(req)
        worst = cost(price, est_in, req.settings["max_output_tokens"])
        blocked = self._budget_blocks(worst)
        if blocked:
            self.stats["skipped"] += 1
            return failed_answer("skipped", blocked)
        self.reserved += worst
        start = time.perf_counter()
        try:
            entry, reply = await self._send(lambda: self.provider.chat(req), est_in + req.settings["max_output_tokens"])
        except Exception as exc:  # noqa: BLE001 - recorded as the row's error, never raised
            self.stats["errors"] += 1
            return failed_answer("error", self._error(exc))
        finally:
            self.reserved -= worst
        self.limiter.reconcile(entry, reply.input_tokens + reply.output_tokens)
        paid = cost(price, reply.input_tokens, reply.output_tokens)
        self.spent += paid
        self.stats["requests"] += 1
        row = {
            "text": reply.text,
            "latency_s": time.perf_counter() - start,
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
            "cost_usd": paid,
            "model_version": reply.model_version,
        }
        self.cache.put("chat", key, row)
        return {**row, "status": "ok", "error": "", "cached": False}

    # embeddings -------------------------------------------------------------------------------
    async def embed(self, model_id: str, texts: list[str]) -> dict:
        """{"status": ok|error|skipped, "error", "vectors": (n, dim) float32 or None, "model_version"}.
        Texts the cache holds are not sent; the rest go in one request."""
        keys = [embed_key(self.name, model_id, t) for t in texts]
        found = {k: self.cache.get("embed", k) for k in keys}
        missing = sorted({k: t for k, t in zip(keys, texts) if found[k] is None}.items())
        self.stats["cache_hits"] += len(texts) - len(missing)
        if missing:
            try:
                price = self._price(model_id)
            except LookupError as exc:
                return {"status": "error", "error": str(exc), "vectors": None, "model_version": ""}
            est = sum(text_tokens(t) for _, t in missing)
            worst = cost(price, est, 0)
            blocked = self._budget_blocks(worst)
            if blocked:
                self.stats["skipped"] += 1
                return {"status": "skipped", "error": blocked, "vectors": None, "model_version": ""}
            self.reserved += worst
            try:
                entry, (vectors, used, version) = await self._send(lambda: self.provider.embed(model_id, [t for _, t in missing]), est)
            except Exception as exc:  # noqa: BLE001 - reported to the stage, which stops and says so
                self.stats["errors"] += 1
                return {"status": "error", "error": self._error(exc), "vectors": None, "model_version": ""}
            finally:
                self.reserved -= worst
            self.limiter.reconcile(entry, used)
            paid = cost(price, used, 0)
            self.spent += paid
            self.stats["requests"] += 1
            for (k, _), v in zip(missing, vectors):
                found[k] = {"vector": base64.b64encode(v.astype("<f4").tobytes()).decode(), "model_version": version}
                self.cache.put("embed", k, found[k])
        vectors = np.stack([np.frombuffer(base64.b64decode(found[k]["vector"]), dtype="<f4") for k in keys])
        return {"status": "ok", "error": "", "vectors": vectors, "model_version": found[keys[0]]["model_version"] if keys else ""}

    def report(self) -> dict:
        return {"spent_usd": self.spent, **self.stats}


def failed_answer(status: str, error: str) -> dict:
    """A chat answer with no text: `status` error (`error` says why) or skipped (a budget)."""
    return {"text": "", "status": status, "error": error, "latency_s": 0.0, "input_tokens": None,
            "output_tokens": None, "cost_usd": 0.0, "model_version": "", "cached": False}


class GatewayActor:
    """The gateway as an async Ray actor: many calls in flight, one limiter for the cluster."""

    def __init__(self, provider: str, cfg: ProviderConfig, key: Secret, cache_dir: str):
        self.gateway = Gateway(provider, cfg, key, cache_dir)

    async def chat(self, req: ChatRequest) -> dict:
        return await self.gateway.chat(req)

    async def embed(self, model_id: str, texts: list[str]) -> dict:
        return await self.gateway.embed(model_id, texts)

    async def report(self) -> dict:
        return self.gateway.report()


def gateway_actor(ray, provider: str, cfg: ProviderConfig, key: Secret, cache_dir: Path, run_id: str):
    """The run's one gateway actor for `provider`, created on this (the driver's) node if it is not
    there yet; stages of the same run share it (and its limits)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = f"vlm_decade-api-{provider}-{hashlib.sha256(run_id.encode()).hexdigest()[:12]}"
    return (
        ray.remote(GatewayActor)
        .options(
            name=name,
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=ACTOR_CONCURRENCY,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
        )
        .remote(provider, cfg, key, str(cache_dir))
    )
