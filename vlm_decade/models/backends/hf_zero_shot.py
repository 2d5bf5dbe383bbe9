"""The `hf-zero-shot` backend: CLIP, SigLIP and SigLIP 2 as closed-world zero-shot classifiers
(Study B's baselines), through transformers' `AutoModel` and `AutoProcessor`. SigLIP 2's NaFlex
processor also returns each image's patch mask and grid, which go to the model with its pixels.

Each stimulus brings its dataset's class names (`Stimulus.classes`); the answer is the class whose
text embedding is closest (cosine) to the image's, written exactly as in the list. The prompt is
ignored. CLIP's softmax over `logits_per_image` and SigLIP's sigmoid are both monotone in that
cosine (a positive scale, plus a bias for SigLIP), so all three pick the same class.

Class texts come from templates ("a photo of a {}."); with several templates each class's
embedding is the re-normalised mean of its normalised template embeddings, CLIP's prompt
ensembling. A dataset's class embeddings are computed once per actor and cached by class list,
since every image of a dataset brings the same list.

The pure part (`ensemble`, `top_classes`) works on arrays and needs no model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field, field_validator

from vlm_decade.core.config import ModelConfig
from vlm_decade.models.backends import Stimulus
from vlm_decade.models.backends.hf_common import HFBackend, HFOptions, UnusableStimulus, stimulus_rgb

DEFAULT_TEMPLATES = ("a photo of a {}.",)
NO_CLASSES = (
    "hf-zero-shot is a closed-world backend: it needs the dataset's class list, and this image came "
    "without one (give the dataset its class names)"
)
# SigLIP's text tower pools the last position, so its texts must be padded to full length, as in training.
_PAD_TO_MAX_LENGTH = {"siglip", "siglip2"}
# Prompts per text forward pass: an ImageNet class list times 80 templates would not fit in one.
_TEXT_BATCH = 256


def template_problem(templates: Any) -> str | None:
    """Why `templates` is unusable (it must be a non-empty list of strings, each with one `{}` where
    the class name goes), or None."""
    if not isinstance(templates, (list, tuple)) or not templates:
        return f"templates must be a non-empty list of strings, got {templates!r}"
    bad = [t for t in templates if not isinstance(t, str) or t.count("{}") != 1]
    if bad:
        return f"every template needs exactly one {{}} for the class name; these do not: {bad!r}"
    return None


def class_prompts(classes: tuple[str, ...], templates: tuple[str, ...]) -> list[str]:
    """Texts to embed, template-major: every class in the first template, then in the second, ..."""
    return [template.replace("{}", name) for template in templates for name in classes]


def _normalised(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def ensemble(template_embeddings: np.ndarray) -> np.ndarray:
    """(templates, classes, dim) text embeddings -> (classes, dim) unit class embeddings: each
    normalised, averaged over templates, normalised again."""
    return _normalised(_normalised(np.asarray(template_embeddings, dtype=np.float64)).mean(axis=0))


def top_classes(image_embeddings: np.ndarray, class_embeddings: np.ndarray, classes: tuple[str, ...]) -> list[str]:
    """For each (image, dim) row, the class of highest cosine similarity (a tie goes to the first)."""
    cosines = _normalised(np.asarray(image_embeddings, dtype=np.float64)) @ _normalised(class_embeddings).T
    return [classes[int(i)] for i in cosines.argmax(axis=1)]


def _features(output):
    """transformers 5 returns the projected embeddings as `pooler_output`; 4.x returns the tensor."""
    return output if hasattr(output, "dim") else output.pooler_output


class ZeroShotOptions(HFOptions):
    templates: list[str] = Field(
        list(DEFAULT_TEMPLATES), description="prompts with one {} for the class name, ensembled"
    )

    @field_validator("templates")
    @classmethod
    def _usable(cls, templates: list[str]) -> list[str]:
        problem = template_problem(templates)
        if problem:
            raise ValueError(problem)
        return templates


class HFZeroShot(HFBackend):
    """Options: `templates` (list of strings with `{}`, default ["a photo of a {}."]), `dtype`,
    `device`, `device_map`, `processor` (kwargs for the processor)."""

    closed_world = True
    Options = ZeroShotOptions

    def __init__(self, model: ModelConfig):
        super().__init__(model)
        self.templates = tuple(self.options["templates"])
        self._class_cache: dict[tuple[str, ...], np.ndarray] = {}

    def _load(self, source: str, **kwargs):
        from transformers import AutoModel

        self.processor = self.processors(source, self.options, **self.hub)
        net = AutoModel.from_pretrained(source, **kwargs)
        text_config = getattr(net.config, "text_config", net.config)
        self._text_kwargs = {
            "padding": "max_length" if net.config.model_type in _PAD_TO_MAX_LENGTH else True,
            "truncation": True,
            "max_length": text_config.max_position_embeddings,
        }
        return net

    def _to_device(self, encoded) -> dict:
        inputs = {k: v.to(self.input_device) for k, v in encoded.items()}
        return {k: v.to(self.dtype) if v.is_floating_point() else v for k, v in inputs.items()}

    def image_embeddings(self, rgbs: list[np.ndarray]) -> np.ndarray:
        """(images, dim) float64 image embeddings, one forward pass."""
        encoded = self.processor(images=rgbs, return_tensors="pt")
        with self._torch.inference_mode():
            out = _features(self.net.get_image_features(**self._to_device(encoded)))
        return out.float().cpu().numpy().astype(np.float64)

    def text_embeddings(self, texts: list[str]) -> np.ndarray:
        """(texts, dim) float64 text embeddings, in chunks of `_TEXT_BATCH`."""
        chunks = []
        for start in range(0, len(texts), _TEXT_BATCH):
            encoded = self.processor(text=texts[start : start + _TEXT_BATCH], return_tensors="pt", **self._text_kwargs)
            with self._torch.inference_mode():
                chunks.append(_features(self.net.get_text_features(**self._to_device(encoded))).float().cpu().numpy())
        return np.concatenate(chunks).astype(np.float64)

    def class_embeddings(self, classes: tuple[str, ...]) -> np.ndarray:
        """(classes, dim) unit class embeddings from the templates; cached per class list."""
        if classes not in self._class_cache:
            flat = self.text_embeddings(class_prompts(classes, self.templates))
            self._class_cache[classes] = ensemble(flat.reshape(len(self.templates), len(classes), -1))
        return self._class_cache[classes]

    def _run(self, items: list[tuple[np.ndarray, tuple[str, ...]]]) -> list[str]:
        images = self.image_embeddings([rgb for rgb, _ in items])
        return [
            top_classes(image[None], self.class_embeddings(classes), classes)[0]
            for image, (_, classes) in zip(images, items)
        ]

    def _item(self, stimulus: Stimulus) -> tuple[np.ndarray, tuple[str, ...]]:
        """The image and its dataset's class names; a stimulus without classes fails its own row."""
        if not stimulus.classes:
            raise UnusableStimulus(NO_CLASSES)
        return stimulus_rgb(stimulus), tuple(stimulus.classes)
