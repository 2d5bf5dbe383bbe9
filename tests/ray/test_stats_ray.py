"""The bootstrap as Ray tasks gives bit-identical results to the in-process run (uses the session Ray)."""

import time

import numpy as np
import pyarrow as pa
import pytest

from vlm_decade.stats import _engine, bootstrap_study

pytestmark = pytest.mark.ray

ERAS = {"A": "pre-mllm", "B": "mllm", "human:top": "human", "human:bottom": "human"}


def _study(n=60):
    rng = np.random.default_rng(0)
    rows = [
        (s, f"{d}{i}", d, "full", "si", float(rng.normal(0.6, 0.1)))
        for d in ("coco", "csb")
        for s in ERAS
        for i in range(n)
    ]
    return pa.table(list(map(list, zip(*rows))), names=["subject", "image_id", "dataset", "variant", "metric", "value"])


def test_ray_tasks_match_in_process_whatever_the_number_of_tasks(ray_session):
    assert ray_session.is_initialized()
    t = _study()
    local = bootstrap_study(t, ERAS, 2300, 7, use_ray=False)
    for k in (2, 5):
        remote = bootstrap_study(t, ERAS, 2300, 7, use_ray=True, n_tasks=k)
        assert remote.stats.equals(local.stats)
        assert remote.comparisons.equals(local.comparisons)
    assert local.comparisons.num_rows > 0


def test_poisson_shards_as_ray_tasks_match_in_process(ray_session):
    rng = np.random.default_rng(1)
    v = rng.random((2, 3000))
    m = np.ones_like(v)
    local = _engine.poisson_partial_sums_many({"big": (v, m)}, 700, 3, shard_size=1000, use_ray=False)["big"]
    remote = _engine.poisson_partial_sums_many({"big": (v, m)}, 700, 3, shard_size=1000, use_ray=True)["big"]
    np.testing.assert_array_equal(local[0], remote[0])
    np.testing.assert_array_equal(local[1], remote[1])


def test_workers_started_ahead_take_the_bootstraps_tasks_and_change_no_result(ray_session):
    """`warm_workers` (begun beside Study A's scores stage) starts one worker per CPU by a block of one
    resample; the bootstrap that follows gives what it gives in-process."""
    import ray

    assert _engine.warm_workers(ray_session) == []  # tasks, not actors: nothing for a stage to let go
    t = _study()
    remote = bootstrap_study(t, ERAS, 2300, 7, use_ray=True)
    local = bootstrap_study(t, ERAS, 2300, 7, use_ray=False)
    assert remote.stats.equals(local.stats) and remote.comparisons.equals(local.comparisons)
    # The warm blocks are not awaited, so one may still be queued or running as the bootstrap
    # ends, and the free CPUs are reported late; they must all come back, not at once.
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        assert time.monotonic() < deadline, "the warm blocks still hold CPUs a minute on"
        time.sleep(0.2)
