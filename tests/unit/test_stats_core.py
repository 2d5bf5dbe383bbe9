"""The numpy core of vlm_decade.stats against hand-worked cases and independent references."""

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from vlm_decade.stats import _core, _streams, format_p


@pytest.mark.parametrize(("b", "n"), [(7, 11), (16, 5), (33, 7), (40, 1000), (1, 3)])
def test_multinomial_counts_are_the_bincount_of_scipys_indices(b, n):
    # Same generator state -> same indices as scipy.stats.bootstrap draws in one call, counted per
    # row, though they are drawn a few rows at a time (odd widths and a last short block included);
    # and the generator is left where one draw leaves it, so the next chunk's stream is unchanged.
    rng = np.random.default_rng(3)
    w = _core.multinomial_counts(rng, b, n)
    reference = np.random.default_rng(3)
    idx = reference.integers(0, n, size=(b, n))
    expect = np.stack([np.bincount(r, minlength=n) for r in idx])
    np.testing.assert_array_equal(w, expect)
    assert (w.sum(axis=1) == n).all()
    assert rng.integers(0, 2**62) == reference.integers(0, 2**62)


@pytest.mark.parametrize("missing", [0.2, 0.0])
def test_a_block_of_chunks_drawn_into_one_matrix_gives_each_chunk_s_means_to_the_bit(missing):
    # The block draws every chunk's counts into one matrix (the last, shorter chunk into its first
    # rows); each chunk's means are those of its counts drawn into a fresh matrix, their totals
    # summed (with no score missing, the block takes each resample's total as its n draws).
    from vlm_decade.stats import _engine

    rng = np.random.default_rng(5)
    mask = (rng.random((4, 300)) >= missing).astype(float)
    values = rng.random((4, 300)) * mask
    sizes = [500, 500, 123]
    streams = _streams.chunk_streams(7, "coco", _streams.KIND_MULTINOMIAL, len(sizes))
    fresh = [
        _core.weighted_means(_core.multinomial_counts(np.random.default_rng(ss), b, 300), values, mask)
        for ss, b in zip(streams, sizes)
    ]
    np.testing.assert_array_equal(_engine._multinomial_block(values, mask, streams, sizes), np.concatenate(fresh))


def test_weighted_means_hand_worked_with_missing():
    values = np.array([[1.0, 2.0, 3.0], [10.0, 0.0, 30.0]])
    mask = np.array([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])  # series 2 lacks image 2
    w = np.array([[3.0, 0, 0], [1, 1, 1], [0, 2, 1], [0, 3, 0]])
    got = _core.weighted_means(w, values, mask)
    expect = np.array([[1.0, 10.0], [2.0, 20.0], [7 / 3, 30.0], [2.0, np.nan]])  # last: no image left
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-15)
    np.testing.assert_allclose(_core.masked_means(values, mask), [2.0, 20.0])
    np.testing.assert_allclose(_core.jackknife_means(values, mask), [[2.5, 2.0, 1.5], [30.0, 20.0, 10.0]])


@pytest.mark.parametrize("kind", ["pearson", "spearman"])
def test_weighted_correlations_equal_scipy_on_explicit_resamples(kind):
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=30), 1)  # rounding makes ties, which ranks must average
    y = np.round(x + rng.normal(size=30), 1)
    idx = rng.integers(0, 30, size=(20, 30))
    w = np.stack([np.bincount(r, minlength=30) for r in idx]).astype(float)
    fn = _core.weighted_pearson if kind == "pearson" else _core.weighted_spearman
    ref = stats.pearsonr if kind == "pearson" else stats.spearmanr
    got = fn(w, x, y)
    expect = [ref(x[r], y[r])[0] for r in idx]
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)


def test_quantile_rows_equals_numpy_and_skips_nan():
    rng = np.random.default_rng(1)
    d = rng.normal(size=(4, 101))
    q = np.array([0.025, 0.5, 0.975, 0.3])
    np.testing.assert_allclose(_core.quantile_rows(d, q), [np.quantile(r, qq) for r, qq in zip(d, q)], rtol=1e-14)
    d[0, :10] = np.nan
    assert _core.quantile_rows(d[:1], [0.2])[0] == pytest.approx(np.quantile(d[0, 10:], 0.2), rel=1e-14)


def test_bootstrap_p_hand_worked():
    # the standard two-sided form min(1, 2 (1 + min(k_below, k_above)) / (B + 1))
    # 1 below, 3 above 0: p = 2 (1 + 1) / (4 + 1)
    assert _core.bootstrap_p(np.array([[1.0, 2.0, 3.0, -1.0]]))[0] == pytest.approx(0.8)
    # 2 below of 9: 2 (1 + 2) / 10
    assert _core.bootstrap_p(np.array([[-1.0, -2.0, 1, 2, 3, 4, 5, 6, 7]]))[0] == pytest.approx(0.6)
    # ties at 0 count half each way: below = 1 + 1, above = 1 + 1 -> capped at 1
    assert _core.bootstrap_p(np.array([[0.0, 0.0, 1.0, -1.0]]))[0] == 1.0
    assert _core.bootstrap_p(np.zeros((1, 10_000)))[0] == 1.0  # a subject against itself
    p = _core.bootstrap_p(np.full((1, 10_000), 0.3))[0]
    assert p == 2 / 10_001 == _core.p_floor(10_000)
    assert format_p(p, 10_000) == "< 2.0e-4"


def test_format_p():
    assert format_p(2 / 1000, 999) == "< 2.0e-3"
    assert format_p(2 / 201, 200) == "< 1.0e-2"  # the floor 9.95e-3, rounded up: the bound holds
    assert format_p(2 / 1001, 1000) == "< 2.0e-3"
    assert format_p(0.0312, 10_000) == "0.031"
    assert format_p(0.0023, 10_000) == "2.3e-3"
    assert format_p(1.0, 10_000) == "1.000"
    assert format_p(float("nan"), 10) == "n/a"


def test_bh_equals_scipy_exactly_and_statsmodels():
    rng = np.random.default_rng(5)
    for m in (1, 2, 17, 200):
        p = rng.uniform(size=m) ** 3
        if m > 2:
            p[1] = p[0]  # ties
        q = _core.bh_qvalues(p)
        np.testing.assert_array_equal(q, stats.false_discovery_control(p, method="bh"))
        np.testing.assert_allclose(q, multipletests(p, method="fdr_bh")[1], rtol=1e-13, atol=0)


def test_bh_hand_worked_and_nan():
    p = np.array([0.01, 0.04, 0.03, np.nan, 0.5])
    # sorted 0.01, 0.03, 0.04, 0.5 (m = 4): 0.04, 0.06, 0.0533.. -> monotone 0.04, 0.0533, 0.0533, 0.5
    np.testing.assert_allclose(_core.bh_qvalues(p), [0.04, 0.16 / 3, 0.16 / 3, np.nan, 0.5])


def test_poisson_counts_follow_poisson_one():
    w = _core.poisson_counts(np.random.default_rng(9), 200, 5000)
    k = np.bincount(w.astype(int).ravel())
    obs = np.r_[k[:6], k[6:].sum()]
    pmf = stats.poisson.pmf(np.arange(6), 1.0)
    exp = np.r_[pmf, 1 - pmf.sum()] * w.size
    assert stats.chisquare(obs, exp).pvalue > 0.001
    assert w.mean() == pytest.approx(1.0, abs=0.005) and w.var() == pytest.approx(1.0, abs=0.01)


def test_streams_do_not_depend_on_count_or_other_names():
    a = _streams.chunk_streams(1, "coco", 0, 3)
    b = _streams.chunk_streams(1, "coco", 0, 20)
    for x, y in zip(a, b):
        assert np.random.default_rng(x).integers(1 << 60) == np.random.default_rng(y).integers(1 << 60)
    c = _streams.chunk_streams(1, "csb", 0, 1)[0]
    assert np.random.default_rng(a[0]).integers(1 << 60) != np.random.default_rng(c).integers(1 << 60)
    assert _streams.chunk_sizes(1234) == [500, 500, 234]
    assert [len(r) for r in _streams.split_chunks(5, 3)] in ([2, 1, 2], [1, 2, 2], [2, 2, 1])
    assert sum(len(r) for r in _streams.split_chunks(5, 99)) == 5
