"""How far the people's data can be trusted, and how many people a study needs (docs/human.md).

* Gold-standard stability: a bootstrap over the ranking's participants (all the votes of a drawn
  participant go in together), each resample ranking every image's `full` descriptions by the
  study's rule (docs/data-format.md: more votes, then the higher win rate, then the seeded tie
  draw of `ranking.tie_draw`); the stability of an image is how often a resample picks the gold
  standard all the votes pick, and overall the mean over images.
* Krippendorff's alpha of the ratings (the `krippendorff` package; interval data by default), each
  rated (subject, image) a unit and each rater a coder.
* A planner: for each candidate number of participants n, resamples of n participants drawn from
  the pilot's (with replacement, from named streams of the seed) give the gold's stability at n and
  the width of the ratings' confidence interval at n (per rated model, the mean rating's percentile
  interval over resamples; the widest counts). The participants needed are the smallest n meeting
  the asked rate and half-width. It resamples participants only: the images are taken as fixed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vlm_decade.stats.resampling import named_generator, percentile_ci, resample_counts
from vlm_decade.studies.decade.ranking import tie_draw

STREAM = "human:reliability"


@dataclass(frozen=True)
class Votes:
    """The ranking's votes as matrices: per image, participants x its `full` descriptions."""

    raters: list[str]
    images: list[str]
    ids: dict[str, list[str]]  # image -> its full description ids, sorted
    votes: dict[str, np.ndarray]  # image -> (raters, descriptions): times chosen
    shown: dict[str, np.ndarray]  # image -> (raters, descriptions): times shown in its own trials


def vote_matrices(votes: Sequence[Mapping], own: Mapping[str, Sequence[str]]) -> Votes:
    """`votes` rows (image_id, rater_id, shown, chosen; `shown` a list or ';'-joined) counted as the
    study counts them: a description's vote and showing count only in its own image's trials.
    `own`: image -> its `full` description ids."""
    raters = sorted({str(v["rater_id"]) for v in votes})
    at = {r: k for k, r in enumerate(raters)}
    images = sorted(i for i in own if own[i])
    ids = {i: sorted(own[i]) for i in images}
    col = {i: {d: k for k, d in enumerate(ids[i])} for i in images}
    counted = {i: np.zeros((len(raters), len(ids[i]))) for i in images}
    shown = {i: np.zeros((len(raters), len(ids[i]))) for i in images}
    for v in votes:
        image = v["image_id"]
        if image not in col:
            continue
        listed = v["shown"] if isinstance(v["shown"], list) else str(v["shown"]).split(";")
        r = at[str(v["rater_id"])]
        for d in (s.strip() for s in listed):
            if d in col[image]:
                shown[image][r, col[image][d]] += 1
        if v["chosen"] in col[image]:
            counted[image][r, col[image][v["chosen"]]] += 1
    return Votes(raters, images, ids, counted, shown)


def gold_index(votes: np.ndarray, shown: np.ndarray, draw: np.ndarray) -> np.ndarray:
    """Per row (a resample), the index of the gold standard: most votes, then the highest win rate
    (never shown: 0), then the lowest tie draw. `votes`, `shown`: (rows, descriptions)."""
    votes, shown = np.atleast_2d(votes), np.atleast_2d(shown)
    most = np.isclose(votes, votes.max(axis=1, keepdims=True))
    rate = np.divide(votes, shown, out=np.zeros_like(votes, dtype=float), where=shown > 0)
    rate = np.where(most, rate, -1.0)
    best = most & np.isclose(rate, rate.max(axis=1, keepdims=True), rtol=0, atol=1e-12)
    return np.argmin(np.where(best, draw[None, :], np.inf), axis=1)


def _draws(data: Votes, seed: int) -> dict[str, np.ndarray]:
    """Each image's tie draw, the study's own (`ranking.seed`, stream "ranking:<image_id>")."""
    out = {}
    for image in data.images:
        draw = tie_draw(data.ids[image], seed, f"ranking:{image}")
        out[image] = np.array([draw[d] for d in data.ids[image]], dtype=float)
    return out


def _stability(
    data: Votes, weights: np.ndarray, draws: Mapping[str, np.ndarray], gold: Mapping[str, int]
) -> dict[str, float]:
    """Per image, the share of resamples (rows of `weights`: each participant's weight) that pick `gold`."""
    return {
        i: float(np.mean(gold_index(weights @ data.votes[i], weights @ data.shown[i], draws[i]) == gold[i]))
        for i in data.images
    }


def gold_stability(data: Votes, n_resamples: int = 1000, seed: int = 0, ranking_seed: int = 0) -> dict[str, float]:
    """Per image, how often a bootstrap over participants picks the gold standard all votes pick;
    `ranking_seed`: the study's `ranking.seed`, for the same tie draw its ranking makes."""
    draws = _draws(data, ranking_seed)
    ones = np.ones((1, len(data.raters)))
    gold = {i: int(gold_index(ones @ data.votes[i], ones @ data.shown[i], draws[i])[0]) for i in data.images}
    agree = {i: 0.0 for i in data.images}
    for counts in resample_counts(seed, f"{STREAM}:gold", n_resamples, len(data.raters)):
        for image, share in _stability(data, counts.astype(float), draws, gold).items():
            agree[image] += share * len(counts)
    return {i: agree[i] / n_resamples for i in data.images}


def ratings_alpha(ratings: Sequence[Mapping], level: str = "interval") -> float:
    """Krippendorff's alpha of a ratings table (rater_id, subject, image_id, rating): units are the
    rated (subject, image) pairs, coders the raters; a pair a rater did not rate is missing."""
    import krippendorff

    raters = sorted({r["rater_id"] for r in ratings})
    units = sorted({(r["subject"], r["image_id"]) for r in ratings})
    at, unit = {r: k for k, r in enumerate(raters)}, {u: k for k, u in enumerate(units)}
    matrix = np.full((len(raters), len(units)), np.nan)
    for r in ratings:
        matrix[at[r["rater_id"]], unit[(r["subject"], r["image_id"])]] = float(r["rating"])
    return float(krippendorff.alpha(reliability_data=matrix, level_of_measurement=level))


@dataclass(frozen=True)
class PlanRow:
    participants: int
    gold_stability: float | None  # mean over images; None without votes
    rating_half_width: float | None  # the widest over rated models; None without ratings


def _rating_sums(ratings: Sequence[Mapping]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Per rater and rated model, the sum and the number of their ratings: (raters, sums, counts)."""
    raters = sorted({r["rater_id"] for r in ratings})
    subjects = sorted({r["subject"] for r in ratings})
    at, sub = {r: k for k, r in enumerate(raters)}, {s: k for k, s in enumerate(subjects)}
    sums, counts = np.zeros((len(raters), len(subjects))), np.zeros((len(raters), len(subjects)))
    for r in ratings:
        sums[at[r["rater_id"]], sub[r["subject"]]] += float(r["rating"])
        counts[at[r["rater_id"]], sub[r["subject"]]] += 1
    return raters, sums, counts


def _drawn(seed: int, name: str, n_resamples: int, n: int, pool: int) -> np.ndarray:
    """(resamples, pool) weights: n participants drawn with replacement from the pilot's `pool`."""
    return named_generator(seed, name).multinomial(n, np.full(pool, 1.0 / pool), size=n_resamples).astype(float)


def plan(
    data: Votes | None,
    ratings: Sequence[Mapping] | None,
    sizes: Sequence[int],
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    ranking_seed: int = 0,
) -> list[PlanRow]:
    """For each participant count in `sizes`, the gold's stability and the rating CI's half-width."""
    rows = []
    draws = _draws(data, ranking_seed) if data is not None else {}
    if data is not None:
        ones = np.ones((1, len(data.raters)))
        gold = {i: int(gold_index(ones @ data.votes[i], ones @ data.shown[i], draws[i])[0]) for i in data.images}
    if ratings:
        raters, sums, counts = _rating_sums(ratings)
    for n in sizes:
        stability = width = None
        if data is not None:
            weights = _drawn(seed, f"{STREAM}:plan:votes:{n}", n_resamples, n, len(data.raters))
            stability = float(np.mean(list(_stability(data, weights, draws, gold).values())))
        if ratings:
            weights = _drawn(seed, f"{STREAM}:plan:ratings:{n}", n_resamples, n, len(raters))
            with np.errstate(invalid="ignore", divide="ignore"):
                means = (weights @ sums) / (weights @ counts)  # (resamples, models)
            lo, hi = percentile_ci(means.T, confidence)
            width = float(np.nanmax((hi - lo) / 2))
        rows.append(PlanRow(n, stability, width))
    return rows


def needed(rows: Sequence[PlanRow], rate: float, half_width: float) -> tuple[int | None, int | None]:
    """The fewest participants whose gold stability reaches `rate`, and whose rating CI half-width is
    at most `half_width` (None: no size tried was enough)."""
    gold = next((r.participants for r in rows if r.gold_stability is not None and r.gold_stability >= rate), None)
    width = next(
        (r.participants for r in rows if r.rating_half_width is not None and r.rating_half_width <= half_width), None
    )
    return gold, width
