"""The input files the ingestion tests write: PNGs of noise and CSV tables."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
from PIL import Image


def png_bytes(width: int = 12, height: int = 8, seed: int = 0) -> bytes:
    """A PNG of seeded noise: noise does not compress, so the pixel data spans most of the file and
    a truncation hits it."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path
