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
