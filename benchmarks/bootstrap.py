"""Benchmark of vlm_decade.stats: ours vs scipy.stats.bootstrap, and Poisson-mode scaling on Ray.

Prints one JSON object per line; the last line is the summary (speedup_vs_scipy against scipy called
once without `batch`, speedup_vs_scipy_best against its fastest usage found, ours_over_floor against
the bare arithmetic, chunks_fresh_matrix_over_one: a block of chunks at 110,000 images with a fresh
counts matrix per chunk against one matrix, seconds_per_million_images, scaling slope). Run:
    .venv/bin/python benchmarks/bootstrap.py
    .venv/bin/python benchmarks/bootstrap.py --smoke   # tiny sizes, seconds: that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from scipy import stats

from vlm_decade.stats import _core, _engine, _streams

# The cases' sizes under --smoke (the defaults otherwise).
SMOKE = {
    "vs_scipy": {"n_images": 50, "n_subjects": 2, "n_metrics": 2, "n_resamples": 200},
    "chunk_matrix": {"n_images": 2000, "n_series": 2, "n_chunks": 2, "repeat": 1},
    "scaling": {"sizes": (10**3, 10**4, 2 * 10**4), "n_resamples": 50},
}


def emit(**kw):
    print(json.dumps(kw), flush=True)


def best_of(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def vs_scipy(n_images=200, n_subjects=20, n_metrics=6, n_resamples=10_000):
    """The same estimates (mean + 95% percentile CI of 120 series) by ours and by scipy at its best.

    scipy is timed as a user would call it (one call, no `batch`: it materialises every resample at
    once and is memory-bound), with the `batch` sizes that make it fastest, and as a loop over the
    series; the speed-up that counts is against the fastest of those. The floor is the arithmetic
    any ordinary bootstrap must do, timed alone: the index draws, one (B, n) x (n, S) product of the
    counts with the values, and the two quantiles per series.
    """
    rng = np.random.default_rng(0)
    data = rng.beta(5, 3, size=(n_subjects * n_metrics, n_images))
    mask = np.ones_like(data)

    def ours():
        dist = _engine.resample_means(data, mask, n_resamples, 1, "bench", use_ray=False)
        return _core.masked_means(data, mask), _core.percentile_ci(dist, 0.95)

    def scipy_call(batch=None):
        return lambda: stats.bootstrap(
            (data,),
            np.mean,
            n_resamples=n_resamples,
            axis=-1,
            vectorized=True,
            method="percentile",
            batch=batch,
            rng=np.random.default_rng(1),
        )

    def scipy_per_series():
        return [
            stats.bootstrap(
                (row,),
                np.mean,
                n_resamples=n_resamples,
                vectorized=True,
                method="percentile",
                rng=np.random.default_rng(1),
            )
            for row in data
        ]

    order_stats = np.unique(np.floor((n_resamples - 1) * np.array([0.025, 0.975])).astype(int) + [[0], [1]])

    def floor():
        counts = _core.multinomial_counts(np.random.default_rng(1), n_resamples, n_images)  # draws, counted
        means = (counts @ data.T).T / n_images
        return np.partition(means, order_stats, axis=1)

    t_ours, (theta, (lo, hi)) = best_of(ours, 5)
    t_scipy, ref = best_of(scipy_call(), 1)
    batched = {batch: best_of(scipy_call(batch), 1)[0] for batch in (50, 100, 250, 500, 1000)}
    t_loop, _ = best_of(scipy_per_series, 1)
    t_floor, _ = best_of(floor, 5)
    usages = {"one_call": t_scipy, **{f"batch_{b}": t for b, t in batched.items()}, "per_series_loop": t_loop}
    best_usage = min(usages, key=usages.get)
    # same estimates: the intervals agree within Monte-Carlo error
    err = np.max(np.abs(lo - ref.confidence_interval.low) / ref.standard_error)
    emit(
        case="vs_scipy",
        n_images=n_images,
        series=data.shape[0],
        n_resamples=n_resamples,
        seconds_ours=round(t_ours, 4),
        seconds_scipy=round(t_scipy, 3),
        seconds_scipy_by_usage={k: round(v, 3) for k, v in usages.items()},
        scipy_best_usage=best_usage,
        seconds_floor=round(t_floor, 4),
        speedup=round(t_scipy / t_ours, 1),
        speedup_vs_scipy_best=round(usages[best_usage] / t_ours, 1),
        ours_over_floor=round(t_ours / t_floor, 2),
        max_ci_low_diff_in_se=round(float(err), 3),
    )
    return t_scipy / t_ours, usages[best_usage] / t_ours, t_ours / t_floor


def chunk_matrix(n_images=110_000, n_series=10, n_chunks=10, repeat=2):
    """One task's block of ordinary-bootstrap chunks at the incremental benchmark's size (500
    resamples x 110,000 images a chunk): the counts drawn into one matrix in turn (`_engine`), side
    by side with the obvious way, a fresh matrix per chunk, alternated; the means equal to the bit."""
    rng = np.random.default_rng(3)
    values, mask = rng.random((n_series, n_images)), np.ones((n_series, n_images))
    sizes = [500] * n_chunks
    streams = _streams.chunk_streams(0, "chunks", _streams.KIND_MULTINOMIAL, n_chunks)

    def fresh():
        return np.concatenate(
            [
                _core.weighted_means(_core.multinomial_counts(np.random.default_rng(ss), b, n_images), values, mask)
                for ss, b in zip(streams, sizes)
            ]
        )

    times = {"one_matrix": [], "fresh_matrix": []}
    for _ in range(repeat):
        for name, way in (
            ("fresh_matrix", fresh),
            ("one_matrix", lambda: _engine._multinomial_block(values, mask, streams, sizes)),
        ):
            t = time.perf_counter()
            out = way()
            times[name].append(time.perf_counter() - t)
            if name == "fresh_matrix":
                want = out
            else:
                assert np.array_equal(out, want), "the same means, to the bit"
    best = {name: min(t) for name, t in times.items()}
    emit(
        case="chunk_matrix",
        n_images=n_images,
        series=n_series,
        chunks=n_chunks,
        seconds={name: [round(x, 2) for x in t] for name, t in times.items()},
        fresh_over_one=round(best["fresh_matrix"] / best["one_matrix"], 2),
    )
    return best["fresh_matrix"] / best["one_matrix"]


def scaling(sizes=(10**3, 10**4, 10**5, 10**6), n_series=6, n_resamples=1000):
    """Poisson bootstrap over image shards, as Ray tasks: seconds per image as n grows."""
    from vlm_decade.core.runtime import start_ray

    start_ray(num_cpus=os.cpu_count() or 2)
    rng = np.random.default_rng(2)
    warm = rng.random((n_series, 30_000))
    _engine.poisson_resample_means(warm, np.ones_like(warm), 50, 0, "warm", use_ray=True)  # start workers
    rows = []
    for n in sizes:
        v = rng.random((n_series, n))
        m = np.ones_like(v)
        t, _ = best_of(
            lambda v=v, m=m, n=n: _engine.poisson_resample_means(v, m, n_resamples, 0, f"n{n}", use_ray=True),
            1 if n >= 10**5 else 3,
        )
        rows.append((n, t))
        emit(
            case="scaling",
            mode="poisson",
            ray_tasks=-(-n // _engine.POISSON_SHARD),
            n_images=n,
            series=n_series,
            n_resamples=n_resamples,
            seconds=round(t, 3),
            microseconds_per_image=round(t / n * 1e6, 3),
        )
    n, t = np.array(rows).T
    big = n >= 10**4  # below that, task start-up dominates
    slope = float(np.polyfit(np.log10(n[big]), np.log10(t[big]), 1)[0])
    return rows, slope, n_resamples


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check that the script runs")
    sizes = SMOKE if parser.parse_args().smoke else {case: {} for case in SMOKE}
    t0 = time.perf_counter()
    speedup, speedup_best, over_floor = vs_scipy(**sizes["vs_scipy"])
    one_matrix = chunk_matrix(**sizes["chunk_matrix"])
    rows, slope, b = scaling(**sizes["scaling"])
    per_million = rows[-1][1] / (rows[-1][0] / 1e6)
    emit(
        summary=True,
        speedup_vs_scipy=round(speedup, 1),
        speedup_vs_scipy_best=round(speedup_best, 1),
        ours_over_floor=round(over_floor, 2),
        chunks_fresh_matrix_over_one=round(one_matrix, 2),
        seconds_per_million_images=round(per_million, 2),
        scaling_resamples=b,
        scaling_series=6,
        loglog_slope_time_vs_images=round(slope, 3),
        per_image_time_ratio_1e6_vs_1e4=round((rows[-1][1] / rows[-1][0]) / (rows[1][1] / rows[1][0]), 2),
        cpus=os.cpu_count(),
        total_seconds=round(time.perf_counter() - t0, 1),
    )


if __name__ == "__main__":
    main()
