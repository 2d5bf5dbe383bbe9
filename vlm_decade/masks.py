"""Masked variants: the paper's occluder, an opaque black window with feathered edges."""

from __future__ import annotations

from .config import MaskConfig


def mask_ids(cfg: MaskConfig) -> list[str]:
    """Mask ids in order: m1, m2, ...; with `full` these are the valid `condition`/`variant` values."""
    n = len(cfg.windows) if cfg.windows else cfg.count
    return [f"m{i}" for i in range(1, n + 1)]
