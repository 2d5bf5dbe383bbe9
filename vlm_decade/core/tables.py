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
from functools import cache, cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
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
    except ValueError:  # a NUL byte in the path
        return "is not a valid path (it holds a NUL byte)"
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


@cache
def _whitespace() -> str:
    """What Python's str.strip() takes off (cell_text strips so), for pyarrow.compute to take the
    same; found once, when first needed (a scan of every code point, kept off every import)."""
    return "".join(c for c in map(chr, range(0x110000)) if c.isspace())


def _text_bytes(values: pa.Array) -> int:
    """The bytes of a text array's values (the span of its offsets)."""
    if not len(values):
        return 0
    width = np.int64 if pa.types.is_large_string(values.type) else np.int32
    offsets = np.frombuffer(values.buffers()[1], width)
    return int(offsets[values.offset + len(values)] - offsets[values.offset])


# A blank line (Arrow reads it as a row of empty cells): a line ending (\r\n, \r or \n) followed by
# \r or \n, which is one of these pairs of bytes somewhere in the file (found by `in`, several
# times faster than a pattern).
_BLANK_PAIRS = (b"\n\n", b"\n\r", b"\r\r")
_CHUNK = 1 << 16  # rows the row-by-row CSV reader holds as Python objects before they become Arrow
_SCAN = 1 << 24  # bytes of a CSV file looked at a time, to choose its reader


@dataclass(frozen=True)
class Table:
    """A table's good rows as Arrow columns, each row with its spreadsheet number (`numbers`), so a
    table that grows with the images is never a Python object per row; `rows` is that for small ones."""

    file: str
    name: str  # the file name, for messages that point from one table to another
    columns: pa.Table  # the cells as read (text, a Parquet list column lists of text); a missing optional column: ""
    numbers: pa.Array  # int64: each row's spreadsheet number
    extra: tuple[str, ...] = ()  # with `extra=True`: the user's own further columns, in the file's order

    def __len__(self) -> int:
        return self.columns.num_rows

    @cached_property
    def rows(self) -> list[Row]:
        """The rows as Python objects: for the small tables (class names, votes, ratings, hand labels)."""
        records = self.columns.to_pylist()
        return [Row(number, cells) for number, cells in zip(self.numbers.to_pylist(), records)]

    def text(self, column: str) -> pa.ChunkedArray:
        """`cell_text` of every row: the cell stripped (a list joined with ';'), in the column's own
        chunks (the blocks it was read in: one array would be a copy of them all)."""
        values = self.columns.column(column)
        if pa.types.is_list(values.type):
            return pc.binary_join(values, ";")
        # A chunk at a time, kept as it is where trimming took nothing off (its bytes as many as
        # before): a column with nothing to strip is the column itself, not a copy of it. Trimming
        # and comparing is several times quicker than a pattern for space at either edge.
        chunks = []
        for chunk in values.chunks:
            trimmed = pc.utf8_trim(chunk, _whitespace())
            chunks.append(chunk if _text_bytes(trimmed) == _text_bytes(chunk) else trimmed)
        return pa.chunked_array(chunks, values.type)

    def blank(self, column: str) -> np.ndarray:
        """Where `column` is empty or only whitespace (a list: empty), as `cell_present` says."""
        values = self.columns.column(column)
        if pa.types.is_list(values.type):
            return pc.equal(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False)
        return pc.equal(pc.utf8_length(self.text(column)), 0).to_numpy(zero_copy_only=False)


def read_table(
    path: Path,
    required: tuple[str, ...],
    problems: Problems,
    optional: tuple[str, ...] = (),
    *,
    lists: tuple[str, ...] = (),
    numbers: tuple[str, ...] = (),
    flags: tuple[str, ...] = (),
    extra: bool = False,
) -> Table | None:
    """The good rows of a CSV or Parquet table, or None (with problems added) when it cannot be used at
    all. `optional` columns are read when the table has them, and are empty cells when it does not.
    `extra`: every further column (the user's metadata) is read too, as text, and named in `Table.extra`.

    A Parquet column must hold text or integers; those named in `lists` may also hold lists of them
    (a list cell stays a list), in `numbers` floats, in `flags` booleans (extra columns: any of the
    three but lists). Any other type is named."""
    kind = path.suffix.lower()
    if kind not in (".csv", ".parquet", ".pq"):
        problems.add(path, f"unsupported table format '{path.suffix}': use .csv or .parquet")
        return None
    problem = regular_file_problem(path)
    if problem is not None:
        problems.add(path, "file not found" if problem == "not found" else problem)
        return None
    try:
        # A CSV file's bytes are read by `_csv_columns`, which lets them go before Arrow parses the file.
        raw = path.read_bytes() if kind != ".csv" else None
        header = (_csv_header(path) if raw is None else _parquet_header(raw)) if extra else []
        named = set(required) | set(optional)
        others = tuple(dict.fromkeys(c for c in header if c and c not in named))
        optional = tuple(optional) + others
        if raw is None:
            read = _csv_columns(path, required, problems, optional)
        else:
            kinds: dict[str, tuple[str, ...]] = {c: ("numbers", "flags") for c in others}
            for allowed, columns in (("lists", lists), ("numbers", numbers), ("flags", flags)):
                for column in columns:
                    kinds[column] = kinds.get(column, ()) + (allowed,)
            read = _parquet_columns(path, raw, required, problems, optional, kinds)
    except OSError as exc:
        problems.add(path, f"cannot be read: {exc.strerror or exc}")
        return None
    if read is None:
        return None
    columns, row_numbers = read
    for column in optional:  # an optional column the file lacks: empty cells
        if column not in columns.column_names:
            columns = columns.append_column(column, pa.array([""] * columns.num_rows, pa.string()))
    return Table(str(path), path.name, columns.select([*required, *optional]), row_numbers, others)


def _csv_header(path: Path) -> list[str]:
    """A CSV file's column names, stripped, read from its first record only ([] when the file cannot
    be read as CSV: its reader says why)."""
    try:
        with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
            return [h.strip() for h in next(csv.reader(f), [])]
    except csv.Error:
        return []


def _parquet_header(raw: bytes) -> list[str]:
    """A Parquet file's column names ([] when it cannot be read: its reader says why)."""
    try:
        return list(pq.read_schema(pa.BufferReader(raw)).names)
    except Exception:  # noqa: BLE001 - a damaged file: _parquet_columns reports it
        return []


def _missing_columns(path: Path, header: list[str], required: tuple[str, ...], problems: Problems) -> bool:
    missing = [c for c in required if c not in header]
    for column in missing:
        problems.add(path, f"missing column '{column}' (required: {', '.join(required)})", row=1, field=column)
    return bool(missing)


def _csv_columns(
    path: Path, required: tuple[str, ...], problems: Problems, optional: tuple[str, ...] = ()
) -> tuple[pa.Table, pa.Array] | None:
    with open(path, "rb") as f:
        head = f.read(_SCAN)
    header_end = head.find(b"\n")
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in head[: header_end if header_end >= 0 else len(head)]:
        problems.add(path, "the file looks like UTF-16 (NUL bytes in the header): save it as UTF-8", row=1)
        return None
    header = _plain_header(head, required, optional) if (header_end >= 0 or len(head) < _SCAN) else None
    plain, nul = _scan_body(path) if header is not None else (False, True)
    if plain:  # Arrow's reader splits the rows as Python's would
        read = _arrow_csv(path, header, required, problems, optional, nul)
        if read is not None:
            return read
    return _python_csv(path, path.read_bytes(), required, problems, optional)


def _plain_header(head: bytes, required: tuple[str, ...], optional: tuple[str, ...]) -> list[str] | None:
    """The header (the first line of `head`, a file's first bytes) when it has nothing the
    row-by-row reader would say (clean UTF-8, each column named once), or None."""
    body = head[3:] if head.startswith(b"\xef\xbb\xbf") else head
    first = re.match(rb"[^\r\n]*", body).group()
    try:
        header = [h.strip() for h in first.decode("utf-8").split(",")]
    except UnicodeDecodeError:
        return None
    named = (*required, *(c for c in optional if c in header))
    if len(header) < 2 or any(header.count(c) > 1 for c in named) or any(c not in header for c in required):
        return None  # the header's problems are said there
    return header


def _scan_body(path: Path) -> tuple[bool, bool]:
    """Whether the file has no quote and no blank line (Arrow reads one as a row of empty cells),
    and, if so, whether it holds a NUL byte anywhere (if not, no cell does); scanned a block at a
    time (the file is never held whole)."""
    last, nul = b"", False  # a pair may straddle two blocks: the last byte of the one before
    with open(path, "rb") as f:
        while block := f.read(_SCAN):
            if b'"' in block or any(pair in block or pair == last + block[:1] for pair in _BLANK_PAIRS):
                return False, True
            nul = nul or b"\x00" in block
            last = block[-1:]
    return True, nul


def _arrow_csv(
    path: Path,
    header: list[str],
    required: tuple[str, ...],
    problems: Problems,
    optional: tuple[str, ...],
    nul: bool = True,
) -> tuple[pa.Table, pa.Array] | None:
    """The columns read by pyarrow.csv from a file with a `_plain_header` when every row is as long
    as the header and all UTF-8; else None, and `_python_csv` reads it and says what is wrong. Its
    cells are searched for NUL bytes only when the file holds one (`nul`). The
    file is read a block at a time, and the columns kept in those blocks' chunks: joined into one
    array each, the chunks and the copy were held at once, and the chunks' freed memory stayed in
    the memory pool (1.1 GB at a million images' descriptions)."""
    index = {c: header.index(c) for c in (*required, *(c for c in optional if c in header))}
    chunks: dict[str, list[pa.Array]] = {c: [] for c in index}
    try:
        reader = pacsv.open_csv(
            str(path),
            # One thread: what Arrow's pool threads allocate stays in their own heaps of the memory pool
            # after it is freed, which no `release_unused` gives back (0.8 KB per image of a study's input).
            read_options=pacsv.ReadOptions(
                column_names=[f"c{j}" for j in range(len(header))], skip_rows=1, use_threads=False
            ),
            parse_options=pacsv.ParseOptions(quote_char=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types={f"c{j}": pa.string() for j in index.values()},
                include_columns=[f"c{j}" for j in index.values()],
                strings_can_be_null=False,
            ),
            # The system allocator gives the parser's freed block buffers back; Arrow's default pool
            # kept them between the chunks it holds (0.3 GB at a million images' descriptions).
            memory_pool=pa.system_memory_pool(),
        )
        for batch in reader:
            for c, j in index.items():
                chunks[c].append(batch.column(f"c{j}"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    columns = pa.table({c: pa.chunked_array(chunks[c], pa.string()) for c in chunks})
    numbers = pa.array(np.arange(2, columns.num_rows + 2, dtype=np.int64))
    if nul:
        _nul_problems(path, columns, numbers, problems)
    return columns, numbers


def _nul_problems(path: Path, columns: pa.Table, numbers: pa.Array, problems: Problems) -> None:
    """A problem for each cell that holds a NUL byte, in row order (then the columns' order)."""
    found = []
    for j, column in enumerate(columns.column_names):
        values = columns.column(column)  # in its chunks: one array of them would be a copy
        if pa.types.is_list(values.type):
            values = values.combine_chunks()
            rows = pc.list_parent_indices(values).filter(pc.match_substring(pc.list_flatten(values), "\x00")).to_numpy()
        else:
            rows = np.flatnonzero(pc.match_substring(values, "\x00").to_numpy(zero_copy_only=False))
        found += [(i, j, column) for i in rows.tolist()]
    for i, _, column in sorted(set(found)):
        message = "contains a NUL byte (\\0), which no text may hold"
        problems.add(path, message, row=numbers[i].as_py(), field=column)


def _python_csv(
    path: Path, raw: bytes, required: tuple[str, ...], problems: Problems, optional: tuple[str, ...] = ()
) -> tuple[pa.Table, pa.Array] | None:
    """The row-by-row reader, for the files `_arrow_csv` leaves: it names every row's problem; the
    rows become Arrow a chunk at a time."""
    text = raw.decode("utf-8-sig", errors="surrogateescape")
    # Strict: a quote that never closes is an error, not a field that silently swallows the rest of
    # the file, and so is text after a closing quote.
    records = csv.reader(io.StringIO(text, newline=""), strict=True)
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
    repeated = sorted(c for c, n in Counter(header).items() if n > 1 and (c in required or c in optional))
    for column in repeated:
        problems.add(path, f"column '{column}' appears more than once", row=1, field=column)
    if _missing_columns(path, header, required, problems) or repeated:
        return None
    index = {c: header.index(c) for c in required + tuple(c for c in optional if c in header)}
    cells: dict[str, list[str]] = {c: [] for c in index}
    numbers: list[int] = []
    chunks: list[pa.Table] = []

    def flush() -> None:
        chunks.append(pa.table({c: pa.array(values, pa.string()) for c, values in cells.items()}))
        for values in cells.values():
            values.clear()

    number, line = 1, records.line_num  # the row (record) being read, and the last line read
    try:
        for record in records:
            number, first_line, line = number + 1, line + 1, records.line_num
            if not record:  # a blank line
                continue
            if len(record) != len(header):
                problems.add(
                    path, f"has {len(record)} fields but the header has {len(header)} (unquoted comma?)", row=number
                )
                continue
            if line > first_line and _swallowed_rows(path, record, header, number, first_line, line, problems):
                continue
            for column, j in index.items():
                value = record[j]
                if _UNDECODABLE.search(value):
                    problems.add(path, "not valid UTF-8 (save the file as UTF-8)", row=number, field=column)
                    value = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                if "\x00" in value:
                    problems.add(path, "contains a NUL byte (\\0), which no text may hold", row=number, field=column)
                cells[column].append(value)
            numbers.append(number)
            if len(numbers) % _CHUNK == 0:
                flush()
    except csv.Error as exc:
        if "unexpected end of data" in str(exc):
            message = (
                f"a quote opens in this row (which begins at line {line + 1}) and never closes: the rest "
                f"of the file, to line {records.line_num}, would be one field; close the quote"
            )
        else:
            message = (
                f'not valid CSV at line {records.line_num}: {exc} (a quote inside a quoted field is written twice: "")'
            )
        problems.add(path, message, row=number + 1)
        return None
    flush()
    return pa.concat_tables(chunks), pa.array(numbers, pa.int64())


def _swallowed_rows(
    path: Path, record: list[str], header: list[str], number: int, first_line: int, last_line: int, problems: Problems
) -> bool:
    """A quoted field may hold line breaks, but when the lines it took in look like rows of their own
    (as many fields as the header), a closing quote is missing: every row up to the next quote was
    swallowed. Says so (at the row where the quote opens) and returns True."""
    for j, value in enumerate(record):
        inner = value.splitlines()[1:]
        lookalikes = sum(1 for text in inner if len(next(csv.reader([text]), [])) == len(header))
        if lookalikes:
            problems.add(
                path,
                f"a quote opens in this row (which begins at line {first_line}) and closes only at line {last_line}, taking in "
                f"{lookalikes} line(s) that look like rows of their own: is a closing quote missing?",
                row=number,
                field=header[j],
            )
            return True
    return False


def _parquet_columns(
    path: Path,
    raw: bytes,
    required: tuple[str, ...],
    problems: Problems,
    optional: tuple[str, ...] = (),
    kinds: dict | None = None,
) -> tuple[pa.Table, pa.Array] | None:
    try:
        table = pq.read_table(pa.BufferReader(raw), use_threads=False)  # one thread, as `_arrow_csv` says
    except Exception as exc:  # noqa: BLE001 - pyarrow reports a damaged file with several exception types
        problems.add(path, f"not a readable Parquet file: {exc}")
        return None
    if _missing_columns(path, table.column_names, required, problems):
        return None
    columns = list(required) + [c for c in optional if c in table.column_names]
    wrong = [(c, _type_problem(table.schema.field(c).type, (kinds or {}).get(c, ()))) for c in columns]
    for column, problem in wrong:
        if problem:
            problems.add(path, f"column '{column}' {problem}", row=1, field=column)
    if any(problem for _, problem in wrong):
        return None
    cells = pa.table({c: _as_text(table.column(c).combine_chunks()) for c in columns})
    numbers = pa.array(np.arange(2, cells.num_rows + 2, dtype=np.int64))
    _nul_problems(path, cells, numbers, problems)
    return cells, numbers


def _type_problem(kind: pa.DataType, allowed: tuple[str, ...]) -> str | None:
    """Why a Parquet column of this type cannot be read as text cells, or None. Text and integers
    always can; floats, booleans and lists only where the caller says so (`numbers`, `flags`, `lists`):
    an id `1.0` or a list of ids joined into one would silently become another id."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    scalar = lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)  # noqa: E731
    if scalar(kind) or pa.types.is_null(kind):
        return None
    if "numbers" in allowed and (pa.types.is_floating(kind) or pa.types.is_decimal(kind)):
        return None
    if "flags" in allowed and pa.types.is_boolean(kind):
        return None
    if "lists" in allowed and (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and scalar(kind.value_type):
        return None
    expected = ["text", "integers"] + [
        {"numbers": "numbers", "flags": "true/false", "lists": "a list of text or integers"}[a] for a in allowed
    ]
    return f"has type {kind}: expected {', '.join(expected[:-1])} or {expected[-1]}"


def _as_text(values: pa.Array) -> pa.Array:
    """A Parquet column as `cell_present`/`cell_text` read it: a null is an empty cell, an integer its
    digits, a float or a flag as Python writes it, a list of text without its nulls."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    kind = values.type
    if pa.types.is_null(kind):
        return pa.array([""] * len(values), pa.string())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind):
        return pc.cast(values, pa.string()).fill_null("")
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        lists = [[] if v is None else [str(x) for x in v if x is not None] for v in values.to_pylist()]
        return pa.array(lists, pa.list_(pa.string()))
    return pa.array(["" if v is None else str(v) for v in values.to_pylist()], pa.string())


def cells_filled(row: Row, columns: tuple[str, ...]) -> bool:
    """Whether every one of `columns` is non-blank in `row` (`cell_present`, saying nothing)."""
    return all(_filled(row.cells[column]) for column in columns)


def _filled(value: str | list[str]) -> bool:
    return bool(value.strip() if isinstance(value, str) else value)


def cell_present(row: Row, table: Table, columns: tuple[str, ...], problems: Problems) -> bool:
    """Whether every one of `columns` is non-blank in `row` (adds a problem for each blank one)."""
    ok = True
    for column in columns:
        if not _filled(row.cells[column]):
            problems.add(table.file, f"'{column}' is empty", row=row.number, field=column)
            ok = False
    return ok


def cell_text(row: Row, column: str) -> str:
    value = row.cells[column]
    return ";".join(value) if isinstance(value, list) else value.strip()
