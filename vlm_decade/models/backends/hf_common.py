"""What the Hugging Face backends (hf-captioner, hf-vlm, hf-detector) share.

- Where weights come from (DESIGN.md): the model's `path`, then a copy a package ships, then the hub
  id; `weight_problems` finds a missing model before any work and says how to get it.
- How a model runs: GPU in bf16 (fp16 where bf16 is unsupported), `device_map` through accelerate
  for models larger than one GPU, CPU in float32 with torch threads matching the Ray actor's CPUs.
- Greedy decoding by default, so a run repeats.
- `run_split`: a batch that fails (a bad image, a CUDA out-of-memory) is retried in halves down to
  single images, so one image fails only its own row.

`HFBackend` is the base class: it reads the options it declares (`HFOptions`), resolves and loads the weights, and
turns each usable image into a row; subclasses load their model (`_load`) and run a batch (`_run`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from vlm_decade.core.config import BackendOptions, ModelConfig
from vlm_decade.core.errors import InputError, Problem, error_text
from vlm_decade.imaging.masks import as_rgb
from vlm_decade.models.backends import Backend, Description, Stimulus, parsed_options

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")

# Model id -> (importable package, folder inside it) for weights that ship in a package, so they load
# offline. None of the models these backends name ships that way today (docs: OFFLINE.md); an entry
# here is all a future package needs.
PACKAGED: dict[str, tuple[str, str]] = {}


class PlacementOptions(BackendOptions):
    """Where and in what precision a local model runs (`placement`)."""

    device: str = Field("auto", description="auto (cuda if there is one), cpu, cuda, cuda:1, ...")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto (GPU: bfloat16, else float16; CPU: float32), or float32, bfloat16, float16"
    )
    device_map: str | dict[str, Any] | None = Field(
        None,
        description="passed to `from_pretrained` (e.g. auto): accelerate places the model; `device` is then unused",
    )


class HFOptions(PlacementOptions):
    """Options every HF backend takes; a backend adds its own."""

    processor: dict[str, Any] = Field(
        {}, description="keyword arguments for the processor's `from_pretrained` (e.g. Qwen2-VL's max_pixels)"
    )
    revision: str | None = Field(None, description="the hub commit (or tag) to load; required with trust_remote_code")
    trust_remote_code: bool = Field(
        False, description="run the checkpoint's own Python code; only together with a pinned `revision`"
    )


class Generation(BackendOptions):
    """How a local model that writes text generates (`generation_kwargs`)."""

    max_new_tokens: int = Field(40, ge=1, description="the longest answer, in tokens")
    generate: dict[str, Any] = Field(
        {}, description="passed to `model.generate` (e.g. {num_beams: 3}); greedy otherwise"
    )


class GenerationOptions(HFOptions, Generation):
    """The options of an HF backend that generates text."""


def packaged_copy(model_id: str) -> Path | None:
    """The folder of a packaged copy of `model_id`, located without importing the package."""
    import importlib.util

    if model_id not in PACKAGED:
        return None
    package, inside = PACKAGED[model_id]
    spec = importlib.util.find_spec(package)
    locations = spec.submodule_search_locations if spec is not None else None
    return Path(locations[0]) / inside if locations else None


def hub_offline() -> bool:
    return any(
        os.environ.get(var, "").upper() in {"1", "ON", "YES", "TRUE"}
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def folder_problems(folder: Path, what: str, how: str) -> list[str]:
    """What a saved model folder lacks: config.json, or a weight file (or a shard its index names)."""
    if not folder.is_dir():
        return [f"{what} {folder} is not a folder. {how}"]
    if not (folder / "config.json").is_file():
        return [f"{what} {folder} has no config.json, so it is no saved Hugging Face model. {how}"]
    if any((folder / name).is_file() for name in _WEIGHT_FILES):
        return []
    for index in _WEIGHT_INDEXES:
        if (folder / index).is_file():
            import json

            shards = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))
            missing = [s for s in shards if not (folder / s).is_file()]
            return [f"{what} {folder} lacks weight shards {', '.join(missing)}. {how}"] if missing else []
    return [f"{what} {folder} has config.json but no weight file ({' or '.join(_WEIGHT_FILES)}). {how}"]


def weight_source(model: ModelConfig) -> str:
    """Where the weights load from: the config's path, a packaged copy, else the hub id."""
    if model.path is not None:
        return str(model.path)
    packaged = packaged_copy(model.model_id)
    return str(packaged) if packaged is not None else model.model_id


def weight_problems(model: ModelConfig) -> list[Problem]:
    """A missing model, found before any work. An explicit `path` never falls back to the hub, so a
    mistyped folder cannot silently run other weights; the hub is only checked when it cannot be
    reached (HF_HUB_OFFLINE=1), since online a missing model is downloaded."""
    get = f"`hf download {model.model_id} --local-dir FOLDER` on a machine with network, then set path: FOLDER"
    if model.path is not None:
        messages = folder_problems(
            Path(model.path), f"{model.name}: the model's path", f"Save the model there or run {get}."
        )
    elif packaged_copy(model.model_id) is not None:
        messages = folder_problems(
            packaged_copy(model.model_id), f"{model.name}: the packaged copy", "Reinstall its package."
        )
    elif hub_offline():
        from huggingface_hub import snapshot_download

        try:
            folder = Path(snapshot_download(model.model_id, local_files_only=True))
        except Exception:  # noqa: BLE001 - not cached (or not a valid id): either way, not here
            messages = [
                f"{model.name}: {model.model_id} is not in the Hugging Face cache and HF_HUB_OFFLINE is set, "
                f"so it cannot be downloaded. Run {get}, or download it into the cache with network."
            ]
        else:
            messages = folder_problems(folder, f"{model.name}: the cached copy of {model.model_id} in", f"Run {get}.")
    else:
        messages = []
    return [Problem(str(model.path or model.model_id), m, field="path" if model.path else "model_id") for m in messages]


def hub_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """What every `from_pretrained` of a model takes: its pinned revision, and trust_remote_code only
    with one (a checkpoint's code is run only at a commit someone chose)."""
    revision = options.get("revision")
    if revision is None:
        return {}
    return {"revision": revision, **({"trust_remote_code": True} if options.get("trust_remote_code") else {})}


def generation_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """Greedy decoding unless the `generate` passthrough says otherwise (sampling would not repeat)."""
    return {"do_sample": False, "num_beams": 1, "max_new_tokens": options["max_new_tokens"], **options["generate"]}


def actor_cpus() -> float | None:
    """The CPUs Ray gave the current actor or task; None outside Ray (never imports Ray itself)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        return ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 - the driver has no assignment
        return None


def configure_threads() -> None:
    """In a Ray actor, torch threads = the actor's CPUs (at least one), so two one-CPU actors do not
    fight over the cores and one two-CPU actor uses both. Outside Ray torch keeps its own choice."""
    cpus = actor_cpus()
    if cpus is not None:
        import torch

        torch.set_num_threads(max(1, math.floor(cpus)))


def placement(options: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    """(device, torch dtype, extra from_pretrained kwargs): GPU in bf16 (fp16 where unsupported) when
    there is one, CPU in float32 otherwise; `device_map` hands placement to accelerate."""
    import torch

    device = options["device"]
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = options["dtype"]
    if dtype == "auto":
        if device.startswith("cuda"):
            dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        else:
            dtype = "float32"
    extra = {"device_map": options["device_map"]} if options["device_map"] is not None else {}
    return device, getattr(torch, dtype), extra


def _free_gpu_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_split(fn: Callable[[list], list], items: Sequence) -> list:
    """`fn(items)` (one result per item), but a batch that raises is retried in halves down to single
    items; an item that still fails gets its exception in place of a result. A CUDA out-of-memory is
    an exception like any other here: the halves need less memory."""
    items = list(items)
    if not items:
        return []
    try:
        results = fn(items)
    except Exception as exc:  # noqa: BLE001 - narrowed down below, recorded per item
        _free_gpu_memory()
        if len(items) == 1:
            return [exc]
        half = len(items) // 2
        return run_split(fn, items[:half]) + run_split(fn, items[half:])
    if len(results) != len(items):
        raise RuntimeError(f"a batch of {len(items)} gave {len(results)} results")
    return results


def model_version(model: ModelConfig, net) -> str:
    """The model id, with the hub commit when the weights came from the hub."""
    commit = getattr(net.config, "_commit_hash", None)
    return f"{model.model_id}@{commit}" if commit else model.model_id


class UnusableStimulus(ValueError):
    """A stimulus a backend cannot run; the message is its row's error."""


def stimulus_rgb(stimulus: Stimulus) -> np.ndarray:
    try:
        return as_rgb(stimulus.image)
    except ValueError as exc:
        raise UnusableStimulus(f"unusable image: {exc}") from None


class HFBackend(Backend):
    """Shared life of an HF backend: options, weights, placement, threads, and per-row errors."""

    Options = HFOptions

    def __init__(self, model: ModelConfig):
        super().__init__(model)
        self.options = parsed_options(model, self.Options)
        problems = weight_problems(model)
        if problems:
            raise InputError(problems)
        configure_threads()
        import torch

        self.device, self.dtype, extra = placement(self.options)
        self.hub = hub_kwargs(self.options)
        self.net = self._load(weight_source(model), dtype=self.dtype, **extra, **self.hub)
        self.model_version = model_version(model, self.net)
        if "device_map" not in extra:
            self.net.to(self.device)
        self.net.eval()
        self._torch = torch

    @classmethod
    def check(cls, model: ModelConfig, image_ids: set[str], variants: list[str]) -> list[Problem]:
        """Missing weights, then what loading would meet (`hf_check`: packages, architecture, hub,
        remote code), before any work; the options are checked with the study file."""
        from vlm_decade.models.backends.hf_check import model_problems

        problems = weight_problems(model)
        try:
            options = parsed_options(model, cls.Options)
        except ValueError:  # reported with the study file's options
            return problems
        return problems or model_problems(cls, model, options, weight_source(model), hub_kwargs(options))

    @property
    def input_device(self):
        """Where inputs go: the model's first device (with device_map, where its embeddings are)."""
        return self.net.device

    @classmethod
    def processors(cls, source: str, options: dict[str, Any], **hub):
        """What turns images (and texts) into the model's inputs, without the weights; `_load`
        keeps it and validate builds it to find what would fail."""
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(source, **options["processor"], **hub)

    def _load(self, source: str, **kwargs):
        """Load the model (returned) and whatever turns images into inputs (kept on self)."""
        raise NotImplementedError

    def _run(self, items: list[tuple[np.ndarray, str]]) -> list[str]:
        """Texts for (rgb image, prompt) pairs, one per pair, in order."""
        raise NotImplementedError

    def _item(self, stimulus: Stimulus) -> tuple[np.ndarray, Any]:
        """What `_run` takes for one stimulus: its RGB image and what conditions the answer (here the
        prompt). Raises UnusableStimulus, with the row's error, for a stimulus that cannot run."""
        return stimulus_rgb(stimulus), stimulus.prompt

    def describe(self, batch: list[Stimulus]) -> list[Description]:
        """One description per stimulus; an unusable stimulus or one that fails the model fails its
        own row only."""
        results: list[Description | None] = [None] * len(batch)
        usable: list[tuple[int, tuple[np.ndarray, Any]]] = []
        for i, stimulus in enumerate(batch):
            try:
                usable.append((i, self._item(stimulus)))
            except UnusableStimulus as exc:
                results[i] = Description("", "error", str(exc), self.model_version)
        with self._torch.inference_mode():
            answers = run_split(self._run, [item for _, item in usable])
        for (i, _), answer in zip(usable, answers):
            if isinstance(answer, Exception):
                results[i] = Description("", "error", error_text(answer), self.model_version)
            else:
                results[i] = Description(answer, model_version=self.model_version)
        return results
