"""Ranking one image's human descriptions into gold / top / bottom / other (Study A).

Pure functions, no I/O; `vlm_decade.studies.decade.data` feeds them the images' descriptions (by
votes one image at a time; by consensus many images at once, on arrays: `consensus_places`). Two
methods (docs/data-format.md, "Ranking"):

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
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


# Each byte of a lower-cased ASCII text: itself where `_WORD` matches it ([a-z0-9_]), else a space.
_WORD_BYTES = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789_", np.uint8)
_ASCII_WORD_BYTES = np.full(256, ord(" "), np.uint8)
_ASCII_WORD_BYTES[_WORD_BYTES] = _WORD_BYTES


def word_tokens(texts: Sequence[str] | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Every token of every text (`tokens`), as each token's text (its index) and the token, in
    order of text and place. An ASCII text, where Python's `\\w` is [a-zA-Z0-9_] and lower-casing
    is ASCII's, is split by Arrow (its bytes other than a word's made spaces, then split at spaces:
    a third of the time of splitting at a pattern); any other by `tokens` itself."""
    column = texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())
    ascii_text = pc.fill_null(pc.string_is_ascii(column), True).to_numpy(zero_copy_only=False)
    fast, slow = np.flatnonzero(ascii_text), np.flatnonzero(~ascii_text)
    lower = pc.ascii_lower(column.take(pa.array(fast)) if len(slow) else column)
    validity, offsets, data = lower.buffers()
    spaced = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    spaced = pa.Array.from_buffers(
        lower.type, len(lower), [validity, offsets, pa.py_buffer(_ASCII_WORD_BYTES[spaced])], offset=lower.offset
    )
    split = pc.ascii_split_whitespace(spaced)
    words, owner = pc.list_flatten(split), fast[pc.list_parent_indices(split).to_numpy(zero_copy_only=False)]
    real = pc.not_equal(words, "")  # the empty ends of a text that begins or ends with no word
    words, owner = words.filter(real), owner[real.to_numpy(zero_copy_only=False)]
    if not len(slow):  # the ASCII texts' tokens come in order of text and place
        return owner, words
    found = [tokens(t) for t in column.take(pa.array(slow)).to_pylist()]
    words = pa.concat_arrays([words, pa.array([w for ws in found for w in ws], pa.string())])
    owner = np.concatenate([owner, np.repeat(slow, [len(ws) for ws in found])])
    order = np.argsort(owner, kind="stable")
    return owner[order], words.take(pa.array(order))


def consensus_scores(texts: Sequence[str]) -> np.ndarray:
    """Each text's mean TF-IDF cosine similarity to the other texts (0.0 for a lone text).

    tf is the raw count of a token in a text; idf is smooth over these texts only,
    ln((1 + n) / (1 + df)) + 1; rows are L2-normalised, and a text with no word tokens is a zero
    vector (similarity 0 to everything).
    """
    return grouped_consensus_scores(texts, np.zeros(min(len(texts), 1), np.int64))


def grouped_consensus_scores(texts: Sequence[str] | pa.Array, starts: np.ndarray) -> np.ndarray:
    """`consensus_scores` of each group of `texts` (the groups are the runs that begin at `starts`,
    sorted, the first at 0: one image's descriptions each), for all of them at once: the TF-IDF
    weights are kept as (text, token) entries, not a matrix per image, and a text's summed
    similarity to the others of its group is its unit vector's dot product with the sum of the
    others' unit vectors (the group's sum less its own), so that no per-image Python runs."""
    n = len(texts)
    sizes = np.diff(np.append(starts, n)).astype(np.int64)
    group = np.repeat(np.arange(len(starts)), sizes)
    owner, words = word_tokens(texts)
    encoded = pc.dictionary_encode(words)
    token = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    width = max(len(encoded.dictionary), 1)
    entry, tf, _ = _counted(owner * width + token)
    text, token = entry // width, entry % width
    # df: the texts of the group that hold the token; `cell` numbers each (group, token)
    _, df, cell = _counted(group[text] * width + token, inverse=True)
    m = sizes[group[text]]
    weight = tf * (np.log((1 + m) / (1 + df[cell])) + 1)
    unit = weight / np.sqrt(np.bincount(text, weight * weight, minlength=n))[text]
    summed = np.bincount(cell, unit)
    others = np.bincount(text, unit * (summed[cell] - unit), minlength=n)
    alone = sizes[group] < 2
    return np.where(alone, 0.0, others / np.where(alone, 1, sizes[group] - 1))


def _counted(values: np.ndarray, inverse: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`np.unique(values, return_counts=True, return_inverse=inverse)`, as (unique, counts, inverse),
    by a stable sort: the values come mostly in order (a text's or an image's entries together),
    which a stable sort uses and np.unique's does not (a quarter of the time at a million texts)."""
    order = np.argsort(values, kind="stable") if inverse else None
    ordered = values[order] if inverse else np.sort(values, kind="stable")
    first = np.ones(len(ordered), bool)
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    counts = np.diff(np.append(starts, len(ordered)))
    if not inverse:
        return ordered[starts], counts, None
    places = np.empty(len(values), np.int64)
    places[order] = np.cumsum(first) - 1
    return ordered[starts], counts, places


def consensus_places(
    description_ids: Sequence[str] | pa.Array,
    texts: Sequence[str] | pa.Array,
    starts: np.ndarray,
    streams: Sequence[str],
    seed: int,
) -> np.ndarray:
    """Each description's place in its image's order (0: the best), by consensus score, higher
    first, ties by the draw (`tie_draw` on the image's stream). The images are the runs of
    descriptions that begin at `starts`, `streams` their ids; the draw is made only for an image
    whose scores tie, as it decides nothing for the others. The ids and texts may be Arrow arrays
    (no Python string per description)."""
    n = len(texts)
    scores = np.round(grouped_consensus_scores(texts, starts), _SCORE_DECIMALS)
    sizes = np.diff(np.append(starts, n)).astype(np.int64)
    group = np.repeat(np.arange(len(starts)), sizes)
    order = np.lexsort((-scores, group))
    tie = (group[order][1:] == group[order][:-1]) & (scores[order][1:] == scores[order][:-1])
    for g in np.unique(group[order][1:][tie]).tolist():
        rows = np.arange(starts[g], starts[g] + sizes[g])
        ids = description_ids[starts[g] : starts[g] + sizes[g]]
        ids = ids.to_pylist() if isinstance(ids, pa.Array) else list(ids)
        draw = tie_draw(ids, seed, streams[g])
        by_draw = np.array([draw[i] for i in ids])
        order[starts[g] : starts[g] + sizes[g]] = rows[np.lexsort((by_draw, -scores[rows]))]
    places = np.empty(n, np.int64)
    places[order] = np.arange(n) - np.repeat(starts, sizes)
    return places


ROLES = (GOLD, TOP, BOTTOM, OTHER)  # `roles_of_places`' codes


def roles_of_places(places: np.ndarray, sizes: np.ndarray, top_k: int, bottom_k: int) -> np.ndarray:
    """Each description's role as a code into `ROLES`, from its place in its image's order and how
    many descriptions the image has (`sizes`, per description): `assign_roles` on arrays."""
    k = np.maximum(sizes - 1, 0) // 2
    small = sizes < 1 + top_k + bottom_k
    n_top, n_bottom = np.where(small, np.minimum(top_k, k), top_k), np.where(small, np.minimum(bottom_k, k), bottom_k)
    roles = np.full(len(places), ROLES.index(OTHER), np.int8)
    roles[(places >= 1) & (places <= n_top)] = ROLES.index(TOP)
    roles[places >= sizes - n_bottom] = ROLES.index(BOTTOM)
    roles[places == 0] = ROLES.index(GOLD)
    return roles


def rank_by_consensus(
    description_ids: Sequence[str], texts: Sequence[str], top_k: int, bottom_k: int, *, seed: int, stream: str
) -> dict[str, str]:
    """Map each id to gold/top/bottom/other by consensus score, higher first, ties by the draw
    (one image: `consensus_places` and `roles_of_places`)."""
    if len(description_ids) != len(texts):
        raise ValueError("description_ids and texts must have the same length")
    if not description_ids:
        raise ValueError("no descriptions to rank")
    if len(set(description_ids)) != len(description_ids):
        raise ValueError("description ids must be unique")
    places = consensus_places(description_ids, texts, np.zeros(1, np.int64), [stream], seed)
    roles = roles_of_places(places, np.full(len(places), len(places)), top_k, bottom_k)
    return {i: ROLES[r] for i, r in zip(description_ids, roles.tolist())}
