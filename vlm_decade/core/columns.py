"""Small column operations for tables that grow with the images, so stages hold Arrow arrays and
never a Python object per row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def first_per_key(table: pa.Table, key: str) -> pa.Table:
    """The first row of each run of equal `key` values in a table sorted by `key`."""
    if table.num_rows < 2:
        return table
    column = table.column(key).combine_chunks()
    changed = pc.not_equal(column.slice(1), column.slice(0, len(column) - 1))
    return table.filter(pa.concat_arrays([pa.array([True]), changed.fill_null(True)]))


def first_rows(keys: pa.Table, among: np.ndarray) -> np.ndarray:
    """For each row of `keys`, the index of the first row where `among` is true with the same values
    in every column of `keys`; -1 where there is none. What `FirstRows` says of a table, at once."""
    n = keys.num_rows
    indexed = keys.append_column("_row", pa.array(np.arange(n, dtype=np.int64)))
    firsts = indexed.filter(pa.array(among, pa.bool_())).group_by(keys.column_names, use_threads=False)
    joined = indexed.join(firsts.aggregate([("_row", "min")]), keys.column_names, use_threads=False)
    out = np.full(n, -1, dtype=np.int64)
    out[joined.column("_row").to_numpy()] = joined.column("_row_min").fill_null(-1).to_numpy()
    return out


def rows_in(keys: pa.Table, known: pa.Table) -> np.ndarray:
    """For each row of `keys`, whether `known` (the same columns) has a row with the same values."""
    indexed = keys.append_column("_row", pa.array(np.arange(keys.num_rows, dtype=np.int64)))
    distinct = known.group_by(known.column_names, use_threads=False).aggregate([])
    matched = indexed.join(distinct, keys.column_names, join_type="inner", use_threads=False).column("_row")
    out = np.zeros(keys.num_rows, dtype=bool)
    out[matched.to_numpy()] = True
    return out
