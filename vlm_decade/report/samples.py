"""Bounded per-image content for the reports: the worst and best rows of a model, and thumbnails
embedded in the page, so a report stays a few MB whatever the number of images. `vlm-decade view`
shows every image."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence

from PIL import Image

from vlm_decade.imaging.decode import load_rgb

SAMPLE_SIZE = 8  # worst and best rows per model
THUMB_PX = 96
VIEW_NOTE = ("Per-image content on this page is a sample: each model's {n} worst and {n} best images (every image "
             "when a model has at most {twice}). <code>vlm-decade view RUN_DIR</code> shows every image, with filters.")


def view_note(n: int | None = None) -> str:
    n = SAMPLE_SIZE if n is None else n
    return f"<p class='note'>{VIEW_NOTE.format(n=n, twice=2 * n)}</p>"


def extremes(rows: Sequence[dict], key: str, n: int | None = None) -> tuple[list[dict], list[dict]]:
    """The `n` rows (default SAMPLE_SIZE) with the lowest `key` (lowest first) and the `n` with the
    highest (highest first), never the same row in both; with at most 2n rows the two together are
    all of them. Rows whose key is None or NaN are left out. Ties keep the rows' given order."""
    n = SAMPLE_SIZE if n is None else n
    valued = [r for r in rows if r[key] is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
    ordered = sorted(valued, key=lambda r: r[key])
    low = ordered[:n]
    high = ordered[max(n, len(ordered) - n):][::-1]
    return low, high


def thumbnail_uri(path: str, px: int = THUMB_PX) -> str | None:
    """The image as a small JPEG data URI, or None when the file cannot be read."""
    try:
        im = Image.fromarray(load_rgb(path)[0])
        im.thumbnail((px, px))
    except (OSError, ValueError):
        return None
    buffer = io.BytesIO()
    im.save(buffer, format="JPEG", quality=70)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def thumbnail_img(path: str | None, alt: str, px: int = THUMB_PX) -> str:
    """An <img> with the thumbnail embedded, or a note that the image file is missing."""
    uri = thumbnail_uri(path, px) if path else None
    if uri is None:
        return "<span class='note'>(image file missing)</span>"
    return f"<img src='{uri}' alt='{html.escape(alt)}' style='max-width:{px}px;max-height:{px}px'>"
