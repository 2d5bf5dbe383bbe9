"""The `hf-detector` backend: object detectors through transformers (DETR, e.g.
facebook/detr-resnet-101; RT-DETR; OWL-ViT / OWLv2 with text queries).

`detect` returns boxes, labels and scores as `Detection`s (boxes in fractions of the image) for the
stages that read detections; `describe` turns them into the same template sentence as ssd-template
(`template_sentence`), so a detector can stand in as an early template captioner. The prompt is
ignored.

Images are run in groups of equal processed size: DETR's processor pads a mixed batch to its
largest image, and the padding would change each image's boxes, so a batch gives the same
detections as its images one by one.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from vlm_decade.models.backends.coco_labels import COCO_LABELS
from vlm_decade.models.backends.detection import Detection
from vlm_decade.models.backends.hf_common import HFBackend, HFOptions
from vlm_decade.models.backends.ssd_template import template_sentence

# Labels that fill gaps in a label map (DETR's COCO ids 12, 26, ...): never trained, dropped as noise.
_GAP_LABELS = {"N/A", ""}
_ZERO_SHOT = {"owlvit", "owlv2"}


class HFDetector(HFBackend):
    """Options: `score_threshold` (default 0.5, the lowest score an object needs), `queries` (text
    queries for OWL-ViT / OWLv2; default the 80 COCO labels), `dtype`, `device`, `device_map`,
    `processor` (kwargs for the processor)."""

    class Options(HFOptions):
        score_threshold: float = Field(0.5, ge=0.0, le=1.0, description="the lowest score an object needs")
        queries: list[str] | None = Field(
            None, description="OWL-ViT / OWLv2: the text queries (default: the COCO labels)"
        )

    @classmethod
    def processors(cls, source: str, options: dict, **hub):
        """OWL-ViT / OWLv2 take texts with the images (their processor); the others images only."""
        from transformers import AutoConfig, AutoImageProcessor, AutoProcessor

        zero_shot = AutoConfig.from_pretrained(source, **hub).model_type in _ZERO_SHOT
        return (AutoProcessor if zero_shot else AutoImageProcessor).from_pretrained(
            source, **options["processor"], **hub
        )

    def _load(self, source: str, **kwargs):
        from transformers import AutoModelForObjectDetection, AutoModelForZeroShotObjectDetection

        self.processor = self.processors(source, self.options, **self.hub)
        self.zero_shot = hasattr(self.processor, "tokenizer")  # OWL-ViT / OWLv2 take text queries
        if self.zero_shot:
            self.queries = list(self.options["queries"] or COCO_LABELS.values())
            return AutoModelForZeroShotObjectDetection.from_pretrained(source, **kwargs)
        return AutoModelForObjectDetection.from_pretrained(source, **kwargs)

    def _inputs(self, rgb: np.ndarray):
        if self.zero_shot:
            return self.processor(text=[self.queries], images=[rgb], return_tensors="pt")
        return self.processor(images=[rgb], return_tensors="pt")

    def _detect_group(self, rgbs: list[np.ndarray], encoded: list) -> list[list[Detection]]:
        """One forward pass over images whose processed inputs have the same shapes."""
        torch = self._torch
        inputs = {k: torch.cat([e[k] for e in encoded]).to(self.input_device) for k in encoded[0].keys()}
        inputs = {k: v.to(self.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
        outputs = self.net(**inputs)
        sizes = [rgb.shape[:2] for rgb in rgbs]
        threshold = float(self.options["score_threshold"])
        if self.zero_shot:
            found = self.processor.post_process_grounded_object_detection(
                outputs, threshold=threshold, target_sizes=sizes, text_labels=[self.queries] * len(rgbs)
            )
            names = [r["text_labels"] for r in found]
        else:
            found = self.processor.post_process_object_detection(outputs, threshold=threshold, target_sizes=sizes)
            names = [[self.net.config.id2label[int(i)] for i in r["labels"]] for r in found]
        result = []
        for (h, w), r, labels in zip(sizes, found, names):
            dets = []
            for label, score, box in zip(labels, r["scores"].tolist(), r["boxes"].float().tolist()):
                if label in _GAP_LABELS:
                    continue
                x0, y0, x1, y1 = np.clip(np.asarray(box) / [w, h, w, h], 0.0, 1.0).tolist()
                dets.append(Detection(label, float(score), (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))))
            result.append(sorted(dets, key=lambda d: (-d.score, d.label, d.box)))
        return result

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        """Detections for each image (RGB uint8), highest score first."""
        encoded = [self._inputs(rgb) for rgb in images]
        groups: dict[tuple, list[int]] = {}
        for i, e in enumerate(encoded):
            groups.setdefault(tuple((k, tuple(v.shape)) for k, v in e.items()), []).append(i)
        result: list[list[Detection] | None] = [None] * len(images)
        with self._torch.inference_mode():
            for rows in groups.values():
                for i, dets in zip(rows, self._detect_group([images[i] for i in rows], [encoded[i] for i in rows])):
                    result[i] = dets
        return result

    def _run(self, items: list[tuple[np.ndarray, str]]) -> list[str]:
        return [template_sentence(dets) for dets in self.detect([rgb for rgb, _ in items])]
