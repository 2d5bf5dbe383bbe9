"""Study A's study file (`study: decade`, the default): its data, ranking, masks, metrics and the
error taxonomy, over the sections both studies share (`vlm_decade.core.config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from vlm_decade.core.config import EncoderConfig, MetricConfig, ModelConfig, Settings, StudyBase, operational, repeated
from vlm_decade.imaging.masks import MaskConfig
from vlm_decade.studies.decade.taxonomy.probes import ProbeTemplates as Templates

MLLM_PROMPT = (
    "In one sentence, guess as accurately as possible what might be happening in this scene. "
    "Avoid mentioning objects that do not help understand the context of the scene."
)


class DataConfig(Settings):
    """Study A's input tables (docs/data-format.md)."""

    images: Path = Field(description="image_id, dataset, file.")
    image_dir: Path = Field(description="The folder that `file` is relative to.")
    descriptions: Path = Field(description="description_id, image_id, worker_id, condition, text.")
    votes: Path | None = Field(None, description="Ranking votes: image_id, rater_id, trial, shown, chosen; none: a consensus gold standard.")
    ratings: Path | None = Field(None, description="Human ratings of model-vs-gold similarity (rater_id, subject, image_id, rating), to validate the metrics (docs/metrics.md).")
    hand_labels: Path | None = Field(None, description="Hand error labels (subject, image_id, error_type, present, note) that override the automatic ones (docs/taxonomy.md).")


class RankingConfig(Settings):
    """How many descriptions make the top- and bottom-ranked human groups (the paper: 4 and 4)."""

    top_k: int = Field(4, ge=1, description="Descriptions in the top-ranked human group.")
    bottom_k: int = Field(4, ge=1, description="Descriptions in the bottom-ranked human group.")


class DetectorConfig(Settings):
    """The object detector that stands in for a local model's visual front end in the error
    taxonomy (boxes and classes per image): `ssd-template` (packaged, offline) or `hf-detector`."""

    backend: Literal["ssd-template", "hf-detector"] = Field("ssd-template", description="ssd-template (the packaged COCO SSD) or hf-detector (DETR, RT-DETR, OWL-ViT).")
    model_id: str = Field("ssd_mobilenet_v2_coco_2018_03_29", description="The detector's model id.")
    path: Path | None = Field(None, description="A local folder with the weights.")
    options: dict[str, Any] = Field(default_factory=dict, description="Backend options (docs/models.md).")
    batch_size: int = operational(8, "Images per batch.", ge=1)

    def as_model(self) -> ModelConfig:
        return ModelConfig(name="detector", backend=self.backend, model_id=self.model_id, path=self.path,
                           options=self.options, batch_size=self.batch_size)


class ProbeTemplates(Settings):
    """The questions put to an API model about one object (docs/taxonomy.md); `{object}`,
    `{anchor}` (another object of the gold description) and `{article}` are filled in. Unset: the
    built-in wording (`vlm_decade.studies.decade.taxonomy.probes`)."""

    detection: str | None = Field(None, description="Is the object there, near the anchor?")
    detection_no_anchor: str | None = Field(None, description="Is the object there (no anchor object to refer to)?")
    recognition: str | None = Field(None, description="What is the object near the anchor?")
    recognition_no_anchor: str | None = Field(None, description="What is the object (no anchor)?")
    presence: str | None = Field(None, description="Is a mentioned object that no human named there?")

    @model_validator(mode="after")
    def _usable(self) -> "ProbeTemplates":
        self.templates()  # raises ValueError naming the template and its problem
        return self

    def templates(self) -> Templates:
        return Templates(**{k: v for k, v in self.model_dump().items() if v is not None})


class TaxonomyConfig(Settings):
    """Study A's error analysis (docs/taxonomy.md, docs/spatial-dependence.md). Local and imported
    models are labelled from the `detector`'s boxes, API models by `probes`; object names match
    through the `matcher` encoder's cosine. `similarity` names the encoder whose scores the SDE
    and the error impact use (default: the study's first encoder; the paper used Gemini-SI)."""

    detector: DetectorConfig = Field(DetectorConfig(), description="Boxes for local and imported models.")
    matcher: EncoderConfig = Field(EncoderConfig(name="object-matcher"), description="The encoder whose cosine matches object names.")
    match_threshold: float = Field(0.72, gt=0.0, le=1.0, description="Object names match at this cosine (sofa = couch).")
    confusable_threshold: float = Field(0.45, gt=0.0, le=1.0, description="A mention this close to a seen object misnames it (recognition).")
    # A factory, so the templates are checked when a study is read, not while this module loads.
    probes: ProbeTemplates = Field(default_factory=ProbeTemplates, description="Question wordings for API models; unset: the built-in ones.")
    sde_n_sd: float = Field(2.0, gt=0.0, description="SDE: the model's correlation this many SDs below the humans' mean.")
    similarity: str | None = Field(None, description="The encoder whose scores the SDE and error impact use; none: the first encoder.")

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> "TaxonomyConfig":
        if self.confusable_threshold > self.match_threshold:
            raise ValueError("confusable_threshold must not exceed match_threshold")
        return self


class StudyConfig(StudyBase):
    """Study A: a decade of VLMs against people (METHOD.md)."""

    study: Literal["decade"] = Field("decade", description="decade: Study A (the default).")
    data: DataConfig = Field(description="The input tables.")
    ranking: RankingConfig = Field(RankingConfig(), description="The human groups from the ranking votes.")
    masks: MaskConfig = Field(MaskConfig(), description="The masked variants (docs/masks.md).")
    prompt: str = Field(MLLM_PROMPT, description="The prompt MLLMs are given (a model's own `prompt` wins).")
    encoders: tuple[EncoderConfig, ...] = Field((EncoderConfig(name="SBERT-SI"),), description="One similarity metric per encoder.")
    metrics: tuple[MetricConfig, ...] = Field((), description="Pairwise metrics beside the encoders' cosines (BERTScore).")
    stsb_check: bool = Field(False, description="Also check the Sentence-BERT encoders and `metrics` against STS-B's human ratings (offline).")
    taxonomy: TaxonomyConfig | None = Field(None, description="The error taxonomy, spatial dependence and error impact; none: similarity only.")

    @model_validator(mode="after")
    def _unique_names(self):
        metric_names = [e.name for e in self.encoders] + [m.name for m in self.metrics]
        for kind, names in (("model", [m.name for m in self.models]), ("metric (encoder or metric)", metric_names)):
            dupes = repeated(names)
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

    @property
    def eras(self) -> dict[str, str]:
        """Each subject's era, the human groups included: the statistics' era comparisons."""
        return {m.name: m.era for m in self.models} | {"human:top": "human", "human:bottom": "human"}
