"""Metric validation against raters: correlations vs scipy, the inter-rater references by hand,
the bootstrap test's verdicts on a good and a useless metric, the ratings checks, the figure."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import pearsonr, spearmanr

from tests.figures import assert_drawn, colour_pixels, markers, panels, record_figures
from vlm_decade.core.errors import InputError
from vlm_decade.studies.decade.metric_validation import (
    KINDS,
    LOO,
    PAIRWISE,
    RATINGS_COLUMNS,
    agreement_summary,
    load_ratings,
    validate_metrics,
    validation_figure,
    write_validation_figure,
)


def ratings_table(matrix: np.ndarray, subject: str = "m") -> pa.Table:
    """Raters x images ratings of one subject as a ratings table (NaN = not rated)."""
    rows = [
        {"rater_id": f"r{j}", "subject": subject, "image_id": f"i{i:02d}", "rating": float(v)}
        for j, row in enumerate(matrix)
        for i, v in enumerate(row)
        if not np.isnan(v)
    ]
    return pa.Table.from_pylist(rows)


def scores_table(metrics: dict[str, np.ndarray], subject: str = "m") -> pa.Table:
    rows = [
        {"subject": subject, "image_id": f"i{i:02d}", "metric": name, "value": float(v)}
        for name, values in metrics.items()
        for i, v in enumerate(values)
    ]
    return pa.Table.from_pylist(rows)


def row(summary: pa.Table, metric: str, kind: str) -> dict:
    (found,) = [r for r in summary.to_pylist() if r["metric"] == metric and r["kind"] == kind]
    return found


# Three raters on four images, worked by hand below.
TOY = np.array([[1.0, 2, 3, 4], [2, 1, 4, 3], [1, 3, 2, 5]])


def test_leave_one_out_reference_matches_hand_computation():
    # Rater r0 (1, 2, 3, 4) against the mean of r1 and r2: (1.5, 2, 3, 4).
    # Centred: (-1.5, -.5, .5, 1.5) and (-1.125, -.625, .375, 1.375);
    # sxy = 4.25, sxx = 5, syy = 3.6875, r = 4.25 / sqrt(18.4375) = 0.989778.
    r0 = 4.25 / np.sqrt(5 * 3.6875)
    # r1 (2, 1, 4, 3) vs mean(r0, r2) = (1, 2.5, 2.5, 4.5): centred (-.5, -1.5, 1.5, .5) and
    # (-1.625, -.125, -.125, 1.875); sxy = .8125 + .1875 - .1875 + .9375 = 1.75, sxx = 5, syy = 6.1875.
    r1 = 1.75 / np.sqrt(5 * 6.1875)
    # r2 (1, 3, 2, 5) vs mean(r0, r1) = (1.5, 1.5, 3.5, 3.5): centred (-1.75, .25, -.75, 2.25) and
    # (-1, -1, 1, 1); sxy = 3, sxx = 8.75, syy = 4.
    r2 = 3 / np.sqrt(8.75 * 4)
    result = validate_metrics(ratings_table(TOY), scores_table({"x": np.arange(4.0)}), n_resamples=200, seed=1)
    assert row(result.summary, LOO, "pearson")["estimate"] == pytest.approx((r0 + r1 + r2) / 3, abs=1e-12)
    per = {
        r["rater_id"]: r["estimate"]
        for r in result.per_rater.to_pylist()
        if r["metric"] == LOO and r["kind"] == "pearson"
    }
    assert per == pytest.approx({"r0": r0, "r1": r1, "r2": r2}, abs=1e-12)
    pairwise = np.mean([pearsonr(TOY[a], TOY[b])[0] for a, b in itertools.combinations(range(3), 2)])
    assert row(result.summary, PAIRWISE, "pearson")["estimate"] == pytest.approx(pairwise, abs=1e-12)
    # the paper's test is against the mean pairwise correlation: the default reference
    assert row(result.summary, PAIRWISE, "pearson")["role"] == "ceiling"
    assert row(result.summary, LOO, "pearson")["role"] == "reference"
    metric = row(result.summary, "x", "pearson")
    assert metric["difference"] == pytest.approx(metric["estimate"] - pairwise, abs=1e-12)
    loo = validate_metrics(
        ratings_table(TOY), scores_table({"x": np.arange(4.0)}), n_resamples=200, seed=1, ceiling="leave-one-out"
    )
    assert row(loo.summary, LOO, "pearson")["role"] == "ceiling"


def test_each_rated_model_is_validated_on_its_own_pairs_too():
    # Figure A.1a per model: two models rated by the same three raters; a model's rows are the analysis
    # of its pairs alone (by hand with scipy), beside the analysis of all pairs.
    rng = np.random.default_rng(3)
    a, b = rng.integers(1, 6, size=(3, 6)).astype(float), rng.integers(1, 6, size=(3, 6)).astype(float)
    ratings = pa.concat_tables([ratings_table(a, "A"), ratings_table(b, "B")])
    metric = {"A": rng.normal(size=6), "B": rng.normal(size=6)}
    scores = pa.concat_tables([scores_table({"x": metric["A"]}, "A"), scores_table({"x": metric["B"]}, "B")])
    result = validate_metrics(ratings, scores, n_resamples=200, seed=3)
    assert sorted(set(result.summary.column("subject").to_pylist())) == ["A", "B", "all"]
    for subject, matrix in (("A", a), ("B", b)):
        (mine,) = [
            r
            for r in result.summary.to_pylist()
            if r["subject"] == subject and r["metric"] == "x" and r["kind"] == "pearson"
        ]
        assert mine["estimate"] == pytest.approx(
            np.mean([pearsonr(metric[subject], rater)[0] for rater in matrix]), abs=1e-12
        )
        assert mine["n_pairs"] == 6 and mine["n_raters"] == 3
    (pooled,) = [
        r for r in result.summary.to_pylist() if r["subject"] == "all" and r["metric"] == "x" and r["kind"] == "pearson"
    ]
    both = np.concatenate([metric["A"], metric["B"]])
    assert pooled["estimate"] == pytest.approx(
        np.mean([pearsonr(both, np.concatenate([a[j], b[j]]))[0] for j in range(3)]), abs=1e-12
    )
    assert pooled["n_pairs"] == 12


def test_correlations_with_each_rater_match_scipy_with_ties_and_gaps():
    rng = np.random.default_rng(7)
    ratings = rng.integers(1, 6, size=(5, 30)).astype(float)  # ties galore
    ratings[2, [3, 8, 20]] = np.nan  # rater r2 skipped three images
    metric = rng.normal(size=30)
    result = validate_metrics(ratings_table(ratings), scores_table({"x": metric}), n_resamples=100, seed=2)
    per = {(r["kind"], r["rater_id"]): r for r in result.per_rater.to_pylist() if r["metric"] == "x"}
    for j in range(5):
        ok = ~np.isnan(ratings[j])
        assert per[("pearson", f"r{j}")]["estimate"] == pytest.approx(
            pearsonr(metric[ok], ratings[j, ok])[0], abs=1e-12
        )
        assert per[("spearman", f"r{j}")]["estimate"] == pytest.approx(
            spearmanr(metric[ok], ratings[j, ok])[0], abs=1e-12
        )
        assert per[("pearson", f"r{j}")]["n_pairs"] == ok.sum()
    for kind, ref in (("pearson", pearsonr), ("spearman", spearmanr)):
        mean = np.mean([ref(metric[~np.isnan(y)], y[~np.isnan(y)])[0] for y in ratings])
        assert row(result.summary, "x", kind)["estimate"] == pytest.approx(mean, abs=1e-12)
        pairs = [(a, b) for a, b in itertools.combinations(ratings, 2)]
        both = [~np.isnan(a) & ~np.isnan(b) for a, b in pairs]
        expected = np.mean([ref(a[m], b[m])[0] for (a, b), m in zip(pairs, both)])
        assert row(result.summary, PAIRWISE, kind)["estimate"] == pytest.approx(expected, abs=1e-12)


def simulated_study(seed: int = 3, n_raters: int = 8, n_images: int = 40):
    rng = np.random.default_rng(seed)
    truth = rng.uniform(0, 4, n_images)
    ratings = truth + rng.normal(0, 0.5, (n_raters, 1)) + rng.normal(0, 1.0, (n_raters, n_images))
    good = ratings.mean(axis=0) + rng.normal(0, 0.05, n_images)  # a noisy copy of the raters' mean
    useless = rng.normal(size=n_images)
    return ratings_table(ratings), scores_table({"good": good, "useless": useless})


@pytest.mark.parametrize("ceiling", ["leave-one-out", "pairwise"])
def test_copy_of_mean_rating_beats_the_ceiling_and_random_metric_does_not(ceiling):
    ratings, scores = simulated_study()
    result = validate_metrics(ratings, scores, n_resamples=1000, seed=4, ceiling=ceiling)
    for kind in ("pearson", "spearman"):
        good, useless = row(result.summary, "good", kind), row(result.summary, "useless", kind)
        assert good["difference"] > 0 and good["diff_ci_low"] > 0 and good["q"] < 0.01
        assert useless["difference"] < 0 and useless["diff_ci_high"] < 0
        assert not useless["estimate"] > row(result.summary, "inter-rater " + f"({ceiling})", kind)["estimate"]
        assert good["ci_low"] <= good["estimate"] <= good["ci_high"]
        assert good["n_raters"] == 8 and good["n_pairs"] == 40
        # BH over the 2 metrics: the larger p keeps its value, the smaller one is doubled (or capped).
        ps = sorted([good["p"], useless["p"]])
        qs = sorted([good["q"], useless["q"]])
        assert qs == pytest.approx([min(2 * ps[0], ps[1]), ps[1]])


def test_same_seed_same_result_and_seed_matters():
    ratings, scores = simulated_study(n_images=15)
    a = validate_metrics(ratings, scores, n_resamples=600, seed=5).summary
    b = validate_metrics(ratings, scores, n_resamples=600, seed=5).summary
    c = validate_metrics(ratings, scores, n_resamples=600, seed=6).summary
    assert a.equals(b)
    assert a.column("ci_low").to_pylist() != c.column("ci_low").to_pylist()


def test_only_pairs_every_metric_scored_are_analysed():
    ratings, scores = simulated_study(n_images=12)
    rows = scores.to_pylist()
    rows[0]["value"] = float("nan")  # "good" has no score for i00
    result = validate_metrics(ratings, pa.Table.from_pylist(rows), n_resamples=100, seed=5)
    assert set(result.summary.column("n_pairs").to_pylist()) == {11}


# --- the ratings table ------------------------------------------------------------------------------


def write_ratings(path: Path, rows: list[list[str]], header=RATINGS_COLUMNS) -> Path:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_ratings_load_sorted_as_floats(tmp_path):
    path = write_ratings(
        tmp_path / "ratings.csv", [["s2", "m", "b", "4"], ["s1", "m", "b", "2.5"], ["s1", "m", "a", "1"]]
    )
    table = load_ratings(path, {"m"}, {"a", "b"})
    assert table.to_pylist() == [
        {"rater_id": "s1", "subject": "m", "image_id": "a", "rating": 1.0},
        {"rater_id": "s1", "subject": "m", "image_id": "b", "rating": 2.5},
        {"rater_id": "s2", "subject": "m", "image_id": "b", "rating": 4.0},
    ]


def test_ratings_problems_name_file_row_and_field(tmp_path):
    path = write_ratings(
        tmp_path / "ratings.csv",
        [
            ["s1", "m", "a", "3"],  # row 2: fine
            ["s1", "ghost", "a", "3"],  # row 3: unknown subject
            ["s1", "m", "zzz", "3"],  # row 4: unknown image
            ["s2", "m", "a", "three"],  # row 5: not a number
            ["s2", "m", "b", "7"],  # row 6: out of range
            ["s1", "m", "a", "4"],  # row 7: duplicate of row 2
            ["", "m", "b", "2"],  # row 8: blank rater
            ["s3", "m", "b", "nan"],  # row 9: NaN is no rating
        ],
    )
    with pytest.raises(InputError) as err:
        load_ratings(path, {"m"}, {"a", "b"})
    found = {(p.row, p.field) for p in err.value.problems}
    assert found == {
        (3, "subject"),
        (4, "image_id"),
        (5, "rating"),
        (6, "rating"),
        (7, "rater_id"),
        (8, "rater_id"),
        (9, "rating"),
    }
    assert all(p.file == str(path) for p in err.value.problems)
    text = str(err.value)
    assert f"{path}, row 7, field 'rater_id': duplicate rating" in text and "first at row 2" in text
    assert "outside the scale 1 to 5" in text and "unknown subject 'ghost'" in text


def test_ratings_missing_column_is_reported_on_the_header(tmp_path):
    path = write_ratings(tmp_path / "ratings.csv", [["s1", "m", "a"]], header=("rater_id", "subject", "image_id"))
    with pytest.raises(InputError) as err:
        load_ratings(path, {"m"}, {"a"})
    (problem,) = err.value.problems
    assert (problem.row, problem.field) == (1, "rating")


# --- the figure -------------------------------------------------------------------------------------


def test_figure_is_written_atomically_and_labelled_demo(tmp_path, monkeypatch):
    ratings, scores = simulated_study(n_images=12)
    summary = validate_metrics(ratings, scores, n_resamples=200, seed=5).summary
    saved = record_figures(monkeypatch)
    out = write_validation_figure(summary, tmp_path / "fig" / "metric_validation.png", labels={"good": "Good metric"})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in out.parent.iterdir()] == ["metric_validation.png"]  # no temporary file left
    # A panel per kind of correlation: each metric's mean correlation as a point, labelled, and the
    # raters' own agreement as a band behind them.
    rows = summary.to_pylist()
    assert [ax.get_title() for ax in panels(saved[0])] == [f"{k.capitalize()} correlation with raters" for k in KINDS]
    for ax, kind in zip(panels(saved[0]), KINDS):
        metrics = [r for r in rows if r["kind"] == kind and r["role"] == "metric"]
        assert [y for _, y in markers(ax)] == pytest.approx([r["estimate"] for r in metrics]) and metrics
        assert [t.get_text() for t in ax.get_xticklabels()] == [
            "Good metric" if r["metric"] == "good" else r["metric"] for r in metrics
        ]
        assert ax.patches, kind  # the band
    assert_drawn(out)
    assert colour_pixels(out, "#1f77b4") > 100  # the points, in C0
    texts = [t.get_text() for t in validation_figure(summary, demo=True).findobj(lambda o: hasattr(o, "get_text"))]
    assert any("DEMO DATA" in t for t in texts)
    plain = [t.get_text() for t in validation_figure(summary).findobj(lambda o: hasattr(o, "get_text"))]
    assert not any("DEMO DATA" in t for t in plain)


def test_the_summary_names_the_metric_that_agrees_best_and_why_no_judge_is_shown():
    # The copy of the raters' mean agrees with them better than its reverse, in both kinds.
    mean = TOY.mean(axis=0)
    scores = scores_table({"copy": mean, "reverse": -mean})
    summary = validate_metrics(ratings_table(TOY), scores, n_resamples=200, seed=5).summary
    pearson = row(summary, "copy", "pearson")
    said = agreement_summary(summary, [])
    assert said.startswith(
        f"Pearson: copy agrees with the raters best ({pearson['estimate']:.3f} "
        f"[95% CI {pearson['ci_low']:.3f}, {pearson['ci_high']:.3f}]). Spearman: copy agrees"
    )
    assert said.endswith(
        "No judge metric is shown: the study configures none (`judge_metrics`, an LLM judge "
        "through an API model; docs/metrics.md), and an offline run has no API model to ask."
    )
    assert "No judge metric" not in agreement_summary(summary, ["CLAIR"])


# --- the demo's simulated ratings -------------------------------------------------------------------


def test_demo_ratings_are_what_make_ratings_writes_and_pass_the_checks(tmp_path):
    from vlm_decade import demo
    from vlm_decade.demo import make_ratings

    out = make_ratings.main(["--out", str(tmp_path / "ratings.csv")])
    committed = demo.DATA_DIR / "ratings.csv"
    assert out.read_bytes() == committed.read_bytes()
    images = [r["image_id"] for r in demo.images()]
    table = load_ratings(committed, {"ssd-template", "demo-imported"}, images)
    assert table.num_rows == make_ratings.N_RATERS * len(images)
    assert set(table["subject"].to_pylist()) == {"demo-imported"}
    # Simulated raters still follow the judgement they were given: wrong captions rate low.
    mean = {i: np.mean([r["rating"] for r in table.to_pylist() if r["image_id"] == i]) for i in images}
    assert mean["retina"] < 2 < 4 < mean["clock"]


def test_a_run_scores_table_counts_only_its_full_variant():
    ratings, scores = simulated_study(n_images=12)
    full = scores.append_column("variant", pa.array(["full"] * scores.num_rows))
    masked = full.set_column(4, "variant", pa.array(["m1"] * scores.num_rows))
    mixed = pa.concat_tables([full, masked.set_column(3, "value", pa.array(np.zeros(scores.num_rows)))])
    a = validate_metrics(ratings, scores, n_resamples=200, seed=5).summary
    b = validate_metrics(ratings, mixed, n_resamples=200, seed=5).summary
    assert a.equals(b)


def test_ratings_too_few_for_a_validation_are_said_and_are_what_the_analysis_refuses():
    """`too_few_ratings` decides before a run (a smoke run's cut ratings, a rater who rated little)
    exactly what the analysis would refuse, so a run leaves the stage out instead of failing in it."""
    from vlm_decade.studies.decade.metric_validation import too_few_ratings

    scores = scores_table({"x": np.arange(4.0)})
    assert too_few_ratings(ratings_table(TOY), "r.csv") is None
    validate_metrics(ratings_table(TOY), scores, n_resamples=100, seed=1)  # runs
    thin = TOY.copy()
    thin[1, 2:] = np.nan  # r1 rated two descriptions
    said = too_few_ratings(ratings_table(thin), "r.csv")
    assert said.startswith("r.csv: rater r1 rated fewer than 3 descriptions") and "no metric_validation" in said
    with pytest.raises(ValueError, match="at least 3 scored pairs per rater"):
        validate_metrics(ratings_table(thin), scores, n_resamples=100, seed=1)
    one = too_few_ratings(ratings_table(TOY[:1]), "r.csv")
    assert one.startswith("r.csv: 1 rater, and inter-rater agreement needs 2")
    with pytest.raises(ValueError, match="at least 2 raters"):
        validate_metrics(ratings_table(TOY[:1]), scores, n_resamples=100, seed=1)
