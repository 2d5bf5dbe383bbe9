"""The Poisson bootstrap's kept shard sums (`stats.ShardSums`): a run that finds an earlier run's sums
of a shard whose scores are unchanged does not resample it, and its results are a fresh run's to the
bit; whatever else changed (a score, the seed, the dataset, the resamples) is resampled again."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vlm_decade.stats import BootstrapOptions, ShardSums, _engine, bootstrap_study
from vlm_decade.stats.shard_sums import keep_shard_sums, kept_shard_sums, shard_sums_file

SHARD = 10  # images per shard here (25,000 in a study)
ERAS = {"A": "pre-mllm", "B": "mllm", "human:top": "human", "human:bottom": "human"}


@pytest.fixture
def resampled(monkeypatch):
    """How many images each resampled shard held, in order, since it was last cleared."""
    sizes = []
    shard = _engine._poisson_shard

    def counted(values, mask, stream, n_resamples):
        sizes.append(values.shape[1])
        return shard(values, mask, stream, n_resamples)

    monkeypatch.setattr(_engine, "_poisson_shard", counted)
    return sizes


def _scores(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three series over `n` images, the first `k` of them the same for any n >= k; one missing score."""
    values = np.random.default_rng(seed).random((3, 100))[:, :n].copy()
    mask = np.ones_like(values)
    mask[1, 4], values[1, 4] = 0.0, 0.0
    return values, mask


def _sums(jobs, kept=None, n_resamples=300, seed=5):
    return _engine.poisson_partial_sums_many(jobs, n_resamples, seed, shard_size=SHARD, use_ray=False, kept=kept)


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name][0], b[name][0])
        np.testing.assert_array_equal(a[name][1], b[name][1])


def test_images_added_at_the_end_resample_only_the_shards_they_fall_in(resampled):
    first = ShardSums()
    _sums({"coco": _scores(25)}, first)
    assert resampled == [10, 10, 5] and len(first.used) == 3

    resampled.clear()
    kept = ShardSums.from_table(first.table())  # as a later run reads it
    grown = _sums({"coco": _scores(37)}, kept)
    assert resampled == [10, 7]  # shards 0 and 1 kept; shard 2 (5 images then, 10 now) and shard 3 new
    assert len(kept.used) == 4 and len(set(first.used) & set(kept.used)) == 2  # the two kept shards' sums

    resampled.clear()
    _assert_same(grown, _sums({"coco": _scores(37)}))  # a fresh run, nothing kept
    assert resampled == [10, 10, 10, 7]


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 6},
        {"n_resamples": 301},
        {"name": "csb"},
        {"values": lambda v: v.__setitem__((2, 13), 0.5)},  # one score of shard 1
        {
            "values": lambda v: v.__setitem__((1, 4), 0.0),
            "mask": lambda m: m.__setitem__((1, 4), 1.0),
        },  # one score no longer missing
    ],
    ids=["seed", "resamples", "dataset", "a score", "a missing score"],
)
def test_whatever_else_changed_is_resampled_again_and_equals_a_fresh_run(resampled, change):
    kept = ShardSums()
    _sums({"coco": _scores(30)}, kept)
    values, mask = _scores(30)
    change.get("values", lambda v: None)(values)
    change.get("mask", lambda m: None)(mask)
    jobs = {change.get("name", "coco"): (values, mask)}
    settings = {k: change[k] for k in ("seed", "n_resamples") if k in change}

    resampled.clear()
    again = _sums(jobs, ShardSums.from_table(kept.table()), **settings)
    touched = 1 if "values" in change else 3  # the changed score's shard; otherwise every shard
    assert len(resampled) == touched
    _assert_same(again, _sums(jobs, **settings))


def test_the_study_bootstrap_with_kept_sums_is_a_fresh_ones_to_the_bit(resampled):
    """`bootstrap_study` in Poisson mode, its comparisons on shared images too (a missing score)."""
    rows = [
        (s, f"img{i:03d}", d, "full", "si", float(np.sin(i * 7 + len(s) + len(d))))
        for d in ("coco", "csb")
        for s in ERAS
        for i in range(40)
        if not (s == "A" and i == 3)
    ]
    table = pa.table(
        list(map(list, zip(*rows))), names=["subject", "image_id", "dataset", "variant", "metric", "value"]
    )
    settings = dict(mode="poisson", use_ray=False)
    kept = ShardSums()
    first = bootstrap_study(table, ERAS, BootstrapOptions(200, 1, shard_sums=kept, **settings))
    resampled.clear()
    again = bootstrap_study(
        table, ERAS, BootstrapOptions(200, 1, shard_sums=ShardSums.from_table(kept.table()), **settings)
    )
    assert resampled == []  # every shard's sums were kept
    assert again.stats.equals(first.stats) and again.comparisons.equals(first.comparisons)
    assert first.stats.column("method").to_pylist()[0] == "poisson-percentile"


def test_the_record_round_trips_in_the_run_folder_and_a_damaged_one_costs_only_time(tmp_path):
    kept = ShardSums()
    _sums({"coco": _scores(25)}, kept)
    keep_shard_sums(tmp_path, "stats", kept)
    read = kept_shard_sums(tmp_path, "stats")
    assert read.known.keys() == kept.used.keys()
    for key, (sums, totals) in kept.used.items():
        np.testing.assert_array_equal(read.known[key][0], sums)
        np.testing.assert_array_equal(read.known[key][1], totals)

    # A row whose arrays are not of its stated shape is left out; a damaged file, or one that is not
    # Parquet, is not read at all.
    table = kept.table()
    cut = table.set_column(3, "sums", pa.array([b"\0" * 8] + table.column("sums").to_pylist()[1:], pa.binary()))
    pq.write_table(cut, shard_sums_file(tmp_path, "stats"))
    assert len(kept_shard_sums(tmp_path, "stats").known) == 2
    keep_shard_sums(tmp_path, "stats", kept)
    damaged = bytearray(shard_sums_file(tmp_path, "stats").read_bytes())
    damaged[len(damaged) // 3] ^= 0xFF  # a byte of the sums flipped on disk: its page fails its checksum
    shard_sums_file(tmp_path, "stats").write_bytes(bytes(damaged))
    assert kept_shard_sums(tmp_path, "stats").known == {}
    shard_sums_file(tmp_path, "stats").write_bytes(b"PAR1 not really")
    assert kept_shard_sums(tmp_path, "stats").known == {}

    keep_shard_sums(tmp_path, "stats", ShardSums())  # an ordinary bootstrap uses none: no record left
    assert not shard_sums_file(tmp_path, "stats").exists()


@pytest.mark.parametrize("library", ["numpy", "scipy"])
def test_sums_kept_under_another_numpy_or_scipy_are_resampled_again(resampled, monkeypatch, library):
    """The draws' table comes from scipy's Poisson CDF and the sums from numpy's arithmetic: sums kept
    under other versions of either are not used."""
    kept = ShardSums()
    _sums({"coco": _scores(25)}, kept)
    monkeypatch.setattr(__import__(library), "__version__", "0.0.0")
    resampled.clear()
    _sums({"coco": _scores(25)}, ShardSums.from_table(kept.table()))
    assert resampled == [10, 10, 5]
