"""Study A's input: read and check the images, human descriptions and votes, and rank the descriptions.

`load_study_data` reads the three tables of docs/data-format.md, decodes every image once, and checks
everything before it ranks anything: all problems (file, spreadsheet row, field) come back together
as one InputError. It writes nothing. The result is the `images` and `references` tables of the run
folder (DESIGN.md) and, per dataset, which ranking method was used ("votes" or "consensus").
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError

from .config import DataConfig, MaskConfig, RankingConfig
from .errors import Problems
from .masks import mask_ids
from .ranking import rank_by_consensus, rank_by_votes

IMAGE_COLUMNS = ("image_id", "dataset", "file")
DESCRIPTION_COLUMNS = ("description_id", "image_id", "worker_id", "condition", "text")
VOTE_COLUMNS = ("image_id", "rater_id", "trial", "shown", "chosen")

FULL = "full"
MASKED = "masked"
VOTES, CONSENSUS = "votes", "consensus"

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
REFERENCES_SCHEMA = pa.schema(
    [
        ("description_id", pa.string()),
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("condition", pa.string()),
        ("worker_id", pa.string()),
        ("role", pa.string()),
        ("votes", pa.int64()),
        ("shown", pa.int64()),
        ("text", pa.string()),
    ]
)

# Bytes that are not UTF-8 survive decoding as lone surrogates (errors="surrogateescape"), so the
# CSV still parses and each bad cell can be named by row and column.
_UNDECODABLE = re.compile("[\udc80-\udcff]")


@dataclass(frozen=True)
class StudyData:
    """Study A's checked input: the run folder's `images` and `references` tables (docs/data-format.md)."""

    images: pa.Table
    references: pa.Table
    ranking_method: dict[str, str]  # dataset -> "votes" | "consensus"
    ratings: pa.Table | None = None  # human similarity ratings, when the study has them (metric_validation)
    hand_labels: pa.Table | None = None  # hand error labels, when the study has them (taxonomy)


@dataclass(frozen=True)
class Row:
    number: int  # as a spreadsheet shows it: the header is row 1
    cells: dict[str, str | list[str]]  # the required columns only; a Parquet list column stays a list


@dataclass(frozen=True)
class Table:
    file: str
    name: str  # the file name, for messages that point from one table to another
    rows: list[Row]


def load_study_data(data: DataConfig, ranking: RankingConfig, masks: MaskConfig) -> StudyData:
    """Read, check and rank Study A's input; every problem is raised together as one InputError."""
    problems = Problems()
    images_t = read_table(Path(data.images), IMAGE_COLUMNS, problems)
    descriptions_t = read_table(Path(data.descriptions), DESCRIPTION_COLUMNS, problems)
    votes_t = read_table(Path(data.votes), VOTE_COLUMNS, problems) if data.votes is not None else None

    images = descriptions = None
    if images_t is not None:
        images = check_images(images_t, Path(data.image_dir), problems)
    if descriptions_t is not None:
        descriptions = _check_descriptions(descriptions_t, images, [FULL, *mask_ids(masks)], problems)
    if images is not None and descriptions is not None:
        _check_every_image_has_full(images_t, images, descriptions, descriptions_t.name, problems)
    tally = _Tally()
    if votes_t is not None and images is not None and descriptions is not None:
        declared = {cell_text(row, "description_id") for row in descriptions_t.rows}
        tally = _check_votes(votes_t, images, descriptions, declared, problems)
    methods = _ranking_methods(images, tally, votes_t, problems) if images is not None else {}
    problems.raise_if_any()

    return StudyData(
        images=images_table(images),
        references=_references_table(images, descriptions, tally, methods, ranking),
        ranking_method=methods,
    )


# --- reading tables --------------------------------------------------------------------------------


def read_table(path: Path, required: tuple[str, ...], problems: Problems, optional: tuple[str, ...] = ()) -> Table | None:
    """Rows of a CSV or Parquet table, or None (with problems added) when it cannot be used at all.
    `optional` columns are read when the table has them, and are empty cells when it does not."""
    kind = path.suffix.lower()
    if kind not in (".csv", ".parquet", ".pq"):
        problems.add(path, f"unsupported table format '{path.suffix}': use .csv or .parquet")
        return None
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        problems.add(path, "file not found")
        return None
    except IsADirectoryError:
        problems.add(path, "is a folder, not a table file")
        return None
    except OSError as exc:
        problems.add(path, f"cannot be read: {exc.strerror or exc}")
        return None
    reader = _csv_rows if kind == ".csv" else _parquet_rows
    rows = reader(path, raw, required, problems, optional)
    return None if rows is None else Table(str(path), path.name, rows)


def _missing_columns(path: Path, header: list[str], required: tuple[str, ...], problems: Problems) -> bool:
    missing = [c for c in required if c not in header]
    for column in missing:
        problems.add(path, f"missing column '{column}' (required: {', '.join(required)})", row=1, field=column)
    return bool(missing)


def _csv_rows(path: Path, raw: bytes, required: tuple[str, ...], problems: Problems, optional: tuple[str, ...] = ()) -> list[Row] | None:
    text = raw.decode("utf-8-sig", errors="surrogateescape")
    records = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(records, None)
    except csv.Error as exc:
        problems.add(path, f"not a valid CSV header: {exc}", row=1)
        return None
    if header is None:
        problems.add(path, f"empty file: expected a header with {', '.join(required)}", row=1)
        return None
    header = [h.strip() for h in header]
    if any(_UNDECODABLE.search(h) for h in header):
        problems.add(path, "header is not valid UTF-8 (save the file as UTF-8)", row=1)
    repeated = sorted(c for c, n in Counter(header).items() if n > 1 and c in required)
    for column in repeated:
        problems.add(path, f"column '{column}' appears more than once", row=1, field=column)
    if _missing_columns(path, header, required, problems) or repeated:
        return None
    index = {c: header.index(c) for c in required + tuple(c for c in optional if c in header)}
    rows = []
    number = 1
    try:
        for record in records:
            number += 1
            if not record:  # a blank line
                continue
            if len(record) != len(header):
                problems.add(
                    path, f"has {len(record)} fields but the header has {len(header)} (unquoted comma?)", row=number
                )
                continue
            cells = {}
            for column, j in index.items():
                value = record[j]
                if _UNDECODABLE.search(value):
                    problems.add(path, "not valid UTF-8 (save the file as UTF-8)", row=number, field=column)
                    value = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                cells[column] = value
            rows.append(Row(number, {c: "" for c in optional} | cells))
    except csv.Error as exc:
        problems.add(path, f"not valid CSV: {exc}", row=number)
        return None
    return rows


def _parquet_rows(path: Path, raw: bytes, required: tuple[str, ...], problems: Problems, optional: tuple[str, ...] = ()) -> list[Row] | None:
    try:
        table = pq.read_table(pa.BufferReader(raw))
    except Exception as exc:  # pyarrow reports a damaged file with several exception types
        problems.add(path, f"not a readable Parquet file: {exc}")
        return None
    if _missing_columns(path, table.column_names, required, problems):
        return None
    rows = table.select(list(required) + [c for c in optional if c in table.column_names]).to_pylist()
    return [Row(n, {c: "" for c in optional} | {c: _cell(v) for c, v in r.items()}) for n, r in enumerate(rows, start=2)]


def _cell(value) -> str | list[str]:
    if value is None:
        return ""
    if isinstance(value, list):
        return [str(v) for v in value if v is not None]
    return str(value)


def cell_present(row: Row, table: Table, columns: tuple[str, ...], problems: Problems) -> bool:
    """Whether every one of `columns` is non-blank in `row` (adds a problem for each blank one)."""
    ok = True
    for column in columns:
        value = row.cells[column]
        if not (value.strip() if isinstance(value, str) else value):
            problems.add(table.file, f"'{column}' is empty", row=row.number, field=column)
            ok = False
    return ok


def cell_text(row: Row, column: str) -> str:
    value = row.cells[column]
    return ";".join(value) if isinstance(value, list) else value.strip()


# --- images ----------------------------------------------------------------------------------------


@dataclass
class _Image:
    row: int
    dataset: str
    path: str
    sha256: str = ""
    width: int = 0
    height: int = 0


def check_images(table: Table, image_dir: Path, problems: Problems) -> dict[str, _Image]:
    images: dict[str, _Image] = {}
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
        images[image_id] = _Image(row.number, cell_text(row, "dataset"), path)
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


# --- descriptions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Description:
    row: int
    image_id: str
    worker_id: str
    condition: str
    text: str


def _check_descriptions(
    table: Table, images: dict[str, _Image] | None, conditions: list[str], problems: Problems
) -> dict[str, _Description]:
    descriptions: dict[str, _Description] = {}
    for row in table.rows:
        ids_ok = cell_present(row, table, ("description_id", "image_id", "worker_id", "condition"), problems)
        text = cell_text(row, "text")
        if not text:
            problems.add(table.file, "'text' is empty or only whitespace", row=row.number, field="text")
        if not ids_ok:
            continue
        description_id, image_id, condition = (cell_text(row, c) for c in ("description_id", "image_id", "condition"))
        if description_id in descriptions:
            problems.add(
                table.file,
                f"duplicate description_id '{description_id}' (first at row {descriptions[description_id].row})",
                row=row.number,
                field="description_id",
            )
            continue
        ok = True
        if images is not None and image_id not in images:
            problems.add(
                table.file, f"unknown image_id '{image_id}' (not in the images table)", row=row.number, field="image_id"
            )
            ok = False
        if condition not in conditions:
            problems.add(
                table.file,
                f"unknown condition '{condition}': expected one of {', '.join(conditions)}",
                row=row.number,
                field="condition",
            )
            ok = False
        if ok:
            descriptions[description_id] = _Description(row.number, image_id, cell_text(row, "worker_id"), condition, text)
    return descriptions


def _check_every_image_has_full(
    table: Table, images: dict[str, _Image], descriptions: dict[str, _Description], source: str, problems: Problems
) -> None:
    with_full = {d.image_id for d in descriptions.values() if d.condition == FULL}
    for image_id, im in images.items():
        if image_id not in with_full:
            message = f"image '{image_id}' has no 'full' description in {source}"
            problems.add(table.file, message, row=im.row, field="image_id")


# --- votes -----------------------------------------------------------------------------------------


@dataclass
class _Tally:
    """Per description: times chosen best and times shown, counting only votes for its own image."""

    votes: Counter = field(default_factory=Counter)
    shown: Counter = field(default_factory=Counter)
    images_with_votes: set[str] = field(default_factory=set)


def _check_votes(
    table: Table,
    images: dict[str, _Image],
    descriptions: dict[str, _Description],
    declared: set[str],
    problems: Problems,
) -> _Tally:
    """Check each vote and tally the good ones.

    `declared` holds every id in the descriptions table, `descriptions` only the rows that passed their
    checks: a vote naming a rejected description is not counted, but is not reported again either.
    """
    tally = _Tally()
    seen: dict[tuple[str, str, str], int] = {}
    for row in table.rows:
        if not cell_present(row, table, VOTE_COLUMNS, problems):
            continue
        errors: list[tuple[str, str]] = []  # (field, message) for this row
        image_id, chosen = cell_text(row, "image_id"), cell_text(row, "chosen")
        key = (image_id, cell_text(row, "rater_id"), cell_text(row, "trial"))
        shown = _shown_ids(row.cells["shown"])
        own = [d for d in shown if d in descriptions and descriptions[d].image_id == image_id]
        if image_id not in images:
            errors.append(("image_id", f"unknown image_id '{image_id}' (not in the images table)"))
        elif key in seen:
            message = f"duplicate vote: rater '{key[1]}', trial '{key[2]}' on image '{image_id}'"
            errors.append(("trial", f"{message} (first at row {seen[key]})"))
        else:
            seen[key] = row.number
            if not shown:
                errors.append(("shown", "'shown' lists no description ids"))
            for description_id, n in Counter(shown).items():
                if description_id not in declared:
                    errors.append(("shown", f"unknown description id '{description_id}' in 'shown'"))
                elif n > 1:
                    errors.append(("shown", f"'shown' lists '{description_id}' {n} times"))
            if shown and not own and all(d in descriptions for d in shown):
                errors.append(("shown", f"'shown' has no description of image '{image_id}'"))
            if chosen not in declared:
                errors.append(("chosen", f"unknown description id '{chosen}' in 'chosen'"))
            elif chosen not in shown:
                errors.append(("chosen", f"chosen '{chosen}' is not among the shown descriptions"))
        for column, message in errors:
            problems.add(table.file, message, row=row.number, field=column)
        if errors or not all(d in descriptions for d in (*shown, chosen)):
            continue
        tally.shown.update(own)
        # A distractor (another image's description) chosen as best counts for nothing.
        if descriptions[chosen].image_id == image_id:
            tally.votes[chosen] += 1
        if any(descriptions[d].condition == FULL for d in own):
            tally.images_with_votes.add(image_id)
    return tally


def _shown_ids(value: str | list[str]) -> list[str]:
    parts = value if isinstance(value, list) else value.split(";")
    return [p.strip() for p in parts if p.strip()]


def _ranking_methods(
    images: dict[str, _Image], tally: _Tally, votes_t: Table | None, problems: Problems
) -> dict[str, str]:
    """Per dataset: "votes" if every image has votes, "consensus" if none has; a mix is a problem."""
    by_dataset: dict[str, list[str]] = defaultdict(list)
    for image_id, im in images.items():
        by_dataset[im.dataset].append(image_id)
    methods = {}
    for dataset in sorted(by_dataset):
        without = sorted(i for i in by_dataset[dataset] if i not in tally.images_with_votes)
        if not without:
            methods[dataset] = VOTES
        elif len(without) == len(by_dataset[dataset]):
            methods[dataset] = CONSENSUS
        else:
            problems.add(
                votes_t.file,
                f"dataset '{dataset}' has votes for some images but none showing a 'full' description of "
                f"{len(without)} image(s): {', '.join(without)}",
                field="image_id",
            )
    return methods


# --- output tables ---------------------------------------------------------------------------------


def images_table(images: dict[str, _Image]) -> pa.Table:
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


def _references_table(
    images: dict[str, _Image],
    descriptions: dict[str, _Description],
    tally: _Tally,
    methods: dict[str, str],
    cfg: RankingConfig,
) -> pa.Table:
    by_image: dict[str, list[str]] = defaultdict(list)
    for description_id, d in descriptions.items():
        by_image[d.image_id].append(description_id)
    roles: dict[str, str] = {}
    for image_id, ids in by_image.items():
        full = sorted(i for i in ids if descriptions[i].condition == FULL)
        if methods[images[image_id].dataset] == VOTES:
            roles.update(rank_by_votes(full, tally.votes, tally.shown, cfg.top_k, cfg.bottom_k))
        else:
            texts = [descriptions[i].text for i in full]
            roles.update(rank_by_consensus(full, texts, cfg.top_k, cfg.bottom_k))
    order = sorted(descriptions, key=lambda i: (descriptions[i].image_id, descriptions[i].condition, i))
    columns = {
        "description_id": order,
        "image_id": [descriptions[i].image_id for i in order],
        "dataset": [images[descriptions[i].image_id].dataset for i in order],
        "condition": [descriptions[i].condition for i in order],
        "worker_id": [descriptions[i].worker_id for i in order],
        "role": [roles.get(i, MASKED) for i in order],
        "votes": [tally.votes[i] for i in order],
        "shown": [tally.shown[i] for i in order],
        "text": [descriptions[i].text for i in order],
    }
    return pa.table(columns, schema=REFERENCES_SCHEMA)
