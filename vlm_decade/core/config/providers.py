"""The APIs a study sends to: the cloud providers (OpenAI, Gemini) and named OpenAI-compatible
endpoints, each with its limits, timeouts, budget and prices (`APIConfig`), a cloud provider's batch
interface (`ProviderConfig`), an endpoint's URL and key (`EndpointConfig`), and the `providers`
section that holds them all with the shared answer cache (`ProvidersConfig`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from vlm_decade.core.config.prices import DEFAULT_PRICES, Price, longest_prefix
from vlm_decade.core.config.settings import Settings, operational


class APIConfig(Settings):
    """What every API a study sends to has, held for the whole cluster by its gateway actor
    (docs/api.md): limits, timeouts, a budget and prices. `budget_usd` caps what the run folder may
    spend with it, across its stages and reruns: requests that could pass it are not sent (rows
    `skipped`). A cloud provider's section (`ProviderConfig`) adds its batch interface; a named
    endpoint's (`EndpointConfig`) its URL, key and what it serves.
    """

    rpm: int | None = Field(None, ge=1, description="Requests per minute, for the whole cluster (none: no limit).")
    tpm: int | None = Field(None, ge=1, description="Tokens per minute, for the whole cluster (none: no limit).")
    max_concurrency: int = Field(32, ge=1, description="Requests in flight at once (with `adaptive`: the ceiling).")
    adaptive: bool = operational(
        False,
        "Size the requests in flight from the answers: start low, grow while throughput rises "
        "(Little's law: in flight over latency), step down on 429, 503 and timeouts, never above "
        "max_concurrency (docs/engines.md).",
    )
    timeout_s: float = Field(60.0, gt=0, description="Seconds before a request is abandoned (and retried).")
    max_attempts: int = Field(8, ge=1, description="Attempts per request (429, 5xx and timeouts are retried).")
    base_url: str | None = Field(None, description="Send the official client elsewhere (a proxy).")
    budget_usd: float | None = Field(
        10.0, ge=0, description="US$ the run folder may spend with the provider; none: no cap."
    )
    prices: dict[str, Price] = Field(
        default_factory=dict, description="Prices by model id (prefix), over the built-in table."
    )

    def price(self, provider: str, model_id: str) -> Price | None:
        table = {
            k: Price(input_per_mtok=p.input_per_mtok, output_per_mtok=p.output_per_mtok)
            for k, p in DEFAULT_PRICES.get(provider, {}).items()
        }
        table.update(self.prices)
        key = longest_prefix(model_id, table)
        return None if key is None else table[key]


class ProviderConfig(APIConfig):
    """A cloud provider (OpenAI, Gemini): the defaults suit a first paid tier; raise them to your
    account's limits. `base_url` points the official client elsewhere (a proxy, or the fake server in
    tests). `mode: batch` sends chat requests and texts to embed through the provider's batch
    interface instead, at half the price.
    """

    mode: Literal["sync", "batch"] = operational(
        "sync",
        "sync: requests one by one; batch: the provider's batch interface, "
        "half the price, answers within a day (docs/api.md).",
    )
    batch_max_requests: int | None = operational(
        None, "Batch mode: requests per batch at most (default: the provider's limit).", ge=1
    )
    batch_poll_s: float = operational(
        30.0, "Batch mode: seconds before a pending batch is looked at again (growing by half each time).", gt=0
    )


ENDPOINT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
CLOUD_PROVIDERS = ("openai", "gemini")
# A cloud provider's limits when its section leaves them out (a first paid tier).
CLOUD_LIMITS = {"openai": {"rpm": 500, "tpm": 30_000}, "gemini": {"rpm": 150, "tpm": 1_000_000}}


class EndpointConfig(APIConfig):
    """A named server that speaks a provider's API (vLLM, SGLang, Ray Serve LLM, TGI, llama.cpp, Ollama:
    the OpenAI chat and embeddings API), with its own gateway: limits, budget, prices, cache entries.
    It has no batch interface, so no batch fields: its requests go one by one (`mode` is sync)."""

    api: Literal["openai"] = Field(
        "openai", description="The API it speaks: openai (chat completions and embeddings, OpenAI-compatible)."
    )
    base_url: str = Field(min_length=1, description="Its URL up to the API's version, e.g. http://host:8000/v1.")
    key_env: str | None = Field(
        None, min_length=1, description="The environment variable that holds its key (none: no key is sent)."
    )
    budget_usd: float | None = Field(
        None, ge=0, description="US$ the run folder may spend with the endpoint; none: no cap."
    )
    prices: dict[str, Price] = Field(default_factory=dict, description="Prices by model id (prefix); zero allowed.")
    free: bool = Field(False, description="A model it serves without a price costs nothing (a local server).")
    revision: str | None = Field(
        None,
        min_length=1,
        description="What it serves (e.g. the weights' commit): part of the cache key, so a new one is asked anew.",
    )

    @property
    def mode(self) -> Literal["sync"]:
        """As a cloud provider's `mode` reads: an endpoint's requests go one by one."""
        return "sync"

    def price(self, provider: str, model_id: str) -> Price | None:
        """Its own prices only (no built-in table); free when declared so and none is given."""
        key = longest_prefix(model_id, self.prices)
        if key is not None:
            return self.prices[key]
        return Price(input_per_mtok=0.0) if self.free else None


class ProvidersConfig(Settings):
    """API providers and the response cache shared across runs (default: the user's cache folder)."""

    cache_dir: Path | None = Field(
        None, description="The API answer cache (also --cache-dir; default ~/.cache/vlm_decade/api)."
    )
    batch_wait: bool = operational(
        True, "Batch mode: wait for batches to finish (--wait); false: submit, and a later run collects (--no-wait)."
    )
    openai: ProviderConfig = Field(
        ProviderConfig(**CLOUD_LIMITS["openai"]), description="OpenAI's limits, budget and prices."
    )
    gemini: ProviderConfig = Field(
        ProviderConfig(**CLOUD_LIMITS["gemini"]), description="Gemini's limits, budget and prices."
    )
    endpoints: dict[str, EndpointConfig] = Field(
        default_factory=dict,
        description="Named OpenAI-compatible servers (docs/engines.md); a model, encoder or judge names one.",
        json_schema_extra={"key": "<name>"},
    )

    @model_validator(mode="before")
    @classmethod
    def _cloud_limits(cls, raw: Any) -> Any:
        """A cloud provider's section that leaves out rpm or tpm keeps the default ones (so `base_url`
        alone may be set); `rpm: null` says no limit."""
        if isinstance(raw, dict):
            raw = dict(raw)
            for name in CLOUD_PROVIDERS:
                if isinstance(raw.get(name), dict):
                    raw[name] = {**CLOUD_LIMITS[name], **raw[name]}
        return raw

    @field_validator("endpoints")
    @classmethod
    def _endpoint_names(cls, endpoints: dict) -> dict:
        for name in endpoints:
            if name in CLOUD_PROVIDERS:
                raise ValueError(f"'{name}' is a cloud provider's name; call the endpoint something else")
            if not ENDPOINT_NAME.match(name):
                raise ValueError(f"endpoint name '{name}' may hold only letters, digits, '.', '_' and '-'")
        return endpoints

    def names(self) -> list[str]:
        """Every provider a study may send to: the cloud ones, then the endpoints."""
        return [*CLOUD_PROVIDERS, *self.endpoints]

    def of(self, name: str) -> ProviderConfig | EndpointConfig:
        """The section of provider or endpoint `name`; KeyError naming the known ones."""
        if name in CLOUD_PROVIDERS:
            return getattr(self, name)
        if name in self.endpoints:
            return self.endpoints[name]
        raise KeyError(f"unknown provider or endpoint '{name}'; known: {', '.join(self.names())}")

    def api(self, name: str) -> str:
        """The API provider `name` speaks (openai or gemini): its request and answer format."""
        return api_of(name, self.of(name))


def api_of(name: str, cfg: APIConfig) -> str:
    """The API the provider `name` with section `cfg` speaks: an endpoint's `api`, else its own name."""
    return cfg.api if isinstance(cfg, EndpointConfig) else name
