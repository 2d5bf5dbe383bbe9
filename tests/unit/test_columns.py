"""Column operations against a plain loop over the rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlm_decade.core.columns import first_rows

KEY = st.one_of(st.none(), st.sampled_from(["a", "b", "", "é", "a "]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(KEY, st.sampled_from(["x", "y"]), st.booleans()), max_size=40))
def test_first_rows_is_the_first_counted_row_of_each_key_as_a_loop_finds_it(rows):
    first: dict[tuple, int] = {}
    for i, (a, b, counted) in enumerate(rows):
        if counted and a is not None and (a, b) not in first:
            first[(a, b)] = i
    expected = [-1 if a is None else first.get((a, b), -1) for a, b, _ in rows]
    keys = pa.table(
        {"a": pa.array([r[0] for r in rows], pa.string()), "b": pa.array([r[1] for r in rows], pa.string())}
    )
    among = np.array([r[2] for r in rows], bool)
    assert first_rows(keys, among).tolist() == expected


def test_the_whitespace_stripped_on_columns_is_what_str_strip_removes():
    import sys

    from vlm_decade.core.columns import PYTHON_WHITESPACE

    assert PYTHON_WHITESPACE == "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())


# Texts with what a hash or an escape could trip on: whitespace of every kind, quotes, backslashes,
# control characters, NUL, non-ASCII and astral characters.
AWKWARD = st.text(
    alphabet=st.sampled_from(list(' \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u2028\u3000"\\\x00\x01\x7fa_é中😀'))
    | st.characters(exclude_categories=("Cs",)),  # no lone surrogates: no Arrow string holds one
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.none() | AWKWARD, max_size=30))
def test_column_keys_and_json_are_hashlib_s_and_json_dumps_value_for_value(values):
    import hashlib
    import json

    from vlm_decade.core.columns import json_strings, sha256_hex, stripped

    column = pa.array(values, pa.string())
    assert stripped(column).to_pylist() == [None if v is None else v.strip() for v in values]
    want = [None if v is None else hashlib.sha256(v.strip().encode()).hexdigest() for v in values]
    assert sha256_hex(stripped(column)).to_pylist() == want
    # a slice of a column (its offsets start inside the buffer), and large strings (64-bit offsets)
    assert sha256_hex(stripped(column.slice(1))).to_pylist() == want[1:]
    assert sha256_hex(stripped(column.cast(pa.large_string()))).to_pylist() == want
    for ascii_only in (True, False):
        assert json_strings(column, ascii_only).to_pylist() == [json.dumps(v, ensure_ascii=ascii_only) for v in values]


@pytest.mark.parametrize("length", [8, 600])  # hashed by DuckDB, and by hashlib
def test_a_long_column_of_chunks_is_hashed_in_its_own_order(length):
    import hashlib

    from vlm_decade.core.columns import sha256_hex

    texts = [None if i % 1000 == 7 else f"text {i}".ljust(length, "é") * (i % 3) for i in range(300_000)]
    chunked = pa.chunked_array([pa.array(texts[:100_000]), pa.array(texts[100_000:])])
    want = [None if t is None else hashlib.sha256(t.encode()).hexdigest() for t in texts]
    assert sha256_hex(chunked).to_pylist() == want
