"""Result records (frozen dataclasses) and the Arrow schemas of the engine's input (`scores`) and
output (`stats`, `comparisons`) tables."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

# One value per subject, image, variant and metric: what the engine resamples. A scores table may add
# a `weight` column (float64 > 0): the number of units (e.g. model-image pairs) the value is the mean
# of, so estimates are means over units while resamples draw whole images.
SCORES_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("variant", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
    ]
)

STATS_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("dataset", pa.string()),
        ("metric", pa.string()),
        ("variant", pa.string()),
        ("estimate", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("n_images", pa.int64()),
        ("n_resamples", pa.int64()),
        ("seed", pa.int64()),
        ("method", pa.string()),
    ]
)

COMPARISONS_SCHEMA = pa.schema(
    [
        ("family", pa.string()),
        ("a", pa.string()),
        ("b", pa.string()),
        ("dataset", pa.string()),  # the shared dataset, or "X vs Y" when a and b are on different ones
        ("metric", pa.string()),
        ("variant", pa.string()),
        ("difference", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("p", pa.float64()),
        ("q", pa.float64()),
        ("significant", pa.bool_()),
        ("n_resamples", pa.int64()),
        ("a_dataset", pa.string()),
        ("b_dataset", pa.string()),
        ("estimate_a", pa.float64()),
        ("estimate_b", pa.float64()),
        ("paired", pa.bool_()),
        ("seed", pa.int64()),
        # Images behind each term; below the analysis' `min_images` a comparison has no p, q or decision.
        ("n_a", pa.int64()),
        ("n_b", pa.int64()),
        # Images of the dataset that one side has and the other lacks, left out of a comparison
        # on shared images (Family.shared_images); 0 otherwise.
        ("n_dropped", pa.int64()),
    ]
)


@dataclass(frozen=True)
class Estimate:
    """A bootstrap estimate with its interval; `distribution` holds the resampled values."""

    estimate: float
    ci_low: float
    ci_high: float
    n: int
    n_resamples: int
    method: str
    distribution: np.ndarray = field(repr=False, compare=False)


@dataclass(frozen=True)
class StudyResult:
    """Everything `bootstrap_study` computed.

    `distributions` (only when asked for) maps (subject, dataset, metric, variant) to the
    resampled means, and `comparison_distributions` maps (family, a, b, a_dataset, b_dataset,
    metric, variant) to the resampled differences, for plots.
    """

    stats: pa.Table
    comparisons: pa.Table
    distributions: dict = field(default_factory=dict, repr=False, compare=False)
    comparison_distributions: dict = field(default_factory=dict, repr=False, compare=False)
