"""What `validate` finds about a local Hugging Face model before any actor starts: it reads the
model's config and builds its processor on the driver, no weights, and names the cause of what
would fail in the workers.

- a package the family needs that is not installed, with the pip line;
- an architecture the installed transformers does not know;
- a hub id that is neither a local folder nor in the local cache while the hub cannot be reached
  (offline mode, or a connection that fails within seconds), instead of a run's first batch;
- a checkpoint that ships its own code (`auto_map` in its config) without both an explicit
  `trust_remote_code: true` and a pinned `revision`, or whose code has no class of the kind the
  backend loads (InternVL2 and MiniCPM-V answer through their own `chat` method, not the processor +
  `generate` contract), naming transformers' own form or an endpoint where there is one.

Every problem names the model and the field it comes from (`path` or `model_id`, or an option).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vlm_decade.core.config import ModelConfig
from vlm_decade.core.errors import STUDY_FILE, Problem, error_text

# model_type of a remote-code checkpoint -> what runs it instead: transformers' own form of the
# family where there is one, else an endpoint.
NATIVE = {
    "internvl_chat": "transformers' own InternVL checkpoints, e.g. OpenGVLab/InternVL3-2B-hf or InternVL3-8B-hf",
    "llava_qwen": "llava-hf/llava-onevision-qwen2-7b-ov-hf",
    "minicpmv": "a MiniCPM-V checkpoint in transformers' own form (model type minicpmv4_6), or an endpoint (vLLM)",
    "phi3_v": "Phi-3.5-vision through an endpoint (vLLM / SGLang) and the openai backend",
    "molmo": "Molmo through an endpoint (vLLM) and the openai backend",
}
# What to install for an ImportError whose message names a package.
PIP = {
    "torchvision": "pip install torchvision (the build matching the installed torch: a CUDA torch on a GPU machine)",
    "num2words": 'pip install num2words (or pip install -e ".[hf]")',
}
_REACH_SECONDS = 3.0


def hub_reachable(timeout: float = _REACH_SECONDS) -> bool:
    """Whether the hub's host answers a TCP connection within `timeout` seconds."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _pip_line(exc: Exception) -> str | None:
    """What to install for `exc`: a package its message names, or an ImportError's module; None
    for an error that names no package."""
    text = str(exc).lower()
    for package, line in PIP.items():
        if package in text:
            return line
    if not isinstance(exc, ImportError):
        return None
    name = getattr(exc, "name", None)
    return f"pip install {name.split('.')[0]}" if name else 'pip install -e ".[hf]"'


def _raw_config(source: str, hub: dict[str, Any], local_only: bool) -> dict[str, Any]:
    from transformers import PretrainedConfig

    config, _ = PretrainedConfig.get_config_dict(source, local_files_only=local_only, revision=hub.get("revision"))
    return config


def load_problems(cls, model: ModelConfig, options: dict[str, Any], source: str, hub: dict[str, Any]) -> list[str]:
    """Why `cls` (an HFBackend) could not load `model` from `source`: the messages, or none. Reads the
    config and builds the processor; the weights are `weight_problems`' part."""
    from vlm_decade.models.backends.hf_common import hub_offline

    name = model.name
    local_only = Path(source).is_dir() or hub_offline()
    try:
        raw = _raw_config(source, hub, local_only=True)
    except (OSError, ValueError):
        if local_only or not hub_reachable():
            return [
                f"{name}: {source} is neither a local folder nor in the Hugging Face cache, and the hub cannot be "
                "reached. Set path: to a saved copy, or download it into the cache on a machine with network "
                f"(`hf download {model.model_id}`)."
            ]
        try:
            raw = _raw_config(source, hub, local_only=False)
        except (OSError, ValueError) as exc:
            return [f"{name}: {source} has no readable config.json on the hub: {error_text(exc)}"]
        local_only = False
    if "auto_map" in raw:
        problem = _remote_code_problem(cls, name, source, raw, hub)
        if problem:
            return [problem]
    return _build_problems(cls, name, options, source, {**hub, "local_files_only": local_only})


def _remote_code_problem(cls, name: str, source: str, raw: dict[str, Any], hub: dict[str, Any]) -> str | None:
    """Why a checkpoint that ships its own code (`raw`'s auto_map) will not load through `cls`, or None."""
    native = NATIVE.get(raw.get("model_type", ""))
    instead = f", or use {native}." if native else "."
    if not ("trust_remote_code" in hub and "revision" in hub):
        return (
            f"{name}: {source} runs its own code (auto_map in its config); set both trust_remote_code: true and "
            "revision: COMMIT in its options to load it at a commit you have read" + instead
        )
    auto_class = getattr(cls, "auto_class", None)
    if auto_class is None or auto_class in raw["auto_map"]:
        return None
    return (
        f"{name}: {source}'s own code has no {auto_class} (its auto_map names {', '.join(raw['auto_map'])}): it "
        f"answers through its own API (such as model.chat), which {cls.__name__} does not drive"
        + (f"; use {native}." if native else "; serve it through an endpoint (vLLM / SGLang) and the openai backend.")
    )


def _build_problems(cls, name: str, options: dict[str, Any], source: str, hub: dict[str, Any]) -> list[str]:
    import transformers
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(source, **hub)
    except (KeyError, ValueError) as exc:
        return [
            f"{name}: transformers {transformers.__version__} does not know this model's architecture "
            f"({error_text(exc)}); a newer transformers may."
        ]
    except ImportError as exc:
        return [f"{name}: a package its config needs is missing ({exc}). Run: {_pip_line(exc)}"]
    try:
        cls.processors(source, options, **hub)
    except Exception as exc:  # noqa: BLE001 - whatever the processor raises is the reason it cannot run
        line = _pip_line(exc)  # transformers says a missing package with an ImportError or a ValueError
        if line is not None:
            return [f"{name}: a package its processor needs is missing ({exc}). Run: {line}"]
        return [f"{name}: its processor cannot be built: {error_text(exc)}"]
    return []


def model_problems(cls, model: ModelConfig, options: dict[str, Any], source: str, hub: dict[str, Any]) -> list[Problem]:
    """`load_problems` as the study file's problems at the model's `path` or `model_id` (the caller
    puts them under the model's entry)."""
    field = "path" if model.path is not None else "model_id"
    return [Problem(STUDY_FILE, m, field=field) for m in load_problems(cls, model, options, source, hub)]
