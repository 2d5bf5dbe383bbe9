"""Describing models: one registry, lazy imports, one small interface.

A backend is a class that is built once per Ray actor from its `ModelConfig` (load the model there,
never at import) and then describes batches of stimuli. Backends only turn stimuli into texts; the
describe stage owns batching, retries of failed rows, resume and persistence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from vlm_decade.core.config import BackendOptions, ModelConfig, check_options, field_path
from vlm_decade.core.errors import STUDY_FILE, Problem
from vlm_decade.core.registry import Registry


@dataclass(frozen=True)
class Stimulus:
    """One image variant to describe: `variant` is `full` or a mask id; `image` is RGB uint8 HxWx3.
    `classes` is the class list of the image's dataset, given only to closed-world backends (Study B's
    CLIP / SigLIP baselines)."""

    image_id: str
    variant: str
    image: np.ndarray
    prompt: str
    classes: tuple[str, ...] = ()
    prompt_id: str = ""  # the prompt's id in the study (an imported file's answers are keyed by it)


@dataclass(frozen=True)
class Description:
    """A backend's answer for one stimulus. `status` is `ok` or `error` (then `error` says why)."""

    text: str
    status: str = "ok"
    error: str = ""
    model_version: str = ""


class Backend:
    """Base class. `needs_images=False` backends (imported files) are called without decoding images."""

    needs_images = True
    # Remote backends (API models) are sent through their provider's gateway, not an actor pool.
    remote = False
    # Closed-world backends choose among the dataset's class names (`Stimulus.classes`).
    closed_world = False
    # Backends whose answers are a lookup (an imported file) answer a table of questions at once, in
    # the driver (`answer_rows`), not in actors: a Ray call per batch costs more than the lookup.
    looks_up = False
    # The options it takes (docs/models.md's tables are generated from these).
    Options: type[BackendOptions] = BackendOptions

    def __init__(self, model: ModelConfig):
        self.model = model

    def describe(self, batch: list[Stimulus]) -> list[Description]:
        raise NotImplementedError

    def answer_rows(self, questions: pa.Table) -> pa.Table:
        """For a `looks_up` backend: per question (image_id, variant, prompt_id), the fields of its
        `Description` (text, status, error, model_version), as `describe` gives them."""
        raise NotImplementedError

    @classmethod
    def fingerprint(cls, model: ModelConfig) -> dict:
        """What decides this model's answers (its display name, batch size and variants do not);
        part of every response's cache key."""
        return model.model_dump(mode="json", exclude={"name", "batch_size", "variants"})

    @classmethod
    def key_settings(cls, model: ModelConfig) -> dict:
        """What goes into each response's cache key of the model's settings: those all its answers share."""
        return cls.fingerprint(model)

    @classmethod
    def answers(cls, model: ModelConfig) -> Callable[[Any, Any, str], Any] | None:
        """For a backend whose answers are rows of a file: the answers to some (image_ids, variants) for
        a prompt id, as an Arrow array of texts as the responses' rows hold them (null where the file
        has none). Each response's cache key then holds its answer's `text_key`, so that only the
        rows that change are done again. None: the answers are not known before they are asked for."""
        return None

    @classmethod
    def check(cls, model: ModelConfig, image_ids: set[str], variants: list[str]) -> list[Problem]:
        """Problems `validate` can find before any work: missing weights, files, keys."""
        return []


# Imported only when a study uses them, so optional dependencies stay optional.
BACKENDS = Registry(
    "backend",
    {
        "cased": "vlm_decade.models.backends.cased:CaSED",
        "hf-captioner": "vlm_decade.models.backends.hf_captioner:HFCaptioner",
        "hf-detector": "vlm_decade.models.backends.hf_detector:HFDetector",
        "hf-vlm": "vlm_decade.models.backends.hf_vlm:HFVLM",
        "hf-zero-shot": "vlm_decade.models.backends.hf_zero_shot:HFZeroShot",
        "gemini": "vlm_decade.models.backends.api:GeminiBackend",
        "imported": "vlm_decade.models.backends.imported:ImportedBackend",
        "litert-classifier": "vlm_decade.models.backends.litert_classifier:LiteRTClassifier",
        "openai": "vlm_decade.models.backends.api:OpenAIBackend",
        "ssd-label": "vlm_decade.models.backends.ssd_template:SSDLabel",
        "ssd-template": "vlm_decade.models.backends.ssd_template:SSDTemplateCaptioner",
    },
)


def backend_class(name: str) -> type[Backend]:
    return BACKENDS.load(name)


def entry_problems(backend: str, options: dict, where: tuple, registry: Registry = BACKENDS) -> list[Problem]:
    """An entry's backend (an unknown one with the closest known name) and its options, checked
    against what the backend declares; `where` is the entry's location, e.g. ("models", 2)."""
    try:
        cls = registry.load(backend)
    except KeyError as exc:
        return [Problem(STUDY_FILE, exc.args[0], field=field_path((*where, "backend")))]
    return check_options(cls.Options, options, where, backend)


def parsed_options(model: ModelConfig, cls: type[BackendOptions]) -> dict:
    """A model's options over their declared defaults, as a mapping; bad ones raise ValueError
    saying each problem (what `validate` reports, for a backend built without it)."""
    problems = check_options(cls, model.options, (), model.backend)
    if problems:
        raise ValueError(f"{model.name}: " + "; ".join(f"{p.field}: {p.message}" for p in problems))
    return cls.model_validate(model.options).model_dump()
