"""Intervals, p-values and coverage against scipy.stats.bootstrap and simulation under a true null."""

import numpy as np
import pyarrow as pa
import pytest
from scipy import special, stats

from vlm_decade.stats import BootstrapOptions, _core, _engine, _streams, bootstrap_study, correlation_ci
from vlm_decade.stats.families import ComparisonSpec, Family, Term


def _one_series(x):
    return x[None, :], np.ones((1, x.size))


def _first_chunk_rng(seed, name, kind):
    return np.random.default_rng(_streams.chunk_streams(seed, name, kind, 1)[0])


@pytest.mark.parametrize("method", ["percentile", "BCa"])
def test_same_resamples_as_scipy_give_the_same_interval(method):
    # With B <= CHUNK our first stream draws exactly the indices scipy draws from the same generator.
    x = np.random.default_rng(2).gamma(2.0, size=60)
    v, m = _one_series(x)
    dist = _engine.resample_means(v, m, 500, 11, "d")
    theta = _core.masked_means(v, m)
    if method == "BCa":
        lo, hi = _core.bca_ci(dist, theta, [_core.jackknife_means(v, m)], 0.9)
    else:
        lo, hi = _core.percentile_ci(dist, 0.9)
    ref = stats.bootstrap(
        (x,),
        np.mean,
        n_resamples=500,
        confidence_level=0.9,
        method=method,
        vectorized=True,
        rng=_first_chunk_rng(11, "d", _streams.KIND_MULTINOMIAL),
    )
    np.testing.assert_allclose(dist[0], ref.bootstrap_distribution, rtol=1e-12)
    np.testing.assert_allclose([lo[0], hi[0]], [ref.confidence_interval.low, ref.confidence_interval.high], rtol=1e-12)


@pytest.mark.parametrize("method", ["percentile", "BCa"])
def test_interval_agrees_with_scipy_within_monte_carlo_error(method):
    x = np.random.default_rng(4).lognormal(size=80)  # skewed, so BCa differs from percentile
    v, m = _one_series(x)
    dist = _engine.resample_means(v, m, 10_000, 1, "d")
    if method == "BCa":
        lo, hi = _core.bca_ci(dist, _core.masked_means(v, m), [_core.jackknife_means(v, m)], 0.95)
    else:
        lo, hi = _core.percentile_ci(dist, 0.95)
    ref = stats.bootstrap(
        (x,), np.mean, n_resamples=10_000, method=method, vectorized=True, rng=np.random.default_rng(99)
    )
    se = ref.standard_error
    # MC sd of a 2.5% quantile with B = 10^4 is ~0.03 se per run; 0.2 se is > 4 sd of the difference.
    assert abs(lo[0] - ref.confidence_interval.low) < 0.2 * se
    assert abs(hi[0] - ref.confidence_interval.high) < 0.2 * se
    assert np.std(dist) == pytest.approx(se, rel=0.05)


def test_bca_of_a_difference_between_datasets_equals_scipy_two_sample():
    rng = np.random.default_rng(8)
    x, y = rng.exponential(size=40), rng.exponential(size=55)
    dx = _engine.resample_means(*_one_series(x), 500, 3, "X")[0]
    dy = _engine.resample_means(*_one_series(y), 500, 3, "Y")[0]
    jx = _core.jackknife_means(*_one_series(x))[0]
    jy = _core.jackknife_means(*_one_series(y))[0]
    theta = np.array([x.mean() - y.mean()])
    lo, hi = _core.bca_ci((dx - dy)[None], theta, [(jx - y.mean())[None], (x.mean() - jy)[None]], 0.95)
    # The textbook BCa for several samples (Efron & Tibshirani 1993, 14.3; Efron 1987, multi-sample
    # acceleration), computed here from the data alone: z0 from the share of resamples below the
    # estimate (ties half), a from each sample's leave-one-out values U = (n - 1)(mean - leave-one-out).
    diffs = dx - dy
    z0 = special.ndtri(((diffs < theta[0]).sum() + (diffs <= theta[0]).sum()) / (2 * diffs.size))
    loo_x = np.array([np.delete(x, i).mean() - y.mean() for i in range(x.size)])
    loo_y = np.array([x.mean() - np.delete(y, j).mean() for j in range(y.size)])
    num = den = 0.0
    for loo in (loo_x, loo_y):
        u = (loo.size - 1) * (loo.mean() - loo)
        num += (u**3).sum() / loo.size**3
        den += (u**2).sum() / loo.size**2
    a = num / (6 * den**1.5)
    z = special.ndtri([0.025, 0.975])
    levels = special.ndtr(z0 + (z0 + z) / (1 - a * (z0 + z)))
    np.testing.assert_allclose([lo[0], hi[0]], np.quantile(diffs, levels), rtol=1e-12)


@pytest.mark.parametrize("kind", ["pearson", "spearman"])
def test_correlation_ci_equals_scipy_paired_bootstrap(kind):
    rng = np.random.default_rng(6)
    x = rng.normal(size=40)
    y = x + rng.normal(size=40)
    ref_stat = stats.pearsonr if kind == "pearson" else stats.spearmanr
    est = correlation_ci(x, y, 500, 21, name="rater", kind=kind, confidence=0.9)
    ref = stats.bootstrap(
        (x, y),
        lambda a, b: ref_stat(a, b)[0],
        paired=True,
        vectorized=False,
        n_resamples=500,
        confidence_level=0.9,
        method="percentile",
        rng=_first_chunk_rng(21, "rater", _streams.KIND_CORRELATION),
    )
    assert est.estimate == pytest.approx(ref_stat(x, y)[0], rel=1e-12)
    np.testing.assert_allclose(est.distribution, ref.bootstrap_distribution, rtol=1e-10)
    np.testing.assert_allclose(
        [est.ci_low, est.ci_high], [ref.confidence_interval.low, ref.confidence_interval.high], rtol=1e-10
    )
    bca = correlation_ci(x, y, 2000, 21, name="rater", kind=kind, method="bca")
    assert bca.ci_low < bca.estimate < bca.ci_high


def _scores(values_by_subject, dataset="d"):
    rows = {"subject": [], "image_id": [], "dataset": [], "variant": [], "metric": [], "value": []}
    for s, vals in values_by_subject.items():
        for i, v in enumerate(vals):
            for k, x in zip(rows, (s, f"i{i}", dataset, "full", "m", float(v))):
                rows[k].append(x)
    return pa.table(rows)


def test_null_p_values_are_uniform_and_track_the_paired_t_test():
    # A and B exchangeable per image (paired design): H0 "equal means" is true.
    boot, ttest = [], []
    for r in range(1000):
        rng = np.random.default_rng(1000 + r)
        common = rng.normal(size=50)
        a, b = common + rng.normal(size=50), common + rng.normal(size=50)
        v = np.vstack([a, b])
        d = _engine.resample_means(v, np.ones_like(v), 999, r, "d")
        boot.append(_core.bootstrap_p((d[0] - d[1])[None])[0])
        ttest.append(stats.ttest_rel(a, b).pvalue)
    boot, ttest = np.array(boot), np.array(ttest)
    assert stats.kstest(boot, "uniform").pvalue > 0.001
    assert 0.03 <= (boot < 0.05).mean() <= 0.07
    # an independent exact reference on the same data: the bootstrap p follows the t-test's p
    assert np.mean(np.abs(boot - ttest)) < 0.03
    assert np.corrcoef(boot, ttest)[0, 1] > 0.99


def test_null_p_through_the_table_interface():
    fam = [Family("ab", [ComparisonSpec(Term.subject("A", "d"), Term.subject("B", "d"))])]
    ps = []
    for r in range(100):
        rng = np.random.default_rng(7000 + r)
        t = _scores({"A": rng.normal(size=40), "B": rng.normal(size=40)})
        ps.append(bootstrap_study(t, {}, BootstrapOptions(999, r, families=fam)).comparisons.column("p")[0].as_py())
    assert 0.3 < np.mean(ps) < 0.7 and min(ps) >= 2 / 1000


def test_ci_coverage_is_near_nominal():
    hits = 0
    n_sim = 400
    for r in range(n_sim):
        x = np.random.default_rng(5000 + r).normal(loc=0.7, scale=0.1, size=60)
        st = bootstrap_study(_scores({"A": x}), {}, BootstrapOptions(1000, r, families=[])).stats
        hits += st.column("ci_low")[0].as_py() <= 0.7 <= st.column("ci_high")[0].as_py()
    # percentile intervals undercover slightly at n = 60 (~0.94); binomial sd at 400 sims ~ 0.011
    assert 0.91 <= hits / n_sim <= 0.975
