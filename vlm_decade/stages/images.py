"""The images of a study, checked: every file read once, fully decoded, hashed and measured.

Both studies' data loaders call `check_images` on their table's rows (image_id, dataset, file); the
result becomes the run folder's `images` table (image_id, dataset, path, sha256, width, height,
mode, background). Each file is decoded as the models will see it (`vlm_decade.imaging.decode`):
width and height are those of the upright image, `mode` is the file's own pixel mode, `background`
the colour (#rrggbb) its transparent pixels are composited onto (null for an image without
transparency; tables written before it lack the column: read it as null), and a file that cannot be
converted to 8-bit RGB faithfully, or is no regular file (a FIFO would block), is refused here, as is
an image with transparency when the study's `data.background` is `none`.

Reading and hashing every image again on every run would cost minutes at a million images, so what a
check found is kept in the run folder (`ImageCache`, `.cache/images.parquet`) under the file's path,
size and modification time: a later check reuses it while those three are unchanged, and reads the
file again otherwise (or always, with `runtime.rehash`).

`image_dir` may be a local folder or an object-storage URI (`vlm_decade.core.storage`); the `path`
column then holds each image's URI, which the workers read directly.
"""

from __future__ import annotations

import hashlib
import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from vlm_decade.core import storage
from vlm_decade.core.errors import Problems
from vlm_decade.core.files import atomic_write_bytes
from vlm_decade.core.names import did_you_mean
from vlm_decade.core.tables import Table, cell_present, cell_text
from vlm_decade.imaging.decode import NO_BACKGROUND, WHITE, ImageDecodeError, decode_image

IMAGE_COLUMNS = ("image_id", "dataset", "file")
IMAGES_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("path", pa.string()),
        ("sha256", pa.string()),
        ("width", pa.int64()),
        ("height", pa.int64()),
        ("mode", pa.string()),  # the file's own pixel mode (Pillow's name: RGB, L, I;16, F, ...)
        ("background", pa.string()),  # what its transparent pixels are composited onto; null: none are
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
    mode: str = ""
    transparent: bool = False


CACHE_FILE = Path(".cache") / "images.parquet"
CACHE_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("bytes", pa.int64()),
        ("mtime_ns", pa.int64()),
        ("sha256", pa.string()),
        ("width", pa.int64()),
        ("height", pa.int64()),
        ("mode", pa.string()),
        ("transparent", pa.bool_()),
    ]
)
# What inspecting one file found: (sha256, width, height, mode, transparent).
Found = tuple[str, int, int, str, bool]


class ImageCache:
    """What earlier checks found, per (path, size, modification time), and what this one found."""

    def __init__(self, known: dict[tuple[str, int, int], Found] | None = None):
        self.known = known or {}
        self.found: dict[tuple[str, int, int], Found] = {}

    @classmethod
    def of(cls, run_folder: str | Path, rehash: bool = False) -> ImageCache:
        """The cache a run folder keeps (none yet, unreadable, or `rehash`: an empty one)."""
        path = Path(run_folder) / CACHE_FILE
        if rehash or not path.is_file():
            return cls()
        try:
            rows = pq.read_table(path).cast(CACHE_SCHEMA).to_pylist()
        except Exception:  # noqa: BLE001 - a damaged cache (or one from before `transparent`) only costs a fresh check
            return cls()
        return cls(
            {
                (r["path"], r["bytes"], r["mtime_ns"]): (
                    r["sha256"],
                    r["width"],
                    r["height"],
                    r["mode"],
                    r["transparent"],
                )
                for r in rows
            }
        )

    def inspect(self, path: str) -> Found | str:
        """`_inspect_image`'s answer, from the cache while the file's size and time are unchanged."""
        try:
            key = (path, *storage.stat(path))
        except (OSError, ValueError):
            return _inspect_image(path)  # says what is wrong with the path
        result = self.known.get(key) or _inspect_image(path)
        if not isinstance(result, str):
            self.found[key] = result
        return result

    def save(self, run_folder: str | Path) -> None:
        rows = [
            {"path": p, "bytes": b, "mtime_ns": t, "sha256": h, "width": w, "height": ht, "mode": m, "transparent": a}
            for (p, b, t), (h, w, ht, m, a) in sorted(self.found.items())
        ]
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(rows, schema=CACHE_SCHEMA), sink)
        atomic_write_bytes(Path(run_folder) / CACHE_FILE, sink.getvalue().to_pybytes())


def declared_ids(table: Table) -> set[str]:
    """Every image_id a table of images names, its rows with problems included: what other tables may
    refer to without being called unknown."""
    return {image_id for row in table.rows if (image_id := cell_text(row, "image_id"))}


def check_images(
    table: Table, image_dir: str | Path, problems: Problems, cache: ImageCache | None = None, background: str = WHITE
) -> dict[str, CheckedImage]:
    """Every row's image, read and measured; `background` (#rrggbb, or `none` to refuse images with
    transparency) is the study's `data.background`."""
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
        path = storage.join(image_dir, cell_text(row, "file"))
        images[image_id] = CheckedImage(row.number, cell_text(row, "dataset"), path)
    if not table.rows:
        problems.add(table.file, "has no images")
    if not storage.is_folder(image_dir):
        # One problem for the folder, not one per image.
        problems.add(str(image_dir), "image folder not found", field="data.image_dir")
        return images
    # Reading and hashing release the GIL, and so does Pillow's decoder: threads keep thousands cheap.
    with ThreadPoolExecutor() as pool:
        results = list(pool.map((cache or ImageCache()).inspect, [im.path for im in images.values()]))
    for im, result in zip(images.values(), results):
        if isinstance(result, str):
            problems.add(table.file, result, row=im.row, field="file")
            continue
        im.sha256, im.width, im.height, im.mode, im.transparent = result
        if im.transparent and background == NO_BACKGROUND:
            problems.add(
                table.file,
                f"{im.path} has transparent pixels, and data.background is none: give a background "
                "(white, a colour name or #rrggbb) to composite them onto, or an image without transparency",
                row=im.row,
                field="file",
            )
    return images


def _inspect_image(path: str) -> Found | str:
    """(sha256 of the bytes, upright width, height, mode, whether it has transparent pixels) from one
    read and one full decode, or what is wrong."""
    problem = storage.file_problem(path)
    if problem is not None:
        return f"image file {problem}: {path}"
    try:
        data = storage.read_bytes(path)
    except OSError as exc:
        return f"cannot read image file {path}: {getattr(exc, 'strerror', None) or exc}"
    try:
        decoded = decode_image(io.BytesIO(data), path)
    except ImageDecodeError as exc:
        return str(exc)
    height, width = decoded.rgb.shape[:2]
    return hashlib.sha256(data).hexdigest(), width, height, decoded.mode, decoded.transparent


def images_table(images: dict[str, CheckedImage], background: str = WHITE) -> pa.Table:
    """The `images` table; `background`: what the images with transparency are composited onto."""
    ids = sorted(images)
    columns = {
        "image_id": ids,
        "dataset": [images[i].dataset for i in ids],
        "path": [images[i].path for i in ids],
        "sha256": [images[i].sha256 for i in ids],
        "width": [images[i].width for i in ids],
        "height": [images[i].height for i in ids],
        "mode": [images[i].mode for i in ids],
        "background": [background if images[i].transparent else None for i in ids],
    }
    return pa.table(columns, schema=IMAGES_SCHEMA)


def transparency_note(images: pa.Table) -> str:
    """What `validate` says of the images with transparency: how many, and what they are
    composited onto ("" when none has any)."""
    backgrounds = [b for b in images.column("background").to_pylist() if b is not None]
    if not backgrounds:
        return ""
    return (
        f"; {len(backgrounds)} of {images.num_rows} images have transparent pixels, composited onto "
        f"{', '.join(sorted(set(backgrounds)))} (data.background) before any model sees them"
    )


def metadata_table(table: Table, image_ids) -> pa.Table:
    """The `metadata` table: `image_id` and the user's own further columns of the images (Study A) or
    labels (Study B) table, as text, for the images that passed their checks, sorted by image_id."""
    keep = set(image_ids)
    rows = sorted((r for r in table.rows if cell_text(r, "image_id") in keep), key=lambda r: cell_text(r, "image_id"))
    columns = {"image_id": [cell_text(r, "image_id") for r in rows]}
    columns |= {c: [cell_text(r, c) for r in rows] for c in table.extra}
    return pa.table(columns, schema=pa.schema([(c, pa.string()) for c in columns]))


def check_group_by(group_by, table: Table, problems: Problems) -> None:
    """Every `analysis.group_by` variable is one of the table's own further columns."""
    for name in group_by:
        if name not in table.extra:
            have = ", ".join(table.extra) if table.extra else "none (it has only the columns the study reads)"
            problems.add(
                "study file",
                f"'{name}' is no metadata column of {table.name}; its metadata columns: {have}"
                + did_you_mean(name, table.extra),
                field="analysis.group_by",
            )
