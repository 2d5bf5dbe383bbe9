"""Validation of the similarity metrics against people (METHOD.md, "Similarity metric"; paper fig. A.1a).

Raters score how similar a model's description is to the image's gold standard. A metric is valid
to the degree that it agrees with each rater as well as raters agree with one another:

* metric vs raters: per rater, the correlation (Pearson and Spearman) of the metric's values with
  that rater's ratings over the (subject, image) pairs the rater rated; then the mean over raters.
* inter-rater, pairwise: the mean correlation over all pairs of raters (how well one person agrees
  with another). The paper's test is against it ("the metric's mean correlation with individual
  raters is higher than the mean inter-rater correlation"), so it is the default reference.
* inter-rater, leave-one-out: each rater against the mean rating of all the other raters, averaged
  over raters: a stricter ceiling (the others' mean is the best prediction of one rater people can
  give), offered as `ceiling="leave-one-out"`.

Each analysis is made on all rated pairs (`subject` "all") and, as the paper's figure A.1a shows
it for UDC, M2M and OSCAR, on each rated model's pairs alone.

Uncertainty comes from a bootstrap over images (all pairs of a drawn image go in together), drawn
from the stats engine's seeded chunk streams, so every statistic sees the same resamples: the CI of
each mean, and the two-sided bootstrap p of (metric-vs-rater mean) minus (ceiling), with
Benjamini-Hochberg q across metrics within each correlation kind. Averages of correlations are
plain means (no Fisher z), as the paper reports them.

Also here: the human ratings table (`load_ratings`, checked like every input: file, row, field)
and the figure (`write_validation_figure`).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import first_rows
from vlm_decade.core.errors import Problems
from vlm_decade.core.fingerprints import table_fingerprint
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.core.tables import read_table
from vlm_decade.report.figures import save_figure
from vlm_decade.stats import METHOD_VERSION, format_p
from vlm_decade.stats.resampling import (
    bh_qvalues,
    bootstrap_p,
    percentile_ci,
    resample_counts,
    weighted_pearson,
    weighted_ranks,
)

RATINGS_COLUMNS = ("rater_id", "subject", "image_id", "rating")
RATINGS_SCHEMA = pa.schema(
    [("rater_id", pa.string()), ("subject", pa.string()), ("image_id", pa.string()), ("rating", pa.float64())]
)
LOO = "inter-rater (leave-one-out)"
PAIRWISE = "inter-rater (pairwise)"
CEILINGS = {"leave-one-out": LOO, "pairwise": PAIRWISE}
KINDS = ("pearson", "spearman")
STREAM = "metric-validation"

ALL = "all"  # the subject of the analysis over every rated pair
VALIDATION_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),  # "all", or the one model whose rated pairs the row is about
        ("metric", pa.string()),
        ("kind", pa.string()),  # pearson | spearman
        ("role", pa.string()),  # metric | ceiling | reference
        ("estimate", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("difference", pa.float64()),  # metric rows: estimate minus the ceiling's estimate
        ("diff_ci_low", pa.float64()),
        ("diff_ci_high", pa.float64()),
        ("p", pa.float64()),
        ("q", pa.float64()),
        ("n_raters", pa.int64()),
        ("n_pairs", pa.int64()),
        ("n_resamples", pa.int64()),
        ("seed", pa.int64()),
    ]
)
PER_RATER_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("metric", pa.string()),
        ("kind", pa.string()),
        ("rater_id", pa.string()),
        ("estimate", pa.float64()),
        ("n_pairs", pa.int64()),
    ]
)


# --- the ratings table -----------------------------------------------------------------------------


def check_ratings(
    path: str | Path,
    known_subjects,
    known_images,
    problems: Problems,
    scale: tuple[float, float] = (1.0, 5.0),
) -> pa.Table | None:
    """Read and check a ratings table (rater_id, subject, image_id, rating), adding every problem.

    Returns the good rows (RATINGS_SCHEMA, sorted) or None when the file cannot be read at all.
    A rating must be a number within `scale`; one rater may rate a (subject, image) only once.
    """
    table = read_table(Path(path), RATINGS_COLUMNS, problems, numbers=("rating",))
    if table is None:
        return None
    subjects, images = set(known_subjects), set(known_images)
    lo, hi = scale
    every = [
        {
            c: (";".join(v) if isinstance(v, list) else v).strip()
            for c, v in ((c, row.cells[c]) for c in RATINGS_COLUMNS)
        }
        for row in table.rows
    ]
    keyed = ("rater_id", "subject", "image_id")
    first = first_rows(
        pa.table({c: [cells[c] for cells in every] for c in keyed}),
        np.array([all(cells[c] for c in keyed) for cells in every], bool),
    )
    rows = []
    for i, (row, cells) in enumerate(zip(table.rows, every)):
        errors: list[tuple[str, str]] = [(c, f"'{c}' is empty") for c, v in cells.items() if not v]
        if cells["subject"] and cells["subject"] not in subjects:
            errors.append(("subject", f"unknown subject '{cells['subject']}' (not a model of the study)"))
        if cells["image_id"] and cells["image_id"] not in images:
            errors.append(("image_id", f"unknown image_id '{cells['image_id']}' (not in the images table)"))
        rating = math.nan
        if cells["rating"]:
            try:
                rating = float(cells["rating"])
            except ValueError:
                errors.append(("rating", f"rating '{cells['rating']}' is not a number"))
            else:
                if not lo <= rating <= hi:  # NaN fails this too
                    errors.append(("rating", f"rating {cells['rating']} is outside the scale {lo:g} to {hi:g}"))
        key = (cells["rater_id"], cells["subject"], cells["image_id"])
        if all(key) and first[i] != i:
            message = f"duplicate rating: rater '{key[0]}' on subject '{key[1]}', image '{key[2]}'"
            errors.append(("rater_id", f"{message} (first at row {table.rows[first[i]].number})"))
        for column, message in errors:
            problems.add(table.file, message, row=row.number, field=column)
        if not errors:
            rows.append({**cells, "rating": rating})
    if not table.rows:
        problems.add(table.file, "has no ratings")
    rows.sort(key=lambda r: (r["subject"], r["image_id"], r["rater_id"]))
    return pa.Table.from_pylist(rows, schema=RATINGS_SCHEMA)


def load_ratings(path: str | Path, known_subjects, known_images, scale: tuple[float, float] = (1.0, 5.0)) -> pa.Table:
    """The checked ratings table; every problem (file, row, field) is raised together as one InputError."""
    problems = Problems()
    table = check_ratings(path, known_subjects, known_images, problems, scale)
    problems.raise_if_any()
    return table


# --- the analysis ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricValidation:
    """`summary` (VALIDATION_SCHEMA): per kind, the two inter-rater references and one row per metric
    with p and q against the ceiling; `per_rater` (PER_RATER_SCHEMA): full-sample correlations."""

    summary: pa.Table
    per_rater: pa.Table
    ceiling: str  # "pairwise" or "leave-one-out"


@dataclass(frozen=True)
class _Design:
    raters: list[str]
    metrics: list[str]
    image_of_pair: np.ndarray  # (P,) image index of each analysed (subject, image) pair
    n_images: int
    ratings: np.ndarray  # (R, P), 0 where missing
    rated: np.ndarray  # (R, P) bool
    values: np.ndarray  # (K, P) metric values


def _design(ratings: pa.Table, scores: pa.Table, thin: str = "refuse") -> _Design | None:
    """The rated pairs that every metric scored, as matrices. A rater with fewer than 3 such pairs is
    refused (`thin="refuse"`, a ValueError) or left out (`thin="drop"`: one model's share of the
    ratings); None when fewer than 2 raters are left."""
    if "variant" in scores.column_names:  # the run's scores table: ratings are of full-image descriptions
        scores = scores.filter(pc.equal(scores["variant"], "full"))
    value_of: dict[str, dict[tuple[str, str], float]] = {}
    for s, i, m, v in zip(*(scores.column(c).to_pylist() for c in ("subject", "image_id", "metric", "value"))):
        if (s, i) in value_of.setdefault(m, {}):
            raise ValueError(f"scores: more than one value for metric '{m}', subject '{s}', image '{i}'")
        value_of[m][(s, i)] = math.nan if v is None else v
    metrics = sorted(value_of)
    rated_pairs = set(zip(ratings.column("subject").to_pylist(), ratings.column("image_id").to_pylist()))
    pairs = sorted(p for p in rated_pairs if all(np.isfinite(value_of[m].get(p, math.nan)) for m in metrics))
    raters = sorted(set(ratings.column("rater_id").to_pylist()))
    if not metrics:
        raise ValueError("scores: no metric values")
    if len(raters) < 2:
        raise ValueError("ratings: inter-rater agreement needs at least 2 raters")
    images = sorted({i for _, i in pairs})
    pair_index = {p: j for j, p in enumerate(pairs)}
    rater_index = {r: j for j, r in enumerate(raters)}
    y = np.zeros((len(raters), len(pairs)))
    rated = np.zeros((len(raters), len(pairs)), dtype=bool)
    for r, s, i, v in zip(*(ratings.column(c).to_pylist() for c in RATINGS_COLUMNS)):
        if (s, i) in pair_index:
            y[rater_index[r], pair_index[(s, i)]] = v
            rated[rater_index[r], pair_index[(s, i)]] = True
    few = [r for r, n in zip(raters, rated.sum(axis=1)) if n < 3]
    if few and thin == "refuse":
        raise ValueError(f"a correlation needs at least 3 scored pairs per rater; too few for: {', '.join(few)}")
    if few:
        keep = [j for j, r in enumerate(raters) if r not in few]
        if len(keep) < 2:
            return None
        raters, y, rated = [raters[j] for j in keep], y[keep], rated[keep]
    return _Design(
        raters=raters,
        metrics=metrics,
        image_of_pair=np.array([images.index(i) for _, i in pairs], dtype=np.intp),
        n_images=len(images),
        ratings=y,
        rated=rated,
        values=np.array([[value_of[m][p] for p in pairs] for m in metrics]),
    )


class _Correlator:
    """Correlations of (vector, subset of pairs) series under one block of resample weights.

    Spearman ranks are taken within each resample and each subset (a pair outside the subset gets
    weight 0, which `weighted_ranks` leaves out), and cached: in a complete design every
    rater shares one subset, so each vector is ranked once per block.
    """

    def __init__(self, weights: np.ndarray, kind: str):
        self.w, self.kind = weights, kind
        self._ranks: dict[tuple[str, bytes], np.ndarray] = {}

    def _series(self, name: str, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self.kind == "pearson":
            return np.broadcast_to(x, self.w.shape)  # the same values in every resample
        key = (name, np.packbits(mask).tobytes())
        if key not in self._ranks:
            self._ranks[key] = weighted_ranks(self.w * mask, x)
        return self._ranks[key]

    def corr(self, a: tuple[str, np.ndarray], b: tuple[str, np.ndarray], mask: np.ndarray) -> np.ndarray:
        return weighted_pearson(self.w * mask, self._series(*a, mask), self._series(*b, mask))


def _nanmean(x: np.ndarray, axis: int = 0) -> np.ndarray:
    with warnings.catch_warnings():  # a resample where every rater's r is undefined gives NaN, quietly
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def _statistics(d: _Design, weights: np.ndarray, kind: str) -> dict[str, np.ndarray]:
    """Per resample (row of `weights`, over pairs): each metric's mean correlation with the raters,
    and the two inter-rater means; plus the per-rater values under the key (name, rater)."""
    c = _Correlator(weights, kind)
    n_raters = len(d.raters)
    rater = [(f"rater:{r}", d.ratings[j]) for j, r in enumerate(d.raters)]
    out: dict = {}
    for k, m in enumerate(d.metrics):
        per = np.vstack([c.corr((f"metric:{m}", d.values[k]), rater[j], d.rated[j]) for j in range(n_raters)])
        out[m] = _nanmean(per)
        out.update({(m, d.raters[j]): per[j] for j in range(n_raters)})
    loo = []
    for j in range(n_raters):
        others = np.delete(np.arange(n_raters), j)
        count = d.rated[others].sum(axis=0)
        mean_others = d.ratings[others].sum(axis=0) / np.maximum(count, 1)
        loo.append(c.corr((f"others:{j}", mean_others), rater[j], d.rated[j] & (count > 0)))
        out[(LOO, d.raters[j])] = loo[-1]
    out[LOO] = _nanmean(np.vstack(loo))
    pairwise = [
        c.corr(rater[i], rater[j], d.rated[i] & d.rated[j]) for i in range(n_raters) for j in range(i + 1, n_raters)
    ]
    out[PAIRWISE] = _nanmean(np.vstack(pairwise))
    return out


def too_few_ratings(ratings: pa.Table, where: str) -> str | None:
    """Why the ratings cannot support a metric validation (None: they can): it needs 2 raters, each
    with 3 rated descriptions (a correlation of fewer pairs says nothing). A study whose images were
    cut (`run --limit`) or whose raters rated little is run without the stage and says so."""
    per_rater = Counter(ratings.column("rater_id").to_pylist())  # one rating per (rater, pair): checked
    thin = sorted(r for r, n in per_rater.items() if n < 3)
    if len(per_rater) >= 2 and not thin:
        return None
    why = (
        f"{len(per_rater)} rater{'s' if len(per_rater) != 1 else ''}, and inter-rater agreement needs 2"
        if len(per_rater) < 2
        else f"rater{'s' if len(thin) > 1 else ''} {', '.join(thin[:5])}{' ...' if len(thin) > 5 else ''} "
        "rated fewer than 3 descriptions, and a correlation needs 3"
    )
    return f"{where}: {why}: the metrics are not validated against the ratings in this run (no metric_validation)"


def validate_metrics(
    ratings: pa.Table,
    scores: pa.Table,
    n_resamples: int = 10_000,
    seed: int = 20_241_101,
    confidence: float = 0.95,
    ceiling: str = "pairwise",
) -> MetricValidation:
    """Each metric's agreement with the raters against the inter-rater reference (module docstring),
    over all rated pairs (subject "all") and over each rated model's pairs.

    ratings: RATINGS_SCHEMA rows (`load_ratings`). scores: one row per (subject, image_id, metric)
    with a `value`: the run's scores table (only its `full` variant is used) or `metrics.score_table`.
    Only rated pairs that every metric scored are analysed, so all metrics see the same pairs.
    ceiling: "pairwise" (default, the paper's test) or "leave-one-out"; p and q are against it. A
    model whose raters rated fewer than 3 of its pairs each (or with fewer than 2 such raters) gets
    no per-model rows."""
    if ceiling not in CEILINGS:
        raise ValueError(f"ceiling must be one of {', '.join(CEILINGS)}, got {ceiling!r}")
    if n_resamples < 1:
        raise ValueError("n_resamples must be at least 1")
    rows, per_rater = _validate(ALL, _design(ratings, scores), n_resamples, seed, confidence, ceiling, STREAM)
    rated = sorted(set(ratings.column("subject").to_pylist()))
    if len(rated) > 1:
        for subject in rated:
            design = _design(ratings.filter(pc.equal(ratings["subject"], subject)), scores, thin="drop")
            if design is not None:
                more, more_raters = _validate(
                    subject, design, n_resamples, seed, confidence, ceiling, f"{STREAM}:{subject}"
                )
                rows += more
                per_rater += more_raters
    summary = pa.Table.from_pylist(rows, schema=VALIDATION_SCHEMA)
    per_rater.sort(key=lambda r: (r["subject"] != ALL, r["subject"], r["kind"], r["metric"], r["rater_id"]))
    return MetricValidation(summary, pa.Table.from_pylist(per_rater, schema=PER_RATER_SCHEMA), ceiling)


def _validate(
    subject: str, d: _Design, n_resamples: int, seed: int, confidence: float, ceiling: str, stream: str
) -> tuple[list[dict], list[dict]]:
    """The summary and per-rater rows of one analysis (all pairs, or one model's)."""
    n_pairs = d.values.shape[1]
    full = {kind: _statistics(d, np.ones((1, n_pairs)), kind) for kind in KINDS}

    # Every kind and statistic sees the same resamples: chunk c of the stream, whatever B is.
    dists: dict[str, dict] = {kind: {} for kind in KINDS}
    for counts in resample_counts(seed, stream, n_resamples, d.n_images):
        weights = counts[:, d.image_of_pair]
        for kind in KINDS:
            for name, dist in _statistics(d, weights, kind).items():
                if isinstance(name, str):
                    dists[kind].setdefault(name, []).append(dist)

    ref = CEILINGS[ceiling]
    rows, per_rater = [], []
    for kind in KINDS:
        dist = {name: np.concatenate(parts) for name, parts in dists[kind].items()}
        names = [LOO, PAIRWISE, *d.metrics]
        lo, hi = percentile_ci(np.vstack([dist[n] for n in names]), confidence)
        diffs = np.vstack([dist[m] - dist[ref] for m in d.metrics])
        p = bootstrap_p(diffs)
        q = bh_qvalues(p)
        dlo, dhi = percentile_ci(diffs, confidence)
        for i, name in enumerate(names):
            row = {
                "subject": subject,
                "metric": name,
                "kind": kind,
                "estimate": float(full[kind][name][0]),
                "ci_low": lo[i],
                "ci_high": hi[i],
            }
            if name in (LOO, PAIRWISE):
                row["role"] = "ceiling" if name == ref else "reference"
            else:
                k = i - 2
                row.update(
                    role="metric",
                    difference=row["estimate"] - float(full[kind][ref][0]),
                    diff_ci_low=dlo[k],
                    diff_ci_high=dhi[k],
                    p=p[k],
                    q=q[k],
                )
            rows.append(
                _nan_to_null(
                    {**row, "n_raters": len(d.raters), "n_pairs": n_pairs, "n_resamples": n_resamples, "seed": seed}
                )
            )
        for key, value in full[kind].items():
            if isinstance(key, tuple):
                name, rater_id = key
                j = d.raters.index(rater_id)
                per_rater.append(
                    {
                        "subject": subject,
                        "metric": name,
                        "kind": kind,
                        "rater_id": rater_id,
                        "estimate": float(value[0]),
                        "n_pairs": int(d.rated[j].sum()),
                    }
                )
    return rows, per_rater


def _nan_to_null(row: dict) -> dict:
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def agreement_summary(summary: pa.Table, judge_metrics: list[str]) -> str:
    """What the report says of the validation in words: per correlation kind, over all rated pairs,
    the metric that agrees with the raters best, with its CI; and, when the study has no judge
    metric, why none is shown."""
    rows = [
        r for r in summary.to_pylist() if r["subject"] == ALL and r["role"] == "metric" and r["estimate"] is not None
    ]
    said = []
    for kind in KINDS:
        here = [r for r in rows if r["kind"] == kind]
        if here:
            best = max(here, key=lambda r: r["estimate"])
            lo, hi = best["ci_low"], best["ci_high"]
            ci = "" if lo is None or hi is None else f" [95% CI {lo:.3f}, {hi:.3f}]"
            said.append(
                f"{kind.capitalize()}: {best['metric']} agrees with the raters best ({best['estimate']:.3f}{ci})."
            )
    if not judge_metrics:
        said.append(
            "No judge metric is shown: the study configures none (`judge_metrics`, an LLM judge through an API "
            "model; docs/metrics.md), and an offline run has no API model to ask."
        )
    return " ".join(said)


# --- the figure ------------------------------------------------------------------------------------


def validation_figure(summary: pa.Table, labels: dict[str, str] | None = None, demo: bool = False):
    """Fig. A.1a's shape: one row of panels per analysis (all rated pairs, then each rated model), one
    panel per kind: each metric's mean correlation with the raters (point, CI) against the reference
    the test uses (grey band: CI, line: estimate) and the other inter-rater reference (dashed line)."""
    from matplotlib.figure import Figure

    labels = labels or {}
    rows = summary.to_pylist()
    kinds = [k for k in KINDS if any(r["kind"] == k for r in rows)]
    subjects = list(dict.fromkeys(r.get("subject", ALL) for r in rows))
    fig = Figure(figsize=(4.2 * max(len(kinds), 1), 4.2 * max(len(subjects), 1)), layout="constrained")
    grid = fig.subplots(max(len(subjects), 1), max(len(kinds), 1), sharey=True, squeeze=False)
    for axes, subject in zip(grid, subjects):
        for ax, kind in zip(axes, kinds):
            here = [r for r in rows if r["kind"] == kind and r.get("subject", ALL) == subject]
            _validation_panel(ax, here, labels, kind, subject)
        axes[0].set_ylabel("mean correlation")
    fig.legend(*grid[0][0].get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8)
    if demo:
        fig.suptitle("DEMO DATA: simulated ratings, no findings", color="firebrick", fontweight="bold")
        fig.text(
            0.5, 0.5, "DEMO DATA", fontsize=48, color="firebrick", alpha=0.15, ha="center", va="center", rotation=20
        )
    return fig


def _validation_panel(ax, here: list[dict], labels: dict[str, str], kind: str, subject: str) -> None:
    metrics = [r for r in here if r["role"] == "metric"]
    ceiling = next(r for r in here if r["role"] == "ceiling")
    other = next(r for r in here if r["role"] == "reference")
    if ceiling["ci_low"] is not None and ceiling["ci_high"] is not None:
        ax.axhspan(ceiling["ci_low"], ceiling["ci_high"], color="0.85", zorder=0, label=f"{ceiling['metric']} (95% CI)")
    if ceiling["estimate"] is not None:
        ax.axhline(ceiling["estimate"], color="0.45", lw=1.2, zorder=1)
    if other["estimate"] is not None:
        ax.axhline(other["estimate"], color="0.45", lw=1.0, ls="--", zorder=1, label=other["metric"])
    shown = [r for r in metrics if r["estimate"] is not None]
    x = np.arange(len(shown))
    est = np.array([r["estimate"] for r in shown])
    err = (
        np.array(
            [
                [
                    r["estimate"] - (r["ci_low"] if r["ci_low"] is not None else r["estimate"]),
                    (r["ci_high"] if r["ci_high"] is not None else r["estimate"]) - r["estimate"],
                ]
                for r in shown
            ]
        )
        .reshape(-1, 2)
        .T
    )
    ax.errorbar(x, est, yerr=err, fmt="o", color="C0", capsize=4, zorder=3, label="metric vs raters (mean, 95% CI)")
    for xi, r in zip(x, shown):
        ax.annotate(
            f"q {format_p(r['q'], r['n_resamples'])}",
            (xi, r["ci_high"] if r["ci_high"] is not None else r["estimate"]),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            fontsize=8,
        )
    ax.set_xticks(x, [labels.get(r["metric"], r["metric"]) for r in shown], rotation=20, ha="right", fontsize=8)
    ax.set_xlim(-0.6, max(len(shown), 1) - 0.4)
    ax.set_title(
        f"{kind.capitalize()} correlation with raters" + ("" if subject == ALL else f": {subject}"), fontsize=10
    )
    n = metrics[0] if metrics else ceiling
    ax.set_xlabel(f"{n['n_raters']} raters, {n['n_pairs']} rated pairs")


def write_validation_figure(
    summary: pa.Table, path: str | Path, labels: dict[str, str] | None = None, demo: bool = False
) -> Path:
    """Draw `validation_figure` and write it atomically (a temporary file renamed into place).
    The format follows the suffix (.png, .svg, .pdf); `labels` maps metric names to legend labels."""
    return save_figure(validation_figure(summary, labels, demo), Path(path), dpi=150)


def stage(study, ratings: pa.Table) -> Stage:
    """The `metric_validation` table: each metric of the run's scores against the study's raters,
    tested against `study.validation.ceiling`."""
    s, ceiling = study.statistics, study.validation.ceiling

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        return {
            "metric_validation": validate_metrics(
                ratings, run.table("scores"), s.n_resamples, s.seed, s.confidence, ceiling
            ).summary
        }

    return Stage(
        "metric_validation", ("scores",), [table_fingerprint(ratings), s.model_dump(), ceiling, METHOD_VERSION], compute
    )
