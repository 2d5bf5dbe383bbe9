"""What the API stages share when they send work to a provider's gateway actor: getting the run's
actor, and copying the money spent from the run folder's spend log into the manifest."""

from __future__ import annotations

import asyncio
import os
import uuid

from vlm_decade.core.config import ProvidersConfig
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.models.api.batch import run_batch_labels
from vlm_decade.models.api.cache import default_cache_dir
from vlm_decade.models.api.gateway import Gateway, gateway_actor
from vlm_decade.models.api.keys import api_key, key_hint
from vlm_decade.models.api.spend import SpendLog, SpendTally, spend_log_path


class APIStopped(Exception):
    """A stage could not finish its API work (the message says why); what it finished is kept."""


class BudgetReached(APIStopped):
    """A provider's budget stopped new requests; a later run with a higher budget goes on."""


class BatchesPending(APIStopped):
    """Requests wait in provider batches that are not finished (batch mode without waiting): the
    stages that need their answers do not start; a later run collects them."""


def stop_if_pending(answers, what: str) -> None:
    """Raise `BatchesPending` when any answer is still in a batch."""
    pending = [a["error"] for a in answers if a["status"] == "pending"]
    if pending:
        raise BatchesPending(
            f"{what}: {len(pending)} requests wait in batches ({pending[0]}); run again to collect them"
        )


def cache_dir(providers: ProvidersConfig):
    return providers.cache_dir or default_cache_dir()


def start_spend_log(run: RunFolder, provider: str):
    """The run folder's spend log for `provider`; a folder whose manifest recorded spend before the
    log existed starts it with that amount, so the total carries over."""
    path = spend_log_path(run.root, provider)
    if not path.exists():
        before = float(run.manifest().get("spend_usd", {}).get(provider, 0.0))
        log = SpendLog(path)
        if before:
            log.write(e="carried", usd=before)
        log.close()
    return path


def record_spend(run: RunFolder, provider: str, tally: SpendTally) -> None:
    """Copy the spend log's totals for `provider` into the manifest."""
    spend = tally.read()
    manifest = run.manifest()
    paid = dict(manifest.get("spend_usd", {}), **{provider: round(spend.paid, 6)})
    unresolved = {k: v for k, v in manifest.get("spend_unresolved_usd", {}).items() if k != provider}
    if spend.unresolved > 0:
        unresolved[provider] = round(spend.unresolved, 6)
    by_mode = dict(
        manifest.get("spend_by_mode_usd", {}), **{provider: {m: round(v, 6) for m, v in sorted(spend.by_mode.items())}}
    )
    run.update_manifest(spend_usd=paid, spend_unresolved_usd=unresolved, spend_by_mode_usd=by_mode)


def cancel_batches(providers: ProvidersConfig, run: RunFolder, provider: str) -> dict | None:
    """Cancel the batches this run folder has pending with `provider`, through a gateway in this
    process (the caller holds the folder's lock, so no run is collecting them now): what they
    answered is kept (cache, spend log, manifest), the rest is left to the next run. None when
    none is pending."""
    labels = run_batch_labels(run.root, provider)
    if not labels:
        return None
    key = api_key(provider)
    if key is None:
        raise InputError(
            [Problem("environment", f"cancelling {provider} batches needs its API key: set {key_hint(provider)}")]
        )
    log = start_spend_log(run, provider)

    async def cancel() -> dict:
        gateway = Gateway(provider, providers.of(provider), key, cache_dir(providers), spend_log=log, run_root=run.root)
        return await gateway.batch.cancel(labels)

    done = asyncio.run(cancel())
    record_spend(run, provider, SpendTally(log))
    return done


class RemoteSession:
    """A gateway actor for one provider, used as a context manager by one stage (or one model of
    it), and ended with it. What the gateways of a run folder share lives in its spend log: each new
    one starts with the spend of those before it (models, encoders, probes, the judge, earlier
    runs) against its budget, and their requests of the last minute against its rate limits.
    `record` copies the log's totals into the manifest: `spend_usd` (paid) and
    `spend_unresolved_usd` (the worst case of attempts sent whose answer was never recorded: in
    flight now, or lost with a killed run).
    """

    def __init__(self, ray, providers: ProvidersConfig, run: RunFolder, provider: str):
        cfg = providers.of(provider)
        key = api_key(provider, cfg)
        if key is None:
            raise InputError(
                [Problem("environment", f"{provider} models need an API key: set {key_hint(provider, cfg)}")]
            )
        self.ray, self.run, self.provider = ray, run, provider
        log = start_spend_log(run, provider)
        self.tally = SpendTally(log)
        # A name of its own: a gateway being ended (`ray.kill` returns before it is gone) is never reused.
        name = f"{run.root.resolve()}:{uuid.uuid4().hex}"
        self.mode = cfg.mode
        self.actor = gateway_actor(
            ray,
            provider,
            cfg,
            key,
            cache_dir(providers),
            name,
            spend_log=log.resolve(),
            driver_pid=os.getpid(),
            run_root=run.root.resolve(),
            batch_wait=providers.batch_wait,
        )

    def batch_for(self, mode: str | None) -> bool:
        """Whether a model, judge or probe with this `mode` of its own (none: the provider's) sends
        through the provider's batch interface."""
        return (mode or self.mode) == "batch"

    def record(self) -> None:
        record_spend(self.run, self.provider, self.tally)

    def report(self) -> dict:
        """The gateway's counts (attempts, cache hits, failures by kind)."""
        return self.ray.get(self.actor.report.remote(), timeout=60)

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.record()
        finally:
            self.ray.kill(self.actor)
