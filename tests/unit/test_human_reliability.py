"""Reliability and planning (studies/decade/human/reliability.py): the gold against the ranking's own
rule, its bootstrap stability on hand-worked cases, Krippendorff's alpha against the package's own
documented examples, and the planner against the binomial's spread."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vlm_decade.studies.decade.human.reliability import (
    gold_index,
    gold_stability,
    needed,
    plan,
    ratings_alpha,
    vote_matrices,
)
from vlm_decade.studies.decade.ranking import rank_by_votes, tie_draw


def test_gold_by_hand():
    # equal votes: the higher win rate; equal both: the lower draw
    assert gold_index(np.array([2.0, 2, 1]), np.array([4.0, 3, 3]), np.array([0.0, 1, 2]))[0] == 1
    assert gold_index(np.array([2.0, 2]), np.array([4.0, 4]), np.array([1.0, 0]))[0] == 1
    assert gold_index(np.array([3.0, 2]), np.array([9.0, 2]), np.array([1.0, 0]))[0] == 0


def test_the_gold_is_the_rankings_own():
    rng = np.random.default_rng(4)
    own = {f"i{k}": [f"i{k}-{j}" for j in range(6)] for k in range(30)}
    votes = []
    for image, ids in own.items():
        for r in range(5):
            shown = list(rng.choice(ids, 3, replace=False))
            votes.append(
                {"image_id": image, "rater_id": f"r{r}", "shown": shown, "chosen": str(shown[rng.integers(3)])}
            )
    data = vote_matrices(votes, own)
    ones = np.ones((1, 5))
    for image in own:
        roles = rank_by_votes(
            data.ids[image],
            dict(zip(data.ids[image], (ones @ data.votes[image])[0].astype(int).tolist())),
            dict(zip(data.ids[image], (ones @ data.shown[image])[0].astype(int).tolist())),
            1,
            1,
            seed=9,
            stream=f"ranking:{image}",
        )
        draw = tie_draw(data.ids[image], 9, f"ranking:{image}")
        index = gold_index(
            ones @ data.votes[image], ones @ data.shown[image], np.array([draw[d] for d in data.ids[image]])
        )[0]
        assert roles[data.ids[image][index]] == "gold"


def test_stability_by_hand():
    # all three choose a: every resample picks a
    agree = [{"image_id": "x", "rater_id": f"r{k}", "shown": "a;b;z", "chosen": "a"} for k in range(3)]
    assert gold_stability(vote_matrices(agree, {"x": ["a", "b"]}), n_resamples=200) == {"x": 1.0}
    # r1 chooses a, r2 b: the full data tie, the draw picks g; a resample picks g when it draws both
    # (1/2) or g's rater twice (1/4): 3/4
    split = [
        {"image_id": "x", "rater_id": "r1", "shown": "a;b", "chosen": "a"},
        {"image_id": "x", "rater_id": "r2", "shown": "a;b", "chosen": "b"},
    ]
    share = gold_stability(vote_matrices(split, {"x": ["a", "b"]}), n_resamples=4000, seed=2)["x"]
    assert share == pytest.approx(0.75, abs=0.025)
    # a distractor (z, another image's) counts for nothing
    assert vote_matrices(agree, {"x": ["a", "b"]}).shown["x"].sum() == 6


# the krippendorff package's documented example (its `alpha` docstring, Krippendorff's own data)
DOCS = [
    [np.nan, np.nan, np.nan, np.nan, np.nan, 3, 4, 1, 2, 1, 1, 3, 3, np.nan, 3],
    [1, np.nan, 2, 1, 3, 3, 4, 3, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan],
    [np.nan, np.nan, 2, 1, 3, 4, 4, np.nan, 2, 1, 1, 3, 3, np.nan, 4],
]


def test_alpha_against_the_packages_examples():
    ratings = [
        {"rater_id": f"c{c}", "subject": "m", "image_id": f"u{u:02d}", "rating": v}
        for c, row in enumerate(DOCS)
        for u, v in enumerate(row)
        if not math.isnan(v)
    ]
    assert round(ratings_alpha(ratings, "nominal"), 6) == 0.691358
    assert round(ratings_alpha(ratings), 6) == 0.810845


def test_the_planner():
    # two raters of one model, one rating 1 and one 5 on each image: n raters' mean is 1 + 4 k / n,
    # k ~ Binomial(n, 1/2): the 95% interval's half-width is about 1.96 x 2 / sqrt(n)
    ratings = [
        {"rater_id": r, "subject": "m", "image_id": f"i{k}", "rating": v}
        for r, v in (("low", 1.0), ("high", 5.0))
        for k in range(3)
    ]
    agree = [{"image_id": "x", "rater_id": f"r{k}", "shown": "a;b", "chosen": "a"} for k in range(3)]
    rows = plan(vote_matrices(agree, {"x": ["a", "b"]}), ratings, [1, 25, 100], n_resamples=2000, seed=1)
    assert [r.gold_stability for r in rows] == [1.0, 1.0, 1.0]
    assert rows[0].rating_half_width == pytest.approx(2.0)
    assert rows[1].rating_half_width == pytest.approx(1.96 * 2 / 5, rel=0.15)
    assert rows[2].rating_half_width == pytest.approx(1.96 * 2 / 10, rel=0.15)
    assert needed(rows, 0.9, 0.5) == (1, 100)
    assert needed(rows, 0.9, 0.1) == (1, None)
    # same seed, same plan
    again = plan(None, ratings, [1, 25, 100], n_resamples=2000, seed=1)
    assert [r.rating_half_width for r in again] == [r.rating_half_width for r in rows]


def test_the_reliability_stage_table():
    import krippendorff

    from vlm_decade.studies.decade.human.stage import ALPHA, STABILITY, reliability_table

    references = [
        {"image_id": i, "description_id": f"{i}-{d}", "dataset": ds, "condition": c}
        for i, ds in (("p", "A"), ("q", "A"), ("s", "B"))
        for d, c in (("1", "full"), ("2", "full"), ("m", "masked"))
    ]
    # p: unanimous for p-1; q: r1 and r2 split; s: r1 and r3 for s-2, r2 for s-1; r3 votes on s only
    votes = [
        {"image_id": i, "rater_id": r, "trial": "1", "shown": [f"{i}-1", f"{i}-2"], "chosen": f"{i}-{c}"}
        for i, r, c in (
            ("p", "r1", "1"),
            ("p", "r2", "1"),
            ("q", "r1", "1"),
            ("q", "r2", "2"),
            ("s", "r1", "2"),
            ("s", "r2", "1"),
            ("s", "r3", "2"),
        )
    ]
    ratings = [
        {"rater_id": r, "subject": m, "image_id": i, "rating": v}
        for r, m, i, v in (
            ("a", "m1", "p", 1.0),
            ("b", "m1", "p", 2.0),
            ("a", "m1", "q", 4.0),
            ("b", "m1", "q", 5.0),
            ("a", "m2", "q", 3.0),
            ("b", "m2", "q", 3.0),
            ("a", "m1", "s", 2.0),
            ("b", "m1", "s", 2.0),
        )
    ]
    table = reliability_table(votes, ratings, references, n_resamples=500, seed=3, ranking_seed=7)
    rows = {(r["dataset"], r["measure"]): r for r in table.to_pylist()}
    assert list(rows) == [
        ("A", STABILITY),
        ("B", STABILITY),
        ("all", STABILITY),
        ("A", ALPHA),
        ("B", ALPHA),
        ("all", ALPHA),
    ]
    own = {i: [f"{i}-1", f"{i}-2"] for i in "pqs"}
    shares = gold_stability(vote_matrices(votes, own), 500, 3, 7)
    # p: unanimous, but a resample of r3 alone (1/27) has no vote on p and its tie draw decides
    assert shares["p"] == pytest.approx(1 - 1 / 27, abs=0.03)
    assert rows[("A", STABILITY)]["value"] == pytest.approx((shares["p"] + shares["q"]) / 2)
    assert rows[("B", STABILITY)]["value"] == pytest.approx(shares["s"])
    assert rows[("all", STABILITY)]["value"] == pytest.approx(sum(shares.values()) / 3)
    assert [rows[(d, STABILITY)][k] for d in ("A", "B", "all") for k in ("participants", "items")] == [2, 2, 3, 1, 3, 3]
    assert rows[("all", STABILITY)]["n_resamples"] == 500 and rows[("all", STABILITY)]["seed"] == 3
    # alpha: raters a, b as coders, (subject, image) units in sorted order
    a_only = np.array([[1.0, 4, 3], [2, 5, 3]])  # units (m1,p), (m1,q), (m2,q)
    every = np.array([[1.0, 4, 2, 3], [2, 5, 2, 3]])  # units (m1,p), (m1,q), (m1,s), (m2,q)
    expected = krippendorff.alpha(reliability_data=every, level_of_measurement="interval")
    assert rows[("A", ALPHA)]["value"] == pytest.approx(
        krippendorff.alpha(reliability_data=a_only, level_of_measurement="interval")
    )
    assert rows[("all", ALPHA)]["value"] == pytest.approx(expected)
    assert rows[("B", ALPHA)]["value"] is None  # one value rated: alpha is undefined
    assert [rows[("all", ALPHA)][k] for k in ("participants", "items", "n_resamples")] == [2, 4, None]
    # ratings only, votes only: the other measure's rows are left out
    assert set(reliability_table(None, ratings, references).column("measure").to_pylist()) == {ALPHA}
    assert set(reliability_table(votes, None, references, 50).column("measure").to_pylist()) == {STABILITY}
