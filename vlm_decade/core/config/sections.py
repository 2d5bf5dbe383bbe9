"""The sections both studies share: the models and text encoders measured, the pairwise metrics,
the statistics, the analysis groups, where work runs, and `StudyBase`, what every study file holds
(each study adds its own sections over it: `vlm_decade.studies.<study>.config`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from vlm_decade.core.config.providers import ProvidersConfig
from vlm_decade.core.config.settings import Settings, for_studies, operational, registry_field

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
