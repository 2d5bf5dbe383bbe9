"""How the package writes Parquet: zstd, and Arrow's own list names (non-compliant), so a table reads
back exactly as written and its fingerprint can be checked from the file alone; columns of float
vectors are stored plain. Every Parquet file the package writes (the run folder's tables and parts,
the image cache, exports) goes through `writer_options`, here or through `table_bytes` and
`write_table`. And how a file too big to read whole is read: a row group at a time
(`file_batches`), the groups that may hold the rows wanted told from the footer (`column_ranges`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# Rows per row group the run folder's tables are written in, and read a batch at a time.
ROW_GROUP_ROWS = 65_536


def writer_options(schema: pa.Schema) -> dict[str, Any]:
    """Parquet writer options for a table of `schema`. Columns of float vectors are stored plain, with
    neither dictionary nor compression: neither makes them smaller, and both cost most of the time
    their writing and reading take (benchmarks/RESULTS.md)."""
    options: dict[str, Any] = {"compression": "zstd", "use_compliant_nested_type": False}
    raw = [f.name for f in schema if pa.types.is_list(f.type) and pa.types.is_floating(f.type.value_type)]
    if raw:
        options["compression"] = {name: "none" if name in raw else "zstd" for name in schema.names}
        options["use_dictionary"] = [name for name in schema.names if name not in raw]
    return options


def write_table(table: pa.Table, where, **options) -> None:
    """Write `table` to `where` (a path, or a binary file or stream open for writing) as the run
    folder's tables are written (`options`: more of `pyarrow.parquet.write_table`'s)."""
    pq.write_table(table, where, **writer_options(table.schema), **options)


def table_bytes(table: pa.Table, **options) -> bytes:
    """`table` as a Parquet file's bytes (`write_table`)."""
    sink = pa.BufferOutputStream()
    write_table(table, sink, **options)
    return sink.getvalue().to_pybytes()


def file_batches(
    path: Path,
    columns: list[str] | None = None,
    batch_size: int = ROW_GROUP_ROWS,
    row_groups: list[int] | None = None,
):
    """One Parquet file as record batches, a row group at a time (of `row_groups` only, where given)."""
    # No pre-buffering (it would cache the whole file) and no read-ahead: one row group at a time.
    source = pq.ParquetFile(path, pre_buffer=False)
    yield from source.iter_batches(batch_size=batch_size, row_groups=row_groups, columns=columns, use_threads=False)


def column_ranges(path: Path, columns: list[str]) -> list[dict[str, tuple[Any, Any] | None]] | None:
    """Each row group's least and greatest value of each of `columns`, from the file's footer
    alone (no row is read): None for a column it has no such statistics of, and in place of the
    list for a file whose footer cannot be read (a damaged part: whoever reads it says so)."""
    try:
        footer = pq.ParquetFile(path, pre_buffer=False).metadata
    except (OSError, pa.ArrowException):
        return None
    ranges = []
    for g in range(footer.num_row_groups):
        group = footer.row_group(g)
        stats = {group.column(j).path_in_schema: group.column(j).statistics for j in range(group.num_columns)}
        ranges.append(
            {
                c: (stats[c].min, stats[c].max) if stats.get(c) is not None and stats[c].has_min_max else None
                for c in columns
            }
        )
    return ranges
