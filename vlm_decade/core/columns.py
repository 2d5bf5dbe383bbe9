"""Small column operations for tables that grow with the images, so stages hold Arrow arrays and
never a Python object per row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def first_per_key(table: pa.Table, key: str) -> pa.Table:
    """The first row of each run of equal `key` values in a table sorted by `key`."""
    if table.num_rows < 2:
        return table
    column = table.column(key).combine_chunks()
    changed = pc.not_equal(column.slice(1), column.slice(0, len(column) - 1))
    return table.filter(pa.concat_arrays([pa.array([True]), changed.fill_null(True)]))
