"""The pure numpy core: resample weights, weighted reductions, intervals, p-values, BH.

Every function here takes already-validated arrays and returns arrays; none draws from a global
random state (each takes a `numpy.random.Generator`), none knows about tables, Ray or subjects.
Resamples are represented as *weight matrices*: row b holds how often each image appears in
resample b (multinomial counts, or Poisson(1) counts in Poisson mode), so a statistic over all
series and all resamples is one matrix product instead of a Python loop.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from scipy.special import ndtr, ndtri

# --------------------------------------------------------------------------------------------
# Resample weights
# --------------------------------------------------------------------------------------------


def multinomial_counts(rng: np.random.Generator, n_resamples: int, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """(n_resamples, n) float64 counts of each image in each ordinary bootstrap resample, written
    into `out` when given (a matrix of that shape: an earlier chunk's, whose pages are touched
    already; a fresh one's first touch took up to three times as long as its draws).

    Draws the same indices as scipy.stats.bootstrap does (``rng.integers(0, n, (B, n))``), so with
    the same generator state both see the very same resamples: drawn `DRAW_ROWS` rows at a time,
    which continues one stream exactly as one draw of every row does, but keeps the indices a few
    MB instead of B x n integers (each chunk's fresh pages cost more than the draws); each row is
    counted by a bincount written straight into the float matrix.
    """
    counts = np.empty((n_resamples, n)) if out is None else out
    for start in range(0, n_resamples, DRAW_ROWS):
        drawn = rng.integers(0, n, size=(min(DRAW_ROWS, n_resamples - start), n))
        for row, indices in zip(counts[start : start + DRAW_ROWS], drawn):
            row[:] = np.bincount(indices, minlength=n)
    return counts


DRAW_ROWS = 16  # resample rows drawn at a time by `multinomial_counts`


# Poisson(1) by table look-up on uniform 32-bit integers: value = #{thresholds <= u}. The table is
# the CDF scaled to 2**32, so the law is exact up to 2**-32 per cell (P(X >= 13) ~ 6e-11 is cut).
@cache
def _poisson_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thresholds, each high-16-bit cell's value, whether the cell straddles a threshold (~12 of
    65,536)); made on first use, as scipy.stats takes most of a second to import."""
    from scipy.stats import poisson

    thresholds = np.unique(np.round(poisson.cdf(np.arange(40), 1.0) * 2.0**32).astype(np.uint64))
    thresholds = thresholds[thresholds < 2**32]
    high = np.arange(65536, dtype=np.uint64) << np.uint64(16)
    low_end = np.searchsorted(thresholds, high, side="right").astype(np.uint8)
    high_end = np.searchsorted(thresholds, high + np.uint64(65535), side="right").astype(np.uint8)
    return thresholds, low_end, low_end != high_end


def poisson_counts(rng: np.random.Generator, n_resamples: int, n: int) -> np.ndarray:
    """(n_resamples, n) float64 Poisson(1) weights (the Poisson bootstrap).

    Several times faster than ``rng.poisson(1.0, ...)``: a uniform 32-bit number is drawn as its
    top 16 bits, which index a table; only in the ~12 of 65,536 cells that straddle a CDF
    threshold are the low 16 bits drawn as well and the value resolved exactly.
    """
    thresholds, by_cell, ambiguous = _poisson_tables()
    hi = rng.integers(0, 65536, size=(n_resamples, n), dtype=np.uint16)
    out = by_cell[hi]
    amb = np.flatnonzero(ambiguous[hi])
    if amb.size:
        lo = rng.integers(0, 65536, size=amb.size, dtype=np.uint16).astype(np.uint64)
        u = (hi.ravel()[amb].astype(np.uint64) << np.uint64(16)) | lo
        out.ravel()[amb] = np.searchsorted(thresholds, u, side="right")
    return out.astype(np.float64)


# --------------------------------------------------------------------------------------------
# Weighted reductions (one matrix product for every series and every resample)
# --------------------------------------------------------------------------------------------


def weighted_sums(
    weights: np.ndarray, values: np.ndarray, mask: np.ndarray, rows_sum_to: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Partial sums of a resample block: (sum_i w_bi x_si m_si, sum_i w_bi m_si), each (B, S).

    `values` (S, n) must hold 0 where `mask` (S, n) is 0, so missing scores drop out of both the
    numerator and the denominator; a mask entry above 1 weighs an image by the units it holds.
    Sums over disjoint image shards add up exactly. `rows_sum_to`: what every row of `weights`
    sums to, where that is known (an ordinary bootstrap's counts: its n draws), so it is not
    summed again (a sum of whole numbers below 2**53 is exact: the same value either way).
    """
    if (mask == 1.0).all():  # no missing scores, no unit weights: every total is the resample's weight sum
        totals = weights.sum(axis=1) if rows_sum_to is None else np.full(len(weights), float(rows_sum_to))
        return weights @ values.T, np.repeat(totals[:, None], mask.shape[0], axis=1)
    return weights @ values.T, weights @ mask.T


def ratio(sums: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """sums / totals with NaN where a resample holds none of a series' available images."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, sums / np.where(totals > 0, totals, 1.0), np.nan)


def weighted_means(
    weights: np.ndarray, values: np.ndarray, mask: np.ndarray, rows_sum_to: int | None = None
) -> np.ndarray:
    """(B, S) resampled means over the images each series has (mask-weighted mean); `rows_sum_to`
    as `weighted_sums` takes it."""
    return ratio(*weighted_sums(weights, values, mask, rows_sum_to))


def masked_means(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(S,) full-sample mean of each series over its available images."""
    return ratio(values.sum(axis=1), mask.sum(axis=1))


def jackknife_means(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(S, n) leave-one-image-out means; leaving out an image a series lacks changes nothing."""
    s = values.sum(axis=1, keepdims=True)
    c = mask.sum(axis=1, keepdims=True)
    return ratio(s - values, c - mask)


def weighted_pearson(weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(B,) Pearson r of (x, y) in each weighted resample (row of `weights`, shape (B, n)).

    x and y are (n,), the same values in every resample, or (B, n), values of their own in each
    resample (within-resample ranks).
    """
    if x.ndim == 2 or y.ndim == 2:
        return _pearson_of_rows(weights, np.broadcast_to(x, weights.shape), np.broadcast_to(y, weights.shape))
    # Centre once on the full-sample means: the result is unchanged, the sums stay well scaled.
    xc = x - x.mean()
    yc = y - y.mean()
    w = weights.sum(axis=1)
    mx, my = weights @ xc / w, weights @ yc / w
    sxy = weights @ (xc * yc) / w - mx * my
    sxx = weights @ (xc * xc) / w - mx * mx
    syy = weights @ (yc * yc) / w - my * my
    with np.errstate(invalid="ignore", divide="ignore"):
        return sxy / np.sqrt(sxx * syy)


def _pearson_of_rows(weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(B,) weighted Pearson r of row b of x and y (each (B, n)) under weights[b]."""
    w = weights.sum(axis=1)
    mx = (weights * x).sum(axis=1) / w
    my = (weights * y).sum(axis=1) / w
    dx, dy = x - mx[:, None], y - my[:, None]
    sxy = (weights * dx * dy).sum(axis=1)
    sxx = (weights * dx * dx).sum(axis=1)
    syy = (weights * dy * dy).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sxy / np.sqrt(sxx * syy)


def weighted_ranks(weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(B, n) average ranks (ties share the mean rank) of x within each weighted resample.

    An image with count w occupies w consecutive ranks; ranks of images with weight 0 are
    computed too but carry no weight. Equals scipy.stats.rankdata on the explicit resample.
    """
    order = np.argsort(x, kind="stable")
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])  # groups of tied values
    group = np.cumsum(np.r_[True, xs[1:] != xs[:-1]]) - 1
    g = np.add.reduceat(weights[:, order], starts, axis=1)  # (B, n_groups) copies per value
    rank_g = np.cumsum(g, axis=1) - g + (g + 1) / 2.0
    ranks = np.empty_like(weights)
    ranks[:, order] = rank_g[:, group]
    return ranks


def weighted_spearman(weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(B,) Spearman rho in each weighted resample: Pearson r of the within-resample ranks."""
    return _pearson_of_rows(weights, weighted_ranks(weights, x), weighted_ranks(weights, y))


# --------------------------------------------------------------------------------------------
# Intervals and p-values from a resample distribution (last axis = resamples)
# --------------------------------------------------------------------------------------------


def quantile_rows(dist: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Linear-interpolation quantile (numpy's default) of each row at its own level q[row].

    NaN resamples (a series with no available image in that resample) are left out per row.
    """
    dist = np.atleast_2d(dist)
    q = np.broadcast_to(np.asarray(q, dtype=float), dist.shape[:1])
    s = np.sort(dist, axis=1)  # NaN sorts last
    nvalid = (~np.isnan(s)).sum(axis=1)
    out = np.full(dist.shape[0], np.nan)
    ok = (nvalid > 0) & ~np.isnan(q)
    h = (nvalid[ok] - 1) * q[ok]
    lo = np.floor(h).astype(np.intp)
    hi = np.minimum(lo + 1, nvalid[ok] - 1)
    rows = np.flatnonzero(ok)
    a, b = s[rows, lo], s[rows, hi]
    out[ok] = a + (h - lo) * (b - a)
    return out


def percentile_ci(dist: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval: the (1-c)/2 and (1+c)/2 quantiles of each row's resample distribution."""
    dist = np.atleast_2d(dist)
    a = (1.0 - confidence) / 2.0
    b = dist.shape[1]
    if not np.isnan(dist).any() and b > 1:
        # Same linear interpolation as quantile_rows, from a partial sort of the 4 order statistics.
        h = (b - 1) * np.array([a, 1.0 - a])
        lo = np.floor(h).astype(np.intp)
        hi = np.minimum(lo + 1, b - 1)
        part = np.partition(dist, np.unique(np.r_[lo, hi]), axis=1)
        v = part[:, lo] + (h - lo) * (part[:, hi] - part[:, lo])
        return v[:, 0], v[:, 1]
    return quantile_rows(dist, np.full(len(dist), a)), quantile_rows(dist, np.full(len(dist), 1.0 - a))


def bca_levels(
    dist: np.ndarray, theta_hat: np.ndarray, jackknife: list[np.ndarray], confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """BCa quantile levels (alpha_1, alpha_2) per row, as Efron & Tibshirani 14.3 / scipy.

    `jackknife` holds one (S, n_j) array of leave-one-out estimates per independent sample (one
    for a single dataset, two for a difference between datasets), as scipy's multi-sample BCa.
    """
    dist = np.atleast_2d(dist)
    theta = np.asarray(theta_hat, dtype=float)[:, None]
    valid = ~np.isnan(dist)
    nb = valid.sum(axis=1)
    # z0 from the "mean" percentile of theta_hat (ties count half), as scipy.
    frac = ((dist < theta).sum(axis=1) + (dist <= theta).sum(axis=1)) / (2.0 * nb)
    z0 = ndtri(frac)
    nums, dens = 0.0, 0.0
    for jk in jackknife:
        n = jk.shape[1]
        u = (n - 1) * (jk.mean(axis=1, keepdims=True) - jk)
        nums = nums + (u**3).sum(axis=1) / n**3
        dens = dens + (u**2).sum(axis=1) / n**2
    with np.errstate(invalid="ignore", divide="ignore"):
        # No jackknife spread (e.g. a difference that is 0 everywhere): no acceleration.
        a_hat = np.where(dens > 0, nums / (6.0 * np.where(dens > 0, dens, 1.0) ** 1.5), 0.0)
    z_a = ndtri((1.0 - confidence) / 2.0)
    n1, n2 = z0 + z_a, z0 - z_a
    return ndtr(z0 + n1 / (1 - a_hat * n1)), ndtr(z0 + n2 / (1 - a_hat * n2))


def bca_ci(
    dist: np.ndarray, theta_hat: np.ndarray, jackknife: list[np.ndarray], confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """Bias-corrected and accelerated interval; NaN where it is undefined (degenerate rows)."""
    a1, a2 = bca_levels(dist, theta_hat, jackknife, confidence)
    return quantile_rows(dist, a1), quantile_rows(dist, a2)


def bootstrap_p(diff_dist: np.ndarray) -> np.ndarray:
    """Two-sided bootstrap p-value of H0: difference = 0, per row of resampled differences.

    p = min(1, 2 (1 + min(k_below, k_above)) / (B + 1)), where k_below counts resamples with
    difference < 0 plus half of those exactly 0 (k_above likewise): twice the one-sided p-value
    (1 + k) / (B + 1), the standard form that keeps a finite-B p valid (Davison & Hinkley 1997, 4.4).
    It never falls below 2/(B + 1) (1.9998e-4 for B = 10,000); a difference that is 0 in every
    resample (a subject against itself) gets exactly p = 1.
    """
    d = np.atleast_2d(diff_dist)
    valid = ~np.isnan(d)
    b = valid.sum(axis=1)
    eq = (d == 0).sum(axis=1) / 2.0
    below = (d < 0).sum(axis=1) + eq
    above = (d > 0).sum(axis=1) + eq
    p = 2.0 * (1.0 + np.minimum(below, above)) / (b + 1.0)
    return np.where(b > 0, np.minimum(p, 1.0), np.nan)


def p_floor(n_resamples: int) -> float:
    """The smallest p-value `bootstrap_p` can return with this many resamples: 2/(B + 1)."""
    return 2.0 / (n_resamples + 1.0)


def bh_qvalues(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values), same arithmetic as scipy's 'bh'.

    q_(i) = min_{j >= i} p_(j) * m / j over the sorted p-values, clipped to 1. NaN p-values
    (comparisons that could not be made) are left out of m and stay NaN.
    """
    p = np.asarray(p, dtype=float)
    q = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    ps = p[ok]
    m = ps.size
    if m == 0:
        return q
    order = np.argsort(ps)
    s = ps[order] * (m / np.arange(1, m + 1, dtype=float))
    np.minimum.accumulate(s[::-1], out=s[::-1])
    adj = np.empty(m)
    adj[order] = s
    q[ok] = np.clip(adj, 0.0, 1.0)
    return q
