"""The demo's Study A tables cut down to a few images, for the Ray tests that run the study end to end
on them."""

from __future__ import annotations

import csv
from pathlib import Path


def keep_images(path: Path, keep: tuple[str, ...]) -> None:
    """Rewrite the CSV table at `path` with only the rows of the images in `keep`."""
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["image_id"] in keep]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
