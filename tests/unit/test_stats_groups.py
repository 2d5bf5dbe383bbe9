"""Statistics per group of a metadata column (`analysis.group_by`), for both studies: each group's rows
are the analysis of a study holding only that group's images, the rows about all images are as
without groups, and a family's q-values are BH over all its groups' p-values (statsmodels). No Ray."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from statsmodels.stats.multitest import multipletests

from vlm_decade.core.config import StatisticsConfig
from vlm_decade.stats import analyse
from vlm_decade.stats.groups import GROUP_COLUMNS, image_groups, ungrouped
from vlm_decade.studies.decade.statistics import grouped_analysis
from vlm_decade.studies.openworld import statistics as openworld
from vlm_decade.studies.openworld.scoring import PREDICTIONS_SCHEMA, SCORES_B_SCHEMA

ERAS = {"UDC": "pre-mllm", "OFA": "pre-mllm", "GPT-4": "mllm", "human:top": "human", "human:bottom": "human"}
SETTINGS = {"n_resamples": 400, "seed": 11, "confidence": 0.95, "alpha": 0.05}


def decade_scores(n=24):
    rng = np.random.default_rng(5)
    rows = []
    for d in ("coco", "csb"):
        for s, era in ERAS.items():
            base = {"pre-mllm": 0.5, "mllm": 0.7, "human": 0.72}[era]
            for i in range(n):
                rows.append((s, f"{d}-{i:02d}", d, "full", "gemini-si", base + 0.1 * rng.standard_normal()))
    columns = ["subject", "image_id", "dataset", "variant", "metric", "value"]
    return pa.table(list(map(list, zip(*rows))), names=columns)


def metadata_of(ids):
    """Every third image is 'hard', the rest 'easy'; one image has no category and is in no group."""
    category = ["hard" if k % 3 == 0 else "easy" for k in range(len(ids))]
    category[1] = ""
    return pa.table({"image_id": ids, "category": category})


def without_group(table):
    return table.drop_columns(list(GROUP_COLUMNS))


def of_group(table, group):
    return without_group(table.filter(pc.equal(table["group"], group)))


def test_decade_groups_are_the_analysis_of_their_images_alone_and_bh_spans_the_groups():
    scores = decade_scores()
    ids = sorted(set(scores["image_id"].to_pylist()))
    metadata = metadata_of(ids)
    stats, comparisons = grouped_analysis(scores, metadata, ERAS, ("category",), SETTINGS)

    whole_stats, whole_comparisons = analyse(scores, ERAS, **SETTINGS)
    assert without_group(ungrouped(stats)).equals(whole_stats)  # the rows about all images, as before
    assert without_group(ungrouped(comparisons)).equals(whole_comparisons)
    assert set(stats["group_by"].drop_null().to_pylist()) == {"category"}

    groups = image_groups(metadata, "category")
    assert {g: len(v) for g, v in groups.items()} == {"easy": 31, "hard": 16}  # 48 images, one with none
    for group, members in groups.items():
        alone = scores.filter(pc.is_in(scores["image_id"], pa.array(members)))
        alone_stats, alone_comparisons = analyse(alone, ERAS, **SETTINGS)
        assert of_group(stats, group).equals(alone_stats)  # estimates, CIs and n, bit for bit
        mine = of_group(comparisons, group)
        for column in ("a", "b", "dataset", "difference", "ci_low", "ci_high", "p"):
            assert mine[column].equals(alone_comparisons[column])
        # a hand check of one estimate: OFA's mean on csb over the group's images
        want = np.mean([r["value"] for r in alone.to_pylist() if (r["subject"], r["dataset"]) == ("OFA", "csb")])
        got = [r for r in of_group(stats, group).to_pylist() if (r["subject"], r["dataset"]) == ("OFA", "csb")]
        assert got[0]["estimate"] == pytest.approx(want, rel=1e-12)

    grouped = comparisons.filter(pc.is_valid(comparisons["group"])).to_pylist()
    for family in {r["family"] for r in grouped}:
        rows = [r for r in grouped if r["family"] == family and r["p"] is not None]
        assert {r["group"] for r in rows} == {"easy", "hard"}
        _, q, _, _ = multipletests([r["p"] for r in rows], method="fdr_bh")
        assert [r["q"] for r in rows] == pytest.approx(list(q), rel=1e-12)
        assert [r["significant"] for r in rows] == [bool(v <= SETTINGS["alpha"]) for v in q]


def test_openworld_groups_are_the_analysis_of_their_images_alone():
    rng = np.random.default_rng(3)
    granularity = {"cars": "very fine-grained", "pets": "prototypical"}
    model_kinds = {"vlm": "open-world", "vlm2": "open-world", "clip": "closed-world"}
    rows = []
    for d in granularity:
        for i in range(18):
            for s in model_kinds:
                for metric in ("TI", "CS"):
                    value = float(rng.random() < 0.6) if metric == "TI" else float(rng.random())
                    rows.append(
                        {"subject": s, "image_id": f"{d}{i}", "dataset": d, "prompt_id": "p1", "metric": metric}
                    )
                    rows[-1]["value"] = value
    scores = pa.Table.from_pylist(rows, schema=SCORES_B_SCHEMA)
    predictions = PREDICTIONS_SCHEMA.empty_table()  # no outcomes: unjudged
    ids = sorted(set(scores["image_id"].to_pylist()))
    metadata = metadata_of(ids)
    settings = StatisticsConfig(n_resamples=300, seed=7)
    args = (granularity, model_kinds, ["p1"], settings)
    out = openworld.grouped_analysis(scores, predictions, metadata, ("category",), *args)
    whole = openworld.grouped_analysis(scores, predictions, None, (), *args)
    for name in ("stats", "comparisons", "paired_tests"):
        assert ungrouped(out[name]).equals(whole[name])
    for group, members in image_groups(metadata, "category").items():
        alone = openworld.grouped_analysis(
            scores.filter(pc.is_in(scores["image_id"], pa.array(members))), predictions, None, (), *args
        )
        assert of_group(out["stats"], group).equals(without_group(alone["stats"]))
        for column in ("a", "b", "dataset", "metric", "difference", "ci_low", "ci_high", "p"):
            assert of_group(out["comparisons"], group)[column].equals(alone["comparisons"][column])
        assert of_group(out["paired_tests"], group)["p"].equals(alone["paired_tests"]["p"])
    grouped = {name: out[name].filter(pc.is_valid(out[name]["group"])) for name in out}
    assert {n: t.num_rows > 0 for n, t in grouped.items()} == {"stats": True, "comparisons": True, "paired_tests": True}
    tests = grouped["paired_tests"].to_pylist()
    for metric in ("TI",):
        rows = [r for r in tests if r["metric"] == metric]
        _, q, _, _ = multipletests([r["p"] for r in rows], method="fdr_bh")
        assert [r["q"] for r in rows] == pytest.approx(list(q), rel=1e-12)
