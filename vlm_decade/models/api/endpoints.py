"""Named endpoints (`providers.endpoints`): which provider a model, encoder or judge sends to, and
whether an endpoint answers and serves the model named, asked before any work (`validate`); and
the one check of every entry that sends to an API (`api_entry_problems`).

An endpoint is any server that speaks a provider's API (vLLM, SGLang, Ray Serve LLM, TGI,
llama.cpp, Ollama: the OpenAI one). It gets a gateway of its own, like a cloud provider: limits,
budget, prices and cache entries under its name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vlm_decade.core.config import APIConfig, EndpointConfig, ProvidersConfig, field_path
from vlm_decade.core.errors import STUDY_FILE, Problem, error_text
from vlm_decade.core.names import did_you_mean
from vlm_decade.models.api.keys import api_key, key_hint, scrub


def served_by(provider: str, endpoint: str | None) -> str:
    """The provider (gateway) an entry sends to: its endpoint, else its backend's provider."""
    return endpoint or provider


def cache_revision(cfg: APIConfig) -> str | None:
    """What an endpoint says it serves, part of its cache keys; None for a cloud provider (whose
    keys have no such field)."""
    return cfg.revision if isinstance(cfg, EndpointConfig) else None


def is_free(cfg: APIConfig, provider: str, model_id: str) -> bool:
    """Whether an endpoint's model costs nothing (a zero price, or `free: true`)."""
    price = cfg.price(provider, model_id) if isinstance(cfg, EndpointConfig) else None
    return price is not None and price.input_per_mtok == 0 and price.output_per_mtok == 0


def prices_field(provider: str, cfg: APIConfig) -> str:
    """Where a study file gives `provider`'s prices."""
    where = f"endpoints.{provider}" if isinstance(cfg, EndpointConfig) else provider
    return f"providers.{where}.prices"


def sending_problems(
    providers: ProvidersConfig, provider: str, endpoint: str | None, model_id: str, where: tuple
) -> list[Problem]:
    """Why the API entry at `where` (its location, e.g. ("models", 2): `models[2]`), whose backend
    sends to `provider`, cannot send: an endpoint it names that is not there or speaks another API,
    or no price for its model (an endpoint's model is free only when the endpoint says `free: true`)."""
    problems = route_problems(providers, provider, endpoint, field_path((*where, "endpoint")))
    if problems:
        return problems
    served = served_by(provider, endpoint)
    cfg = providers.of(served)
    if cfg.price(served, model_id) is None:
        free = " (or `free: true` for a server that costs nothing)" if endpoint else ""
        message = f"no price for {served} model '{model_id}'; add one under {prices_field(served, cfg)}{free}"
        problems.append(Problem(STUDY_FILE, message, field=field_path((*where, "model_id"))))
    return problems


def route_problems(providers: ProvidersConfig, api: str, endpoint: str | None, field: str) -> list[Problem]:
    """Why an entry whose backend speaks `api` cannot send to `endpoint`: no such endpoint, or one
    that speaks another API."""
    if endpoint is None:
        return []
    known = list(providers.endpoints)
    if endpoint not in providers.endpoints:
        hint = did_you_mean(endpoint, known) + (f"; known: {', '.join(known)}" if known else "")
        return [Problem(STUDY_FILE, f"no endpoint '{endpoint}' under providers.endpoints{hint}", field=field)]
    if providers.endpoints[endpoint].api != api:
        return [
            Problem(
                STUDY_FILE,
                f"endpoint '{endpoint}' speaks the {providers.endpoints[endpoint].api} API; this backend speaks {api}",
                field=field,
            )
        ]
    return []


def served_models(base_url: str, key: str, timeout_s: float = 10.0) -> list[str]:
    """The model ids an OpenAI-compatible server lists at GET {base_url}/models; OSError or
    ValueError saying why it could not be read."""
    import httpx

    try:
        r = httpx.get(base_url.rstrip("/") + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise OSError(f"does not answer ({error_text(exc)})") from None
    if r.status_code != 200:
        raise ValueError(f"answered GET /models with HTTP {r.status_code}")
    try:
        return [str(m["id"]) for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ValueError("answered GET /models with no list of models") from None


def endpoint_problems(providers: ProvidersConfig, wanted: dict[str, dict[str, str]]) -> list[Problem]:
    """For each endpoint of `wanted` ({endpoint: {model id: the field that names it}}): its key is
    set, it answers GET /models, and it lists every model id asked of it."""
    problems = []
    for name, models in sorted(wanted.items()):
        cfg = providers.endpoints[name]
        where = f"endpoint '{name}' at {cfg.base_url}"
        field = next(iter(models.values()))
        key = api_key(name, cfg)
        if key is None:
            problems.append(Problem("environment", f"{where} needs its key: set {key_hint(name, cfg)}", field=field))
            continue
        try:
            served = served_models(cfg.base_url, key.reveal())
        except (OSError, ValueError) as exc:
            problems.append(Problem(STUDY_FILE, scrub(f"{where} {exc}", key), field=field))
            continue
        for model_id, model_field in sorted(models.items()):
            if model_id not in served:
                listed = ", ".join(served) or "none"
                problems.append(
                    Problem(STUDY_FILE, f"{where} does not serve '{model_id}'; it serves: {listed}", field=model_field)
                )
    return problems


@dataclass(frozen=True)
class APIEntry:
    """An entry of a study file that sends to an API (a model, an encoder, a judge, the verifier):
    its location (e.g. ("models", 2)), what a message calls it (e.g. "model 'gpt-4o'"), the API its
    backend speaks, the endpoint it names (None: that API's cloud provider) and its model id."""

    where: tuple
    what: str
    api: str
    endpoint: str | None
    model_id: str


def api_entry_problems(providers: ProvidersConfig, entries: Iterable[APIEntry]) -> list[Problem]:
    """Why each API entry cannot send, before any work: a cloud provider's key not set, an endpoint
    not there or speaking another API, no price for its model (`sending_problems`); then, once per
    endpoint named, whether its key is set and it answers and serves each model asked of it
    (`endpoint_problems`)."""
    problems, wanted = [], {}
    for entry in entries:
        if entry.endpoint is None and api_key(entry.api) is None:
            message = f"{entry.what} needs an API key: set {key_hint(entry.api)}"
            problems.append(Problem("environment", message, field=field_path(entry.where)))
        mine = sending_problems(providers, entry.api, entry.endpoint, entry.model_id, entry.where)
        problems += mine
        if entry.endpoint is not None and not mine:
            wanted.setdefault(entry.endpoint, {}).setdefault(entry.model_id, field_path((*entry.where, "model_id")))
    return problems + endpoint_problems(providers, wanted)
