"""Column operations against a plain loop over the rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
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
