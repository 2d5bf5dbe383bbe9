"""The statistics engine: bootstrap estimates, paired comparisons and Benjamini-Hochberg FDR.

Files:
- `analysis.py`  the entry points: `analyse` (scores table -> stats and comparisons tables),
                 `bootstrap_study` (same, with all options, `BootstrapOptions`, and the
                 resample distributions),
                 `correlation_ci` (metric vs human ratings) and `format_p`.
- `families.py`  which comparisons are made and corrected together (`Term`, `ComparisonSpec`,
                 `Family`, the paper's `default_families`).
- `_core.py`     the pure numpy core: resample weights, weighted reductions, percentile and BCa
                 intervals, the bootstrap p-value, BH q-values. Tests call it directly.
- `_streams.py`  where random numbers come from: one SeedSequence per (seed, name, chunk).
- `_engine.py`   runs blocks of resamples (or Poisson image shards) in-process or as Ray tasks.
- `_validate.py` argument checks, kept apart from the numerics.
- `results.py`   frozen result records and the Arrow schemas of the input and output tables.
- `shards.py`    the Poisson bootstrap's image shards' partial sums, kept for a later run.
- `shard_sums.py` where a statistics stage keeps those sums in its run folder between runs.
- `exact.py`     exact tests without resampling: McNemar's test for paired binary outcomes.
- `resampling.py` the public building blocks (resample counts, weighted correlations, named
                 generators) for analyses outside `analyse`.

See docs/statistics.md for the definitions.
"""

from vlm_decade.stats._core import bh_qvalues, bootstrap_p, p_floor
from vlm_decade.stats._engine import warm_workers
from vlm_decade.stats._validate import StatsInputError
from vlm_decade.stats.analysis import BootstrapOptions, analyse, bootstrap_study, correlation_ci, format_p, pivot
from vlm_decade.stats.exact import discordant_counts, mcnemar_exact
from vlm_decade.stats.families import (
    ComparisonSpec,
    Family,
    Term,
    dataset_family,
    default_families,
    era_family,
    era_vs_humans_family,
    vs_humans_family,
    within_era_family,
)
from vlm_decade.stats.results import COMPARISONS_SCHEMA, SCORES_SCHEMA, STATS_SCHEMA, Estimate, StudyResult
from vlm_decade.stats.shards import ShardSums

# What the engine computes, as a version: stages put it in their settings, so a change of method
# (2: the standard two-sided p-value, min_images, unit weights) recomputes existing runs.
METHOD_VERSION = 2

__all__ = [
    "METHOD_VERSION",
    "analyse",
    "bootstrap_study",
    "BootstrapOptions",
    "correlation_ci",
    "format_p",
    "pivot",
    "warm_workers",
    "bh_qvalues",
    "bootstrap_p",
    "p_floor",
    "mcnemar_exact",
    "discordant_counts",
    "StatsInputError",
    "Term",
    "ComparisonSpec",
    "Family",
    "default_families",
    "era_family",
    "dataset_family",
    "vs_humans_family",
    "era_vs_humans_family",
    "within_era_family",
    "SCORES_SCHEMA",
    "STATS_SCHEMA",
    "COMPARISONS_SCHEMA",
    "Estimate",
    "StudyResult",
    "ShardSums",
]
