"""Study A's study file (`study: decade`, the default): its data, ranking, masks, metrics and the
error taxonomy, over the sections both studies share (`vlm_decade.core.config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from vlm_decade.core.config import (
    EncoderConfig,
    FolderLocation,
    MetricConfig,
    ModelConfig,
    Settings,
    StudyBase,
    no_batches_of_an_endpoint,
    operational,
    repeated,
)
from vlm_decade.core.storage import ShardPatterns
from vlm_decade.imaging.decode import WHITE, Background
from vlm_decade.imaging.masks import MaskConfig
from vlm_decade.models.backends.hf_locator import HFLocator
from vlm_decade.studies.decade.taxonomy.probes import ProbeTemplates as Templates

MLLM_PROMPT = (
    "In one sentence, guess as accurately as possible what might be happening in this scene. "
    "Avoid mentioning objects that do not help understand the context of the scene."
)


class DataConfig(Settings):
    """Study A's input tables (docs/data-format.md)."""

    images: Path | None = Field(
        None,
        description="image_id, dataset, file (none: `captions_json` instead); with `shards`: image_id, dataset, no file (none: every image of the shards, of `dataset`).",
    )
    image_dir: FolderLocation | None = Field(
        None,
        description="The folder that `file` (or a captions JSON's `file_name`) is relative to: a path, or an s3:// or gs:// URI (docs/cluster.md); none with `shards`.",
    )
    shards: ShardPatterns | None = Field(
        None,
        description="WebDataset tar or Parquet shards holding the images, in place of `image_dir`: a brace pattern (shards/train-{000000..000009}.tar) or a list, local or s3:// / gs:// (docs/data-format.md, Shards); an image's id is its key.",
    )
    key_column: str | None = Field(
        None, min_length=1, description="`shards`, Parquet: the key column (none: __key__, key or image_id)."
    )
    image_column: str | None = Field(
        None,
        min_length=1,
        description="`shards`, Parquet: the image column, bytes or {bytes, path} (none: image, jpg, png, webp, img or image_bytes).",
    )
    descriptions: Path | None = Field(
        None, description="description_id, image_id, worker_id, condition, text (none: `captions_json` instead)."
    )
    captions_json: Path | None = Field(
        None,
        description="A COCO-style captions JSON (`images`, `annotations`) in place of `images` and `descriptions`.",
    )
    dataset: str | None = Field(
        None, min_length=1, description="The dataset of a captions JSON's images (none: the JSON's file name)."
    )
    votes: Path | None = Field(
        None, description="Ranking votes: image_id, rater_id, trial, shown, chosen; none: a consensus gold standard."
    )
    ratings: Path | None = Field(
        None,
        description="Human ratings of model-vs-gold similarity (rater_id, subject, image_id, rating), to validate the metrics (docs/metrics.md).",
    )
    hand_labels: Path | None = Field(
        None,
        description="Hand error labels (subject, image_id, error_type, present, note) that override the automatic ones (docs/taxonomy.md).",
    )
    background: Background = WHITE

    @model_validator(mode="after")
    def _one_form(self) -> DataConfig:
        tables = self.images is not None or self.descriptions is not None
        if self.captions_json is not None and tables:
            raise ValueError("give either `captions_json` or `images` and `descriptions`, not both")
        if self.shards is not None and self.descriptions is None:
            raise ValueError(
                "with `shards`, give `descriptions` (description_id, image_id, worker_id, condition, text)"
            )
        if self.captions_json is None and self.shards is None and (self.images is None or self.descriptions is None):
            raise ValueError("give `images` and `descriptions` (CSV or Parquet tables), or `captions_json`")
        if self.shards is not None:
            return self._shards_form()
        if self.image_dir is None:
            raise ValueError("give `image_dir`, the folder the images' files are in, or `shards`")
        if self.dataset is not None and self.captions_json is None:
            raise ValueError("`dataset` names a captions JSON's dataset: the images table has its own column")
        if self.key_column is not None or self.image_column is not None:
            raise ValueError("`key_column` and `image_column` name the columns of Parquet `shards`")
        return self

    def _shards_form(self) -> DataConfig:
        if self.image_dir is not None or self.captions_json is not None:
            raise ValueError("`shards` holds the images: give neither `image_dir` nor `captions_json` with it")
        if (self.images is None) == (self.dataset is None):
            raise ValueError(
                "with `shards`, give `dataset` (every image of the shards is of it) or an `images` table "
                "(image_id, dataset), not both"
            )
        return self

    @property
    def source(self) -> Path:
        """The file the human descriptions come from: the descriptions table or the captions JSON."""
        return self.captions_json if self.captions_json is not None else self.descriptions

    def form(self) -> str:
        """Which form the data is read from, as `validate` says it."""
        if self.shards is not None:
            return f"; images read from the shards {', '.join(self.shards)}"
        if self.captions_json is None:
            return (
                f"; read from the tables {self.images} and {self.descriptions}, images from the folder {self.image_dir}"
            )
        return f"; read from the COCO captions JSON {self.captions_json}"


class RankingConfig(Settings):
    """How many descriptions make the top- and bottom-ranked human groups (the paper: 4 and 4)."""

    top_k: int = Field(4, ge=1, description="Descriptions in the top-ranked human group.")
    bottom_k: int = Field(4, ge=1, description="Descriptions in the bottom-ranked human group.")
    seed: int = Field(
        20_241_101,
        ge=0,
        description="Seed of the draw that orders descriptions the votes (or the consensus scores) cannot tell apart.",
    )


class ValidationConfig(Settings):
    """The metrics' validation against human ratings (docs/metrics.md): the inter-rater reference
    each metric's mean correlation with the raters is tested against."""

    ceiling: Literal["pairwise", "leave-one-out"] = Field(
        "pairwise",
        description="pairwise (the mean correlation of two raters: the paper's test) or leave-one-out (each rater against the others' mean: stricter).",
    )


class DetectorConfig(Settings):
    """The object detector that stands in for a local model's visual front end in the error
    taxonomy (boxes and classes per image): `ssd-template` (packaged, offline) or `hf-detector`."""

    backend: Literal["ssd-template", "hf-detector"] = Field(
        "ssd-template", description="ssd-template (the packaged COCO SSD) or hf-detector (DETR, RT-DETR, OWL-ViT)."
    )
    model_id: str = Field("ssd_mobilenet_v2_coco_2018_03_29", description="The detector's model id.")
    path: Path | None = Field(None, description="A local folder with the weights.")
    options: dict[str, Any] = Field(default_factory=dict, description="Backend options (docs/models.md).")
    batch_size: int = operational(8, "Images per batch.", ge=1)

    def as_model(self) -> ModelConfig:
        return ModelConfig(
            name="detector",
            backend=self.backend,
            model_id=self.model_id,
            path=self.path,
            options=self.options,
            batch_size=self.batch_size,
        )


class ProbeTemplates(Settings):
    """The questions put to an API model about one object (docs/taxonomy.md); `{object}`,
    `{anchor}` (another object of the gold description) and `{article}` are filled in. Unset: the
    built-in wording (`vlm_decade.studies.decade.taxonomy.probes`)."""

    detection: str | None = Field(None, description="Is the object there, near the anchor?")
    detection_no_anchor: str | None = Field(None, description="Is the object there (no anchor object to refer to)?")
    recognition: str | None = Field(None, description="What is the object near the anchor?")
    recognition_no_anchor: str | None = Field(None, description="What is the object (no anchor)?")
    presence: str | None = Field(
        None,
        description="The verifier model's question: is a mentioned object that the gold does not name in the image?",
    )

    @model_validator(mode="after")
    def _usable(self) -> ProbeTemplates:
        self.templates()  # raises ValueError naming the template and its problem
        return self

    def templates(self) -> Templates:
        return Templates(**{k: v for k, v in self.model_dump().items() if v is not None})


class LocatorConfig(Settings):
    """An open-vocabulary detector (OWL-ViT or OWLv2 through transformers) that finds objects by name
    (docs/taxonomy.md): where each gold object is, so that a local model's boxes there can be read for
    its class, and, when it is the `verifier`, whether a mentioned object is in the image at all."""

    model_id: str = Field("google/owlv2-base-patch16-ensemble", description="The OWL-ViT / OWLv2 model id.")
    path: Path | None = Field(None, description="A local folder with the weights.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="dtype, device, device_map, processor (docs/models.md)."
    )
    min_score: float = Field(0.1, gt=0.0, le=1.0, description="A box scoring at least this finds the object.")
    iou: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="A local model's box is at a gold object's place when its IoU with the locator's box reaches this.",
    )
    batch_size: int = operational(4, "Images per batch.", ge=1)

    def as_model(self) -> ModelConfig:
        return ModelConfig(
            name="locator",
            backend="hf-locator",
            model_id=self.model_id,
            path=self.path,
            options=self.options,
            batch_size=self.batch_size,
        )


class VerifierConfig(Settings):
    """The check, independent of the model, that an object a model mentions and the gold does not
    name is in the image (docs/taxonomy.md): the `locator` queried with its name, or another MLLM
    (`model`) asked whether it is there. The human descriptions of all workers are always checked."""

    kind: Literal["locator", "model"] = Field(
        description="locator (the taxonomy's locator) or model (an API model asked)."
    )
    backend: Literal["openai", "gemini"] | None = Field(None, description="model: its API.")
    model_id: str | None = Field(
        None, description="model: its API model id (not one of the models it checks, ideally)."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="model: backend options (temperature, max_output_tokens)."
    )
    endpoint: str | None = Field(
        None, min_length=1, description="model: the named endpoint that serves it (providers.endpoints)."
    )

    @model_validator(mode="after")
    def _complete(self) -> VerifierConfig:
        if self.kind == "model" and (self.backend is None or not self.model_id):
            raise ValueError("a model verifier needs `backend` (openai or gemini) and `model_id`")
        if self.kind == "locator" and (self.backend, self.model_id, self.endpoint) != (None, None, None):
            raise ValueError(
                "the locator verifier takes no backend, model_id or endpoint (set them under taxonomy.locator)"
            )
        return self

    def as_model(self) -> ModelConfig:
        return ModelConfig(
            name=f"verifier:{self.model_id}",
            backend=self.backend,
            model_id=self.model_id,
            options=self.options,
            endpoint=self.endpoint,
        )


class TaxonomyConfig(Settings):
    """Study A's error analysis (docs/taxonomy.md, docs/spatial-dependence.md). Local and imported
    models are labelled from the `detector`'s boxes, API models by `probes`; object names match
    through the `matcher` encoder's cosine. `similarity` names the encoder whose scores the SDE
    and the error impact use (default: the study's first encoder; the paper used Gemini-SI)."""

    detector: DetectorConfig = Field(DetectorConfig(), description="Boxes for local and imported models.")
    matcher: EncoderConfig = Field(
        EncoderConfig(name="object-matcher"), description="The encoder whose cosine matches object names."
    )
    match_threshold: float = Field(
        0.72, gt=0.0, le=1.0, description="Object names match at this cosine (sofa = couch)."
    )
    confusable_threshold: float = Field(
        0.45, gt=0.0, le=1.0, description="A mention this close to a seen object misnames it (recognition)."
    )
    # A factory, so the templates are checked when a study is read, not while this module loads.
    probes: ProbeTemplates = Field(
        default_factory=ProbeTemplates, description="Question wordings for API models; unset: the built-in ones."
    )
    locator: LocatorConfig | None = Field(
        None,
        description="An open-vocabulary detector that finds objects by name; none: detector labels read the boxes' classes by name only.",
    )
    min_humans: int = Field(
        1,
        ge=1,
        description="A mentioned object the gold does not name is there when at least this many human descriptions (any worker) name it.",
    )
    verifier: VerifierConfig | None = Field(
        None,
        description="Checks that a mentioned object the gold does not name is there (besides all human descriptions); none: the humans only.",
    )
    sde_n_sd: float = Field(
        2.0, gt=0.0, description="SDE: the model's correlation this many SDs below the humans' mean."
    )
    min_images: int = Field(
        5,
        ge=1,
        description="Error rates and impact: a group on fewer images is shown, flagged, and not tested (no p, q).",
    )
    similarity: str | None = Field(
        None, description="The encoder whose scores the SDE and error impact use; none: the first encoder."
    )

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> TaxonomyConfig:
        if self.confusable_threshold > self.match_threshold:
            raise ValueError("confusable_threshold must not exceed match_threshold")
        if self.verifier is not None and self.verifier.kind == "locator" and self.locator is None:
            raise ValueError("verifier kind 'locator' needs a `locator` section")
        return self


class JudgeMetricConfig(Settings):
    """An LLM judge as a metric of each description (docs/metrics.md, "Judge metrics"), through the
    gateway of its provider or `endpoint` (cached, budgeted, sync or batch): `rating` (CLAIR: how likely the description
    describes the same image as the gold standard, 0-100, with a reason; text only) or `preference`
    (CapArena: the better of the description and the gold standard, the top-ranked human's, asked
    in both orders, with the image)."""

    name: str = Field(min_length=1, description="The metric's name in every table.")
    kind: Literal["rating", "preference"] = Field(
        description="rating (CLAIR, against the gold standard) or preference (CapArena, against it)."
    )
    backend: Literal["openai", "gemini"] = Field(description="The judge's API.")
    model_id: str = Field(
        min_length=1, description="The judge's API model id (not one of the models it judges, ideally)."
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="temperature (0), max_output_tokens (512; a thinking model's: 2000), reasoning_effort, "
        "thinking_budget, thinking_level, detail.",
    )
    mode: Literal["sync", "batch"] | None = operational(
        None, "sync or batch (none: its provider's `mode`; docs/api.md)."
    )
    endpoint: str | None = Field(
        None, min_length=1, description="The named endpoint that serves the judge (providers.endpoints)."
    )

    _sync_on_an_endpoint = model_validator(mode="after")(no_batches_of_an_endpoint)


class StudyConfig(StudyBase):
    """Study A: a decade of VLMs against people (METHOD.md)."""

    study: Literal["decade"] = Field("decade", description="decade: Study A (the default).")
    data: DataConfig = Field(description="The input tables.")
    ranking: RankingConfig = Field(RankingConfig(), description="The human groups from the ranking votes.")
    masks: MaskConfig = Field(MaskConfig(), description="The masked variants (docs/masks.md).")
    prompt: str = Field(MLLM_PROMPT, description="The prompt MLLMs are given (a model's own `prompt` wins).")
    encoders: tuple[EncoderConfig, ...] = Field(
        (EncoderConfig(name="SBERT-SI"),), description="One similarity metric per encoder."
    )
    metrics: tuple[MetricConfig, ...] = Field(
        (), description="Pairwise metrics beside the encoders' cosines (BERTScore)."
    )
    judge_metrics: tuple[JudgeMetricConfig, ...] = Field(
        (), description="LLM-judge metrics through an API model (CLAIR rating, CapArena preference)."
    )
    validation: ValidationConfig = Field(
        ValidationConfig(), description="The metrics against the human ratings (`data.ratings`)."
    )
    caption_metrics: tuple[Literal["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D"], ...] = (
        Field(
            (),
            description="Caption metrics against all human descriptions of the image (pycocoevalcap; needs Java; docs/metrics.md).",
        )
    )
    stsb_check: bool = Field(
        False,
        description="Also check the Sentence-BERT encoders and `metrics` against STS-B's human ratings (offline).",
    )
    taxonomy: TaxonomyConfig | None = Field(
        None, description="The error taxonomy, spatial dependence and error impact; none: similarity only."
    )

    @model_validator(mode="after")
    def _unique_names(self):
        metric_names = [e.name for e in self.encoders] + [m.name for m in self.metrics] + list(self.caption_metrics)
        metric_names += [j.name for j in self.judge_metrics]
        metric_kind = "metric (encoder, metric or judge metric)"
        for kind, names in (("model", [m.name for m in self.models]), (metric_kind, metric_names)):
            dupes = repeated(names)
            if dupes:
                raise ValueError(f"{kind} names must be unique; repeated: {', '.join(dupes)}")
        missing_era = [m.name for m in self.models if m.era is None]
        if missing_era:
            raise ValueError(
                f"Study A needs each model's era (pre-mllm or mllm); missing for: {', '.join(missing_era)}"
            )
        similarity = self.taxonomy.similarity if self.taxonomy else None
        if similarity is not None and similarity not in [e.name for e in self.encoders]:
            raise ValueError(f"taxonomy.similarity '{similarity}' is not one of the encoders")
        return self

    def option_entries(self) -> list[tuple[tuple, str, dict, type | None]]:
        """Beyond the models, the entries of this study that run a backend with options: (location,
        backend, options, their declared class, or None to look it up in the backend registry)."""
        entries = [(("judge_metrics", i), j.backend, j.options, None) for i, j in enumerate(self.judge_metrics)]
        t = self.taxonomy
        if t is None:
            return entries
        entries.append((("taxonomy", "detector"), t.detector.backend, t.detector.options, None))
        if t.locator is not None:
            entries.append((("taxonomy", "locator"), "hf-locator", t.locator.options, HFLocator.Options))
        if t.verifier is not None and t.verifier.kind == "model":
            entries.append((("taxonomy", "verifier"), t.verifier.backend, t.verifier.options, None))
        return entries

    def encoder_entries(self) -> list[tuple[tuple, str]]:
        """(location, encoder backend) of every encoder this study runs."""
        entries = [(("encoders", i), e.backend) for i, e in enumerate(self.encoders)]
        entries += [
            (("metrics", i, "encoder"), m.encoder.backend) for i, m in enumerate(self.metrics) if m.encoder is not None
        ]
        return entries + ([(("taxonomy", "matcher"), self.taxonomy.matcher.backend)] if self.taxonomy else [])

    @property
    def taxonomy_metric(self) -> str:
        """The encoder whose similarities the SDE and the error impact use."""
        return (self.taxonomy and self.taxonomy.similarity) or self.encoders[0].name

    @property
    def eras(self) -> dict[str, str]:
        """Each subject's era, the human groups included: the statistics' era comparisons."""
        return {m.name: m.era for m in self.models} | {"human:top": "human", "human:bottom": "human"}
