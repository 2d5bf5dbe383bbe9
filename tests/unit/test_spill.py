"""A spill gives back each bucket's rows in the order they were added, whether it holds them in
memory or spreads them over files; a run leaves no spill folder behind."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlm_decade.core.config import RuntimeConfig
from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import StudyRun
from vlm_decade.core.runtime import LazyRay
from vlm_decade.core.spill import SPILL_FOLDER, Spill

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


def test_a_run_leaves_no_spill_folder_behind(tmp_path):
    """The run folder's `.spill/` is scratch: what a killed run left there, and the empty folders the
    stages leave, are gone when a run ends, however it ends."""
    for ending in (None, KeyboardInterrupt):
        left = tmp_path / SPILL_FOLDER / "responses" / "0"
        left.mkdir(parents=True)
        (left / "000001.arrow").write_bytes(b"a killed run's rows")
        with pytest.raises(KeyboardInterrupt) if ending else nullcontext():
            with StudyRun(RunFolder(tmp_path), Reporter(quiet=True), LazyRay(RuntimeConfig())):
                (tmp_path / SPILL_FOLDER / "describe").mkdir()  # a stage's, emptied as it ends
                if ending:
                    raise ending
        assert not (tmp_path / SPILL_FOLDER).exists()
