"""A spill gives back each bucket's rows in the order they were added, whether it holds them in
memory or spreads them over files."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from vlm_decade.core.spill import Spill

SCHEMA = pa.schema([("n", pa.int64())])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), max_size=12), max_size=4))
def test_held_and_spread_buckets_are_the_rows_of_each_bucket_in_the_order_added(tmp_path_factory, adds):
    root = tmp_path_factory.mktemp("spill")
    spills = [Spill(root / "files", SCHEMA), Spill(root / "held", SCHEMA, held=True)]
    by_hand: dict[int, list[int]] = {}
    counter = 0
    for buckets in adds:
        numbers = list(range(counter, counter + len(buckets)))  # each row told apart by its number
        counter += len(buckets)
        for spill in spills:
            spill.add(pa.table({"n": numbers}, schema=SCHEMA), np.array(buckets, np.int64))
        for number, bucket in zip(numbers, buckets):
            by_hand.setdefault(bucket, []).append(number)
    for spill in spills:
        spill.close()
        assert spill.buckets == sorted(by_hand)
        for bucket in range(7):  # 6 was never added to: no rows
            assert spill.read(bucket).column("n").to_pylist() == by_hand.get(bucket, [])
    assert not (root / "held").exists()  # nothing written
