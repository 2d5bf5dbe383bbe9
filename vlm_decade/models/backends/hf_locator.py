"""An open-vocabulary locator: OWL-ViT / OWLv2 through transformers, asked for named objects.

Where `hf-detector` looks for one fixed list of classes, the locator takes, per image, the names to
look for (the error taxonomy's gold objects and the objects models mention) and returns, for each
name, its best boxes (`Detection` with the name as label, box in fractions of the image). It
describes nothing, so it is no describing backend: the taxonomy's `locations` stage builds it.

OWL-ViT scores every predicted box against every query and gives the box to its best query
(transformers' `post_process_grounded_object_detection`); the `PER_QUERY` best boxes of each name
are kept, whatever their score, so the caller decides what score counts as a find.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vlm_decade.models.backends.detection import Detection
from vlm_decade.models.backends.hf_common import HFBackend

PER_QUERY = 3  # boxes kept per name: the best one decides, the next ones are evidence


class HFLocator(HFBackend):
    """Options: `dtype`, `device`, `device_map`, `processor` (kwargs for the processor)."""

    def _load(self, source: str, **kwargs):
        from transformers import AutoModelForZeroShotObjectDetection

        self.processor = self.processors(source, self.options, **self.hub)
        net = AutoModelForZeroShotObjectDetection.from_pretrained(source, **kwargs)
        # Names of different lengths in one query batch: padded to the longest, cut at the text tower's length.
        self._text_kwargs = {
            "padding": True,
            "truncation": True,
            "max_length": net.config.text_config.max_position_embeddings,
        }
        return net

    def locate(self, images: Sequence[np.ndarray], queries: Sequence[Sequence[str]]) -> list[list[Detection]]:
        """For each RGB image and its names, the best boxes of each name (highest score first). One
        image per forward pass: the number of names differs from image to image."""
        return [self._locate_one(rgb, list(dict.fromkeys(names))) for rgb, names in zip(images, queries)]

    def _locate_one(self, rgb: np.ndarray, names: list[str]) -> list[Detection]:
        if not names:
            return []
        torch = self._torch
        inputs = self.processor(text=[names], images=[rgb], return_tensors="pt", **self._text_kwargs)
        inputs = {k: v.to(self.input_device) for k, v in inputs.items()}
        inputs = {k: v.to(self.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
        with torch.inference_mode():
            outputs = self.net(**inputs)
        h, w = rgb.shape[:2]
        found = self.processor.post_process_grounded_object_detection(
            outputs, threshold=0.0, target_sizes=[(h, w)], text_labels=[names]
        )[0]
        per_name: dict[str, list[Detection]] = {}
        for label, score, box in zip(
            found["text_labels"], found["scores"].float().tolist(), found["boxes"].float().tolist()
        ):
            x0, y0, x1, y1 = np.clip(np.asarray(box) / [w, h, w, h], 0.0, 1.0).tolist()
            per_name.setdefault(label, []).append(
                Detection(label, float(score), (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)))
            )
        kept = []
        for name in names:
            kept += sorted(per_name.get(name, []), key=lambda d: (-d.score, d.box))[:PER_QUERY]
        return kept
