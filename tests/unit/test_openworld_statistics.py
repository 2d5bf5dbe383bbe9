"""Study B's statistics on constructed scores: per-dataset estimates, the paper's group mean of dataset
means with its combined bootstrap, SS's threshold shares, and the comparison families (open vs closed,
model vs model, the prompt ablation), each value worked by hand or recomputed from the engine's
own resample counts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats as scipy_stats

from vlm_decade.stats import _core, _streams, mcnemar_exact
from vlm_decade.studies.openworld.metrics import ss_threshold_shares
from vlm_decade.studies.openworld.scoring import PREDICTIONS_SCHEMA, SCORES_B_SCHEMA
from vlm_decade.studies.openworld.statistics import analyse_groups, dataset_scores, group_members, mcnemar_tests

B, SEED = 1000, 11
GRANULARITY = {"A": "prototypical", "Bd": "prototypical", "C": "fine-grained"}
KINDS = {"m": "open-world", "n": "open-world", "clip": "closed-world"}


def scores_of(values: dict[tuple[str, str, str, str], list[float]]) -> pa.Table:
    """(subject, dataset, prompt, metric) -> one value per image of the dataset (ids d0, d1, ...)."""
    rows = [
        {"subject": s, "image_id": f"{d}{k}", "dataset": d, "prompt_id": v, "metric": m, "value": x}
        for (s, d, v, m), xs in values.items()
        for k, x in enumerate(xs)
    ]
    return pa.Table.from_pylist(rows, schema=SCORES_B_SCHEMA)


VALUES = {
    # TI: dataset A has 2 images, Bd 4: pooled, m's prototypical mean would be 2/6; the paper's mean
    # of dataset means is (1 + 0) / 2 = 0.5.
    ("m", "A", "default", "TI"): [1.0, 1.0],
    ("m", "Bd", "default", "TI"): [0.0, 0.0, 0.0, 0.0],
    ("m", "C", "default", "TI"): [1.0, 0.0, 0.0],
    ("n", "A", "default", "TI"): [0.0, 1.0],
    ("n", "Bd", "default", "TI"): [1.0, 1.0, 0.0, 1.0],
    ("n", "C", "default", "TI"): [0.0, 0.0, 1.0],
    ("clip", "A", "default", "TI"): [1.0, 1.0],
    ("clip", "Bd", "default", "TI"): [1.0, 1.0, 1.0, 1.0],
    ("clip", "C", "default", "TI"): [1.0, 1.0, 1.0],
    ("m", "A", "specific", "TI"): [1.0, 1.0],
    ("m", "Bd", "specific", "TI"): [1.0, 0.0, 1.0, 1.0],
    ("m", "C", "specific", "TI"): [1.0, 1.0, 0.0],
    ("n", "A", "specific", "TI"): [0.0, 0.0],
    ("n", "Bd", "specific", "TI"): [1.0, 1.0, 0.0, 0.0],
    ("n", "C", "specific", "TI"): [0.0, 0.0, 0.0],
}


@pytest.fixture(scope="module")
def result():
    return analyse_groups(scores_of(VALUES), GRANULARITY, KINDS, ["default", "specific"], B, SEED, use_ray=False)


def engine_means(dataset: str, values: list[float]) -> np.ndarray:
    """A dataset's resampled means, from the engine's own stream of that dataset (by hand)."""
    n = len(values)
    counts = np.vstack(
        [
            _core.multinomial_counts(np.random.default_rng(ss), b, n)
            for ss, b in zip(
                _streams.chunk_streams(SEED, dataset, _streams.KIND_MULTINOMIAL, 2), _streams.chunk_sizes(B)
            )
        ]
    )
    return counts @ np.asarray(values) / n


def stat(result, subject, dataset, metric="TI", prompt="default"):
    (row,) = [
        r
        for r in result[0].to_pylist()
        if (r["subject"], r["dataset"], r["metric"], r["prompt_id"]) == (subject, dataset, metric, prompt)
    ]
    return row


def test_per_dataset_rows_are_each_dataset_s_mean(result):
    assert stat(result, "m", "A")["estimate"] == 1.0 and stat(result, "m", "Bd")["estimate"] == 0.0
    assert stat(result, "n", "Bd")["estimate"] == 0.75 and stat(result, "n", "Bd")["n_images"] == 4


def test_a_group_is_the_mean_of_its_dataset_means_bootstrapped_within_datasets(result):
    row = stat(result, "m", "prototypical")
    assert row["estimate"] == pytest.approx(0.5)  # not the pooled 2/6
    assert row["n_images"] == 6 and row["method"] == "percentile, mean of 2 dataset means"
    # its CI: percentiles of the mean of A's and Bd's resampled means, each from its own stream
    n = stat(result, "n", "prototypical")
    combined = (
        engine_means("A", VALUES[("n", "A", "default", "TI")])
        + engine_means("Bd", VALUES[("n", "Bd", "default", "TI")])
    ) / 2
    assert n["estimate"] == pytest.approx((0.5 + 0.75) / 2)
    assert (n["ci_low"], n["ci_high"]) == pytest.approx(tuple(np.quantile(combined, [0.025, 0.975])))
    assert stat(result, "n", "all")["estimate"] == pytest.approx((0.5 + 0.75 + 1 / 3) / 3)


def test_model_vs_model_within_each_group_with_bh_over_the_family(result):
    rows = [r for r in result[1].to_pylist() if r["family"] == "model-vs-model" and r["metric"] == "TI"]
    assert {(r["a"], r["b"]) for r in rows} == {("clip", "m"), ("clip", "n"), ("m", "n")}
    assert {r["dataset"] for r in rows} == {"prototypical", "fine-grained", "all"}
    mn = next(r for r in rows if (r["a"], r["b"], r["dataset"]) == ("m", "n", "prototypical"))
    assert mn["difference"] == pytest.approx(0.5 - 0.625) and mn["paired"] and mn["prompt_id"] == "default"
    diff = (
        engine_means("A", VALUES[("m", "A", "default", "TI")])
        + engine_means("Bd", VALUES[("m", "Bd", "default", "TI")])
    ) / 2 - (
        engine_means("A", VALUES[("n", "A", "default", "TI")])
        + engine_means("Bd", VALUES[("n", "Bd", "default", "TI")])
    ) / 2
    k_below, k_above = (diff < 0).sum() + (diff == 0).sum() / 2, (diff > 0).sum() + (diff == 0).sum() / 2
    assert mn["p"] == pytest.approx(min(1.0, 2 * (1 + min(k_below, k_above)) / (B + 1)))
    np.testing.assert_allclose(
        [r["q"] for r in rows], scipy_stats.false_discovery_control([r["p"] for r in rows], method="bh")
    )


def test_the_prompt_ablation_is_one_family_across_prompts(result):
    rows = [r for r in result[1].to_pylist() if r["family"] == "prompt-ablation" and r["metric"] == "TI"]
    assert {(r["a"], r["b"]) for r in rows} == {
        ("m [specific]", "m [default]"),
        ("n [specific]", "n [default]"),
    }  # open-world only
    m_all = next(r for r in rows if r["a"] == "m [specific]" and r["dataset"] == "all")
    specific = (1 + 0.75 + 2 / 3) / 3
    default = (1 + 0 + 1 / 3) / 3
    assert m_all["difference"] == pytest.approx(specific - default) and m_all["prompt_id"] == "specific"
    np.testing.assert_allclose(
        [r["q"] for r in rows], scipy_stats.false_discovery_control([r["p"] for r in rows], method="bh")
    )


def test_open_world_mean_against_the_closed_world_mean(result):
    rows = [r for r in result[1].to_pylist() if r["family"] == "open-vs-closed" and r["metric"] == "TI"]
    fine = next(r for r in rows if r["dataset"] == "fine-grained")
    assert (fine["a"], fine["b"]) == ("open-world", "closed-world")
    assert fine["estimate_a"] == pytest.approx((1 / 3 + 1 / 3) / 2) and fine["estimate_b"] == 1.0


def prediction(subject, image, dataset, ss, outcome="correct"):
    return {
        "subject": subject,
        "image_id": image,
        "dataset": dataset,
        "granularity": GRANULARITY[dataset],
        "prompt_id": "default",
        "label": "x",
        "prediction": "y",
        "TI": 0.0,
        "LI": 1.0,
        "SS": ss,
        "CS": 0.5,
        "best_concept": "y",
        "judge_answer": "1",
        "outcome": outcome,
    }


def test_ss_threshold_shares_per_dataset_and_group():
    ss = {"A": [0.55, 0.95], "Bd": [0.45, 0.65, 0.75, 0.85]}
    preds = [prediction("m", f"{d}{k}", d, v) for d, vs in ss.items() for k, v in enumerate(vs)]
    preds[0]["outcome"] = "granularity"
    scores = pa.Table.from_pylist(
        [
            {
                "subject": "m",
                "image_id": p["image_id"],
                "dataset": p["dataset"],
                "prompt_id": "default",
                "metric": "SS",
                "value": p["SS"],
            }
            for p in preds
        ],
        schema=SCORES_B_SCHEMA,
    )
    table = dataset_scores(scores, pa.Table.from_pylist(preds, schema=PREDICTIONS_SCHEMA))
    st, _ = analyse_groups(
        table, {"A": "prototypical", "Bd": "prototypical"}, {"m": "open-world"}, ["default"], 200, 1, use_ray=False
    )
    got = {(r["dataset"], r["metric"]): r["estimate"] for r in st.to_pylist()}
    for d, vs in ss.items():
        for name, share in ss_threshold_shares(np.array(vs)).items():
            assert got[(d, name)] == pytest.approx(share)
    assert got[("prototypical", "ss@0.7")] == pytest.approx((0.5 + 0.5) / 2)
    # ss@avg by hand: A's shares at 0.5..0.9 are 1, .5, .5, .5, .5 (avg 0.6); Bd's .75, .75, .5, .25, 0 (avg 0.45)
    assert got[("A", "ss@avg")] == pytest.approx(0.6) and got[("Bd", "ss@avg")] == pytest.approx(0.45)
    assert got[("prototypical", "ss@avg")] == pytest.approx((0.6 + 0.45) / 2)
    assert got[("A", "outcome:granularity")] == 0.5 and got[("Bd", "outcome:correct")] == 1.0


def test_a_dataset_named_like_a_group_is_refused():
    assert group_members({"x": "fine-grained", "y": "prototypical", "z": "prototypical"}) == {
        "prototypical": ["y", "z"],
        "fine-grained": ["x"],
        "all": ["x", "y", "z"],
    }
    with pytest.raises(ValueError, match="rename"):
        group_members({"all": "prototypical"})


@pytest.mark.parametrize("a_only, b_only", [(0, 0), (0, 1), (3, 0), (5, 5), (2, 9), (17, 4), (0, 40), (120, 95)])
def test_mcnemar_exact_equals_statsmodels(a_only, b_only):
    from statsmodels.stats.contingency_tables import mcnemar

    reference = mcnemar([[7, a_only], [b_only, 3]], exact=True).pvalue  # concordant cells do not matter
    assert mcnemar_exact([a_only], [b_only])[0] == pytest.approx(reference, rel=1e-12, abs=1e-15)


def test_mcnemar_tests_pair_images_per_dataset_and_pool_groups():
    # m vs n on TI under "default": A: (1,0), (1,1) -> m only 1; Bd: (0,1), (0,1), (0,0), (0,1) -> n only 3;
    # C: (1,0), (0,0), (0,1) -> 1 and 1. Prototypical pools A and Bd: 1 and 3; all: 2 and 4.
    table = mcnemar_tests(scores_of(VALUES), GRANULARITY, ["m", "n"], "default").to_pylist()
    got = {r["dataset"]: (r["n_pairs"], r["a_only"], r["b_only"], r["p"]) for r in table}
    assert got == {
        "A": (2, 1, 0, 1.0),
        "Bd": (4, 0, 3, 0.25),
        "C": (3, 1, 1, 1.0),
        "prototypical": (6, 1, 3, 0.625),
        "fine-grained": (3, 1, 1, 1.0),
        "all": (9, 2, 4, 0.6875),
    }
    assert {r["metric"] for r in table} == {"TI"} and {(r["a"], r["b"]) for r in table} == {("m", "n")}
    # BH over the family's six p-values (scipy's implementation as the reference)
    q = scipy_stats.false_discovery_control([r["p"] for r in table])
    assert [r["q"] for r in table] == pytest.approx(list(q))


def test_mcnemar_tests_use_only_images_both_models_answered():
    values = {("m", "A", "default", "TI"): [1.0, 1.0, 0.0], ("n", "A", "default", "TI"): [0.0, 0.0]}
    rows = scores_of(values).to_pylist()
    rows.append(
        {"subject": "n", "image_id": "A2", "dataset": "A", "prompt_id": "default", "metric": "TI", "value": None}
    )
    table = mcnemar_tests(
        pa.Table.from_pylist(rows, schema=SCORES_B_SCHEMA), {"A": "prototypical"}, ["m", "n"], "default"
    )
    first = table.to_pylist()[0]
    assert (first["n_pairs"], first["a_only"], first["b_only"]) == (2, 2, 0)
    assert first["p"] == pytest.approx(0.5)
