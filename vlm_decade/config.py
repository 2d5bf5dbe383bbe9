"""The study file (YAML) as typed, validated, frozen config objects.

Paths in a study file are relative to the file's own folder; `load_study` resolves them, so
everything downstream sees absolute paths. Config errors come back as `Problem`s naming the file
and the field, all at once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import InputError, Problem

MLLM_PROMPT = (
    "In one sentence, guess as accurately as possible what might be happening in this scene. "
    "Avoid mentioning objects that do not help understand the context of the scene."
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DataConfig(_Frozen):
    """Study A's input tables (docs/data-format.md)."""

    images: Path
    image_dir: Path
    descriptions: Path
    votes: Path | None = None
    # Human ratings of model-vs-gold similarity (rater_id, subject, image_id, rating), to validate
    # the metrics against people (docs/metrics.md).
    ratings: Path | None = None
    # Hand error labels (subject, image_id, error_type, present) that override the automatic ones
    # (docs/taxonomy.md).
    hand_labels: Path | None = None


class RankingConfig(_Frozen):
    """How many descriptions make the top- and bottom-ranked human groups (the paper: 4 and 4)."""

    top_k: int = Field(4, ge=1)
    bottom_k: int = Field(4, ge=1)


class MaskConfig(_Frozen):
    """The occluder: opaque black windows with feathered edges (docs/masks.md).

    `layout` places `count` equal windows that together tile the image (`columns`: full-height strips,
    `rows`: full-width strips), each covering 1/count of it; `windows` gives explicit fractional
    boxes [x0, y0, x1, y1] instead. `feather` is the width of the soft edge as a fraction of the
    image's shorter side.
    """

    layout: Literal["columns", "rows"] = "columns"
    count: int = Field(3, ge=1, le=16)
    windows: tuple[tuple[float, float, float, float], ...] | None = None
    feather: float = Field(0.04, ge=0.0, le=0.5)

    @field_validator("windows")
    @classmethod
    def _boxes_inside_image(cls, windows):
        for box in windows or ():
            x0, y0, x1, y1 = box
            if not (0.0 <= x0 < x1 <= 1.0 and 0.0 <= y0 < y1 <= 1.0):
                raise ValueError(f"window {list(box)} must satisfy 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1")
        return windows


Era = Literal["pre-mllm", "mllm"]


class ModelConfig(_Frozen):
    """One describing (A) or classifying (B) model: `name` is its subject in every table. Study A
    needs each model's `era`; Study B takes none."""

    name: str = Field(min_length=1)
    backend: str = Field(min_length=1)
    model_id: str = Field(min_length=1)
    era: Era | None = None
    prompt: str | None = None
    variants: Literal["full", "all"] = "full"
    batch_size: int = Field(8, ge=1)
    path: Path | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _not_a_human_group(cls, name: str) -> str:
        if name.startswith("human:"):
            raise ValueError("the prefix 'human:' is reserved for the human reference groups")
        return name


MINILM = "sentence-transformers/all-MiniLM-L6-v2"


class EncoderConfig(_Frozen):
    """A text encoder whose cosine similarity to the gold standard is a metric (e.g. SBERT-SI, GPT-SI)."""

    name: str = Field(min_length=1)
    backend: str = "sentence-transformers"
    model_id: str = MINILM
    path: Path | None = None
    batch_size: int = Field(64, ge=1)


class MetricConfig(_Frozen):
    """A pairwise text metric beside the encoders' cosines (e.g. BERTScore; docs/metrics.md).
    `name` is what tables call it. Built and run by `vlm_decade.metrics`."""

    name: str = Field(min_length=1)
    kind: Literal["cosine", "bertscore"]
    # cosine: the encoder whose embeddings are compared
    encoder: EncoderConfig | None = None
    # bertscore: the contextual model, where its weights are, which layer, which component
    model_id: str = MINILM
    path: Path | None = None
    num_layers: int | None = Field(None, ge=1)
    component: Literal["precision", "recall", "f1"] = "f1"
    batch_size: int = Field(64, ge=1)

    @model_validator(mode="after")
    def _fields_match_kind(self) -> "MetricConfig":
        if self.kind == "cosine" and self.encoder is None:
            raise ValueError(f"metric '{self.name}': a cosine metric needs an 'encoder'")
        if self.kind == "bertscore" and self.encoder is not None:
            raise ValueError(f"metric '{self.name}': a bertscore metric takes no 'encoder' (set model_id/path)")
        return self


class DetectorConfig(_Frozen):
    """The object detector that stands in for a local model's visual front end in the error
    taxonomy (boxes and classes per image): `ssd-template` (packaged, offline) or `hf-detector`."""

    backend: Literal["ssd-template", "hf-detector"] = "ssd-template"
    model_id: str = "ssd_mobilenet_v2_coco_2018_03_29"
    path: Path | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    batch_size: int = Field(8, ge=1)

    def as_model(self) -> ModelConfig:
        return ModelConfig(name="detector", backend=self.backend, model_id=self.model_id, path=self.path,
                           options=self.options, batch_size=self.batch_size)


class ProbeTemplates(_Frozen):
    """The questions put to an API model about one object (docs/taxonomy.md); `{object}`,
    `{anchor}` (another object of the gold description) and `{article}` are filled in. Unset: the
    built-in wording (`vlm_decade.taxonomy.probes`)."""

    detection: str | None = None
    detection_no_anchor: str | None = None
    recognition: str | None = None
    recognition_no_anchor: str | None = None
    presence: str | None = None

    @model_validator(mode="after")
    def _usable(self) -> "ProbeTemplates":
        self.templates()  # raises ValueError naming the template and its problem
        return self

    def templates(self):
        from .taxonomy.probes import ProbeTemplates as Templates

        return Templates(**{k: v for k, v in self.model_dump().items() if v is not None})


class TaxonomyConfig(_Frozen):
    """Study A's error analysis (docs/taxonomy.md, docs/spatial-dependence.md). Local and imported
    models are labelled from the `detector`'s boxes, API models by `probes`; object names match
    through the `matcher` encoder's cosine. `similarity` names the encoder whose scores the SDE
    and the error impact use (default: the study's first encoder; the paper used Gemini-SI)."""

    detector: DetectorConfig = DetectorConfig()
    matcher: EncoderConfig = EncoderConfig(name="object-matcher")
    match_threshold: float = Field(0.72, gt=0.0, le=1.0)
    confusable_threshold: float = Field(0.45, gt=0.0, le=1.0)
    # A factory, so the templates are checked when a study is read, not while this module loads.
    probes: ProbeTemplates = Field(default_factory=ProbeTemplates)
    sde_n_sd: float = Field(2.0, gt=0.0)
    similarity: str | None = None

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> "TaxonomyConfig":
        if self.confusable_threshold > self.match_threshold:
            raise ValueError("confusable_threshold must not exceed match_threshold")
        return self


class StatisticsConfig(_Frozen):
    n_resamples: int = Field(10_000, ge=100)
    seed: int = 20_241_101
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    alpha: float = Field(0.05, gt=0.0, lt=1.0)


class RuntimeConfig(_Frozen):
    """Where work runs. No address: a local Ray; an address (or RAY_ADDRESS) joins a cluster."""

    address: str | None = None
    num_cpus: int | None = Field(None, ge=1)
    actors_per_model: int = Field(1, ge=1)
    cpus_per_actor: float = Field(1.0, ge=0.0)
    gpus_per_actor: float = Field(0.0, ge=0.0)


# Published list prices in US$ per million tokens (standard tier, text and image input alike), as
# read from the providers' pricing pages on PRICES_AS_OF. Prices change: a study can override or add
# entries under `providers.<name>.prices`. A model id takes the price of its longest listed prefix,
# so a dated snapshot (gpt-4o-2024-08-06) takes its family's price.
PRICES_AS_OF = "2025-08-15"
DEFAULT_PRICES: dict[str, dict[str, tuple[float, float]]] = {
    "openai": {
        "gpt-4o": (2.50, 10.00),
        "gpt-4o-mini": (0.15, 0.60),
        "gpt-4.1": (2.00, 8.00),
        "gpt-4.1-mini": (0.40, 1.60),
        "gpt-4.1-nano": (0.10, 0.40),
        "gpt-5": (1.25, 10.00),
        "gpt-5-mini": (0.25, 2.00),
        "gpt-5-nano": (0.05, 0.40),
        "o1": (15.00, 60.00),
        "o3": (2.00, 8.00),
        "o3-mini": (1.10, 4.40),
        "o4-mini": (1.10, 4.40),
        "text-embedding-3-large": (0.13, 0.0),
        "text-embedding-3-small": (0.02, 0.0),
    },
    "gemini": {
        "gemini-2.5-pro": (1.25, 10.00),
        "gemini-2.5-flash": (0.30, 2.50),
        "gemini-2.5-flash-lite": (0.10, 0.40),
        "gemini-2.0-flash": (0.10, 0.40),
        "gemini-embedding-001": (0.15, 0.0),
    },
}


class Price(_Frozen):
    """US$ per million tokens; output includes reasoning ("thinking") tokens, billed as output."""

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(0.0, ge=0)


class ProviderConfig(_Frozen):
    """Limits for one API provider, held for the whole cluster by its gateway actor (docs/api.md).

    The defaults suit a first paid tier; raise them to your account's limits. `base_url` points the
    official client elsewhere (a proxy, or the fake server in tests). `budget_usd` caps what one run
    may spend with this provider: requests that could pass it are not sent (rows `skipped`).
    """

    rpm: int = Field(ge=1)
    tpm: int = Field(ge=1)
    max_concurrency: int = Field(32, ge=1)
    timeout_s: float = Field(60.0, gt=0)
    max_attempts: int = Field(8, ge=1)
    base_url: str | None = None
    budget_usd: float | None = Field(10.0, ge=0)
    prices: dict[str, Price] = Field(default_factory=dict)

    def price(self, provider: str, model_id: str) -> Price | None:
        table = {k: Price(input_per_mtok=i, output_per_mtok=o) for k, (i, o) in DEFAULT_PRICES.get(provider, {}).items()}
        table.update(self.prices)
        matches = [k for k in table if model_id == k or model_id.startswith(k + "-")]
        return table[max(matches, key=len)] if matches else None


class ProvidersConfig(_Frozen):
    """API providers and the response cache shared across runs (default: the user's cache folder)."""

    cache_dir: Path | None = None
    openai: ProviderConfig = ProviderConfig(rpm=500, tpm=30_000)
    gemini: ProviderConfig = ProviderConfig(rpm=150, tpm=1_000_000)


def _repeated(names: list[str]) -> list[str]:
    return sorted({n for n in names if names.count(n) > 1})


class _Study(_Frozen):
    """What both studies share: models, statistics, where work runs, API providers, the run folder."""

    name: str = Field(min_length=1)
    demo: bool = False
    models: tuple[ModelConfig, ...] = Field(min_length=1)
    statistics: StatisticsConfig = StatisticsConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    providers: ProvidersConfig = ProvidersConfig()
    output: Path = Path("runs/study")

    def hash(self) -> str:
        """A stable hash of everything that decides the results (not where they are written)."""
        payload = self.model_dump(mode="json", exclude={"output", "runtime", "providers"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class StudyConfig(_Study):
    """Study A: a decade of VLMs against people (METHOD.md)."""

    study: Literal["decade"] = "decade"
    data: DataConfig
    ranking: RankingConfig = RankingConfig()
    masks: MaskConfig = MaskConfig()
    prompt: str = MLLM_PROMPT
    encoders: tuple[EncoderConfig, ...] = (EncoderConfig(name="SBERT-SI"),)
    metrics: tuple[MetricConfig, ...] = ()
    # Also check the Sentence-BERT encoders and `metrics` against STS-B's human ratings (offline).
    stsb_check: bool = False
    # The error taxonomy, spatial dependence and error impact; none: similarity only.
    taxonomy: TaxonomyConfig | None = None

    @model_validator(mode="after")
    def _unique_names(self):
        metric_names = [e.name for e in self.encoders] + [m.name for m in self.metrics]
        for kind, names in (("model", [m.name for m in self.models]), ("metric (encoder or metric)", metric_names)):
            dupes = _repeated(names)
            if dupes:
                raise ValueError(f"{kind} names must be unique; repeated: {', '.join(dupes)}")
        missing_era = [m.name for m in self.models if m.era is None]
        if missing_era:
            raise ValueError(f"Study A needs each model's era (pre-mllm or mllm); missing for: {', '.join(missing_era)}")
        similarity = self.taxonomy.similarity if self.taxonomy else None
        if similarity is not None and similarity not in [e.name for e in self.encoders]:
            raise ValueError(f"taxonomy.similarity '{similarity}' is not one of the encoders")
        return self

    @property
    def taxonomy_metric(self) -> str:
        """The encoder whose similarities the SDE and the error impact use."""
        return (self.taxonomy and self.taxonomy.similarity) or self.encoders[0].name


OPEN_WORLD_PROMPT = "What type of object is in this image?"


class OpenWorldDataConfig(_Frozen):
    """Study B's input tables (docs/openworld-data.md)."""

    labels: Path
    image_dir: Path
    classnames: Path


class PromptConfig(_Frozen):
    """One prompt of Study B; its `id` is the `variant` of its rows in `scores` and `stats`."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    text: str = Field(min_length=1)


class JudgeConfig(_Frozen):
    """The LI judge (docs/openworld-metrics.md): a local instruct model (`hf-judge`, the paper's
    Llama-3.2-3B-Instruct by default) or an API model (`openai`, `gemini`)."""

    backend: Literal["hf-judge", "openai", "gemini"] = "hf-judge"
    model_id: str = "meta-llama/Llama-3.2-3B-Instruct"
    path: Path | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    batch_size: int = Field(16, ge=1)


class OpenWorldMetricsConfig(_Frozen):
    """SS and CS use `encoder` (Sentence-BERT all-MiniLM-L6-v2 in the paper); a prediction's CS at or
    above `cs_high`, and LI at or above `li_high`, count as high in the error analysis."""

    encoder: EncoderConfig = EncoderConfig(name="SBERT")
    cs_high: float = Field(0.55, gt=0.0, le=1.0)
    li_high: float = Field(0.5, gt=0.0, le=1.0)


class OpenWorldStudyConfig(_Study):
    """Study B: LMMs as open-world classifiers (METHOD.md). Every open-world model answers every
    prompt (the first is the main one; the others make the ablation); closed-world baselines choose
    from the dataset's class names once."""

    study: Literal["openworld"]
    data: OpenWorldDataConfig
    prompts: tuple[PromptConfig, ...] = Field((PromptConfig(id="default", text=OPEN_WORLD_PROMPT),), min_length=1)
    judge: JudgeConfig | None = JudgeConfig()
    scoring: OpenWorldMetricsConfig = OpenWorldMetricsConfig()

    @model_validator(mode="after")
    def _consistent(self):
        for kind, names in (("model", [m.name for m in self.models]), ("prompt id", [p.id for p in self.prompts])):
            dupes = _repeated(names)
            if dupes:
                raise ValueError(f"{kind}s must be unique; repeated: {', '.join(dupes)}")
        for m in self.models:
            if m.era is not None or m.prompt is not None or m.variants != "full":
                raise ValueError(f"model '{m.name}': Study B models take no era, prompt or variants (prompts are set under `prompts`)")
        return self


STUDIES = {"decade": StudyConfig, "openworld": OpenWorldStudyConfig}
AnyStudy = StudyConfig | OpenWorldStudyConfig


def study_from_dict(raw: dict) -> AnyStudy:
    """A validated study of the kind its `study` field names (Study A when absent)."""
    kind = raw.get("study", "decade")
    if kind not in STUDIES:
        raise ValidationError.from_exception_data(
            "StudyConfig", [{"type": "literal_error", "loc": ("study",), "input": kind, "ctx": {"expected": "'decade' or 'openworld'"}}]
        )
    return STUDIES[kind].model_validate(raw)


def _resolve(value: Any, base: Path) -> Any:
    return value if value is None or Path(value).is_absolute() else str(base / value)


def load_study(path: str | Path, output: str | Path | None = None) -> AnyStudy:
    """Read and validate a study file; every config problem is raised together as an InputError."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError([Problem(str(path), "study file not found")]) from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InputError([Problem(str(path), f"not valid YAML: {exc}")]) from None
    if not isinstance(raw, dict):
        raise InputError([Problem(str(path), "a study file must be a YAML mapping")])
    base = path.resolve().parent
    data = raw.get("data")
    if isinstance(data, dict):
        raw["data"] = {k: _resolve(v, base) for k, v in data.items()}
    entries = [e for section in ("models", "encoders", "metrics") for e in raw.get(section) or []]
    entries += [m.get("encoder") for m in raw.get("metrics") or [] if isinstance(m, dict)]
    for parent, keys in (("taxonomy", ("detector", "matcher")), ("scoring", ("encoder",))):
        if isinstance(raw.get(parent), dict):
            entries += [raw[parent].get(k) for k in keys]
    entries.append(raw.get("judge"))
    for entry in entries:
        if isinstance(entry, dict):
            if entry.get("path") is not None:
                entry["path"] = _resolve(entry["path"], base)
            opts = entry.get("options")
            if isinstance(opts, dict) and opts.get("file") is not None:
                opts["file"] = _resolve(opts["file"], base)
    providers = raw.get("providers")
    if isinstance(providers, dict) and providers.get("cache_dir") is not None:
        providers["cache_dir"] = _resolve(providers["cache_dir"], base)
    if output is not None:
        raw["output"] = str(output)
    elif raw.get("output") is not None:
        raw["output"] = _resolve(raw["output"], Path.cwd())
    try:
        return study_from_dict(raw)
    except ValidationError as exc:
        raise InputError(
            [
                Problem(str(path), err["msg"], field=".".join(str(p) for p in err["loc"]) or None)
                for err in exc.errors()
            ]
        ) from None
