"""Reading the user's tables (CSV or Parquet): rows with their spreadsheet numbers, so that every
problem can name the file, the row and the field. Nothing here knows what a table means."""

from __future__ import annotations

import csv
import io
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from vlm_decade.core.errors import Problems

# Bytes that are not UTF-8 survive decoding as lone surrogates (errors="surrogateescape"), so the
# CSV still parses and each bad cell can be named by row and column.
_UNDECODABLE = re.compile("[\udc80-\udcff]")


def regular_file_problem(path: str | Path) -> str | None:
    """Why `path` cannot be read as a file (missing, a folder, a FIFO, a device), or None.

    Opening a FIFO blocks until someone writes to it and a device can be endless, so both are
    refused from their file type before anything opens them."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "not found"
    except NotADirectoryError:
        return "not found (a part of the path is a file, not a folder)"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        return f"is {kind}, not a regular file"
    return None


@dataclass(frozen=True)
class Row:
    number: int  # as a spreadsheet shows it: the header is row 1
    cells: dict[str, str | list[str]]  # the required columns only; a Parquet list column stays a list


@dataclass(frozen=True)
class Table:
    file: str
    name: str  # the file name, for messages that point from one table to another
    rows: list[Row]


def read_table(path: Path, required: tuple[str, ...], problems: Problems, optional: tuple[str, ...] = ()) -> Table | None:
    """Rows of a CSV or Parquet table, or None (with problems added) when it cannot be used at all.
    `optional` columns are read when the table has them, and are empty cells when it does not."""
    kind = path.suffix.lower()
    if kind not in (".csv", ".parquet", ".pq"):
        problems.add(path, f"unsupported table format '{path.suffix}': use .csv or .parquet")
        return None
    problem = regular_file_problem(path)
    if problem is not None:
        problems.add(path, "file not found" if problem == "not found" else problem)
        return None
    try:
        raw = path.read_bytes()
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
