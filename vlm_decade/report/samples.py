"""Bounded per-image content for the reports: the worst and best rows of a model, and thumbnails
embedded in the page, so a report stays a few MB whatever the number of images. `vlm-decade view`
shows every image. Both studies' sample tables are `Samples`, drawn by the `sample_tables` macro."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PIL import Image

from vlm_decade.imaging.decode import load_rgb

SAMPLE_SIZE = 8  # worst and best rows per model
THUMB_PX = 96


@dataclass(frozen=True)
class SampleRow:
    image_id: str
    where: str  # under the id: the dataset, and more
    cells: list[str]


@dataclass(frozen=True)
class Samples:
    """Per model its sample tables, (title, rows), none when it has no rows; the columns after the
    image; each sampled image's thumbnail (None when its file cannot be read)."""

    head: list[str]
    models: list[tuple[str, list[tuple[str, list[SampleRow]]]]]
    thumbs: dict[str, str | None]
    empty: str  # the note under a model with no rows
    px: int = THUMB_PX


def extremes(rows: Sequence[dict], key: str, n: int | None = None) -> tuple[list[dict], list[dict]]:
    """The `n` rows (default SAMPLE_SIZE) with the lowest `key` (lowest first) and the `n` with the
    highest (highest first), never the same row in both; with at most 2n rows the two together are
    all of them. Rows whose key is None or NaN are left out. Ties keep the rows' given order."""
    n = SAMPLE_SIZE if n is None else n
    valued = [r for r in rows if r[key] is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
    ordered = sorted(valued, key=lambda r: r[key])
    low = ordered[:n]
    high = ordered[max(n, len(ordered) - n) :][::-1]
    return low, high


def sample_tables(
    picked: dict[str, tuple[list[dict], list[dict]]],
    key: str,
    head: list[str],
    row: Callable[[str, dict], SampleRow],
    path_of: dict[str, str],
    empty: str,
) -> Samples:
    """The sample tables of `picked` (model -> its `extremes` by `key`, in the models' order);
    `row(model, r)` gives a row's cells."""
    ids = sorted({r["image_id"] for low, high in picked.values() for r in low + high})
    models = [
        (
            model,
            [
                (f"{model}: {end} {key}", [row(model, r) for r in rows])
                for end, rows in (("lowest", low), ("highest", high))
                if rows
            ],
        )
        for model, (low, high) in picked.items()
    ]
    return Samples(head, models, {i: thumbnail_uri(path_of[i]) if path_of.get(i) else None for i in ids}, empty)


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
