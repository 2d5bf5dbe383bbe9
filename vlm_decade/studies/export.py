"""What both studies' exports share (`vlm-decade export`): a DuckDB connection over a run folder's
Parquet tables, the user's metadata columns joined by image_id (each by its own name, or
`metadata:<name>` where the export has a column of that name already), and how the tidy table is
written (Parquet, or CSV made spreadsheet-safe by the one CSV writer). Each study's `export` module
says what its table holds."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.files import atomic_write_bytes
from vlm_decade.core.parquet import table_bytes
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.report.html import write_csv

FORMATS = ("parquet", "csv")


def identifier(name: str) -> str:
    """`name` as a DuckDB identifier, whatever it holds (a metric named by the user)."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def connect(folder: RunFolder, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one view per table of the run folder; a required table the run has not
    written yet is an InputError naming its file (every missing one together)."""
    missing = [name for name in required if not folder.has(name)]
    if missing:
        raise InputError(
            [
                Problem(str(folder.table_path(n)), "missing: the run has not written it yet (run the study first)")
                for n in missing
            ]
        )
    # Parquet reading is built in; DuckDB must not fetch extensions from the network on its own.
    connection = duckdb.connect(
        ":memory:", config={"threads": 2, "autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    for name in required + tuple(n for n in optional if folder.has(n)):
        path = folder.table_path(name)
        try:
            connection.execute(f"CREATE VIEW {identifier(name)} AS SELECT * FROM read_parquet({literal(str(path))})")
        except duckdb.Error as exc:
            raise InputError([Problem(str(path), f"not a readable Parquet table: {exc}")]) from None
    return connection


def columns(connection: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [row[0] for row in connection.execute(f"DESCRIBE {identifier(table)}").fetchall()]


METADATA = "metadata"
METADATA_PREFIX = "metadata:"  # a metadata column whose name the export already has


def metadata_columns(connection: duckdb.DuckDBPyConnection, taken: Collection[str]) -> tuple[str, str]:
    """The user's metadata columns (the run's `metadata` table, joined by image_id) as a select list
    and its join: each by its own name, in the table's order, or `metadata:<name>` where `taken` (the
    export's other columns) or an earlier metadata column has that name. A run folder without the
    table (written before it was kept) gives neither."""
    if not connection.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [METADATA]).fetchall()[0][0]:
        return "", ""
    named = set(taken)
    select = ""
    for source in columns(connection, METADATA):
        if source == "image_id":
            continue
        name = source
        while name in named:
            name = METADATA_PREFIX + name
        named.add(name)
        select += f", m.{identifier(source)} AS {identifier(name)}"
    return select, "LEFT JOIN metadata m ON m.image_id = r.image_id"


def joined_lists(table: pa.Table) -> pa.Table:
    """`table` with each list column as text, its items joined by `|` (as a labels table's
    `accepted` is written in CSV): a CSV cell holds no list."""
    for i, field in enumerate(table.schema):
        if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
            items = table.column(i).cast(pa.list_(pa.string()))
            table = table.set_column(i, field.name, pc.binary_join(items, "|"))
    return table


def write_export(table: pa.Table, path: Path, fmt: str) -> None:
    """The export at `path`, whole or not at all: Parquet as the run's tables are written, or CSV."""
    if fmt == "csv":
        write_csv(joined_lists(table), path)
    else:
        atomic_write_bytes(path, table_bytes(table))
