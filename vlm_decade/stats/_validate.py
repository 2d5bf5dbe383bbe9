"""Input validation, kept apart from the numerical core (as scipy.stats `_resampling.py` does).

Each function checks one kind of argument and returns it in the form the core expects, or raises
`StatsInputError` with a message that names the argument (and the table row, for scores).
"""

from __future__ import annotations

import numbers

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.config import MAX_RESAMPLES, MAX_SEED
from vlm_decade.stats.families import ERAS, Family

SCORE_COLUMNS = ("subject", "image_id", "dataset", "variant", "metric")


class StatsInputError(ValueError):
    """Bad input to the statistics engine."""


def validate_scores(scores) -> pa.Table:
    if not isinstance(scores, pa.Table):
        raise StatsInputError(f"scores must be a pyarrow.Table, got {type(scores).__name__}")
    missing = [c for c in (*SCORE_COLUMNS, "value") if c not in scores.column_names]
    if missing:
        raise StatsInputError(f"scores lacks column(s) {missing}; has {scores.column_names}")
    cols = {}
    for c in SCORE_COLUMNS:
        col = scores.column(c)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_dictionary(col.type)):
            raise StatsInputError(f"scores column '{c}' must be strings, got {col.type}")
        col = col.cast(pa.string()) if not pa.types.is_string(col.type) else col
        if col.null_count:
            row = int(np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False))[0])
            raise StatsInputError(f"scores column '{c}' is empty at row {row}")
        cols[c] = col
    value = scores.column("value")
    if not (pa.types.is_floating(value.type) or pa.types.is_integer(value.type)):
        raise StatsInputError(f"scores column 'value' must be numeric, got {value.type}")
    v = value.cast(pa.float64()).to_numpy(zero_copy_only=False)  # nulls become NaN = missing
    if np.isinf(v).any():
        row = int(np.flatnonzero(np.isinf(v))[0])
        raise StatsInputError(f"scores column 'value' is infinite at row {row}")
    cols["value"] = pa.array(v, pa.float64())
    if "weight" in scores.column_names:  # optional: how many units (pairs) a row's value averages
        weight = scores.column("weight")
        if not (pa.types.is_floating(weight.type) or pa.types.is_integer(weight.type)):
            raise StatsInputError(f"scores column 'weight' must be numeric, got {weight.type}")
        w = weight.cast(pa.float64()).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(~(np.isfinite(w) & (w > 0)))
        if bad.size:
            raise StatsInputError(
                f"scores column 'weight' must be a positive number, got {w[bad[0]]!r} at row {int(bad[0])}"
            )
        cols["weight"] = pa.array(w, pa.float64())
    return pa.table(cols)


def validate_eras(eras, subjects, need_all: bool) -> dict[str, str]:
    if not isinstance(eras, dict):
        raise StatsInputError(f"eras must be a dict subject -> era, got {type(eras).__name__}")
    bad = {s: e for s, e in eras.items() if e not in ERAS}
    if bad:
        raise StatsInputError(f"eras: unknown era(s) {bad}; expected one of {ERAS}")
    humans = [s for s, e in eras.items() if e == "human" and not s.startswith("human:")]
    if humans:
        raise StatsInputError(f"eras: human groups must be named 'human:<group>', got {humans}")
    if need_all:
        lacking = sorted(set(subjects) - set(eras))
        if lacking:
            raise StatsInputError(f"eras: no era for subject(s) {lacking} (needed by the default families)")
    return dict(eras)


def validate_params(n_resamples, seed, confidence, alpha, method, mode) -> None:
    if not isinstance(n_resamples, numbers.Integral) or isinstance(n_resamples, bool) or n_resamples < 1:
        raise StatsInputError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if n_resamples > MAX_RESAMPLES:
        raise StatsInputError(
            f"n_resamples must be at most {MAX_RESAMPLES:,}, got {n_resamples:,}: resamples are drawn in blocks, but every "
            f"series keeps its {n_resamples:,} resampled means ({8 * n_resamples / 1e9:g} GB each) for its percentiles"
        )
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise StatsInputError(f"seed must be an integer from 0 to 2**63 - 1 (stored as a 64-bit integer), got {seed!r}")
    for name, x in (("confidence", confidence), ("alpha", alpha)):
        if not isinstance(x, numbers.Real) or not 0.0 < float(x) < 1.0:
            raise StatsInputError(f"{name} must be strictly between 0 and 1, got {x!r}")
    if method not in ("percentile", "bca"):
        raise StatsInputError(f"method must be 'percentile' or 'bca', got {method!r}")
    if mode not in ("auto", "multinomial", "poisson"):
        raise StatsInputError(f"mode must be 'auto', 'multinomial' or 'poisson', got {mode!r}")
    if mode == "poisson" and method == "bca":
        raise StatsInputError("BCa needs the jackknife over all images; Poisson mode gives percentile intervals only")


def validate_families(families) -> list[Family]:
    if not isinstance(families, (list, tuple)) or not all(isinstance(f, Family) for f in families):
        raise StatsInputError("families must be a list of vlm_decade.stats.Family")
    names = [f.name for f in families]
    if len(set(names)) != len(names):
        raise StatsInputError(f"family names must be unique, got {names}")
    return list(families)


def validate_paired(x, y) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise StatsInputError(f"x and y must be 1-D arrays of the same length, got {x.shape} and {y.shape}")
    if x.size < 3:
        raise StatsInputError("a correlation needs at least 3 pairs")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise StatsInputError("x and y must be finite (drop missing pairs first)")
    return x, y
