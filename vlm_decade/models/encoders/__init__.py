"""Text encoders: one registry, lazy imports. An encoder turns texts into L2-normalised vectors.

The similarity metrics (SBERT-SI here; GPT-SI and Gemini-SI through the API layer) are cosine
similarities of these vectors, so every encoder returns unit-length float32 rows.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

from vlm_decade.core.columns import sha256_hex, stripped
from vlm_decade.core.config import BackendOptions, EncoderConfig
from vlm_decade.core.registry import Registry


class Encoder:
    # Remote encoders (APIs) are sent through their provider's gateway, not loaded in an actor.
    remote = False
    # No encoder takes options today (an encoder entry has no `options:` key); the declaration keeps
    # encoders under the one check every backend's options go through.
    Options: type[BackendOptions] = BackendOptions

    def __init__(self, cfg: EncoderConfig):
        self.cfg = cfg

    @property
    def version(self) -> str:
        return self.cfg.model_id

    def encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row of unit length."""
        raise NotImplementedError


ENCODERS = Registry(
    "encoder backend",
    {
        "gemini-embedding": "vlm_decade.models.encoders.api:GeminiEmbedding",
        "openai-embedding": "vlm_decade.models.encoders.api:OpenAIEmbedding",
        "sentence-transformers": "vlm_decade.models.encoders.sbert:SentenceTransformerEncoder",
    },
)


def encoder_class(name: str) -> type[Encoder]:
    return ENCODERS.load(name)


class EncodeActor:
    """An encoder loaded once and kept, as each of the embed stage's Ray actors holds it. It lives
    here, not in the stage, so that an actor's process imports the encoders and not the stage's
    module with all it imports (a fifth of a second of a core at each actor's start)."""

    def __init__(self, cfg: EncoderConfig):
        self.encoder = encoder_class(cfg.backend)(cfg)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encoder.encode(texts)

    def ready(self) -> bool:
        """Answered once the encoder is loaded (the embed stage waits for the first)."""
        return True


def text_key(text: str) -> str:
    """A text's key in the `embeddings` table: the sha256 of the stripped text."""
    return hashlib.sha256(text.strip().encode("utf-8")).hexdigest()


def text_keys(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`text_key` of every text of a column (null: null), on the column."""
    return sha256_hex(stripped(texts))


def normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1, norms)
