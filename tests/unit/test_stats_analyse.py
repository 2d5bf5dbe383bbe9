"""analyse(): tables, pairing, families, missing scores, determinism and input checks (no Ray)."""

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from vlm_decade.stats import (
    COMPARISONS_SCHEMA,
    STATS_SCHEMA,
    BootstrapOptions,
    ComparisonSpec,
    Family,
    StatsInputError,
    Term,
    _core,
    _streams,
    analyse,
    bootstrap_study,
)

ERAS = {
    "UDC": "pre-mllm",
    "OFA": "pre-mllm",
    "GPT-4": "mllm",
    "Gemini": "mllm",
    "human:top": "human",
    "human:bottom": "human",
}


def study(n=40, datasets=("coco", "csb"), metrics=("gemini-si", "gpt-si"), seed=0, drop=()):
    rng = np.random.default_rng(seed)
    rows = []
    for d in datasets:
        img = rng.normal(0, 0.05, size=n)  # image difficulty shared by all subjects: pairing matters
        for s, era in ERAS.items():
            base = {"pre-mllm": 0.6 if d == "coco" else 0.4, "mllm": 0.7, "human": 0.72}[era]
            for m in metrics:
                for i in range(n):
                    value = base + img[i] + 0.05 * rng.standard_normal()  # drawn even if dropped
                    if (s, d, i) not in drop:
                        rows.append((s, f"{d}-{i:03d}", d, "full", m, value))
    return pa.table(list(map(list, zip(*rows))), names=["subject", "image_id", "dataset", "variant", "metric", "value"])


def rows(table):
    return table.to_pylist()


def test_tables_have_the_schemas_and_estimates_are_means():
    t = study()
    st, cp = analyse(t, ERAS, 1000, 3)
    assert st.schema == STATS_SCHEMA and cp.schema == COMPARISONS_SCHEMA
    assert st.num_rows == 2 * 6 * 2
    r = [x for x in rows(st) if x["subject"] == "OFA" and x["dataset"] == "csb" and x["metric"] == "gpt-si"][0]
    vals = t.filter(
        pa.compute.and_(
            pa.compute.equal(t["subject"], "OFA"),
            pa.compute.and_(pa.compute.equal(t["dataset"], "csb"), pa.compute.equal(t["metric"], "gpt-si")),
        )
    )["value"].to_numpy()
    assert r["estimate"] == pytest.approx(vals.mean(), rel=1e-12)
    assert r["ci_low"] < r["estimate"] < r["ci_high"]
    assert (r["n_images"], r["n_resamples"], r["seed"], r["method"]) == (40, 1000, 3, "percentile")


def test_default_families_and_bh_within_each():
    st, cp = analyse(study(), ERAS, 2000, 1)
    c = rows(cp)
    per = {f: [x for x in c if x["family"] == f and x["metric"] == "gpt-si"] for f in ("era", "dataset", "vs-humans")}
    assert len(per["era"]) == 2  # one per dataset
    assert len(per["dataset"]) == 6 + 2  # each subject and each era mean, coco vs csb
    assert len(per["vs-humans"]) == 4 * 2 * 2  # 4 models x {top, bottom} x 2 datasets
    for xs in per.values():
        p = np.array([x["p"] for x in xs])
        np.testing.assert_array_equal([x["q"] for x in xs], stats.false_discovery_control(p))
        assert all(x["significant"] == (x["q"] <= 0.05) for x in xs)
    pre = [x for x in per["dataset"] if x["a"] == "era:pre-mllm"][0]
    assert pre["dataset"] == "coco vs csb" and not pre["paired"] and pre["difference"] > 0.15 and pre["significant"]
    assert pre["p"] == 2 / 2001  # no resample crosses 0: the floor
    mllm = [x for x in per["dataset"] if x["a"] == "era:mllm"][0]
    assert mllm["ci_low"] < 0 < mllm["ci_high"]


def test_subject_against_itself_is_exactly_zero_with_p_one():
    fam = [Family("self", [ComparisonSpec(Term.subject("OFA", "csb"), Term.subject("OFA", "csb"))])]
    for method in ("percentile", "bca"):
        (r,) = [
            x
            for x in rows(
                bootstrap_study(study(), ERAS, BootstrapOptions(1000, 2, families=fam, method=method)).comparisons
            )
            if x["metric"] == "gpt-si"
        ]
        assert (r["difference"], r["ci_low"], r["ci_high"], r["p"]) == (0.0, 0.0, 0.0, 1.0)


def test_same_dataset_is_paired_and_different_datasets_are_independent():
    t = study(datasets=("coco",))
    shifted = t.set_column(5, "value", pa.compute.add(t["value"], 0.01))
    shifted = shifted.set_column(0, "subject", pa.compute.binary_join_element_wise(shifted["subject"], "+", ""))
    both = pa.concat_tables([t, shifted])
    fam = [Family("f", [ComparisonSpec(Term.subject("OFA+", "coco"), Term.subject("OFA", "coco"))])]
    res = bootstrap_study(both, {}, BootstrapOptions(1000, 4, families=fam, keep_distributions=True))
    r = rows(res.comparisons)[0]
    # paired: every resample moves both subjects together, so the difference never varies
    assert (
        r["paired"] and r["ci_low"] == pytest.approx(0.01, abs=1e-12) and r["ci_high"] == pytest.approx(0.01, abs=1e-12)
    )
    # the same scores under two dataset names are resampled independently: the difference varies
    twin = pa.concat_tables([t, t.set_column(2, "dataset", pa.array(["coco2"] * t.num_rows))])
    fam2 = [Family("f", [ComparisonSpec(Term.subject("OFA", "coco"), Term.subject("OFA", "coco2"))])]
    r2 = [
        x
        for x in rows(bootstrap_study(twin, {}, BootstrapOptions(1000, 4, families=fam2)).comparisons)
        if x["metric"] == "gpt-si"
    ][0]
    assert r2["difference"] == 0.0 and not r2["paired"]
    assert r2["ci_low"] < -0.005 and r2["ci_high"] > 0.005 and r2["p"] > 0.5


def test_missing_scores_use_the_available_images():
    drop = {("GPT-4", "coco", i) for i in range(0, 40, 4)}
    t = study(datasets=("coco",), drop=drop)
    nan_t = study(datasets=("coco",))
    v = nan_t["value"].to_numpy().copy()
    sub, img = nan_t["subject"].to_pylist(), nan_t["image_id"].to_pylist()
    for k in range(len(v)):
        if sub[k] == "GPT-4" and int(img[k][-3:]) % 4 == 0:
            v[k] = np.nan  # a NaN value is a missing score, like an absent row
    nan_t = nan_t.set_column(5, "value", pa.array(v))
    a = bootstrap_study(t, ERAS, BootstrapOptions(500, 9, keep_distributions=True))
    b = bootstrap_study(nan_t, ERAS, BootstrapOptions(500, 9, keep_distributions=True))
    assert a.stats.equals(b.stats)
    r = [x for x in rows(a.stats) if x["subject"] == "GPT-4" and x["metric"] == "gpt-si"][0]
    assert r["n_images"] == 30
    # resample 0 by hand: the weights of the first chunk, the mean over GPT-4's 30 images
    w = _core.multinomial_counts(np.random.default_rng(_streams.chunk_streams(9, "coco", 0, 1)[0]), 500, 40)[0]
    g = t.filter(pa.compute.and_(pa.compute.equal(t["subject"], "GPT-4"), pa.compute.equal(t["metric"], "gpt-si")))
    idx = np.array([int(s[-3:]) for s in g["image_id"].to_pylist()])  # image order = sorted ids
    val = g["value"].to_numpy()
    assert a.distributions[("GPT-4", "coco", "gpt-si", "full")][0] == pytest.approx(
        (w[idx] * val).sum() / w[idx].sum(), rel=1e-12
    )
    assert r["estimate"] == pytest.approx(val.mean(), rel=1e-12)


def test_same_result_for_any_number_of_blocks_and_any_row_order():
    t = study()
    base = bootstrap_study(t, ERAS, BootstrapOptions(1700, 5, n_tasks=1))
    for k in (2, 3, 7):
        other = bootstrap_study(t, ERAS, BootstrapOptions(1700, 5, n_tasks=k))
        assert other.stats.equals(base.stats) and other.comparisons.equals(base.comparisons)
    shuffled = t.take(np.random.default_rng(0).permutation(t.num_rows))
    assert bootstrap_study(shuffled, ERAS, BootstrapOptions(1700, 5)).stats.equals(base.stats)
    assert not bootstrap_study(t, ERAS, BootstrapOptions(1700, 6)).stats.equals(base.stats)  # the seed matters


def test_adding_a_dataset_leaves_the_others_unchanged():
    two = bootstrap_study(study(datasets=("coco", "csb")), ERAS, BootstrapOptions(1000, 8, keep_distributions=True))
    three = bootstrap_study(
        study(datasets=("coco", "csb", "private")), ERAS, BootstrapOptions(1000, 8, keep_distributions=True)
    )
    for key, d in two.distributions.items():
        np.testing.assert_array_equal(d, three.distributions[key])


def test_bca_option_and_poisson_mode():
    t = study(datasets=("coco",), n=200)
    pct = rows(bootstrap_study(t, ERAS, BootstrapOptions(4000, 1)).stats)
    bca = rows(bootstrap_study(t, ERAS, BootstrapOptions(4000, 1, method="bca")).stats)
    poi = rows(bootstrap_study(t, ERAS, BootstrapOptions(4000, 1, mode="poisson")).stats)
    for a, b, c in zip(pct, bca, poi):
        assert b["method"] == "bca" and c["method"] == "poisson-percentile"
        assert a["estimate"] == b["estimate"] == c["estimate"]
        w = a["ci_high"] - a["ci_low"]
        for other in (b, c):  # symmetric data: all three intervals agree within MC error
            assert abs(other["ci_low"] - a["ci_low"]) < 0.1 * w and abs(other["ci_high"] - a["ci_high"]) < 0.1 * w


def test_poisson_partial_sums_over_shards_add_up():
    from vlm_decade.stats import _engine

    rng = np.random.default_rng(0)
    v = rng.random((3, 1000))
    m = (rng.random((3, 1000)) > 0.1).astype(float)
    v *= m
    ((s, tot),) = _engine.poisson_partial_sums_many({"d": (v, m)}, 600, 2, shard_size=300).values()
    streams = _streams.chunk_streams(2, "d", _streams.KIND_POISSON, 4)
    parts = [
        _engine._poisson_shard(v[:, k * 300 : (k + 1) * 300], m[:, k * 300 : (k + 1) * 300], streams[k], 600)
        for k in range(4)
    ]
    np.testing.assert_allclose(s, sum(p[0] for p in parts), rtol=1e-13)
    np.testing.assert_array_equal(tot, sum(p[1] for p in parts))
    assert abs(tot.mean() / m.sum(axis=1).mean() - 1) < 0.01  # Poisson(1): expected total weight = n


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda t: t.drop_columns(["metric"]), "lacks column"),
        (lambda t: pa.concat_tables([t, t.slice(0, 1)]), "more than one row"),
        (lambda t: t.set_column(5, "value", pa.array([np.inf] + [0.5] * (t.num_rows - 1))), "infinite at row 0"),
        (
            lambda t: t.set_column(0, "subject", pa.array([None] + t["subject"].to_pylist()[1:], pa.string())),
            "empty at row 0",
        ),
    ],
)
def test_bad_scores_are_refused(mutate, match):
    with pytest.raises(StatsInputError, match=match):
        analyse(mutate(study(n=5)), ERAS, 10, 0)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"n_resamples": 0}, "n_resamples"),
        ({"seed": -1}, "seed"),
        ({"confidence": 1.0}, "confidence"),
        ({"alpha": 0}, "alpha"),
        ({"eras": {"UDC": "pre-mllm"}}, "no era for subject"),
        ({"eras": {**ERAS, "crowd": "human"}}, "human:<group>"),
        ({"families": ["era"]}, "Family"),
    ],
)
def test_bad_arguments_are_refused(kw, match):
    args = {"eras": ERAS, "n_resamples": 10, "seed": 0, **kw}
    with pytest.raises(StatsInputError, match=match):
        analyse(study(n=5), **args)


def test_a_comparison_on_too_few_images_keeps_its_difference_but_gets_no_test():
    # "big" and "other" have 6 images, "tiny" only 1: with min_images=5 the tiny comparison keeps its
    # difference and interval, gets no p, q or decision, and leaves the BH family: the other q is its p.
    values = {"big": [0.9, 0.8, 0.85, 0.95, 0.7, 0.75], "other": [0.5, 0.4, 0.45, 0.6, 0.3, 0.35], "tiny": [0.2]}
    rows = [(s, f"i{k}", "all", "full", "m", v) for s, vs in values.items() for k, v in enumerate(vs)]
    scores = pa.table(
        list(map(list, zip(*rows))), names=["subject", "image_id", "dataset", "variant", "metric", "value"]
    )
    family = Family(
        "f", [ComparisonSpec(Term.subject("big", "all"), Term.subject(s, "all")) for s in ("other", "tiny")]
    )
    _, strict = analyse(scores, {}, 500, 1, families=[family], min_images=5)
    _, loose = analyse(scores, {}, 500, 1, families=[family])
    small, fine = {r["b"]: r for r in rows_of(strict)}["tiny"], {r["b"]: r for r in rows_of(strict)}["other"]
    assert (small["p"], small["q"], small["significant"]) == (None, None, None)
    assert small["difference"] == pytest.approx(np.mean(values["big"]) - 0.2) and small["ci_low"] is not None
    assert (small["n_a"], small["n_b"], fine["n_a"], fine["n_b"]) == (6, 1, 6, 6)
    assert fine["q"] == fine["p"] and fine["significant"] is True
    by_b = {r["b"]: r for r in rows_of(loose)}
    assert by_b["tiny"]["p"] is not None  # without the minimum, both are tested and corrected together
    expected = stats.false_discovery_control([by_b["other"]["p"], by_b["tiny"]["p"]], method="bh")
    assert [by_b["other"]["q"], by_b["tiny"]["q"]] == pytest.approx(list(expected))
    with pytest.raises(StatsInputError, match="min_images"):
        analyse(scores, {}, 500, 1, families=[family], min_images=0)


def rows_of(table):
    return table.to_pylist()


def test_a_weight_column_weighs_each_image_by_its_units_and_must_be_positive():
    # i1 holds two units averaging 0.3, i2 one unit of 0.9: the estimate is (2 * 0.3 + 0.9) / 3 = 0.5.
    scores = pa.table(
        {
            "subject": ["s", "s"],
            "image_id": ["i1", "i2"],
            "dataset": ["d", "d"],
            "variant": ["full", "full"],
            "metric": ["m", "m"],
            "value": [0.3, 0.9],
            "weight": [2.0, 1.0],
        }
    )
    (row,) = analyse(scores, {}, 200, 0, families=[])[0].to_pylist()
    assert row["estimate"] == pytest.approx(0.5) and row["n_images"] == 2
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(StatsInputError, match="weight"):
            analyse(scores.set_column(6, "weight", pa.array([2.0, bad])), {}, 200, 0, families=[])


def test_the_paper_s_era_against_human_and_within_era_comparisons():
    # Study (ERAS): pre-MLLMs UDC, OFA; MLLMs GPT-4, Gemini; humans top and bottom; datasets coco, csb.
    st, c = analyse(study(), ERAS, 1000, 1)
    xs = [x for x in rows(c) if x["metric"] == "gpt-si"]
    era_h = [(x["a"], x["b"], x["dataset"]) for x in xs if x["family"] == "era-vs-humans"]
    assert era_h == [
        ("era:pre-mllm", "human:bottom", "coco"),
        ("era:mllm", "human:top", "coco"),
        ("era:pre-mllm", "human:bottom", "csb"),
        ("era:mllm", "human:top", "csb"),
    ]
    within = [(x["a"], x["b"], x["dataset"]) for x in xs if x["family"] == "within-era"]
    assert within == [
        ("OFA", "UDC", "coco"),
        ("OFA", "UDC", "csb"),
        ("GPT-4", "Gemini", "coco"),
        ("GPT-4", "Gemini", "csb"),
    ]
    # the era mean is the mean of its models' means; on csb the pre-MLLMs (0.4) lie below bottom humans (0.72)
    means = {(r["subject"], r["dataset"]): r["estimate"] for r in rows(st) if r["metric"] == "gpt-si"}
    pre_csb = next(
        x for x in xs if x["family"] == "era-vs-humans" and x["a"] == "era:pre-mllm" and x["dataset"] == "csb"
    )
    assert pre_csb["estimate_a"] == pytest.approx((means[("UDC", "csb")] + means[("OFA", "csb")]) / 2)
    assert pre_csb["difference"] < -0.25 and pre_csb["significant"]
    for family in ("era-vs-humans", "within-era"):
        ps = [x["p"] for x in xs if x["family"] == family]
        np.testing.assert_array_equal([x["q"] for x in xs if x["family"] == family], stats_bh(ps))


def stats_bh(ps):
    return stats.false_discovery_control(ps, method="bh")


def test_more_resamples_extend_the_fewer_ones():
    """docs/statistics.md: resamples come in fixed chunks of one stream per (seed, dataset), so a
    run with more resamples begins with exactly the resamples of a run with fewer."""
    t = study()
    few = bootstrap_study(t, ERAS, BootstrapOptions(1_000, 12, keep_distributions=True))
    many = bootstrap_study(t, ERAS, BootstrapOptions(2_300, 12, keep_distributions=True))
    for key, dist in few.distributions.items():
        np.testing.assert_array_equal(many.distributions[key][:1_000], dist)


def test_pivot_is_the_matrix_of_each_dataset_built_row_by_row():
    """`pivot` against a plain build: per dataset, its images and series sorted as strings, each
    row's value times weight and its weight at (series, image), zero where a series lacks an image
    or its value is missing; whatever the order of the rows, and with codes of images and series
    that another dataset alone has."""
    from vlm_decade.stats.analysis import pivot

    rng = np.random.default_rng(11)
    rows = []
    for dataset, images in (("coco", 40), ("vg", 25)):
        for image in rng.choice(60, images, replace=False):
            for subject in ("GPT-4", "UDC", "human:top")[: 2 + (dataset == "coco")]:
                for variant in ("full", "mask_center"):
                    if rng.random() < 0.8:
                        value = None if rng.random() < 0.1 else float(rng.random())
                        rows.append(
                            (dataset, f"img{image:03d}", subject, "SBERT-SI", variant, value, float(rng.integers(1, 4)))
                        )
    order = rng.permutation(len(rows))
    columns = list(zip(*[rows[i] for i in order]))
    names = ["dataset", "image_id", "subject", "metric", "variant", "value", "weight"]
    table = pa.table(
        {n: pa.array(c, pa.float64() if n in ("value", "weight") else pa.string()) for n, c in zip(names, columns)}
    )
    got = pivot(table)
    assert sorted(got) == ["coco", "vg"]
    for dataset, matrix in got.items():
        mine = [r for r in rows if r[0] == dataset]
        images = sorted({r[1] for r in mine})
        series = sorted({(r[2], r[3], r[4]) for r in mine})
        values, mask = np.zeros((len(series), len(images))), np.zeros((len(series), len(images)))
        for _, image, subject, metric, variant, value, weight in mine:
            if value is not None:
                at = series.index((subject, metric, variant)), images.index(image)
                values[at], mask[at] = value * weight, weight
        assert matrix.images == tuple(images) and matrix.series == tuple(series)
        np.testing.assert_array_equal(matrix.values, values)
        np.testing.assert_array_equal(matrix.mask, mask)
