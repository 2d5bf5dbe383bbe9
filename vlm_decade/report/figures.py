"""Writing matplotlib figures into the run folder: drawn off-screen, saved atomically."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from vlm_decade.core.files import atomic_write_bytes

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def save_figure(fig, path: Path, **savefig) -> Path:
    """Write `fig` to `path` (the format from its suffix) as a temporary file renamed into place,
    and close it."""
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip(".") or "png", **savefig)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path
