"""From a `scores` table to the `stats` and `comparisons` tables (the pipeline's entry point).

The long scores table is pivoted, per dataset, into a (series x images) value matrix and a mask
(series = subject x metric x variant). Every series of a dataset shares the dataset's resamples,
so comparisons on one dataset are paired, and different datasets draw independent resamples.

An optional `weight` column says how many units a row's value is the mean of (the model-image pairs
of an error group on one image): the mask then holds the weight and the values the weighted sums, so
an estimate is the mean over units while the bootstrap still resamples images, whole (clusters).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.stats import _core, _engine, _streams, _validate
from vlm_decade.stats.families import Family, default_families
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


def bootstrap_study(
    scores: pa.Table,
    eras: dict[str, str],
    n_resamples: int,
    seed: int,
    confidence: float = 0.95,
    alpha: float = 0.05,
    families: list[Family] | None = None,
    *,
    method: str = "percentile",
    mode: str = "auto",
    keep_distributions: bool = False,
    use_ray: bool | None = None,
    n_tasks: int | None = None,
    min_images: int = 1,
    shard_sums: ShardSums | None = None,
) -> StudyResult:
    """`analyse` with every option, returning a `StudyResult` (tables, optional distributions).

    method: "percentile" or "bca" (intervals of estimates and of differences).
    mode: "multinomial" (ordinary bootstrap), "poisson" (Poisson bootstrap over image shards,
    for studies too large for the index matrix) or "auto" (Poisson above POISSON_AUTO_IMAGES).
    use_ray: None = use Ray tasks when Ray is initialised. n_tasks: blocks per dataset (results
    do not depend on it). min_images: a comparison whose term (either side) rests on fewer images
    gets its difference and interval but no p, q or decision, and is left out of the family's BH
    correction (`n_a`, `n_b` say how many each side had). shard_sums: in Poisson mode, the image
    shards' partial sums an earlier run kept (the same to the bit), and where this run's are put.
    """
    _validate.validate_params(n_resamples, seed, confidence, alpha, method, mode)
    if not isinstance(min_images, int) or isinstance(min_images, bool) or min_images < 1:
        raise _validate.StatsInputError(f"min_images must be a whole number >= 1, got {min_images!r}")
    scores = _validate.validate_scores(scores)
    mats = pivot(scores)
    subjects = {s for m in mats.values() for s, _, _ in m.series}
    eras = _validate.validate_eras(eras, subjects, need_all=families is None)
    families = default_families(eras, list(mats)) if families is None else _validate.validate_families(families)
    if mode == "auto":
        mode = (
            "poisson" if max((len(m.images) for m in mats.values()), default=0) > POISSON_AUTO_IMAGES else "multinomial"
        )
    if mode == "poisson" and method == "bca":
        raise _validate.StatsInputError("BCa is not available in Poisson mode (studies this large use percentile)")

    jobs = {d: (m.values, m.mask) for d, m in mats.items()}
    if mode == "poisson":
        partial = _engine.poisson_partial_sums_many(jobs, n_resamples, seed, use_ray=use_ray, kept=shard_sums)
        dists = {d: _core.ratio(*partial[d]).T for d in mats}
        label = "poisson-percentile"
    else:
        dists = _engine.resample_means_many(jobs, n_resamples, seed, use_ray=use_ray, n_tasks=n_tasks)
        label = method

    # Per series: estimate, jackknife (BCa only), interval.
    index: dict[tuple[str, str, str, str], tuple[str, int]] = {}
    theta, jack = {}, {}
    stats_rows, distributions = [], {}
    for d, m in mats.items():
        theta[d] = _core.masked_means(m.values, m.mask)
        jack[d] = _core.jackknife_means(m.values, m.mask) if method == "bca" else None
        lo, hi = _interval(dists[d], theta[d], [jack[d]] if method == "bca" else [], confidence, method)
        n_img = (m.mask > 0).sum(axis=1).astype(np.int64)
        for k, (subject, metric, variant) in enumerate(m.series):
            index[(subject, d, metric, variant)] = (d, k)
            stats_rows.append(
                (subject, d, metric, variant, theta[d][k], lo[k], hi[k], n_img[k], n_resamples, seed, label)
            )
            if keep_distributions:
                distributions[(subject, d, metric, variant)] = dists[d][k]

    def series(t, metric, variant) -> list[int]:
        """Rows of the term's subjects that have this (dataset, metric, variant)."""
        return [
            index[(s, t.dataset, metric, variant)][1] for s in t.subjects if (s, t.dataset, metric, variant) in index
        ]

    on_shared: dict[tuple[str, bytes], tuple] = {}

    def shared(d: str, keep: np.ndarray) -> tuple:
        """(resample means, estimates, jackknife) of every series of dataset `d` over only the images
        in `keep`: the same resamples (streams depend on the seed and the dataset's name only), fewer
        images. Computed once per (dataset, image set)."""
        key = (d, keep.tobytes())
        if key not in on_shared:
            m = mats[d]
            values, mask = m.values * keep, m.mask * keep
            if mode == "poisson":
                dist = _core.ratio(
                    *_engine.poisson_partial_sums_many(
                        {d: (values, mask)}, n_resamples, seed, use_ray=use_ray, kept=shard_sums
                    )[d]
                ).T
            else:
                dist = _engine.resample_means_many(
                    {d: (values, mask)}, n_resamples, seed, use_ray=use_ray, n_tasks=n_tasks
                )[d]
            jk = _core.jackknife_means(values, mask) if method == "bca" else None
            on_shared[key] = (dist, _core.masked_means(values, mask), jk)
        return on_shared[key]

    def term(d, ks, own):
        """Mean over the term's series (rows `ks` of dataset `d`), from `own` = (dists, theta, jackknife)."""
        dist, th, jk = own
        return dist[ks].mean(axis=0), float(th[ks].mean()), jk[ks].mean(axis=0) if method == "bca" else None

    def n_images(d: str, ks: list[int], keep: np.ndarray | None) -> int:
        """Images any of the series `ks` of dataset `d` has (within `keep`, when on shared images)."""
        has = (mats[d].mask[ks] > 0).any(axis=0)
        return int((has & (keep > 0)).sum() if keep is not None else has.sum())

    keys = sorted({(metric, variant) for (_, _, metric, variant) in index})
    comp_rows, comp_dists = [], {}
    for fam in families:
        for metric, variant in keys:
            rows, diffs, jks, thetas = [], [], [], []
            for spec in fam.specs:
                ka, kb = series(spec.a, metric, variant), series(spec.b, metric, variant)
                if not ka or not kb:
                    continue
                da, db = spec.a.dataset, spec.b.dataset
                paired, dropped, shared_keep = da == db, 0, None
                own_a = own_b = (dists[da], theta[da], jack[da])
                if db != da:
                    own_b = (dists[db], theta[db], jack[db])
                if paired and fam.shared_images:
                    masks = mats[da].mask[ka + kb]
                    keep = masks.min(axis=0)
                    if not keep.any():
                        continue  # no image that both sides have
                    dropped = int((masks.max(axis=0) - keep).sum())
                    if dropped:
                        own_a = own_b = shared(da, keep)
                        shared_keep = keep
                ta, tb = term(da, ka, own_a), term(db, kb, own_b)
                diffs.append(ta[0] - tb[0])
                thetas.append(ta[1] - tb[1])
                if method == "bca":  # multi-sample jackknife when the datasets differ
                    jks.append([ta[2] - tb[2]] if paired else [ta[2] - tb[1], ta[1] - tb[2]])
                rows.append(
                    (spec, ta[1], tb[1], paired, dropped, n_images(da, ka, shared_keep), n_images(db, kb, shared_keep))
                )
            if not rows:
                continue
            dd = np.vstack(diffs)
            p = _core.bootstrap_p(dd)
            p[[min(r[5], r[6]) < min_images for r in rows]] = np.nan  # too few images: no test
            q = _core.bh_qvalues(p)
            if method == "bca":
                lo = np.empty(len(rows))
                hi = np.empty(len(rows))
                for i, jk in enumerate(jks):  # jackknife lengths differ between rows
                    lo[i : i + 1], hi[i : i + 1] = _core.bca_ci(
                        dd[i : i + 1], np.array([thetas[i]]), [j[None] for j in jk], confidence
                    )
            else:
                lo, hi = _core.percentile_ci(dd, confidence)
            for i, (spec, ea, eb, paired, dropped, na, nb) in enumerate(rows):
                a, b = spec.a, spec.b
                ds = a.dataset if paired else f"{a.dataset} vs {b.dataset}"
                comp_rows.append(
                    (
                        fam.name,
                        a.label,
                        b.label,
                        ds,
                        metric,
                        variant,
                        thetas[i],
                        lo[i],
                        hi[i],
                        p[i],
                        q[i],
                        None if np.isnan(q[i]) else bool(q[i] <= alpha),
                        n_resamples,
                        a.dataset,
                        b.dataset,
                        ea,
                        eb,
                        paired,
                        seed,
                        na,
                        nb,
                        dropped,
                    )
                )
                if keep_distributions:
                    comp_dists[(fam.name, a.label, b.label, a.dataset, b.dataset, metric, variant)] = dd[i]
    return StudyResult(
        _rows_to_table(stats_rows, STATS_SCHEMA),
        _rows_to_table(comp_rows, COMPARISONS_SCHEMA),
        distributions,
        comp_dists,
    )


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
    (metric, variant). `options` go to `bootstrap_study` (method, mode, use_ray, n_tasks).
    """
    res = bootstrap_study(scores, eras, n_resamples, seed, confidence, alpha, families, **options)
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
