"""What the describe and embed stages share when they send work to a provider's gateway actor:
getting the actor for this run, and recording the money spent in the manifest as it is spent."""

from __future__ import annotations

from vlm_decade.core.config import ProvidersConfig
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.models.api.cache import default_cache_dir
from vlm_decade.models.api.gateway import gateway_actor
from vlm_decade.models.api.keys import api_key, key_hint


class APIStopped(Exception):
    """A stage could not finish its API work (the message says why); what it finished is kept."""


class BudgetReached(APIStopped):
    """A provider's budget stopped new requests; a later run with a higher budget goes on."""


def cache_dir(providers: ProvidersConfig):
    return providers.cache_dir or default_cache_dir()


class RemoteSession:
    """The run's gateway actor for one provider, used as a context manager by one stage.

    `spend_usd` in the manifest is the total for the run folder: what earlier runs recorded plus
    what this gateway has paid, written at every `record` so a killed run leaves it nearly current
    (the responses rows carry each request's own cost in any case).
    """

    def __init__(self, ray, providers: ProvidersConfig, run: RunFolder, provider: str):
        key = api_key(provider)
        if key is None:
            raise InputError([Problem("environment", f"{provider} models need an API key: set {key_hint(provider)}")])
        self.ray, self.run, self.provider = ray, run, provider
        self.base = float(run.manifest().get("spend_usd", {}).get(provider, 0.0))
        self.actor = gateway_actor(ray, provider, getattr(providers, provider), key, cache_dir(providers), str(run.root.resolve()))

    def record(self) -> dict:
        report = self.ray.get(self.actor.report.remote(), timeout=60)
        spend = dict(self.run.manifest().get("spend_usd", {}))
        spend[self.provider] = round(self.base + report["spent_usd"], 6)
        self.run.update_manifest(spend_usd=spend)
        return report

    def __enter__(self) -> "RemoteSession":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.record()
        finally:
            self.ray.kill(self.actor)
