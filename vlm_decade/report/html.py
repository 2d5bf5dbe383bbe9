"""The report pages' parts: the one Jinja environment they are rendered with (autoescaping on, the
shared macros of `report/templates/` beside a study's own templates), tables from Arrow as cells,
and the one CSV writer (the CSV copies the pages link, the export), whose text cells a spreadsheet
cannot evaluate."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from markupsafe import Markup

from vlm_decade.core.files import atomic_file, atomic_write_bytes
from vlm_decade.core.progress import counted
from vlm_decade.core.reuse import INPUTS
from vlm_decade.core.runfolder import RunFolder

TEMPLATES = Path(__file__).parent / "templates"
STYLE = Markup("""
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:0.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}.demo{background:#fff3cd;border:1px solid #e0b400;padding:0.8em 1em;border-radius:4px}
.failed{background:#fde2e1;border:1px solid #c0392b;padding:0.8em 1em;border-radius:4px}.note{color:#555;font-size:14px}img{max-width:100%}
""")


@dataclass(frozen=True)
class Grid:
    """A table's header and its cells' texts, as a page shows them (the `table` macro)."""

    head: list[str]
    rows: list[list[str]]


def cell_text(value) -> str:
    """A cell's default text: floats to three decimals, a null (an estimate a budget stop left out) empty."""
    return "" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))


def grid(table: pa.Table, columns: list[str], formats: dict[str, Callable] | None = None) -> Grid:
    """`columns` of `table`; `formats[column](value, row)` gives a cell's text (else `cell_text`)."""
    formats = formats or {}
    rows = [
        [formats[c](row[c], row) if c in formats else cell_text(row[c]) for c in columns]
        for row in table.select(columns).to_pylist()
    ]
    return Grid(list(columns), rows)


@cache
def environment(folder: Path | None = None) -> jinja2.Environment:
    """Templates of `folder` (a study's), then the shared ones; every value is escaped unless it is Markup."""
    folders = [str(f) for f in (folder, TEMPLATES) if f is not None]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folders), autoescape=True, undefined=jinja2.StrictUndefined)
    env.globals["style"] = STYLE
    env.filters["counted"] = counted
    return env


def render(folder: Path | None, name: str, **context) -> Markup:
    """Template `name` (of `folder`, else shared) rendered with `context`."""
    return Markup(environment(folder).get_template(name).render(**context))


def write_page(path: Path, page: str) -> None:
    atomic_write_bytes(path, page.encode("utf-8"))


# A spreadsheet evaluates a cell whose text begins with one of these (`=HYPERLINK(...)`, `+1+cmd|...`,
# `@SUM(...)`; a leading tab or carriage return hides one): such a text cell gets a leading single quote,
# which spreadsheets show as text and do not evaluate. Text is text whatever it looks like, so "-3" in
# a text column is prefixed too; number columns are numbers and are written as they are.
_FORMULA_START = r"^([=+\-@\t\r])"


def spreadsheet_safe(table: pa.Table) -> pa.Table:
    """`table` with every text cell that a spreadsheet would evaluate prefixed with `'` (other columns as they are)."""
    columns = []
    for column in table.columns:
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        # Found first, replaced only where found: most columns hold no such cell, and finding is
        # a fifth of the cost of replacing (a million rows' CSVs are written on every run).
        text = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        if text and pc.any(pc.match_substring_regex(column, pattern=_FORMULA_START)).as_py():
            column = pc.replace_substring_regex(column, pattern=_FORMULA_START, replacement="'\\1")
        columns.append(column)
    return pa.table(columns, names=table.column_names)


CSV_ROWS = 65_536  # rows made safe and written at a time, so a CSV of any size is never held whole


def write_csv(table: pa.Table, path: Path) -> None:
    """`table` as CSV at `path`, made `spreadsheet_safe`: every CSV the package writes is written here."""
    _write_csv(table.schema, (table.slice(start, CSV_ROWS) for start in range(0, table.num_rows, CSV_ROWS)), path)


def _write_csv(schema: pa.Schema, parts, path: Path) -> None:
    with atomic_file(path) as fh, pacsv.CSVWriter(fh, spreadsheet_safe(schema.empty_table()).schema) as writer:
        for part in parts:
            writer.write_table(spreadsheet_safe(part))


def write_csvs(run: RunFolder, tables: Mapping[str, pa.Table], names: tuple[str, ...]) -> tuple[str, ...]:
    """Write `tables/<name>.csv` in the run folder for each name, without the run's own bookkeeping
    (a row's inputs hash): from `tables`, or for a name it lacks streamed from the run folder's
    table `CSV_ROWS` rows at a time; the names, for the page's `csv_note`."""
    for name in names:
        path = run.root / "tables" / f"{name}.csv"
        if name in tables:
            table = tables[name]
            write_csv(table.drop_columns([INPUTS]) if INPUTS in table.column_names else table, path)
            continue
        stored = run.schema(name)
        columns = [c for c in stored.names if c != INPUTS]
        schema = pa.schema([stored.field(c) for c in columns])
        batches = run.batches(name, columns=columns, batch_size=CSV_ROWS)
        _write_csv(schema, (pa.Table.from_batches([b]).select(columns) for b in batches), path)
    return names
