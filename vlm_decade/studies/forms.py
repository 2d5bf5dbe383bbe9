"""The data forms people keep, read as the tables of the CSV form (docs/data-format.md, docs/openworld-data.md).

A COCO-style captions JSON (Study A) becomes the images and descriptions tables; an image folder with
one folder per class (Study B) becomes the labels and class-names tables. Each reader checks what is
its form's own (the JSON's shape and entries, named by their JSON path such as
`annotations[17].caption`; an empty class folder, a folder the class list lacks) and hands on only
the entries that passed, as `core.tables.Table`s, so the studies' loaders run their usual checks and
every later stage is unchanged. A problem the shared checks find at a row of such a table is named
by what the row is in the form, a JSON path or an image's file (`name_rows`). Nothing is written. A
Hugging Face dataset, whose images are bytes in its rows, is `vlm_decade.studies.hfdata`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from vlm_decade.core.errors import Problems
from vlm_decade.core.tables import Table

# What a class folder's files must end with to be images (the others, e.g. a README, are left out).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def table(file: Path, columns: dict[str, list[str]], numbers: list[int], extra: tuple[str, ...] = ()) -> Table:
    """A Table of text columns whose row numbers are `numbers` (an entry's index, or a running count);
    `extra`: which of the columns are the user's metadata."""
    return Table(
        file=str(file),
        name=file.name,
        columns=pa.table({c: pa.array(v, pa.string()) for c, v in columns.items()}),
        numbers=pa.array(numbers, pa.int64()),
        extra=extra,
    )


# --- Study A: COCO-style captions JSON ---------------------------------------------------------------------


def _text(value) -> str:
    """A JSON id or name as text (COCO's ids are integers); None and containers are ''."""
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return ""
    return str(value).strip()


def coco_tables(path: Path, dataset: str, problems: Problems) -> tuple[Table, Table] | None:
    """The images (image_id, dataset, file) and descriptions (description_id, image_id, worker_id,
    condition, text) tables of a COCO captions JSON, or None with problems added when it cannot be
    read. Each caption is a `full` description; its worker is the annotation's `worker_id`, when it
    has one, else the caption's own id. Entries with problems are named by JSON path and left out."""
    try:
        document = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        problems.add(path, "file not found")
        return None
    except (OSError, ValueError) as exc:
        problems.add(path, f"cannot be read as JSON: {exc}")
        return None
    if not isinstance(document, dict):
        problems.add(path, "is not a COCO captions JSON: expected an object with `images` and `annotations`")
        return None
    lists = {}
    for key in ("images", "annotations"):
        entries = document.get(key)
        if not isinstance(entries, list):
            problems.add(path, f"{key}: {'missing' if entries is None else 'not a list'}")
        lists[key] = entries
    if any(not isinstance(v, list) for v in lists.values()):
        return None
    images = _coco_images(path, lists["images"], dataset, problems)
    descriptions = _coco_captions(path, lists["annotations"], set(images["image_id"]), problems)
    numbers = images.pop("number")
    kept = [lists["images"][n] for n in numbers]
    extra = _metadata_fields(kept)
    for field in extra:
        images[field] = [_cell(entry.get(field)) for entry in kept]
    return table(path, images, numbers, extra), table(path, descriptions, descriptions.pop("number"))


# An `images` entry's fields the images table reads, and the links to where the image lies online: no
# metadata (the image is read from `image_dir`; a link is the same for no two images, so groups nothing).
_READ_FIELDS = ("id", "file_name", "image_id", "dataset", "file")


def _metadata_fields(entries: list[dict]) -> tuple[str, ...]:
    """The further fields of the kept `images` entries, in the order they first appear: the images'
    metadata. Left out: the fields the table reads, URL fields (`url`, `*_url`: `coco_url`,
    `flickr_url`) and a field whose value is an object or a list in any entry (a metadata cell is one
    value)."""
    fields = dict.fromkeys(k for entry in entries for k in entry)
    nested = {k for entry in entries for k, v in entry.items() if isinstance(v, (dict, list))}
    return tuple(
        k for k in fields if k and k not in _READ_FIELDS and k not in nested and k != "url" and not k.endswith("_url")
    )


def _cell(value) -> str:
    """A metadata cell as the Parquet form gives it: text as it is, a number or true/false by Python's
    `str` (`3`, `0.5`, `True`), a field the entry lacks or null empty."""
    return "" if value is None else value if isinstance(value, str) else str(value)


def _coco_images(path: Path, entries: list, dataset: str, problems: Problems) -> dict[str, list]:
    columns: dict[str, list] = {"image_id": [], "dataset": [], "file": [], "number": []}
    first: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.add(path, f"images[{i}]: not an object")
            continue
        image_id, file = _text(entry.get("id")), _text(entry.get("file_name"))
        bad = [f"images[{i}].{k}: empty or missing" for k, v in (("id", image_id), ("file_name", file)) if not v]
        if image_id in first:
            bad.append(f"images[{i}].id: duplicate image id '{image_id}' (first at images[{first[image_id]}])")
        for message in bad:
            problems.add(path, message)
        if bad:
            continue
        first[image_id] = i
        for column, value in zip(columns, (image_id, dataset, file, i)):
            columns[column].append(value)
    if not entries:
        problems.add(path, "images: has no images")
    return columns


def _coco_captions(path: Path, entries: list, known: set[str], problems: Problems) -> dict[str, list]:
    names = ("description_id", "image_id", "worker_id", "condition", "text", "number")
    columns: dict[str, list] = {c: [] for c in names}
    first: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.add(path, f"annotations[{i}]: not an object")
            continue
        ids = {k: _text(entry.get(k)) for k in ("id", "image_id")}
        caption = entry.get("caption")
        text = caption.strip() if isinstance(caption, str) else ""
        bad = [f"annotations[{i}].{k}: empty or missing" for k, v in ids.items() if not v]
        if not text:
            bad.append(f"annotations[{i}].caption: empty")
        if ids["id"] in first:
            bad.append(
                f"annotations[{i}].id: duplicate caption id '{ids['id']}' (first at annotations[{first[ids['id']]}])"
            )
        elif ids["image_id"] and ids["image_id"] not in known:
            bad.append(f"annotations[{i}].image_id: unknown image id '{ids['image_id']}' (not in `images`)")
        for message in bad:
            problems.add(path, message)
        if bad:
            continue
        first[ids["id"]] = i
        worker = _text(entry.get("worker_id")) or ids["id"]
        for column, value in zip(names, (ids["id"], ids["image_id"], worker, "full", text, i)):
            columns[column].append(value)
    return columns


def name_rows(
    problems: Problems, file: Path, where: Callable[[int, str | None], str], *, as_file: bool = False
) -> None:
    """Name the problems the shared checks found at a row of a form's table by what the row is in the
    form (`where(row, field)`): a JSON path such as `images[3].file_name` before the message, or with
    `as_file`, an image's file in place of the form's."""
    items = []
    for p in problems.items:
        if p.file == str(file) and p.row is not None:
            named = where(p.row, p.field)
            message = p.message if as_file else f"{named}: {p.message}"
            p = replace(p, file=named if as_file else p.file, message=message, row=None, field=None)
        items.append(p)
    problems.items = items


def json_path(array: str, fields: dict[str, str]) -> Callable[[int, str | None], str]:
    """`name_rows`' namer for a JSON array: `array[row].key` (`fields`: the table's column -> the entry's key)."""
    return lambda row, field: f"{array}[{row}]" + (f".{fields.get(field, field)}" if field else "")


# --- Study B: an image folder, one folder per class ------------------------------------------------------


def folder_tables(
    root: Path, dataset: str, granularity: str, problems: Problems, classes: list[str] | None = None
) -> tuple[Table, Table] | None:
    """The labels (image_id, dataset, file, label, granularity) and class-names (dataset, class_name)
    tables of an image folder whose subfolders are the classes: an image's id is its path under the
    folder without its suffix, its label its folder's name. The class list is the folder names,
    sorted, or `classes` (a class-names table's list) when given, which must name every folder. None,
    with problems added, when the folder cannot be used."""
    root = Path(root)
    if not root.is_dir():
        problems.add(root, "image folder not found", field="data.image_folder")
        return None
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        problems.add(root, "has no class folders (one folder per class, its images inside)")
        return None
    # `accepted`: a folder names no alternatives to its class (the labels table's optional column, empty).
    labels: dict[str, list[str]] = {c: [] for c in ("image_id", "dataset", "file", "label", "granularity", "accepted")}
    for folder in folders:
        if classes is not None and folder.name not in classes:
            problems.add(folder, f"class folder '{folder.name}' is not in the class list of dataset '{dataset}'")
            continue
        files = sorted(
            p.relative_to(root).as_posix()
            for p in folder.rglob("*")
            if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
        )
        if not files:
            problems.add(folder, f"class folder '{folder.name}' has no images ({', '.join(IMAGE_SUFFIXES)})")
        for file in files:
            for column, value in zip(labels, (file.rsplit(".", 1)[0], dataset, file, folder.name, granularity, "")):
                labels[column].append(value)
    names = [f.name for f in folders] if classes is None else classes
    class_table = table(root, {"dataset": [dataset] * len(names), "class_name": names}, list(range(len(names))))
    return table(root, labels, list(range(len(labels["file"])))), class_table
