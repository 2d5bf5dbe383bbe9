"""Exact tests that need no resampling: McNemar's test for paired binary outcomes.

Two models answer the same images right or wrong (Study B's TI and LI); only the discordant pairs
say which is better. Under the null hypothesis each discordant pair favours either model with
probability 1/2, so the two-sided exact p-value is twice the binomial tail of the smaller count,
capped at 1 (McNemar 1947; the exact form as statsmodels' `mcnemar(exact=True)` computes it).
"""

from __future__ import annotations

import numpy as np


def mcnemar_exact(a_only, b_only) -> np.ndarray:
    """Two-sided exact p-values, elementwise: `a_only` pairs where only a was right, `b_only`
    where only b was. No discordant pair gives p = 1 (nothing tells the two apart)."""
    a_only, b_only = np.asarray(a_only, dtype=np.int64), np.asarray(b_only, dtype=np.int64)
    if np.any(a_only < 0) or np.any(b_only < 0):
        raise ValueError("McNemar counts must be non-negative")
    discordant = a_only + b_only
    from scipy.stats import binom  # on first use: scipy.stats takes most of a second to import

    p = 2.0 * binom.cdf(np.minimum(a_only, b_only), discordant, 0.5)
    return np.where(discordant == 0, 1.0, np.minimum(p, 1.0))


def discordant_counts(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(pairs where only a is 1, pairs where only b is 1) of two aligned 0/1 arrays."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes need aligned arrays, got {a.shape} and {b.shape}")
    return int(np.sum(a & ~b)), int(np.sum(b & ~a))
