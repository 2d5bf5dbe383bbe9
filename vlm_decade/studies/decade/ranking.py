"""Ranking one image's human descriptions into gold / top / bottom / other (Study A).

Pure functions, no I/O; `vlm_decade.studies.decade.data` feeds them one image at a time. Two methods
(docs/data-format.md, "Ranking"):

- by votes, as in the paper: the description chosen "best" most often is the gold standard, and of
  the rest the `top_k` highest-ranked are `top` and the `bottom_k` lowest-ranked are `bottom`;
- by consensus, the fallback for a dataset that has no votes: a description's score is its mean
  TF-IDF cosine similarity to the image's other descriptions, and the order follows the score.

Descriptions the votes (or scores) cannot tell apart are ordered by a seeded random draw per image
(`tie_draw`), not by their ids, so no naming scheme decides a gold standard; `tied_cuts` counts
the role boundaries that fell inside such a tie, for the report.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from vlm_decade.stats.resampling import named_generator

GOLD, TOP, BOTTOM, OTHER = "gold", "top", "bottom", "other"

_WORD = re.compile(r"\w+")
# Consensus scores equal to this many decimals count as tied, so that float summation order
# never decides between two equally typical descriptions; the seeded draw decides instead.
_SCORE_DECIMALS = 12


def group_sizes(n: int, top_k: int, bottom_k: int) -> tuple[int, int]:
    """How many of n ranked descriptions are `top` and `bottom`.

    With fewer than 1 + top_k + bottom_k descriptions both groups shrink to k = (n - 1) // 2 (never
    growing past what was asked), so they never overlap and neither takes the gold standard.
    """
    if n < 1 + top_k + bottom_k:
        k = max(n - 1, 0) // 2
        return min(top_k, k), min(bottom_k, k)
    return top_k, bottom_k


def assign_roles(ordered_ids: Sequence[str], top_k: int, bottom_k: int) -> dict[str, str]:
    """Roles for ids already in rank order (best first)."""
    if not ordered_ids:
        raise ValueError("no descriptions to rank")
    if len(set(ordered_ids)) != len(ordered_ids):
        raise ValueError("description ids must be unique")
    n_top, n_bottom = group_sizes(len(ordered_ids), top_k, bottom_k)
    roles = {i: OTHER for i in ordered_ids}
    roles[ordered_ids[0]] = GOLD
    for i in ordered_ids[1 : 1 + n_top]:
        roles[i] = TOP
    for i in ordered_ids[len(ordered_ids) - n_bottom :]:
        roles[i] = BOTTOM
    return roles


def tie_draw(description_ids: Sequence[str], seed: int, stream: str) -> dict[str, int]:
    """The tie-break: each id's place in a random order of the image's ids, drawn from the stream
    `named_generator(seed, "ranking:" + stream)` (stream: the image id) over the ids sorted, so the
    draw depends on the seed, the image and its set of descriptions only."""
    ids = sorted(description_ids)
    order = named_generator(seed, f"ranking:{stream}").permutation(len(ids))
    return {i: int(k) for i, k in zip(ids, order)}


def vote_key(votes: int, shown: int) -> tuple[int, Fraction]:
    """What the votes say of a description, higher first: its votes, then its win rate (an exact
    fraction, so the order never depends on rounding; never shown: 0)."""
    if votes < 0 or shown < 0 or votes > shown:
        raise ValueError(f"{votes} votes from {shown} showings is impossible")
    return votes, Fraction(votes, shown) if shown else Fraction(0)


def vote_order(
    description_ids: Sequence[str],
    votes_per_id: Mapping[str, int],
    shown_per_id: Mapping[str, int],
    draw: Mapping[str, int],
) -> list[str]:
    """Ids best first: more votes, then higher win rate (votes / times shown), then the tie draw
    (`tie_draw`). An id missing from a mapping counts 0; a description never shown has win rate 0."""

    def key(i: str):
        try:
            votes, rate = vote_key(votes_per_id.get(i, 0), shown_per_id.get(i, 0))
        except ValueError as exc:
            raise ValueError(f"description {i!r}: {exc}") from None
        return (-votes, -rate, draw[i])

    return sorted(description_ids, key=key)


def rank_by_votes(
    description_ids: Sequence[str],
    votes_per_id: Mapping[str, int],
    shown_per_id: Mapping[str, int],
    top_k: int,
    bottom_k: int,
    *,
    seed: int,
    stream: str,
) -> dict[str, str]:
    """Map each id to gold/top/bottom/other from "best" votes (order: `vote_order`, ties drawn with
    `seed` on the image's `stream`)."""
    draw = tie_draw(description_ids, seed, stream)
    return assign_roles(vote_order(description_ids, votes_per_id, shown_per_id, draw), top_k, bottom_k)


def tied_cuts(keys: Sequence, roles: Sequence[str]) -> tuple[int, int]:
    """(cuts that fell in a tie, cuts) of one image's ranking: `keys` and `roles` of its descriptions
    in rank order. A cut is a boundary between two roles (gold | top, top | other, other | bottom);
    it falls in a tie when the descriptions on either side have the same key, so the draw chose."""
    cuts = [k for k in range(1, len(roles)) if roles[k] != roles[k - 1]]
    return sum(keys[k] == keys[k - 1] for k in cuts), len(cuts)


def vote_ties(references: Sequence[Mapping]) -> dict[str, int]:
    """Over the images ranked by votes (rows of the `references` table: image_id, condition, role,
    votes, shown), how many role cuts fell in a tie, how many of them decided the gold standard, and
    of how many cuts and images."""
    by_image: dict[str, list[Mapping]] = {}
    for r in references:
        if r["condition"] == "full" and r["role"] in (GOLD, TOP, BOTTOM, OTHER):
            by_image.setdefault(r["image_id"], []).append(r)
    rank = {GOLD: 0, TOP: 1, OTHER: 2, BOTTOM: 3}
    out = {"tied": 0, "cuts": 0, "gold_tied": 0, "images": 0}
    for rows in by_image.values():
        if not any(r["shown"] for r in rows):
            continue  # ranked by consensus
        rows = sorted(rows, key=lambda r: (rank[r["role"]], [-x for x in vote_key(r["votes"], r["shown"])]))
        keys = [vote_key(r["votes"], r["shown"]) for r in rows]
        tied, cuts = tied_cuts(keys, [r["role"] for r in rows])
        out["tied"] += tied
        out["cuts"] += cuts
        out["gold_tied"] += int(len(keys) > 1 and keys[0] == keys[1])
        out["images"] += 1
    return out


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens (runs of Unicode letters, digits and underscores)."""
    return _WORD.findall(text.lower())


def consensus_scores(texts: Sequence[str]) -> np.ndarray:
    """Each text's mean TF-IDF cosine similarity to the other texts (0.0 for a lone text).

    tf is the raw count of a token in a text; idf is smooth over these texts only,
    ln((1 + n) / (1 + df)) + 1; rows are L2-normalised, and a text with no word tokens is a zero
    vector (similarity 0 to everything).
    """
    n = len(texts)
    if n < 2:
        return np.zeros(n)
    counts = [Counter(tokens(t)) for t in texts]
    vocab = {w: j for j, w in enumerate(sorted(set().union(*counts)))}
    tf = np.zeros((n, len(vocab)))
    for row, c in enumerate(counts):
        for w, k in c.items():
            tf[row, vocab[w]] = k
    df = (tf > 0).sum(axis=0)
    weights = tf * (np.log((1 + n) / (1 + df)) + 1)
    norms = np.linalg.norm(weights, axis=1, keepdims=True)
    unit = np.divide(weights, norms, out=np.zeros_like(weights), where=norms > 0)
    sim = unit @ unit.T
    np.fill_diagonal(sim, 0.0)
    return sim.sum(axis=1) / (n - 1)


def rank_by_consensus(
    description_ids: Sequence[str], texts: Sequence[str], top_k: int, bottom_k: int, *, seed: int, stream: str
) -> dict[str, str]:
    """Map each id to gold/top/bottom/other by consensus score, higher first, ties by the draw."""
    if len(description_ids) != len(texts):
        raise ValueError("description_ids and texts must have the same length")
    scores = np.round(consensus_scores(texts), _SCORE_DECIMALS)
    draw = tie_draw(description_ids, seed, stream)
    order = sorted(range(len(description_ids)), key=lambda j: (-scores[j], draw[description_ids[j]]))
    return assign_roles([description_ids[j] for j in order], top_k, bottom_k)
