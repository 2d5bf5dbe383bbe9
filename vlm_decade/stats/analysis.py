"""From a `scores` table to the `stats` and `comparisons` tables (the pipeline's entry point).

The long scores table is pivoted, per dataset, into a (series x images) value matrix and a mask
(series = subject x metric x variant). Every series of a dataset shares the dataset's resamples,
so comparisons on one dataset are paired, and different datasets draw independent resamples.

An optional `weight` column says how many units a row's value is the mean of (the model-image pairs
of an error group on one image): the mask then holds the weight and the values the weighted sums, so
an estimate is the mean over units while the bootstrap still resamples images, whole (clusters).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, replace
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.stats import _core, _engine, _streams, _validate
from vlm_decade.stats.families import ComparisonSpec, Family, Term, default_families
from vlm_decade.stats.results import COMPARISONS_SCHEMA, STATS_SCHEMA, Estimate, StudyResult
from vlm_decade.stats.shards import ShardSums

POISSON_AUTO_IMAGES = 200_000  # "auto" mode switches to the Poisson bootstrap above this many images


@dataclass(frozen=True)
class DatasetMatrix:
    """One dataset's scores as matrices: values (S, n) with 0 where missing, mask (S, n) of 0/1."""

    name: str
    images: tuple[str, ...]
    series: tuple[tuple[str, str, str], ...]  # (subject, metric, variant), sorted
    values: np.ndarray
    mask: np.ndarray


def _sorted_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Integer codes that sort like the strings (so input row order never matters), and the strings."""
    enc = pc.dictionary_encode(col).combine_chunks()
    words = np.asarray(enc.dictionary.to_pylist(), dtype=object)
    order = np.argsort(words)
    rank = np.empty(len(words), dtype=np.int64)
    rank[order] = np.arange(len(words))
    return rank[enc.indices.to_numpy(zero_copy_only=False)], list(words[order])


def _dense(codes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(codes, return_inverse=True)` of codes in [0, size), by marking those present
    rather than sorting (a sort of every row's code took most of a 110,000-image pivot)."""
    present = np.zeros(size, dtype=bool)
    present[codes] = True
    return np.flatnonzero(present), (np.cumsum(present) - 1)[codes]


def pivot(scores: pa.Table) -> dict[str, DatasetMatrix]:
    """Validated scores table -> {dataset: DatasetMatrix}. Duplicate rows are an error."""
    codes, words = {}, {}
    for c in _validate.SCORE_COLUMNS:
        codes[c], words[c] = _sorted_codes(scores.column(c))
    value = scores.column("value").to_numpy()
    weight = scores.column("weight").to_numpy() if "weight" in scores.column_names else np.ones(len(value))
    n_m, n_v = len(words["metric"]), len(words["variant"])
    series_key = (codes["subject"] * n_m + codes["metric"]) * n_v + codes["variant"]
    by_ds = np.argsort(codes["dataset"], kind="stable")
    bounds = np.searchsorted(codes["dataset"][by_ds], np.arange(len(words["dataset"]) + 1))
    out = {}
    for d, name in enumerate(words["dataset"]):
        rows = by_ds[bounds[d] : bounds[d + 1]]
        img_u, img_i = _dense(codes["image_id"][rows], len(words["image_id"]))
        ser_u, ser_i = _dense(series_key[rows], len(words["subject"]) * n_m * n_v)
        n, s = len(img_u), len(ser_u)
        flat = ser_i * n + img_i
        seen = np.zeros(s * n, dtype=bool)
        seen[flat] = True
        if np.count_nonzero(seen) != len(flat):
            dup = rows[np.flatnonzero(np.bincount(flat, minlength=s * n)[flat] > 1)[0]]
            raise _validate.StatsInputError(
                f"scores: more than one row for subject/image/variant/metric at row {int(dup)} "
                f"(dataset {name!r}, image {words['image_id'][codes['image_id'][dup]]!r})"
            )
        v = value[rows]
        w = weight[rows]
        ok = ~np.isnan(v)  # NaN/null = no score (failed response): that image is masked out
        values = np.zeros((s, n))
        mask = np.zeros((s, n))
        values[ser_i[ok], img_i[ok]] = v[ok] * w[ok]
        mask[ser_i[ok], img_i[ok]] = w[ok]
        sub, rem = np.divmod(ser_u, n_m * n_v)
        met, var = np.divmod(rem, n_v)
        series = tuple((words["subject"][a], words["metric"][b], words["variant"][c]) for a, b, c in zip(sub, met, var))
        out[name] = DatasetMatrix(name, tuple(words["image_id"][i] for i in img_u), series, values, mask)
    return out


def _interval(dist, theta, jackknife, confidence, method):
    if method == "bca":
        return _core.bca_ci(dist, theta, jackknife, confidence)
    return _core.percentile_ci(dist, confidence)


@dataclass(frozen=True)
class BootstrapOptions:
    """How `bootstrap_study` resamples, tests and reports: everything but the tables it reads.

    families: the comparisons made and corrected together (None: the paper's `default_families`,
    which need an era for every subject).
    method: "percentile" or "bca" (intervals of estimates and of differences).
    mode: "multinomial" (ordinary bootstrap), "poisson" (Poisson bootstrap over image shards,
    for studies too large for the index matrix) or "auto" (Poisson above POISSON_AUTO_IMAGES).
    keep_distributions: also return the resampled means and differences (for plots).
    use_ray: None = use Ray tasks when Ray is initialised. n_tasks: blocks per dataset (results
    do not depend on it). min_images: a comparison whose term (either side) rests on fewer images
    gets its difference and interval but no p, q or decision, and is left out of the family's BH
    correction (`n_a`, `n_b` say how many each side had). shard_sums: in Poisson mode, the image
    shards' partial sums an earlier run kept (the same to the bit), and where this run's are put.
    """

    n_resamples: int
    seed: int
    _: KW_ONLY
    confidence: float = 0.95
    alpha: float = 0.05
    families: list[Family] | None = None
    method: str = "percentile"
    mode: str = "auto"
    keep_distributions: bool = False
    use_ray: bool | None = None
    n_tasks: int | None = None
    min_images: int = 1
    shard_sums: ShardSums | None = None


class _Fit(NamedTuple):
    """Per series of one dataset: resampled means (S, B), estimates (S,), jackknife (BCa only)."""

    dist: np.ndarray
    theta: np.ndarray
    jack: np.ndarray | None


def bootstrap_study(scores: pa.Table, eras: dict[str, str], options: BootstrapOptions) -> StudyResult:
    """`analyse` with every option, returning a `StudyResult` (tables, optional distributions).

    `eras` maps subjects to their era (for the default families); `options` says the rest.
    """
    mats, families, options = _prepare(scores, eras, options)
    fits = _fit(mats, options)
    stats_rows, distributions = _estimate_rows(mats, fits, options)
    comp_rows, comp_dists = _Comparisons(mats, fits, options).rows(families)
    return StudyResult(
        _rows_to_table(stats_rows, STATS_SCHEMA),
        _rows_to_table(comp_rows, COMPARISONS_SCHEMA),
        distributions,
        comp_dists,
    )


def _prepare(
    scores: pa.Table, eras: dict[str, str], options: BootstrapOptions
) -> tuple[dict[str, DatasetMatrix], list[Family], BootstrapOptions]:
    """Checked inputs: the scores pivoted, the families, and the options with the mode decided."""
    o = options
    _validate.validate_params(o.n_resamples, o.seed, o.confidence, o.alpha, o.method, o.mode)
    if not isinstance(o.min_images, int) or isinstance(o.min_images, bool) or o.min_images < 1:
        raise _validate.StatsInputError(f"min_images must be a whole number >= 1, got {o.min_images!r}")
    mats = pivot(_validate.validate_scores(scores))
    subjects = {s for m in mats.values() for s, _, _ in m.series}
    eras = _validate.validate_eras(eras, subjects, need_all=o.families is None)
    families = default_families(eras, list(mats)) if o.families is None else _validate.validate_families(o.families)
    mode = o.mode
    if mode == "auto":
        most = max((len(m.images) for m in mats.values()), default=0)
        mode = "poisson" if most > POISSON_AUTO_IMAGES else "multinomial"
    if mode == "poisson" and o.method == "bca":
        raise _validate.StatsInputError("BCa is not available in Poisson mode (studies this large use percentile)")
    return mats, families, replace(o, mode=mode)


def _resample(jobs: dict[str, tuple[np.ndarray, np.ndarray]], o: BootstrapOptions) -> dict[str, np.ndarray]:
    """{dataset: resampled means (S, B)} of each (values, mask) job, by the options' (decided) mode."""
    if o.mode == "poisson":
        partial = _engine.poisson_partial_sums_many(jobs, o.n_resamples, o.seed, use_ray=o.use_ray, kept=o.shard_sums)
        return {d: _core.ratio(*partial[d]).T for d in jobs}
    return _engine.resample_means_many(jobs, o.n_resamples, o.seed, use_ray=o.use_ray, n_tasks=o.n_tasks)


def _fit_one(dist: np.ndarray, values: np.ndarray, mask: np.ndarray, method: str) -> _Fit:
    return _Fit(
        dist, _core.masked_means(values, mask), _core.jackknife_means(values, mask) if method == "bca" else None
    )


def _fit(mats: dict[str, DatasetMatrix], o: BootstrapOptions) -> dict[str, _Fit]:
    """Every dataset's series resampled (all datasets in one go, so Ray can run them together)."""
    dists = _resample({d: (m.values, m.mask) for d, m in mats.items()}, o)
    return {d: _fit_one(dists[d], m.values, m.mask, o.method) for d, m in mats.items()}


def _estimate_rows(mats: dict[str, DatasetMatrix], fits: dict[str, _Fit], o: BootstrapOptions) -> tuple[list, dict]:
    """The `stats` rows (estimate and interval per series), and the distributions when kept."""
    label = "poisson-percentile" if o.mode == "poisson" else o.method
    stats_rows, distributions = [], {}
    for d, m in mats.items():
        fit = fits[d]
        lo, hi = _interval(fit.dist, fit.theta, [fit.jack] if o.method == "bca" else [], o.confidence, o.method)
        n_img = (m.mask > 0).sum(axis=1).astype(np.int64)
        for k, (subject, metric, variant) in enumerate(m.series):
            stats_rows.append(
                (subject, d, metric, variant, fit.theta[k], lo[k], hi[k], n_img[k], o.n_resamples, o.seed, label)
            )
            if o.keep_distributions:
                distributions[(subject, d, metric, variant)] = fit.dist[k]
    return stats_rows, distributions


class _Pair(NamedTuple):
    """One comparison before testing: a minus b, resampled, estimated and (BCa) jackknifed."""

    spec: ComparisonSpec
    diff: np.ndarray
    theta: float
    jack: list | None
    estimate_a: float
    estimate_b: float
    paired: bool
    dropped: int
    n_a: int
    n_b: int


class _Comparisons:
    """The comparisons of a study's families, from its fitted series: each family's specs per
    (metric, variant) are differenced, then tested and BH-corrected together."""

    def __init__(self, mats: dict[str, DatasetMatrix], fits: dict[str, _Fit], options: BootstrapOptions):
        self.mats, self.fits, self.o = mats, fits, options
        self.index = {
            (s, d, metric, variant): k for d, m in mats.items() for k, (s, metric, variant) in enumerate(m.series)
        }
        self.on_shared: dict[tuple[str, bytes], _Fit] = {}

    def rows(self, families: list[Family]) -> tuple[list, dict]:
        """The `comparisons` rows of every family, and the distributions of differences when kept."""
        keys = sorted({(metric, variant) for (_, _, metric, variant) in self.index})
        comp_rows, comp_dists = [], {}
        for fam in families:
            for metric, variant in keys:
                pairs = [self._pair(fam, spec, metric, variant) for spec in fam.specs]
                pairs = [p for p in pairs if p is not None]
                if pairs:
                    self._test(fam, metric, variant, pairs, comp_rows, comp_dists)
        return comp_rows, comp_dists

    def _series(self, t: Term, metric: str, variant: str) -> list[int]:
        """Rows of the term's subjects that have this (dataset, metric, variant)."""
        return [
            self.index[(s, t.dataset, metric, variant)]
            for s in t.subjects
            if (s, t.dataset, metric, variant) in self.index
        ]

    def _shared(self, d: str, keep: np.ndarray) -> _Fit:
        """Every series of dataset `d` over only the images in `keep`: the same resamples (streams
        depend on the seed and the dataset's name only), fewer images. Fitted once per image set."""
        key = (d, keep.tobytes())
        if key not in self.on_shared:
            m = self.mats[d]
            values, mask = m.values * keep, m.mask * keep
            self.on_shared[key] = _fit_one(_resample({d: (values, mask)}, self.o)[d], values, mask, self.o.method)
        return self.on_shared[key]

    def _term(self, ks: list[int], fit: _Fit) -> tuple:
        """Mean over the term's series (rows `ks` of its dataset): (resampled, estimate, jackknife)."""
        jack = fit.jack[ks].mean(axis=0) if self.o.method == "bca" else None
        return fit.dist[ks].mean(axis=0), float(fit.theta[ks].mean()), jack

    def _n_images(self, d: str, ks: list[int], keep: np.ndarray | None) -> int:
        """Images any of the series `ks` of dataset `d` has (within `keep`, when on shared images)."""
        has = (self.mats[d].mask[ks] > 0).any(axis=0)
        return int((has & (keep > 0)).sum() if keep is not None else has.sum())

    def _pair(self, fam: Family, spec: ComparisonSpec, metric: str, variant: str) -> _Pair | None:
        """One spec's difference, on the images both sides have when the family asks; None when a
        side has no series here or the sides share no image."""
        ka, kb = self._series(spec.a, metric, variant), self._series(spec.b, metric, variant)
        if not ka or not kb:
            return None
        da, db = spec.a.dataset, spec.b.dataset
        paired, dropped, shared_keep = da == db, 0, None
        fit_a, fit_b = self.fits[da], self.fits[db]
        if paired and fam.shared_images:
            masks = self.mats[da].mask[ka + kb]
            keep = masks.min(axis=0)
            if not keep.any():
                return None  # no image that both sides have
            dropped = int((masks.max(axis=0) - keep).sum())
            if dropped:
                fit_a = fit_b = self._shared(da, keep)
                shared_keep = keep
        ta, tb = self._term(ka, fit_a), self._term(kb, fit_b)
        jack = None
        if self.o.method == "bca":  # multi-sample jackknife when the datasets differ
            jack = [ta[2] - tb[2]] if paired else [ta[2] - tb[1], ta[1] - tb[2]]
        n_a, n_b = self._n_images(da, ka, shared_keep), self._n_images(db, kb, shared_keep)
        return _Pair(spec, ta[0] - tb[0], ta[1] - tb[1], jack, ta[1], tb[1], paired, dropped, n_a, n_b)

    def _test(self, fam: Family, metric: str, variant: str, pairs: list[_Pair], comp_rows: list, comp_dists: dict):
        """p, BH q, interval and decision of one family's pairs on one (metric, variant), as rows."""
        o = self.o
        dd = np.vstack([x.diff for x in pairs])
        p = _core.bootstrap_p(dd)
        p[[min(x.n_a, x.n_b) < o.min_images for x in pairs]] = np.nan  # too few images: no test
        q = _core.bh_qvalues(p)
        if o.method == "bca":
            lo = np.empty(len(pairs))
            hi = np.empty(len(pairs))
            for i, x in enumerate(pairs):  # jackknife lengths differ between rows
                lo[i : i + 1], hi[i : i + 1] = _core.bca_ci(
                    dd[i : i + 1], np.array([x.theta]), [j[None] for j in x.jack], o.confidence
                )
        else:
            lo, hi = _core.percentile_ci(dd, o.confidence)
        for i, x in enumerate(pairs):
            a, b = x.spec.a, x.spec.b
            ds = a.dataset if x.paired else f"{a.dataset} vs {b.dataset}"
            significant = None if np.isnan(q[i]) else bool(q[i] <= o.alpha)
            comp_rows.append(
                (fam.name, a.label, b.label, ds, metric, variant, x.theta, lo[i], hi[i], p[i], q[i], significant)
                + (o.n_resamples, a.dataset, b.dataset, x.estimate_a, x.estimate_b, x.paired, o.seed)
                + (x.n_a, x.n_b, x.dropped)
            )
            if o.keep_distributions:
                comp_dists[(fam.name, a.label, b.label, a.dataset, b.dataset, metric, variant)] = dd[i]


def _rows_to_table(rows, schema: pa.Schema) -> pa.Table:
    cols = list(zip(*rows)) if rows else [[] for _ in schema]
    return pa.table(
        [
            pa.array([None if isinstance(x, float) and np.isnan(x) else x for x in col], f.type)
            for col, f in zip(cols, schema)
        ],
        schema=schema,
    )


def analyse(
    scores: pa.Table,
    eras: dict[str, str],
    n_resamples: int,
    seed: int,
    confidence: float = 0.95,
    alpha: float = 0.05,
    families: list[Family] | None = None,
    **options,
) -> tuple[pa.Table, pa.Table]:
    """Bootstrap estimates and family-wise BH-corrected comparisons: (stats, comparisons) tables.

    Estimates are per (subject, dataset, metric, variant); comparisons per family spec and
    (metric, variant). `options` are the other fields of `BootstrapOptions` (method, mode,
    use_ray, n_tasks, min_images, ...).
    """
    settings = BootstrapOptions(n_resamples, seed, confidence=confidence, alpha=alpha, families=families, **options)
    res = bootstrap_study(scores, eras, settings)
    return res.stats, res.comparisons


def correlation_ci(
    x,
    y,
    n_resamples: int,
    seed: int,
    *,
    name: str = "correlation",
    kind: str = "pearson",
    method: str = "percentile",
    confidence: float = 0.95,
) -> Estimate:
    """Bootstrap CI of the correlation of paired per-image arrays (metric vs human ratings).

    Images are resampled in pairs; the stream depends on (seed, name). kind: "pearson" or
    "spearman" (ranks recomputed within each resample, ties averaged).
    """
    _validate.validate_params(n_resamples, seed, confidence, 0.5, method, "multinomial")
    x, y = _validate.validate_paired(x, y)
    if kind not in ("pearson", "spearman"):
        raise _validate.StatsInputError(f"kind must be 'pearson' or 'spearman', got {kind!r}")
    stat = _core.weighted_pearson if kind == "pearson" else _core.weighted_spearman
    n = x.size
    sizes = _streams.chunk_sizes(n_resamples)
    streams = _streams.chunk_streams(seed, name, _streams.KIND_CORRELATION, len(sizes))
    dist = np.concatenate(
        [stat(_core.multinomial_counts(np.random.default_rng(ss), b, n), x, y) for ss, b in zip(streams, sizes)]
    )
    theta = float(stat(np.ones((1, n)), x, y)[0])
    if method == "bca":
        jk = stat(1.0 - np.eye(n), x, y)  # leave-one-pair-out weights
        lo, hi = _core.bca_ci(dist[None], np.array([theta]), [jk[None]], confidence)
    else:
        lo, hi = _core.percentile_ci(dist[None], confidence)
    return Estimate(theta, float(lo[0]), float(hi[0]), n, n_resamples, method, dist)


def format_p(p: float, n_resamples: int) -> str:
    """A p-value as the report prints it: "< 2.0e-4" at the resolution floor 2/(B+1), else digits.

    With B resamples `bootstrap_p` never returns less than 2/(B+1); a p at that floor means "no
    resample crossed 0", and is printed as "< " and the floor rounded up to two significant digits
    (B = 10,000: floor 1.9998e-4, printed "< 2.0e-4"), so the bound it states always holds.
    """
    if p is None or np.isnan(p):
        return "n/a"
    floor = _core.p_floor(n_resamples)
    if p <= floor * (1 + 1e-9):
        exponent = int(np.floor(np.log10(floor)))
        mantissa = np.ceil(floor / 10.0**exponent * 10 - 1e-9) / 10
        if mantissa >= 10:
            mantissa, exponent = mantissa / 10, exponent + 1
        return f"< {mantissa:.1f}e{exponent}"
    if p >= 0.01:
        return f"{p:.3f}" if p < 0.9995 else "1.000"
    return f"{p:.1e}".replace("e-0", "e-")
