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


COMPARED_ROWS = 1 << 20  # `first_rows` compares this many neighbours at a time


def first_rows(keys: pa.Table, among: np.ndarray) -> np.ndarray:
    """For each row of `keys`, the index of the first row where `among` is true with the same values
    in every column of `keys`; -1 where there is none (and for a row with a null key). What
    `FirstRows` says of a table, at once. Found by a stable sort, not a hash join: a join of a table
    of millions of rows holds several times its keys."""
    n = keys.num_rows
    if n == 0:
        return np.full(0, -1, dtype=np.int64)
    null = np.zeros(n, bool)
    for column in keys.columns:
        null |= column.is_null().to_numpy(zero_copy_only=False)
    counted = among & ~null
    # Equal keys sort together, the rows counted first, each part in row order (the sort is stable).
    ranked = keys.append_column("_not_counted", pa.array(~counted))
    by = [*((c, "ascending") for c in keys.column_names), ("_not_counted", "ascending")]
    order = pc.sort_indices(ranked, sort_keys=by).to_numpy()
    del ranked
    starts = np.zeros(n, bool)
    starts[0] = True
    for column in keys.columns:
        # One array (a take from many chunks joins them each time), its neighbours in that order
        # compared a slice at a time: the column in that order is never held whole.
        values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        for begin in range(0, n - 1, COMPARED_ROWS):
            at = order[begin : begin + COMPARED_ROWS + 1]
            in_order = values.take(pa.array(at))
            differs = pc.not_equal(in_order.slice(1), in_order.slice(0, len(at) - 1))
            starts[begin + 1 : begin + len(at)] |= differs.fill_null(True).to_numpy(zero_copy_only=False)
        del values
    if starts.all():  # every key once (the usual case): each counted row is its own first
        return np.where(counted, np.arange(n, dtype=np.int64), -1)
    out = np.full(n, -1, dtype=np.int64)
    heads = order[starts]  # each key's first row in that order: its first counted row, if it has one
    firsts = np.where(counted[heads], heads, -1)
    del heads
    key = np.cumsum(starts, dtype=np.int32 if n < 2**31 else np.int64)  # each row's key's number, from 1
    key -= 1
    for begin in range(0, n, COMPARED_ROWS):  # a slice at a time: no third array of a number per row
        out[order[begin : begin + COMPARED_ROWS]] = firsts[key[begin : begin + COMPARED_ROWS]]
    out[null] = -1
    return out


def rows_in(keys: pa.Table, known: pa.Table) -> np.ndarray:
    """For each row of `keys`, whether `known` (the same columns) has a row with the same values."""
    indexed = keys.append_column("_row", pa.array(np.arange(keys.num_rows, dtype=np.int64)))
    distinct = known.group_by(known.column_names, use_threads=False).aggregate([])
    matched = indexed.join(distinct, keys.column_names, join_type="inner", use_threads=False).column("_row")
    out = np.zeros(keys.num_rows, dtype=bool)
    out[matched.to_numpy()] = True
    return out
