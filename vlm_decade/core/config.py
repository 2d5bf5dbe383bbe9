"""The config types both studies share, and how a study file becomes config objects.

Every section of a study file is a frozen pydantic model (`Settings`): unknown keys are errors, and
each field carries its description, which `vlm-decade schema` prints and docs/study-file.md shows.
A field that changes how fast work runs but never what it produces (batch sizes) is declared with
`operational(...)`; `Settings.fingerprint()` leaves those out, so that is said in one place.

Each study adds its own sections (`vlm_decade.studies.<study>.config`); `read_study_file` reads the
YAML and resolves paths relative to the file's folder, so everything downstream sees absolute paths.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import annotated_types
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from vlm_decade.core.errors import STUDY_FILE, InputError, Problem
from vlm_decade.core.names import did_you_mean
from vlm_decade.core.storage import is_uri, uri_problem
from vlm_decade.core.tables import regular_file_problem

OPERATIONAL = {"affects_results": False}


def _folder_location(value: Any) -> Path | str:
    if isinstance(value, Path):
        return value
    if not isinstance(value, str):
        raise ValueError("must be a path or an s3:// or gs:// URI (text)")
    if is_uri(value):
        problem = uri_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value
    return Path(value)


# A folder on a local or shared disk (a Path), or in object storage (the URI as text).
FolderLocation = Annotated[Path | str, PlainValidator(_folder_location), WithJsonSchema({"type": "string"})]


def operational(default: Any, description: str, **constraints: Any) -> Any:
    """A field that changes how work runs, never what it produces: left out of `fingerprint()`."""
    return Field(default, description=description, json_schema_extra=OPERATIONAL, **constraints)


def for_studies(default: Any, description: str, *studies: str) -> Any:
    """A field only the named studies take: `vlm-decade schema` shows it for them alone, and
    any other refuses it, set (`set_for_other_studies`)."""
    return Field(default, description=description, json_schema_extra={"studies": list(studies)})


def registry_field(default: Any, description: str, registry: str) -> Any:
    """A field whose value names an entry of a registry ("backend", "encoder"): the schema lists the
    registry's names, read from it, so a new backend is shown the moment it is registered."""
    return Field(default, min_length=1, description=description, json_schema_extra={"registry": registry})


def _extra(field: Any, key: str) -> Any:
    return field.json_schema_extra.get(key) if isinstance(field.json_schema_extra, dict) else None


def taken_by(field: Any, study: str | None) -> bool:
    """Whether `study` takes this field (every field but those `for_studies` names others for)."""
    studies = _extra(field, "studies")
    return study is None or studies is None or study in studies


def set_for_other_studies(section: Settings, study: str) -> list[str]:
    """The fields set in `section` to other than their default that `study` does not take (the study
    refuses them). A default written out, as a run folder's manifest records every field, is no
    request for anything."""
    fields = type(section).model_fields
    return sorted(
        name
        for name in section.model_fields_set
        if not taken_by(fields[name], study)
        and getattr(section, name) != fields[name].get_default(call_default_factory=True)
    )


def _settings_in(annotation: Any) -> type[Settings] | None:
    """The Settings class a field holds, directly or as the items of a tuple (or None-able)."""
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, Settings)), None)


class Settings(BaseModel):
    """A frozen section of a study file. No text field may be only whitespace: a name or prompt of
    blanks would pass a length check and name nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _not_only_whitespace(cls, value: Any) -> Any:
        if isinstance(value, str) and value and not value.strip():
            raise ValueError("is only whitespace")
        return value

    @classmethod
    def _operational(cls) -> dict:
        """pydantic's `exclude` for the operational fields, nested sections included."""
        exclude: dict = {}
        for name, field in cls.model_fields.items():
            if field.json_schema_extra == OPERATIONAL:
                exclude[name] = True
                continue
            inner = _settings_in(field.annotation)
            nested = inner._operational() if inner else {}
            if nested:
                is_tuple = getattr(field.annotation, "__origin__", None) is tuple
                exclude[name] = {"__all__": nested} if is_tuple else nested
        return exclude

    def fingerprint(self) -> dict:
        """What in these settings decides results: every field but the operational ones, as JSON."""
        return self.model_dump(mode="json", exclude=self._operational())

    def key(self, without: tuple[str, ...] = ()) -> str:
        """A short hash of `fingerprint()` less the fields `without` (e.g. a display name)."""
        payload = {k: v for k, v in self.fingerprint().items() if k not in without}
        return hashlib.sha256(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()[:16]


class BackendOptions(Settings):
    """The options one backend takes (`options:` of a model, encoder, detector, locator or judge),
    declared next to the backend class as its `Options`: `check_options` refuses an unknown name with
    a "did you mean" and a bad value with its allowed range, before any work. Strict: `k: 2.5` or
    `score_threshold: "high"` is refused, not rounded or read."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


def field_path(loc: tuple) -> str:
    """A pydantic location as a study file's author reads it: `models[2].options.threshold`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def section_at(cls: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section class a location (less its last part) ends in: list indices and mapping keys
    (a provider's prices by model id) are stepped over."""
    skip = False
    for part in loc:
        if skip:
            skip = False
            continue
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        inner = _settings_in(field.annotation) if field is not None else None
        if inner is None:
            return None
        skip = getattr(field.annotation, "__origin__", None) in (tuple, dict)
        cls = inner
    return cls


def range_text(field: Any) -> str | None:
    """A numeric field's allowed range from its bounds ("in 0..1", "> 0 and <= 1", ">= 1"), or None."""
    kinds = {
        annotated_types.Gt: ("gt", ">"),
        annotated_types.Ge: ("ge", ">="),
        annotated_types.Lt: ("lt", "<"),
        annotated_types.Le: ("le", "<="),
    }
    bounds = {kinds[type(m)][1]: getattr(m, kinds[type(m)][0]) for m in field.metadata if type(m) in kinds}
    if ">=" in bounds and "<=" in bounds:
        return f"in {bounds['>=']:g}..{bounds['<=']:g}"
    return " and ".join(f"{sign} {value:g}" for sign, value in bounds.items()) or None


_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")
_PLAIN = {"path_type": "must be a path (text)", "tuple_type": "must be a list"}


def error_message(cls: type[BaseModel], err: dict, what: str = "field") -> str:
    """One pydantic error as a sentence: an unknown name with the closest known one and the list,
    a value out of range with the range allowed, a value of the wrong kind with the value."""
    loc, value = err["loc"], err.get("input")
    if err["type"] == "extra_forbidden":
        section = section_at(cls, loc[:-1])
        known = list(section.model_fields) if section is not None else []
        return f"unknown {what} '{loc[-1]}'{did_you_mean(str(loc[-1]), known)}" + (
            f"; known: {', '.join(known)}" if known else ""
        )
    if err["type"] in _RANGE_ERRORS:
        section = section_at(cls, loc[:-1])
        field = section.model_fields.get(loc[-1]) if section is not None else None
        allowed = range_text(field) if field is not None else None
        if allowed is not None:
            return f"must be {allowed}, got {value!r}"
    message = _PLAIN.get(err["type"]) or err["msg"].removeprefix("Value error, ")
    if err["type"].endswith(("_type", "_parsing", "literal_error")) and not isinstance(value, (dict, list)):
        message += f" (got {repr(value)[:40]})"
    return message


def check_options(
    cls: type[BackendOptions], options: Any, where: tuple, backend: str, file: str = STUDY_FILE
) -> list[Problem]:
    """Why `options` (of the entry at location `where`, e.g. ("models", 2), run by `backend`) are not
    what `cls` declares: one problem per unknown name or bad value, each naming its field
    (`models[2].options.x`)."""
    try:
        cls.model_validate(options)
    except ValidationError as exc:
        return [
            Problem(
                file, error_message(cls, err, f"{backend} option"), field=field_path((*where, "options", *err["loc"]))
            )
            for err in exc.errors()
        ]
    return []


Era = Literal["pre-mllm", "mllm"]


def no_batches_of_an_endpoint(section: Settings) -> Settings:
    """`section` (a model, encoder or judge) unless it names an endpoint and asks for `mode: batch`,
    which an endpoint does not have."""
    if getattr(section, "endpoint", None) is not None and getattr(section, "mode", None) == "batch":
        raise ValueError("an endpoint has no batch interface: `mode: batch` is for a cloud provider")
    return section


class ModelConfig(Settings):
    """One describing (A) or classifying (B) model: `name` is its subject in every table."""

    name: str = Field(min_length=1, description="The model's name in every table (its `subject`).")
    backend: str = registry_field(..., "How it runs: each backend's options are in docs/models.md.", "backend")
    model_id: str = Field(
        min_length=1, description="The model: a hub id, an API model id, or a name for imported descriptions."
    )
    era: Era | None = for_studies(None, "pre-mllm or mllm (the era comparisons).", "decade")
    prompt: str | None = for_studies(None, "This model's prompt instead of the study's.", "decade")
    variants: Literal["full", "all"] = for_studies(
        "full", "full, or all (the full image and every masked variant).", "decade"
    )
    batch_size: int = operational(8, "Stimuli per batch in the model's actor.", ge=1)
    path: Path | None = Field(
        None, description="A local folder with the weights (default: a packaged copy, then the hub)."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Backend options (docs/models.md), e.g. temperature, max_output_tokens, file."
    )
    mode: Literal["sync", "batch"] | None = operational(
        None, "API models: sync or batch for this model alone (none: its provider's `mode`; docs/api.md)."
    )
    endpoint: str | None = Field(
        None, min_length=1, description="API models: the named endpoint that serves it (providers.endpoints)."
    )

    _sync_on_an_endpoint = model_validator(mode="after")(no_batches_of_an_endpoint)

    @field_validator("name")
    @classmethod
    def _not_a_human_group(cls, name: str) -> str:
        if name.startswith("human:"):
            raise ValueError("the prefix 'human:' is reserved for the human reference groups")
        return name


MINILM = "sentence-transformers/all-MiniLM-L6-v2"


class EncoderConfig(Settings):
    """A text encoder whose cosine similarity to the gold standard is a metric (e.g. SBERT-SI, GPT-SI)."""

    name: str = Field(min_length=1, description="The metric's name in every table (e.g. SBERT-SI).")
    backend: str = registry_field("sentence-transformers", "How it runs.", "encoder")
    model_id: str = Field(MINILM, description="The encoder's hub or API model id.")
    path: Path | None = Field(
        None, description="A local folder with the weights (default: a packaged copy, then the hub)."
    )
    batch_size: int = operational(64, "Texts per batch.", ge=1)
    mode: Literal["sync", "batch"] | None = operational(
        None, "API encoders: sync or batch for this encoder alone (none: its provider's `mode`; docs/api.md)."
    )
    endpoint: str | None = Field(
        None, min_length=1, description="API encoders: the named endpoint that serves it (providers.endpoints)."
    )

    _sync_on_an_endpoint = model_validator(mode="after")(no_batches_of_an_endpoint)


class MetricConfig(Settings):
    """A pairwise text metric beside the encoders' cosines (e.g. BERTScore; docs/metrics.md)."""

    name: str = Field(min_length=1, description="The metric's name in every table.")
    kind: Literal["cosine", "bertscore"] = Field(description="cosine (of an encoder's vectors) or bertscore.")
    encoder: EncoderConfig | None = Field(None, description="cosine: the encoder whose vectors are compared.")
    model_id: str = Field(MINILM, description="bertscore: the contextual model.")
    path: Path | None = Field(None, description="bertscore: a local folder with the model's weights.")
    num_layers: int | None = Field(
        None, ge=1, description="bertscore: which layer's embeddings (default: bert-score's choice for the model)."
    )
    component: Literal["precision", "recall", "f1"] = Field(
        "f1", description="bertscore: which of precision, recall, f1."
    )
    batch_size: int = operational(64, "Pairs per batch.", ge=1)

    @model_validator(mode="after")
    def _fields_match_kind(self) -> MetricConfig:
        if self.kind == "cosine" and self.encoder is None:
            raise ValueError(f"metric '{self.name}': a cosine metric needs an 'encoder'")
        if self.kind == "bertscore" and self.encoder is not None:
            raise ValueError(f"metric '{self.name}': a bertscore metric takes no 'encoder' (set model_id/path)")
        return self


# The bootstrap draws its resamples in blocks, but keeps every series' B resampled means (8 bytes
# each) to read off percentiles: 10^6 resamples take 8 MB per series, 10^10 would take 80 GB. And
# past 10^6 the Monte-Carlo error of a p-value or an interval end is far below anything it changes.
MAX_RESAMPLES = 1_000_000
# Seeds are stored in the run folder's tables as 64-bit integers.
MAX_SEED = 2**63 - 1


class StatisticsConfig(Settings):
    """The bootstrap over images and the FDR control (docs/statistics.md)."""

    n_resamples: int = Field(
        10_000,
        ge=100,
        le=MAX_RESAMPLES,
        description="Bootstrap resamples over images (at most 1,000,000: memory grows with them).",
    )
    seed: int = Field(
        20_241_101,
        ge=0,
        le=MAX_SEED,
        description="Seed of every resampling stream (with each stream's name); 0 to 2**63 - 1.",
    )
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Confidence level of the intervals.")
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="FDR level of the Benjamini-Hochberg decisions.")


class AnalysisConfig(Settings):
    """How the results are sliced beyond the study's own groups (docs/data-format.md#metadata)."""

    group_by: tuple[str, ...] = Field(
        (),
        description="Metadata columns (the user's own columns of the images or labels table) to group the "
        "statistics and comparisons by, each on its own.",
    )


class RuntimeConfig(Settings):
    """Where work runs. No address: a local Ray; an address (or RAY_ADDRESS) joins a cluster."""

    address: str | None = Field(
        None, description="A Ray cluster to join (also --address or RAY_ADDRESS); none: a local Ray."
    )
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray (default: all).")
    actors_per_model: int = Field(1, ge=1, description="Actors per local model.")
    cpus_per_actor: float = Field(1.0, ge=0.0, description="CPUs each model or encoder actor reserves.")
    gpus_per_actor: float = Field(
        0.0, ge=0.0, description="GPUs each model actor reserves (0.25: four small models per GPU)."
    )
    stall_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="A stage that finishes no call for this long stops with a message naming what it waits for.",
    )
    rehash: bool = Field(
        False,
        description="Read and hash every image and table file again, instead of trusting the run folder's record of unchanged files (same size and time; also --rehash).",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        description="Model or encoder actors a stage may lose (process or node) and replace before the rest of its batches become error rows.",
    )


# Published list prices in US$ per million tokens (standard tier, text and image input alike; the
# batch interfaces bill half of them), each with the date it was read and where (docs/api.md lists
# the sources). Prices change: a study can override or add entries under `providers.<name>.prices`,
# and `estimate` says which listed prices are over a year old. A model id takes the price of its
# longest listed prefix, so a dated snapshot (gpt-4o-2024-08-06) takes its family's price.
class ListedPrice(NamedTuple):
    input_per_mtok: float
    output_per_mtok: float
    as_of: str  # ISO date the price was read


_OPENAI_PAGE, _OPENAI_2024, _READ_2025 = "2026-03-21", "2024-11-20", "2025-08-15"
_GEMINI_PAGE, _GEMINI_1X = "2025-11-18", "2024-10-01"
# Where each reading came from (docs/api.md shows them beside the prices).
PRICE_SOURCES = {
    _OPENAI_PAGE: "OpenAI's pricing page (openai.com/api/pricing), as tabulated on 2026-03-21",
    _OPENAI_2024: "OpenAI's pricing page, legacy models, 2024-11-20 (GPT-4o's May 2024 snapshot kept its launch price)",
    _READ_2025: "the providers' pricing pages, 2025-08-15",
    _GEMINI_PAGE: "Google's Gemini API pricing page at Gemini 3 Pro's launch, 2025-11-18 (prompts up to 200k tokens)",
    _GEMINI_1X: "Google's Gemini API pricing page after the 2024-10-01 price cut (prompts up to 128k tokens)",
}
DEFAULT_PRICES: dict[str, dict[str, ListedPrice]] = {
    "openai": {
        # the papers' lineups: GPT-4 (its 32k and vision previews), GPT-4 Turbo, GPT-4o, o1, GPT-5.1
        "gpt-4": ListedPrice(30.00, 60.00, _OPENAI_2024),
        "gpt-4-32k": ListedPrice(60.00, 120.00, _OPENAI_2024),
        "gpt-4-turbo": ListedPrice(10.00, 30.00, _OPENAI_2024),
        "gpt-4-1106-preview": ListedPrice(10.00, 30.00, _OPENAI_2024),
        "gpt-4-0125-preview": ListedPrice(10.00, 30.00, _OPENAI_2024),
        "gpt-4-vision-preview": ListedPrice(10.00, 30.00, _OPENAI_2024),
        "gpt-4o": ListedPrice(2.50, 10.00, _OPENAI_PAGE),
        "gpt-4o-2024-05-13": ListedPrice(5.00, 15.00, _OPENAI_2024),
        "gpt-4o-mini": ListedPrice(0.15, 0.60, _OPENAI_PAGE),
        "gpt-4.1": ListedPrice(2.00, 8.00, _OPENAI_PAGE),
        "gpt-4.1-mini": ListedPrice(0.40, 1.60, _OPENAI_PAGE),
        "gpt-4.1-nano": ListedPrice(0.10, 0.40, _OPENAI_PAGE),
        "gpt-5": ListedPrice(1.25, 10.00, _OPENAI_PAGE),
        "gpt-5-mini": ListedPrice(0.25, 2.00, _OPENAI_PAGE),
        "gpt-5-nano": ListedPrice(0.05, 0.40, _OPENAI_PAGE),
        "gpt-5-pro": ListedPrice(15.00, 120.00, _OPENAI_PAGE),
        "gpt-5.1": ListedPrice(1.25, 10.00, _OPENAI_PAGE),
        "gpt-5.4": ListedPrice(2.50, 15.00, _OPENAI_PAGE),
        "o1": ListedPrice(15.00, 60.00, _READ_2025),
        "o1-mini": ListedPrice(1.10, 4.40, _READ_2025),
        "o3": ListedPrice(2.00, 8.00, _OPENAI_PAGE),
        "o3-mini": ListedPrice(1.10, 4.40, _OPENAI_PAGE),
        "o4-mini": ListedPrice(1.10, 4.40, _OPENAI_PAGE),
        "text-embedding-3-large": ListedPrice(0.13, 0.0, _READ_2025),
        "text-embedding-3-small": ListedPrice(0.02, 0.0, _READ_2025),
    },
    "gemini": {
        # Gemini 1.x at prompts up to 128k tokens, Gemini 3 Pro up to 200k (longer prompts cost more)
        "gemini-1.0-pro": ListedPrice(0.50, 1.50, _GEMINI_1X),
        "gemini-1.5-pro": ListedPrice(1.25, 5.00, _GEMINI_1X),
        "gemini-1.5-flash": ListedPrice(0.075, 0.30, _GEMINI_1X),
        "gemini-1.5-flash-8b": ListedPrice(0.0375, 0.15, _GEMINI_1X),
        "gemini-2.0-flash": ListedPrice(0.10, 0.40, _READ_2025),
        "gemini-2.5-pro": ListedPrice(1.25, 10.00, _READ_2025),
        "gemini-2.5-flash": ListedPrice(0.30, 2.50, _READ_2025),
        "gemini-2.5-flash-lite": ListedPrice(0.10, 0.40, _READ_2025),
        "gemini-3-pro-preview": ListedPrice(2.00, 12.00, _GEMINI_PAGE),
        "gemini-embedding-001": ListedPrice(0.15, 0.0, _READ_2025),
    },
}


def stale_prices(uses, providers: ProvidersConfig, today: datetime.date, max_age_days: int = 365) -> list[str]:
    """What `estimate` warns of: each (provider, model id) in `uses` priced by a built-in entry read
    more than `max_age_days` before `today` (a study's own price is the user's to keep)."""
    found = {}
    for provider, model_id in uses:
        own, table = providers.of(provider).prices, DEFAULT_PRICES.get(provider, {})
        key = longest_prefix(model_id, {**table, **own})  # the entry `price` charges by
        if key is None or key in own:
            continue
        if (today - datetime.date.fromisoformat(table[key].as_of)).days > max_age_days:
            found[(provider, key)] = table[key].as_of
    return [
        f"{provider} `{key}`: listed price read {as_of}, over a year ago; check the provider's page "
        f"(providers.{provider}.prices overrides it)"
        for (provider, key), as_of in sorted(found.items())
    ]


def price_table_markdown(batch_discount: float) -> str:
    """The built-in prices as docs/api.md shows them, then each reading's source (a test keeps the
    two the same)."""
    lines = [
        "| provider | model id (prefix) | input | output | batch input | batch output | read |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for provider, table in DEFAULT_PRICES.items():
        for model_id, p in sorted(table.items()):
            lines.append(
                f"| {provider} | `{model_id}` | {p.input_per_mtok:g} | {p.output_per_mtok:g} | "
                f"{p.input_per_mtok * batch_discount:g} | {p.output_per_mtok * batch_discount:g} | {p.as_of} |"
            )
    lines.append("")
    lines += [f"- {date}: {source}" for date, source in sorted(PRICE_SOURCES.items(), reverse=True)]
    return "\n".join(lines) + "\n"


def longest_prefix(model_id: str, keys) -> str | None:
    """The key a model id is priced by: itself, or the longest key it extends with `-...`."""
    matches = [k for k in keys if model_id == k or model_id.startswith(k + "-")]
    return max(matches, key=len) if matches else None


class Price(Settings):
    """US$ per million tokens; output includes reasoning ("thinking") tokens, billed as output."""

    input_per_mtok: float = Field(ge=0, description="US$ per million input tokens.")
    output_per_mtok: float = Field(0.0, ge=0, description="US$ per million output tokens (reasoning tokens included).")


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
        "Size the requests in flight from the answers: start low, grow while latency holds, "
        "halve on 429, 503 and timeouts, never above max_concurrency (docs/engines.md).",
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


def repeated(names: list[str]) -> list[str]:
    return sorted({n for n in names if names.count(n) > 1})


class StudyBase(Settings):
    """What both studies share: models, statistics, where work runs, API providers, the run folder."""

    name: str = Field(min_length=1, description="The study's name (the report's title).")
    demo: bool = Field(False, description="Demo data: the report says its numbers are no findings.")
    models: tuple[ModelConfig, ...] = Field(min_length=1, description="The models to measure.")
    statistics: StatisticsConfig = Field(StatisticsConfig(), description="The bootstrap and the FDR control.")
    analysis: AnalysisConfig = Field(AnalysisConfig(), description="Statistics per group of a metadata column.")
    runtime: RuntimeConfig = Field(RuntimeConfig(), description="Where work runs.")
    providers: ProvidersConfig = Field(
        ProvidersConfig(), description="API providers: limits, budgets, prices, the cache."
    )
    output: Path = Field(Path("runs/study"), description="The run folder (also --out).")
    limit: int | None = Field(
        None,
        ge=1,
        description="A smoke run: only the first N images of each dataset (also run --limit); its run folder says so.",
    )

    def hash(self) -> str:
        """A stable hash of everything that decides the results (not where they are written)."""
        payload = self.model_dump(mode="json", exclude={"output", "runtime", "providers"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# A URI whose "//" a path type (or a typing hand) has folded to one slash.
FOLDED_URI = re.compile(r"^(s3|gs):/[^/]")


def resolve_path(value: Any, base: Path) -> Any:
    """A path relative to `base` made absolute; a URI (one with a slash lost, too), and anything that
    is no path text (a number, a list), is left as it is, for the field's own check to name."""
    if not isinstance(value, str) or is_uri(value) or FOLDED_URI.match(value) or Path(value).is_absolute():
        return value
    return str(base / value)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key that appears twice in one mapping (plain YAML keeps the
    last one silently, so a setting written twice would be half ignored)."""

    def construct_mapping(self, node, deep=False):
        first: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` then overrides: that is allowed
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                seen = key in first
            except TypeError:  # an unhashable key: the base class names it
                break
            if seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key '{key}' appears twice (lines {first[key]} and {line}): each key may be given once",
                    key_node.start_mark,
                )
            first[key] = line
        return super().construct_mapping(node, deep=deep)


def read_study_file(path: str | Path) -> dict:
    """A study file's YAML as a mapping, or an InputError naming the file."""
    path = Path(path)
    problem = regular_file_problem(path)
    if problem is not None:
        raise InputError([Problem(str(path), f"study file {problem}")])
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except OSError as exc:
        raise InputError([Problem(str(path), f"study file cannot be read: {exc.strerror or exc}")]) from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError([Problem(str(path), f"not valid YAML: {exc}")]) from None
    if not isinstance(raw, dict):
        raise InputError([Problem(str(path), "a study file must be a YAML mapping")])
    return raw


def output_problems(output: str | Path, field: str = "output") -> list[Problem]:
    """Why the run folder `output` cannot be written (it is a file, under a file, or in a folder
    this user may not write; a URI of a store not supported), found before any work; [] when it can."""
    if is_uri(str(output)):  # a run folder in a bucket, worked on in a local copy (core.storage)
        problem = uri_problem(str(output))
        return [] if problem is None else [Problem(str(output), problem, field=field)]
    if FOLDED_URI.match(str(output)):
        return [
            Problem(
                str(output), "looks like a URI with one slash: write s3://bucket/... or gs://bucket/...", field=field
            )
        ]
    output = Path(output)
    if "\0" in str(output):
        return [Problem(str(output).replace("\0", "\\0"), "a path cannot hold a NUL byte", field=field)]
    if output.exists() and not output.is_dir():
        return [Problem(str(output), "the run folder exists and is not a folder", field=field)]
    existing = next((p for p in (output, *output.parents) if p.exists()), None)
    if existing is None:
        return []
    if not existing.is_dir():
        return [
            Problem(
                str(output), f"{existing} is a file, not a folder: the run folder cannot be made under it", field=field
            )
        ]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [Problem(str(output), f"{existing} may not be written by this user", field=field)]
    return []


# Backend options that name a file (the imported backend's descriptions, CaSED's caption database).
PATH_OPTIONS = ("file", "database")


def _is_path(annotation: Any) -> bool:
    return annotation is Path or Path in getattr(annotation, "__args__", ())


def resolve_paths(raw: Any, cls: type[Settings], base: Path) -> None:
    """Every path of a study file's section `raw` (a mapping, changed in place) made absolute
    against `base`, the study file's folder: each field `cls` declares as a path (`output` too), in
    its sections and their lists, and the options that name a file. Only what has the right shape is
    touched: a field of the wrong type (`models: 5`) is left for validation to name."""
    if not isinstance(raw, dict):
        return
    for name, field in cls.model_fields.items():
        value = raw.get(name)
        if value is None:
            continue
        if _is_path(field.annotation):
            raw[name] = resolve_path(value, base)
        inner = _settings_in(field.annotation)
        if inner is None:
            continue
        origin = getattr(field.annotation, "__origin__", None)
        items = (
            value
            if origin is tuple and isinstance(value, list)
            else value.values()
            if origin is dict and isinstance(value, dict)
            else [value]
        )
        for item in items:
            resolve_paths(item, inner, base)
    options = raw.get("options") if "options" in cls.model_fields else None
    if isinstance(options, dict):
        for key in PATH_OPTIONS:
            if options.get(key) is not None:
                options[key] = resolve_path(options[key], base)


def _type_text(annotation: Any) -> str:
    """A field's type as a study file's author reads it."""
    origin, args = getattr(annotation, "__origin__", None), getattr(annotation, "__args__", ())
    if origin is Literal:
        return " or ".join(str(a) for a in args)
    if origin is tuple:
        return f"list of {_type_text(args[0])}" if len(args) == 2 and args[1] is Ellipsis else "list"
    if origin is dict:
        return "mapping"
    if origin is list:
        return f"list of {_type_text(args[0])}" if args else "list"
    if args and type(None) in args:  # X | None
        return " or ".join(_type_text(a) for a in args if a is not type(None)) + " or none"
    if isinstance(annotation, type) and issubclass(annotation, Settings):
        return "section"
    if set(args) == {Path, str}:
        return "path or URI"
    return {Path: "path", str: "text", int: "integer", float: "number", bool: "true/false"}.get(
        annotation, str(annotation)
    )


_REQUIRED = object()


def _value_text(value: Any) -> str:
    if value is _REQUIRED:
        return "required"
    if isinstance(value, Settings):
        return "(below)"
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(str(getattr(v, "name", getattr(v, "id", v))) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    text = "{}" if value == {} else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def reference(
    cls: type[Settings],
    prefix: str = "",
    defaults: Settings | None = None,
    study: str | None = None,
    registries: dict[str, list[str]] | None = None,
) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every field of a section and the sections inside it
    that `study` takes; `defaults`: the section's default value, whose fields are the defaults
    shown; `registries`: the names of each registry, the values a `registry_field` takes."""
    rows = []
    for name, field in cls.model_fields.items():
        if not taken_by(field, study):
            continue
        key = prefix + name
        if defaults is not None:
            value = getattr(defaults, name)
        else:
            value = _REQUIRED if field.is_required() else field.get_default(call_default_factory=True)
        names = (registries or {}).get(_extra(field, "registry"))
        kind = "one of " + ", ".join(names) if names else _type_text(field.annotation)
        rows.append((key, kind, _value_text(value), field.description or ""))
        inner = _settings_in(field.annotation)
        if inner is not None:
            origin = getattr(field.annotation, "__origin__", None)
            label = _extra(field, "key") or "<model id>"  # what a mapping's keys are
            nested = {tuple: "[].", dict: f".{label}."}.get(origin, ".")
            rows += reference(inner, key + nested, value if isinstance(value, Settings) else None, study, registries)
    return rows


def reference_markdown(
    cls: type[Settings], study: str | None = None, registries: dict[str, list[str]] | None = None
) -> str:
    """`reference` as a Markdown table (what `vlm-decade schema` prints and the docs show)."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = ["| key | type | default | what |", "| --- | --- | --- | --- |"]
    rows = reference(cls, study=study, registries=registries)
    lines += [f"| `{key}` | {cell(kind)} | {cell(default)} | {cell(what)} |" for key, kind, default, what in rows]
    return "\n".join(lines) + "\n"


def json_schema(cls: type[Settings], study: str | None = None, registries: dict[str, list[str]] | None = None) -> dict:
    """The JSON Schema of what `study` takes: pydantic's, less the fields only other studies take,
    and with each `registry_field`'s names as its enum."""
    schema = cls.model_json_schema()
    for section in [schema, *schema.get("$defs", {}).values()]:
        properties = section.get("properties", {})
        for name, prop in list(properties.items()):
            studies, registry = prop.pop("studies", None), prop.pop("registry", None)
            if study is not None and studies is not None and study not in studies:
                del properties[name]
                section["required"] = [r for r in section.get("required", []) if r != name]
            elif registry in (registries or {}):
                prop["enum"] = list(registries[registry])
    return schema


def options_markdown(cls: type[BackendOptions]) -> str:
    """A backend's declared options as a Markdown table, with each number's allowed range (what
    docs/models.md shows; a test keeps the two equal)."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    if not cls.model_fields:
        return "No options.\n"
    lines = ["| option | type | default | what |", "| --- | --- | --- | --- |"]
    for name, field in cls.model_fields.items():
        allowed = range_text(field)
        kind = _type_text(field.annotation) + (f", {allowed}" if allowed else "")
        default = _value_text(field.get_default(call_default_factory=True))
        lines.append(f"| `{name}` | {cell(kind)} | {cell(default)} | {cell(field.description or '')} |")
    return "\n".join(lines) + "\n"
