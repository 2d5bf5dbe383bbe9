"""The content-addressed response cache, shared by every run that points at the same folder.

One JSON file per key (`<kind>/<key[:2]>/<key>.json`), written to a temporary name in the same
folder and renamed into place: a run killed at any moment leaves whole files or none, and two runs
writing the same key at once each leave a whole file (the same answer, or either of two equally
valid ones). A key is the sha256 of everything that decides an answer (`providers.chat_key`), so
an answer is paid for once, whichever run or study asks again.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import numpy as np

from vlm_decade.core.files import atomic_write_bytes


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/vlm_decade/api`, else `~/.cache/vlm_decade/api`."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vlm_decade" / "api"


def vector_entry(vector: np.ndarray, model_version: str, cost_usd: float, mode: str) -> dict:
    """An embedding's cache entry: the vector as base64 little-endian float32, and how it was bought."""
    return {
        "vector": base64.b64encode(vector.astype("<f4").tobytes()).decode(),
        "model_version": model_version,
        "cost_usd": cost_usd,
        "mode": mode,
    }


def entry_vector(entry: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(entry["vector"]), dtype="<f4")


class ResponseCache:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / f"{key}.json"

    def get(self, kind: str, key: str) -> dict | None:
        try:
            return json.loads(self.path(kind, key).read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # cannot happen with atomic writes; a damaged file is simply bought again

    def has(self, kind: str, key: str) -> bool:
        return self.path(kind, key).exists()

    def put(self, kind: str, key: str, entry: dict) -> None:
        atomic_write_bytes(self.path(kind, key), json.dumps(entry, sort_keys=True).encode())
