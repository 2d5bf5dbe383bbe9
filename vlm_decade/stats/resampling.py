"""The engine's resampling building blocks, for analyses that `analyse` does not cover (the metric
validation's correlations over rated pairs, the SDE's sample of pseudo-workers).

Every random number comes from the engine's streams: `resample_counts` gives the multinomial
resample counts of a named analysis chunk by chunk, so its results do not depend on how the work is
split; `named_generator` gives one independent generator per (seed, name).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from vlm_decade.stats._core import (
    bh_qvalues,
    bootstrap_p,
    multinomial_counts,
    percentile_ci,
    weighted_pearson,
    weighted_ranks,
    weighted_spearman,
)
from vlm_decade.stats._streams import KIND_CORRELATION, chunk_sizes, chunk_streams, name_key

__all__ = [
    "resample_counts",
    "named_generator",
    "weighted_pearson",
    "weighted_spearman",
    "weighted_ranks",
    "percentile_ci",
    "bootstrap_p",
    "bh_qvalues",
]


def resample_counts(seed: int, name: str, n_resamples: int, n: int) -> Iterator[np.ndarray]:
    """Multinomial resample counts over `n` units, (chunk size, n) at a time, `n_resamples` rows in
    all; chunk c is the same for any `n_resamples` that reaches it."""
    sizes = chunk_sizes(n_resamples)
    for ss, b in zip(chunk_streams(seed, name, KIND_CORRELATION, len(sizes)), sizes):
        yield multinomial_counts(np.random.default_rng(ss), b, n)


def named_generator(seed: int, name: str) -> np.random.Generator:
    """An independent generator for one named use of the seed."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(name_key(name),)))
