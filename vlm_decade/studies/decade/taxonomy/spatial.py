"""Study A's spatial dependence error (SDE): do a model and people rely on the same image regions?

The masking paradigm (METHOD.md; seed section 2.5.3): each image is also shown with each of its masks.
A mask's *similarity* is how close a masked-image description stays to the unmasked one: for people,
each masked description against the image's gold standard; for a model, its masked-variant
description against its own full-image description. Low similarity means the hidden region mattered
(importance = 1 - similarity). Per image, a model's profile over the masks is correlated (Pearson)
with the humans' mean profile, and compared with the inter-human reference: the correlations of every
*pseudo-worker* (one masked description per mask, as each worker saw only one masked version) with the
mean profile of the other descriptions. The model has an SDE on the image when its correlation is more
than `n_sd` standard deviations below the pseudo-workers' mean. Whatever cannot be decided is `None`
with a reason. Pure numpy; the caller supplies the similarity function (docs/spatial-dependence.md).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from vlm_decade.stats.resampling import named_generator

FULL = "full"
GOLD = "gold"
OK = "ok"
HUMANS = "humans"  # the panel name of the people in heat maps

MIN_MASKS = 3  # a correlation over 2 regions is always +-1: no evidence of agreement
MIN_MASKED_PER_MASK = 2  # a leave-one-out reference needs another description of each mask
CONSTANT_ATOL = 1e-12  # a profile whose range is below this has no correlation
MAX_EXACT_PSEUDO = 100_000  # enumerate every pseudo-worker up to this many (the paper's 20^3 = 8,000)
SAMPLED_PSEUDO = 20_000  # beyond it, a seeded sample of this many

SPATIAL_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("mask_ids", pa.list_(pa.string())),
        ("model_profile", pa.list_(pa.float64())),
        ("human_profile", pa.list_(pa.float64())),
        ("model_r", pa.float64()),
        ("human_mean_r", pa.float64()),
        ("human_sd_r", pa.float64()),
        ("z", pa.float64()),
        ("n_human", pa.int64()),
        ("n_pseudo", pa.int64()),
        ("sde", pa.bool_()),
        ("reason", pa.string()),
    ]
)


@dataclass(frozen=True)
class HumanReference:
    """The pseudo-workers' correlations with the rest of the group: mean and SD (ddof 0) over those
    with a defined correlation (`n_defined` of `n_pseudo`); `exact` = all enumerated, not sampled."""

    mean_r: float | None
    sd_r: float | None
    n_defined: int
    n_pseudo: int
    exact: bool


@dataclass(frozen=True)
class SpatialRow:
    """One model on one image. Profiles are similarities in `mask_ids` order (NaN where missing);
    `z` = (model_r - human_mean_r) / human_sd_r; `sde` is None exactly when `reason` is not empty."""

    subject: str
    image_id: str
    dataset: str
    mask_ids: tuple[str, ...]
    model_profile: tuple[float, ...]
    human_profile: tuple[float, ...]
    model_r: float | None
    human_mean_r: float | None
    human_sd_r: float | None
    z: float | None
    n_human: int  # masked human descriptions of the image
    n_pseudo: int  # pseudo-workers whose correlation entered the reference
    sde: bool | None
    reason: str


@dataclass(frozen=True)
class _HumanSide:
    dataset: str
    values_by_mask: tuple[tuple[float, ...], ...]
    profile: tuple[float, ...]
    reference: HumanReference | None
    problem: str  # why the humans give no reference for this image ("" when they do)


# --- the numbers -----------------------------------------------------------------------------------


def importance(profile: Sequence[float]) -> list[float]:
    """How much each region matters: 1 - similarity (NaN stays NaN)."""
    return [1.0 - float(s) for s in profile]


def _is_constant(values: np.ndarray) -> np.ndarray:
    return np.ptp(values, axis=-1) <= CONSTANT_ATOL


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise Pearson r of two (n, k) arrays; NaN where either row is constant."""
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (xc * yc).sum(axis=1) / np.sqrt((xc * xc).sum(axis=1) * (yc * yc).sum(axis=1))
    r = np.clip(r, -1.0, 1.0)
    return np.where(_is_constant(x) | _is_constant(y), np.nan, r)


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson correlation of two profiles; None when either is constant or has a missing value."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError(f"profiles must be two 1-d sequences of the same length >= 2, got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    r = _pearson_rows(a[None, :], b[None, :])[0]
    return None if np.isnan(r) else float(r)


def mean_profile(values_by_mask: Sequence[Sequence[float]]) -> list[float]:
    """The humans' profile: the mean similarity of each mask's descriptions (NaN for a mask with none).
    fsum of sorted values, so the result does not depend on the order of the rows."""
    return [math.fsum(sorted(v)) / len(v) if len(v) else math.nan for v in values_by_mask]


def inter_human_reference(
    values_by_mask: Sequence[Sequence[float]],
    seed: int = 0,
    stream: str = "",
    max_exact: int = MAX_EXACT_PSEUDO,
    n_sampled: int = SAMPLED_PSEUDO,
) -> HumanReference:
    """Correlation of each pseudo-worker's profile with the mean profile of the other descriptions.

    A pseudo-worker takes one description of each mask; the rest of the group is every other
    description (leave-one-out per mask). All combinations are enumerated when there are at most
    `max_exact` (this is the limit of averaging over every random grouping of descriptions into
    pseudo-workers, and needs no randomness); otherwise `n_sampled` combinations are drawn from the
    stream of (`seed`, `stream`), the caller's image id. Each mask needs at least 2 descriptions.
    """
    if any(len(v) < MIN_MASKED_PER_MASK for v in values_by_mask):
        raise ValueError(f"every mask needs at least {MIN_MASKED_PER_MASK} descriptions for a leave-one-out reference")
    # Sorted: the pseudo-workers are a multiset of values, so this only fixes what a sample draws.
    own = [np.sort(np.asarray(v, dtype=np.float64)) for v in values_by_mask]
    rest = [(v.sum() - v) / (v.size - 1) for v in own]  # the other descriptions' mean, per choice
    sizes = [v.size for v in own]
    total = math.prod(sizes)
    exact = total <= max_exact
    if exact:
        choice = np.indices(sizes).reshape(len(sizes), -1)
    else:
        rng = named_generator(seed, stream)
        choice = np.stack([rng.integers(0, n, size=n_sampled) for n in sizes])
    x = np.stack([v[c] for v, c in zip(own, choice)], axis=1)
    y = np.stack([v[c] for v, c in zip(rest, choice)], axis=1)
    r = _pearson_rows(x, y)
    r = r[~np.isnan(r)]
    n_pseudo = total if exact else n_sampled
    if r.size == 0:
        return HumanReference(None, None, 0, n_pseudo, exact)
    return HumanReference(float(r.mean()), float(r.std()), int(r.size), n_pseudo, exact)


def classify(model_r: float, mean_r: float, sd_r: float, n_sd: float) -> bool:
    """The paper's rule: an SDE when the model's correlation is more than n_sd SDs below the humans'."""
    return model_r < mean_r - n_sd * sd_r


# --- from the pipeline's rows ----------------------------------------------------------------------


def spatial_dependence(
    references_rows: Iterable[dict],
    responses_rows: Iterable[dict],
    similarity: Callable[[str, str], float],
    mask_ids: Sequence[str],
    n_sd: float = 2.0,
    seed: int = 0,
) -> list[SpatialRow]:
    """One SpatialRow per (model, image): every subject in `responses_rows` on every image of
    `references_rows`, sorted by subject and image. `similarity(candidate, reference)` is the caller's
    metric (e.g. the cosine of embeddings looked up by `text_key`); `seed` matters only when an image
    has more than MAX_EXACT_PSEUDO pseudo-workers. Responses with status other than "ok" are missing."""
    mask_ids = tuple(mask_ids)
    if not mask_ids or len(set(mask_ids)) != len(mask_ids) or FULL in mask_ids:
        raise ValueError(f"mask_ids must be distinct mask ids other than '{FULL}', got {list(mask_ids)}")
    if not (math.isfinite(n_sd) and n_sd >= 0):
        raise ValueError(f"n_sd must be a finite number >= 0, got {n_sd}")
    humans = _human_sides(list(references_rows), similarity, mask_ids, seed)
    responses_rows = list(responses_rows)
    texts = _model_texts(responses_rows)
    subjects = sorted({r["subject"] for r in responses_rows})
    return [
        _model_row(subject, image_id, humans[image_id], texts.get((subject, image_id), {}), similarity, mask_ids, n_sd)
        for subject in subjects
        for image_id in sorted(humans)
    ]


def _human_sides(rows: list[dict], similarity, mask_ids: tuple[str, ...], seed: int) -> dict[str, _HumanSide]:
    dataset: dict[str, str] = {}
    gold: dict[str, list[str]] = defaultdict(list)
    masked: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        dataset.setdefault(r["image_id"], r["dataset"])
        if r["condition"] == FULL and r["role"] == GOLD:
            gold[r["image_id"]].append(r["text"])
        elif r["condition"] in mask_ids:
            masked[(r["image_id"], r["condition"])].append(r)
    sides = {}
    for image_id in dataset:
        golds = gold[image_id]
        if len(golds) > 1:
            raise ValueError(f"image '{image_id}' has {len(golds)} gold standard descriptions, expected 1")
        values_by_mask = tuple(
            tuple(similarity(r["text"], golds[0]) for r in sorted(masked[(image_id, m)], key=_description_order))
            if golds
            else ()
            for m in mask_ids
        )
        sides[image_id] = _human_side(image_id, dataset[image_id], bool(golds), values_by_mask, mask_ids, seed)
    return sides


def _description_order(row: dict) -> tuple:
    return (row.get("worker_id") or "", row.get("description_id") or "", row["text"])


def _human_side(
    image_id: str, dataset: str, has_gold: bool, values_by_mask: tuple[tuple[float, ...], ...], mask_ids, seed: int
) -> _HumanSide:
    profile = tuple(mean_profile(values_by_mask))
    thin = [m for m, v in zip(mask_ids, values_by_mask) if len(v) < MIN_MASKED_PER_MASK]
    problem, reference = "", None
    if not has_gold:
        problem = "no gold standard description for the image"
    elif len(mask_ids) < MIN_MASKS:
        problem = f"{len(mask_ids)} masks: a correlation needs at least {MIN_MASKS} regions"
    elif thin:
        problem = f"fewer than {MIN_MASKED_PER_MASK} human descriptions for {', '.join(thin)}: no inter-human reference"
    elif _is_constant(np.asarray(profile)):
        problem = "the humans' mean profile is constant: no region stands out, no correlation"
    else:
        reference = inter_human_reference(values_by_mask, seed=seed, stream=image_id)
        if reference.mean_r is None:
            problem = "every pseudo-worker's profile is constant: no inter-human correlation"
        elif reference.sd_r <= CONSTANT_ATOL:
            problem = "the inter-human correlations have no spread (SD 0): the rule has no scale"
    return _HumanSide(dataset, values_by_mask, profile, reference, problem)


def _model_texts(rows: list[dict]) -> dict[tuple[str, str], dict[str, str]]:
    texts: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for r in rows:
        if r["status"] != OK:
            continue
        by_variant = texts[(r["subject"], r["image_id"])]
        if r["variant"] in by_variant:
            raise ValueError(f"two 'ok' responses for {r['subject']} on {r['image_id']} ({r['variant']})")
        by_variant[r["variant"]] = r["text"]
    return texts


def _model_row(
    subject: str,
    image_id: str,
    human: _HumanSide,
    texts: dict[str, str],
    similarity,
    mask_ids: tuple[str, ...],
    n_sd: float,
) -> SpatialRow:
    full = texts.get(FULL)
    model_profile = tuple(similarity(texts[m], full) if full is not None and m in texts else math.nan for m in mask_ids)
    missing = [m for m in mask_ids if m not in texts]
    model_r = pearson(model_profile, human.profile) if len(mask_ids) >= 2 else None
    ref = human.reference
    mean_r = ref.mean_r if ref else None
    sd_r = ref.sd_r if ref else None
    z = (model_r - mean_r) / sd_r if None not in (model_r, mean_r) and sd_r > CONSTANT_ATOL else None

    if full is None:
        reason = "no full-image description from the model"
    elif missing:
        reason = f"no masked description from the model for {', '.join(missing)}"
    elif human.problem:
        reason = human.problem
    elif model_r is None:
        reason = "the model's profile is constant: masking changed nothing it says, no correlation"
    else:
        reason = ""
    return SpatialRow(
        subject=subject,
        image_id=image_id,
        dataset=human.dataset,
        mask_ids=mask_ids,
        model_profile=model_profile,
        human_profile=human.profile,
        model_r=model_r,
        human_mean_r=mean_r,
        human_sd_r=sd_r,
        z=z,
        n_human=sum(len(v) for v in human.values_by_mask),
        n_pseudo=ref.n_defined if ref else 0,
        sde=None if reason else classify(model_r, mean_r, sd_r, n_sd),
        reason=reason,
    )


def heatmap_panels(rows: Sequence[SpatialRow], image_id: str) -> dict[str, list[float]]:
    """Importance per mask for one image's heat map: "humans" first, then each model in row order."""
    here = [r for r in rows if r.image_id == image_id]
    if not here:
        raise ValueError(f"no spatial-dependence rows for image '{image_id}'")
    panels = {HUMANS: importance(here[0].human_profile)}
    panels.update({r.subject: importance(r.model_profile) for r in here})
    return panels


def spatial_table(rows: Sequence[SpatialRow]) -> pa.Table:
    """The rows as an Arrow table with SPATIAL_SCHEMA; NaN profile entries become nulls."""

    def nulls(profile):
        return [None if math.isnan(v) else v for v in profile]

    return pa.Table.from_pylist(
        [
            {
                "subject": r.subject,
                "image_id": r.image_id,
                "dataset": r.dataset,
                "mask_ids": list(r.mask_ids),
                "model_profile": nulls(r.model_profile),
                "human_profile": nulls(r.human_profile),
                "model_r": r.model_r,
                "human_mean_r": r.human_mean_r,
                "human_sd_r": r.human_sd_r,
                "z": r.z,
                "n_human": r.n_human,
                "n_pseudo": r.n_pseudo,
                "sde": r.sde,
                "reason": r.reason,
            }
            for r in rows
        ],
        schema=SPATIAL_SCHEMA,
    )
