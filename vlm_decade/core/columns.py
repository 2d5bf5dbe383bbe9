"""Small column operations for tables that grow with the images, so stages hold Arrow arrays and
never a Python object per row."""

from __future__ import annotations

import hashlib
import json
import threading
from functools import cache
from json.encoder import encode_basestring_ascii

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# What Python's `str.strip()` removes: exactly the characters that `str.isspace()` is true of.
PYTHON_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# A string with one of these characters is escaped by `json.dumps` (with ensure_ascii, every
# character past ASCII too); one without is written as it is, between quotes.
_JSON_ESCAPED = {True: r"[^\x20-\x21\x23-\x5b\x5d-\x7e]", False: r'[\x00-\x1f"\\]'}


def stripped(texts: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Each text as `str.strip()` leaves it, on the column (nulls stay null)."""
    return pc.utf8_trim(texts, characters=PYTHON_WHITESPACE)


# Where DuckDB hashes a column faster than hashlib's loop over its bytes: many short strings, on
# every core (benchmarks/column_hashing.py: texts of 64 bytes about twice as fast; of 540 bytes, a
# cache key's payload, no faster for more CPU); each DuckDB call costs a few milliseconds.
DUCKDB_MIN_ROWS, DUCKDB_MAX_MEAN_BYTES = 20_000, 256


def sha256_hex(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each string's sha256 (of its UTF-8) in hex, as `hashlib.sha256(s.encode()).hexdigest()`
    gives it; null stays null. No Python string is made of a value: many short strings are hashed
    by DuckDB over the whole column on every core, others by hashlib from the column's own bytes."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not len(values):
        return pa.array([], pa.string())
    _, offsets, data = values.buffers()
    width = np.int64 if pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type) else np.int32
    bounds = np.frombuffer(offsets, width)[values.offset : values.offset + len(values) + 1]
    if len(values) >= DUCKDB_MIN_ROWS and bounds[-1] - bounds[0] <= DUCKDB_MAX_MEAN_BYTES * len(values):
        return _duckdb_sha256(values)
    bounds = bounds.tolist()
    data = memoryview(data if data is not None else b"")
    sha256 = hashlib.sha256
    hashed = pa.array([sha256(data[a:b]).hexdigest() for a, b in zip(bounds, bounds[1:])], pa.string())
    return pc.if_else(pc.is_valid(values), hashed, pa.scalar(None, pa.string())) if values.null_count else hashed


@cache
def _database() -> tuple[duckdb.DuckDBPyConnection, threading.Lock]:
    return duckdb.connect(":memory:"), threading.Lock()


def _duckdb_sha256(values: pa.Array) -> pa.Array:
    database, lock = _database()
    with lock:  # a cursor per call: one connection is not to be used by two threads at once
        cursor = database.cursor()
    try:
        hashed = cursor.from_arrow(pa.table({"v": values})).project("sha256(v) AS k").to_arrow_table()
    finally:
        cursor.close()
    return hashed.column("k").combine_chunks().cast(pa.string())


def json_strings(values: pa.Array | pa.ChunkedArray, ensure_ascii: bool = True) -> pa.Array:
    """Each string as `json.dumps` writes it (with `ensure_ascii`), null as `null`: quoted on the
    column where nothing needs escaping (hex keys, plain names), by `json.dumps` where it does."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    quoted = pc.binary_join_element_wise('"', values, '"', "")
    odd = pc.fill_null(pc.match_substring_regex(values, _JSON_ESCAPED[ensure_ascii]), False)
    if pc.any(odd).as_py():
        at = np.flatnonzero(odd.to_numpy(zero_copy_only=False))
        dump = encode_basestring_ascii if ensure_ascii else lambda v: json.dumps(v, ensure_ascii=False)
        escaped = pa.array([dump(v) for v in values.take(pa.array(at)).to_pylist()], pa.string())
        mask = np.zeros(len(values), bool)
        mask[at] = True
        quoted = pc.replace_with_mask(quoted, pa.array(mask), escaped)
    return pc.fill_null(quoted, "null")


def run_starts(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Where each run of equal values begins (the first at 0; none for no values)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not len(values):
        return np.zeros(0, np.int64)
    changed = pc.not_equal(values.slice(1), values.slice(0, len(values) - 1))
    return np.concatenate([[0], np.flatnonzero(changed.to_numpy(zero_copy_only=False)) + 1])


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
    in every column of `keys`; -1 where there is none (and for a row with a null key): a counted row
    whose first is another gives its key again (a check says "first at row ..."). Found by a stable
    sort, not a hash join: a join of a table of millions of rows holds several times its keys."""
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
