"""Study B's study file (`study: openworld`): labelled images, prompts, the LI judge and the
scoring thresholds, over the sections both studies share (`vlm_decade.core.config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from vlm_decade.core.config import (
    BackendOptions,
    EncoderConfig,
    FolderLocation,
    Settings,
    StudyBase,
    no_batches_of_an_endpoint,
    operational,
    repeated,
    set_for_other_studies,
)
from vlm_decade.core.storage import ShardPatterns
from vlm_decade.imaging.decode import WHITE, Background
from vlm_decade.models.backends.api import GeminiOptions, OpenAITextOptions
from vlm_decade.models.backends.hf_common import Generation, PlacementOptions
from vlm_decade.studies.openworld.metrics import JUDGE_MAX_NEW_TOKENS

OPEN_WORLD_PROMPT = "What type of object is in this image?"


class OpenWorldDataConfig(Settings):
    """Study B's input (docs/openworld-data.md): the labels and class-names tables beside a folder of
    images, or an image folder with one folder per class."""

    labels: Path | None = Field(
        None, description="image_id, dataset, file, label, granularity (none: `image_folder` instead)."
    )
    image_dir: FolderLocation | None = Field(
        None,
        description="The folder that `file` is relative to: a path, or an s3:// or gs:// URI (docs/cluster.md).",
    )
    shards: ShardPatterns | None = Field(
        None,
        description="WebDataset tar or Parquet shards holding the images, in place of `image_dir`: a brace pattern (shards/train-{000000..000009}.tar) or a list, local or s3:// / gs:// (docs/data-format.md, Shards); the labels name images by key, with no `file` column.",
    )
    key_column: str | None = Field(
        None, min_length=1, description="`shards`, Parquet: the key column (none: __key__, key or image_id)."
    )
    classnames: Path | None = Field(
        None,
        description="dataset, class_name: each dataset's class list (for the closed-world baselines); with `image_folder`, optional: the list its folders must be in.",
    )
    image_folder: Path | None = Field(
        None, description="A folder with one folder per class, its images inside, in place of `labels`."
    )
    hf_dataset: Path | None = Field(
        None,
        description="A Hugging Face dataset on disk (`save_to_disk`, or its Parquet files), in place of `labels`.",
    )
    split: str = Field("train", min_length=1, description="`hf_dataset`: the split to read.")
    image_column: str = Field(
        "image", min_length=1, description="`hf_dataset`, Parquet `shards`: the image column ({bytes, path}, or bytes)."
    )
    label_column: str = Field(
        "label", min_length=1, description="`hf_dataset`: the label column (a ClassLabel, its names the class list)."
    )
    dataset: str | None = Field(
        None, min_length=1, description="`image_folder`, `hf_dataset`: the name of its dataset."
    )
    granularity: Literal["prototypical", "fine-grained", "very fine-grained"] | None = Field(
        None, description="`image_folder`, `hf_dataset`: its dataset's label granularity."
    )
    background: Background = WHITE

    @model_validator(mode="after")
    def _one_form(self) -> OpenWorldDataConfig:
        if self.shards is not None:
            return self._shards_form()
        if self.key_column is not None:
            raise ValueError("`key_column` names the key column of Parquet `shards`")
        form = [f for f in ("image_folder", "hf_dataset") if getattr(self, f) is not None]
        if not form:
            lacking = [f for f in ("labels", "image_dir", "classnames") if getattr(self, f) is None]
            if lacking or self.dataset is not None or self.granularity is not None:
                raise ValueError(
                    "give `labels`, `image_dir` and `classnames` (CSV or Parquet tables and their images), or "
                    "`image_folder` or `hf_dataset` with `dataset` and `granularity`"
                )
            return self
        if len(form) > 1 or self.labels is not None or self.image_dir is not None:
            raise ValueError("give one of `labels` and `image_dir`, `image_folder` or `hf_dataset`")
        if self.hf_dataset is not None and self.classnames is not None:
            raise ValueError("`hf_dataset` takes its class names from its ClassLabel feature, not `classnames`")
        if self.dataset is None or self.granularity is None:
            raise ValueError(f"`{form[0]}` needs `dataset` and `granularity` (it gives only the labels)")
        return self

    def _shards_form(self) -> OpenWorldDataConfig:
        if any(getattr(self, f) is not None for f in ("image_dir", "image_folder", "hf_dataset")):
            raise ValueError("`shards` holds the images: give no `image_dir`, `image_folder` or `hf_dataset` with it")
        if self.labels is None or self.classnames is None:
            raise ValueError("with `shards`, give `labels` (image_id, dataset, label, granularity) and `classnames`")
        if self.dataset is not None or self.granularity is not None:
            raise ValueError("with `shards`, the labels table gives each image's dataset and granularity")
        return self

    def form(self) -> str:
        """Which form the data is read from, as `validate` says it."""
        if self.shards is not None:
            return f"; images read from the shards {', '.join(self.shards)}"
        if self.hf_dataset is not None:
            return f"; read from the Hugging Face dataset {self.hf_dataset} (split {self.split})"
        if self.image_folder is None:
            return (
                f"; read from the tables {self.labels} and {self.classnames}, images from the folder {self.image_dir}"
            )
        return f"; read from the image folder {self.image_folder}"


class PromptConfig(Settings):
    """One prompt of Study B; its `id` is the `prompt_id` of its rows in every table."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="The prompt's id in every table.")
    text: str = Field(min_length=1, description="The question every open-world model answers.")


class LocalJudgeOptions(PlacementOptions, Generation):
    """The options of the local judge (`hf-judge`)."""

    max_new_tokens: int = Field(
        JUDGE_MAX_NEW_TOKENS, ge=1, description="the longest answer, in tokens (the paper's 16)"
    )


# What each judge backend takes: an API judge is sent text only, so no image `detail`.
JUDGE_OPTIONS: dict[str, type[BackendOptions]] = {
    "hf-judge": LocalJudgeOptions,
    "openai": OpenAITextOptions,
    "gemini": GeminiOptions,
}


class JudgeConfig(Settings):
    """The LI judge (docs/openworld-metrics.md): a local instruct model (`hf-judge`, the paper's
    Llama-3.2-3B-Instruct by default) or an API model (`openai`, `gemini`)."""

    backend: Literal["hf-judge", "openai", "gemini"] = Field(
        "hf-judge", description="hf-judge (a local instruct model), openai or gemini."
    )
    model_id: str = Field("meta-llama/Llama-3.2-3B-Instruct", description="The judge's hub or API model id.")
    path: Path | None = Field(None, description="A local folder with the weights.")
    options: dict[str, Any] = Field(default_factory=dict, description="Judge options (docs/openworld-metrics.md).")
    batch_size: int = operational(16, "Prompts per batch of a local judge.", ge=1)
    mode: Literal["sync", "batch"] | None = operational(
        None, "An API judge: sync or batch (none: its provider's `mode`; docs/api.md)."
    )
    endpoint: str | None = Field(
        None, min_length=1, description="An API judge: the named endpoint that serves it (providers.endpoints)."
    )

    @model_validator(mode="after")
    def _mode_for_api_judges(self) -> JudgeConfig:
        for own in ("mode", "endpoint"):
            if getattr(self, own) is not None and self.backend == "hf-judge":
                raise ValueError(f"`{own}` is for an API judge (openai, gemini); hf-judge runs here")
        return no_batches_of_an_endpoint(self)


class OpenWorldMetricsConfig(Settings):
    """SS and CS use `encoder` (Sentence-BERT all-MiniLM-L6-v2 in the paper); a prediction's CS at or
    above `cs_high`, and LI at or above `li_high`, count as high in the error analysis."""

    encoder: EncoderConfig = Field(EncoderConfig(name="SBERT"), description="The encoder of SS and CS.")
    max_tokens: int = Field(
        512,
        ge=8,
        le=8192,
        description="SS and CS: wordpieces kept of each text, as the authors' tokenizer call (512; the encoder's own default is 256).",
    )
    cs_high: float = Field(0.55, gt=0.0, le=1.0, description="CS at or above this counts as high.")
    li_high: float = Field(0.5, gt=0.0, le=1.0, description="LI at or above this counts as high.")


class OpenWorldStudyConfig(StudyBase):
    """Study B: LMMs as open-world classifiers (METHOD.md). Every open-world model answers every
    prompt (the first is the main one; the others make the ablation); closed-world baselines choose
    from the dataset's class names once."""

    study: Literal["openworld"] = Field(description="openworld: Study B.")
    data: OpenWorldDataConfig = Field(description="The input tables.")
    prompts: tuple[PromptConfig, ...] = Field(
        (PromptConfig(id="default", text=OPEN_WORLD_PROMPT),),
        min_length=1,
        description="The prompts; the first is the main one, the others make the ablation.",
    )
    judge: JudgeConfig | None = Field(JudgeConfig(), description="The LI judge; none: LI is skipped.")
    scoring: OpenWorldMetricsConfig = Field(
        OpenWorldMetricsConfig(), description="SS and CS, and the error types' thresholds."
    )

    @model_validator(mode="after")
    def _consistent(self):
        for kind, names in (("model", [m.name for m in self.models]), ("prompt id", [p.id for p in self.prompts])):
            dupes = repeated(names)
            if dupes:
                raise ValueError(f"{kind}s must be unique; repeated: {', '.join(dupes)}")
        for m in self.models:
            foreign = set_for_other_studies(m, "openworld")
            if foreign:
                raise ValueError(
                    f"model '{m.name}': Study B models take no {', '.join(foreign)} (prompts are set under `prompts`)"
                )
        return self

    def option_entries(self) -> list[tuple[tuple, str, dict, type | None]]:
        """Beyond the models, the entries of this study that run a backend with options: the judge."""
        j = self.judge
        return [] if j is None else [(("judge",), j.backend, j.options, JUDGE_OPTIONS[j.backend])]

    def encoder_entries(self) -> list[tuple[tuple, str]]:
        """(location, encoder backend) of every encoder this study runs."""
        return [(("scoring", "encoder"), self.scoring.encoder.backend)]
