"""The images of a study, checked: every file read once, fully decoded, hashed and measured.

Both studies' data loaders call `check_images` on their table's rows (image_id, dataset, file); the
result becomes the run folder's `images` table (image_id, dataset, path, sha256, width, height).
"""

from __future__ import annotations

import hashlib
import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from PIL import Image, UnidentifiedImageError

from vlm_decade.core.errors import Problems
from vlm_decade.core.tables import Table, cell_present, cell_text

IMAGE_COLUMNS = ("image_id", "dataset", "file")
IMAGES_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("path", pa.string()),
        ("sha256", pa.string()),
        ("width", pa.int64()),
        ("height", pa.int64()),
    ]
)


@dataclass
class CheckedImage:
    """One image's row in the user's table, and what reading the file found."""

    row: int
    dataset: str
    path: str
    sha256: str = ""
    width: int = 0
    height: int = 0


def check_images(table: Table, image_dir: Path, problems: Problems) -> dict[str, CheckedImage]:
    images: dict[str, CheckedImage] = {}
    for row in table.rows:
        if not cell_present(row, table, IMAGE_COLUMNS, problems):
            continue
        image_id = cell_text(row, "image_id")
        if image_id in images:
            problems.add(
                table.file,
                f"duplicate image_id '{image_id}' (first at row {images[image_id].row})",
                row=row.number,
                field="image_id",
            )
            continue
        path = os.path.abspath(image_dir / cell_text(row, "file"))
        images[image_id] = CheckedImage(row.number, cell_text(row, "dataset"), path)
    if not table.rows:
        problems.add(table.file, "has no images")
    if not image_dir.is_dir():
        # One problem for the folder, not one per image.
        problems.add(image_dir, "image folder not found", field="data.image_dir")
        return images
    # Reading and hashing release the GIL, and so does Pillow's decoder: threads keep thousands cheap.
    with ThreadPoolExecutor() as pool:
        results = list(pool.map(_inspect_image, [im.path for im in images.values()]))
    for im, result in zip(images.values(), results):
        if isinstance(result, str):
            problems.add(table.file, result, row=im.row, field="file")
        else:
            im.sha256, im.width, im.height = result
    return images


def _inspect_image(path: str) -> tuple[str, int, int] | str:
    """(sha256 of the bytes, width, height) from one read and one full decode, or what is wrong."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return f"image file not found: {path}"
    except IsADirectoryError:
        return f"not an image file but a folder: {path}"
    except OSError as exc:
        return f"cannot read image file {path}: {exc.strerror or exc}"
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()  # a full decode: a truncated file fails here, not just a bad header
            width, height = im.size
    except UnidentifiedImageError:
        return f"not a readable image (not a format Pillow recognises): {path}"
    except Exception as exc:  # Pillow signals a damaged image with many exception types
        return f"not a readable image ({type(exc).__name__}: {exc}): {path}"
    return hashlib.sha256(data).hexdigest(), width, height


def images_table(images: dict[str, CheckedImage]) -> pa.Table:
    ids = sorted(images)
    columns = {
        "image_id": ids,
        "dataset": [images[i].dataset for i in ids],
        "path": [images[i].path for i in ids],
        "sha256": [images[i].sha256 for i in ids],
        "width": [images[i].width for i in ids],
        "height": [images[i].height for i in ids],
    }
    return pa.table(columns, schema=IMAGES_SCHEMA)
