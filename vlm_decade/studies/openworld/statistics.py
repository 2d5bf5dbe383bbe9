"""Study B's stats stage: per-dataset statistics, the paper's group means of dataset means, and the
comparisons (open vs closed world, model vs model, the prompt ablation), with bootstrap CIs and
BH q-values.

The paper's main table averages, within each granularity group, the datasets' means (each dataset
counts once, however many images it has). Here each dataset is bootstrapped on its own images (the
engine, `bootstrap_study`, one independent stream per dataset), and a group's resampled mean is the
mean of its datasets' resampled means, resample by resample; the group's CI, and every comparison's
difference and p, come from those combined distributions. `all` is the mean over every dataset. All
series of one dataset share its resamples, so comparisons within a group are paired.

With `analysis.group_by`, all of it again per group of each metadata column (`stats.groups`).

Beside the bootstrap comparisons, `mcnemar_tests` gives McNemar's exact test of each pair of models
on the binary metrics (TI, LI), over the images both answered (`paired_tests`).

Metrics: TI, LI, SS, CS (and their accepted-name forms, `TI_accepted` ..., when some label has
accepted alternatives: scoring.py); SS's share of predictions at or above 0.5, ..., 0.9 and their average
(`ss@0.5` ... `ss@avg`, as the authors' code reports SS: per prediction `ss_threshold_shares` of its
own SS, so the group statistics are shares); and each outcome's rate (`outcome:<name>`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.models.backends import backend_class
from vlm_decade.stats import (
    COMPARISONS_SCHEMA,
    METHOD_VERSION,
    STATS_SCHEMA,
    BootstrapOptions,
    bootstrap_study,
    discordant_counts,
    mcnemar_exact,
)
from vlm_decade.stats.groups import grouped_tables
from vlm_decade.stats.resampling import bh_qvalues, bootstrap_p, percentile_ci
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.metrics import ss_threshold_shares
from vlm_decade.studies.openworld.outcomes import OUTCOMES
from vlm_decade.studies.openworld.scoring import SCORES_B_SCHEMA, prompt_named

ALL = "all"
PROMPT = "prompt_id"  # the column of stats, comparisons and paired_tests that names the prompt
GROUPS = ("prototypical", "fine-grained", "very fine-grained")
# Part of the stage's settings: bump it when what is estimated or compared changes
# (3: McNemar's exact tests of the binary metrics; 4: the prompt is `prompt_id` in every table).
STATS_FORMAT = 4
STATS_B_SCHEMA = prompt_named(STATS_SCHEMA)
COMPARISONS_B_SCHEMA = prompt_named(COMPARISONS_SCHEMA)
BINARY_METRICS = ("TI", "LI", "TI_accepted", "LI_accepted")  # the last two when labels have alternatives
PAIRED_TESTS_SCHEMA = pa.schema(
    [
        ("family", pa.string()),
        ("a", pa.string()),
        ("b", pa.string()),
        ("dataset", pa.string()),  # a dataset, a granularity group (its datasets' pairs pooled) or `all`
        ("metric", pa.string()),
        ("prompt_id", pa.string()),
        ("test", pa.string()),
        ("n_pairs", pa.int64()),  # images both models have a value for
        ("a_only", pa.int64()),  # pairs where a is right and b wrong
        ("b_only", pa.int64()),
        ("p", pa.float64()),
        ("q", pa.float64()),  # BH within the family and metric
        ("significant", pa.bool_()),
    ]
)


def kinds(study: OpenWorldStudyConfig) -> dict[str, str]:
    """open-world or closed-world, per model."""
    return {m.name: "closed-world" if backend_class(m.backend).closed_world else "open-world" for m in study.models}


def dataset_scores(scores: pa.Table, predictions: pa.Table) -> pa.Table:
    """What the engine bootstraps, per dataset (`dataset` is the real dataset): the four metrics,
    SS's threshold shares and each outcome's rate (0 or 1 per prediction; unjudged ones have none)."""
    rows = scores.to_pylist()
    for r in [r for r in rows if r["metric"] == "SS"]:
        rows += [
            {**r, "metric": name, "value": share} for name, share in ss_threshold_shares(np.array([r["value"]])).items()
        ]
    names = [o for o in OUTCOMES if o != "unjudged"]  # every rate, 0 included
    for p in predictions.to_pylist():
        if p["outcome"] != "unjudged":
            rows += [
                {
                    "subject": p["subject"],
                    "image_id": p["image_id"],
                    "dataset": p["dataset"],
                    "prompt_id": p["prompt_id"],
                    "metric": f"outcome:{name}",
                    "value": float(p["outcome"] == name),
                }
                for name in names
            ]
    return pa.Table.from_pylist(rows, schema=SCORES_B_SCHEMA)


def group_members(granularity: dict[str, str]) -> dict[str, list[str]]:
    """Each granularity group's datasets, and `all`: every dataset. A dataset named like a group
    (or `all`) would be mistaken for it in the tables, so it is refused."""
    clash = sorted(set(granularity) & {*GROUPS, ALL})
    if clash:
        raise ValueError(
            f"dataset name(s) {clash} are also granularity group names in Study B's tables: rename the dataset(s)"
        )
    members: dict[str, list[str]] = defaultdict(list)
    for dataset, group in sorted(granularity.items()):
        members[group].append(dataset)
    return {**{g: members[g] for g in GROUPS if members[g]}, ALL: sorted(granularity)}


def analyse_groups(
    scores: pa.Table,
    granularity: dict[str, str],
    model_kinds: dict[str, str],
    prompts: list[str],
    n_resamples: int,
    seed: int,
    confidence: float = 0.95,
    alpha: float = 0.05,
    use_ray: bool | None = None,
) -> tuple[pa.Table, pa.Table]:
    """(stats, comparisons): per dataset and per group (mean of its dataset means), per subject,
    metric and prompt; and the comparison families (`open-vs-closed`, `model-vs-model` under the
    main prompt `prompts[0]`, `prompt-ablation`: each other prompt against the main one, per open-world
    model), each with BH q within the family and metric (and prompt, but for the ablation, whose
    family spans the prompts). The engine calls the prompt `variant`: it gets `scores` and gives its
    tables under that name, and they are named back (`prompt_id`) here."""
    members = group_members(granularity)
    scores = scores.rename_columns({"prompt_id": "variant"})
    stats_rows: list[dict] = []
    comparison_rows: list[dict] = []
    for metric in sorted(set(scores.column("metric").to_pylist())):
        part = scores.filter(pc.equal(scores.column("metric"), metric))
        options = BootstrapOptions(
            n_resamples, seed, confidence=confidence, alpha=alpha, families=[], keep_distributions=True, use_ray=use_ray
        )
        result = bootstrap_study(part, {}, options)
        per_dataset = {(r["subject"], r["dataset"], r["variant"]): r for r in result.stats.to_pylist()}
        stats_rows += result.stats.to_pylist()
        groups = _group_terms(result.distributions, per_dataset, members, metric)
        for (subject, group, variant), term in sorted(groups.items()):
            lo, hi = percentile_ci(term.dist[None], confidence)
            stats_rows.append(
                {
                    "subject": subject,
                    "dataset": group,
                    "metric": metric,
                    "variant": variant,
                    "estimate": term.estimate,
                    "ci_low": float(lo[0]),
                    "ci_high": float(hi[0]),
                    "n_images": term.n_images,
                    "n_resamples": n_resamples,
                    "seed": seed,
                    "method": f"percentile, mean of {len(term.datasets)} dataset means",
                }
            )
        for family, specs in _families(groups, model_kinds, prompts, list(members)):
            comparison_rows += _compare(family, specs, groups, metric, confidence, alpha, n_resamples, seed)
    stats = pa.Table.from_pylist(_nulls(stats_rows), schema=STATS_SCHEMA)
    comparisons = pa.Table.from_pylist(_nulls(comparison_rows), schema=COMPARISONS_SCHEMA)
    return stats.rename_columns(STATS_B_SCHEMA.names), comparisons.rename_columns(COMPARISONS_B_SCHEMA.names)


@dataclass(frozen=True)
class _Term:
    """One subject's group mean: its estimate, resampled distribution, datasets and images."""

    estimate: float
    dist: np.ndarray
    datasets: list[str]
    n_images: int


def _group_terms(
    distributions: dict, per_dataset: dict, members: dict[str, list[str]], metric: str
) -> dict[tuple, _Term]:
    """(subject, group, prompt) -> the mean over the group's datasets that the subject has of their
    means, estimate and resample by resample."""
    series = sorted({(s, v) for s, _, v in per_dataset})
    out = {}
    for group, datasets in members.items():
        for subject, variant in series:
            have = [
                d
                for d in datasets
                if (subject, d, variant) in per_dataset and per_dataset[(subject, d, variant)]["estimate"] is not None
            ]
            if not have:
                continue
            dist = np.mean([distributions[(subject, d, metric, variant)] for d in have], axis=0)
            estimate = float(np.mean([per_dataset[(subject, d, variant)]["estimate"] for d in have]))
            out[(subject, group, variant)] = _Term(
                estimate, dist, have, sum(per_dataset[(subject, d, variant)]["n_images"] for d in have)
            )
    return out


def _families(groups: dict, model_kinds: dict[str, str], prompts: list[str], group_names: list[str]):
    """The comparison families as (name, specs); a spec is (a label, a's (subject, prompt) keys,
    b label, b's keys, group, prompt column value); a term is the mean of its keys' group means."""
    main = prompts[0]
    open_models = sorted(m for m, k in model_kinds.items() if k == "open-world")
    closed = sorted(m for m, k in model_kinds.items() if k == "closed-world")
    specs = {"open-vs-closed": [], "model-vs-model": [], "prompt-ablation": []}
    for group in group_names:
        if open_models and closed:
            specs["open-vs-closed"].append(
                (
                    "open-world",
                    [(m, main) for m in open_models],
                    "closed-world",
                    [(m, main) for m in closed],
                    group,
                    main,
                )
            )
        for a, b in combinations(sorted(model_kinds), 2):
            specs["model-vs-model"].append((a, [(a, main)], b, [(b, main)], group, main))
        for model in open_models:
            for prompt in prompts[1:]:
                specs["prompt-ablation"].append(
                    (f"{model} [{prompt}]", [(model, prompt)], f"{model} [{main}]", [(model, main)], group, prompt)
                )
    return [(name, s) for name, s in specs.items() if s]


def _compare(
    family: str, specs: list, groups: dict, metric: str, confidence: float, alpha: float, n_resamples: int, seed: int
) -> list[dict]:
    """Each spec's difference a - b with its percentile CI and two-sided bootstrap p; q by BH within
    the family, per prompt column value except in the prompt ablation (one family across prompts)."""
    rows, diffs = [], []
    for a_label, a_keys, b_label, b_keys, group, variant in specs:
        a = [groups[(s, group, v)] for s, v in a_keys if (s, group, v) in groups]
        b = [groups[(s, group, v)] for s, v in b_keys if (s, group, v) in groups]
        if not a or not b:
            continue
        ea, eb = float(np.mean([t.estimate for t in a])), float(np.mean([t.estimate for t in b]))
        diffs.append(np.mean([t.dist for t in a], axis=0) - np.mean([t.dist for t in b], axis=0))
        rows.append(
            {
                "family": family,
                "a": a_label,
                "b": b_label,
                "dataset": group,
                "metric": metric,
                "variant": variant,
                "difference": ea - eb,
                "n_resamples": n_resamples,
                "a_dataset": group,
                "b_dataset": group,
                "estimate_a": ea,
                "estimate_b": eb,
                "paired": True,
                "seed": seed,
                "n_a": max(t.n_images for t in a),
                "n_b": max(t.n_images for t in b),
            }
        )
    if not rows:
        return []
    d = np.vstack(diffs)
    lo, hi = percentile_ci(d, confidence)
    p = bootstrap_p(d)
    q = np.full(len(rows), np.nan)
    strata = [None] * len(rows) if family == "prompt-ablation" else [r["variant"] for r in rows]
    for stratum in set(strata):
        at = [i for i, s in enumerate(strata) if s == stratum]
        q[at] = bh_qvalues(p[at])
    for i, r in enumerate(rows):
        r.update(
            ci_low=float(lo[i]),
            ci_high=float(hi[i]),
            p=float(p[i]),
            q=float(q[i]),
            significant=None if np.isnan(q[i]) else bool(q[i] <= alpha),
        )
    return rows


def mcnemar_tests(
    scores: pa.Table, granularity: dict[str, str], models: list[str], prompt: str, alpha: float = 0.05
) -> pa.Table:
    """McNemar's exact test of every pair of models on each binary metric under `prompt`: per dataset,
    and per granularity group and `all` with the pairs of their datasets pooled; an image counts
    when both models have a value for it. BH within the family and metric, as the bootstrap's
    model-vs-model comparisons."""
    members = group_members(granularity)
    outcome: dict[tuple, dict[tuple[str, str], float]] = defaultdict(dict)
    for r in scores.filter(pc.equal(scores.column("prompt_id"), prompt)).to_pylist():
        if r["metric"] in BINARY_METRICS and r["value"] is not None:
            outcome[(r["subject"], r["metric"])][(r["dataset"], r["image_id"])] = r["value"]
    units = {name: [name] for name in sorted(granularity)} | members  # each dataset, then the groups
    rows = []
    for metric in BINARY_METRICS:
        for a, b in combinations(sorted(models), 2):
            va, vb = outcome.get((a, metric), {}), outcome.get((b, metric), {})
            for unit, datasets in units.items():
                keys = sorted(k for k in va.keys() & vb.keys() if k[0] in datasets)
                if not keys:
                    continue
                a_only, b_only = discordant_counts(np.array([va[k] for k in keys]), np.array([vb[k] for k in keys]))
                rows.append(
                    {
                        "family": "model-vs-model",
                        "a": a,
                        "b": b,
                        "dataset": unit,
                        "metric": metric,
                        "prompt_id": prompt,
                        "test": "McNemar exact",
                        "n_pairs": len(keys),
                        "a_only": a_only,
                        "b_only": b_only,
                    }
                )
    if rows:
        p = mcnemar_exact([r["a_only"] for r in rows], [r["b_only"] for r in rows])
        q = np.empty(len(rows))
        for metric in BINARY_METRICS:
            at = [i for i, r in enumerate(rows) if r["metric"] == metric]
            if at:
                q[at] = bh_qvalues(p[at])
        for i, r in enumerate(rows):
            r.update(p=float(p[i]), q=float(q[i]), significant=bool(q[i] <= alpha))
    return pa.Table.from_pylist(rows, schema=PAIRED_TESTS_SCHEMA)


def _nulls(rows: list[dict]) -> list[dict]:
    return [{k: None if isinstance(v, float) and np.isnan(v) else v for k, v in r.items()} for r in rows]


def _strata_of_comparisons(row: dict) -> tuple:
    """How `_compare` corrects a family: per metric and prompt, but the prompt ablation across prompts."""
    return row["family"], row["metric"], None if row["family"] == "prompt-ablation" else row[PROMPT]


def grouped_analysis(
    scores: pa.Table,
    predictions: pa.Table,
    metadata: pa.Table | None,
    group_by,
    granularity: dict[str, str],
    model_kinds: dict[str, str],
    prompts: list[str],
    statistics,
    use_ray: bool | None = None,
) -> dict[str, pa.Table]:
    """`stats`, `comparisons` and `paired_tests` on all images, then per group of each `group_by`
    column of `metadata` (`stats.groups`)."""
    s = statistics

    def analyse_all(inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        per_dataset = dataset_scores(inputs["scores"], inputs["predictions"])
        stats, comparisons = analyse_groups(
            per_dataset, granularity, model_kinds, prompts, s.n_resamples, s.seed, s.confidence, s.alpha, use_ray
        )
        paired = mcnemar_tests(inputs["scores"], granularity, sorted(model_kinds), prompts[0], s.alpha)
        return {"stats": stats, "comparisons": comparisons, "paired_tests": paired}

    strata = {"comparisons": _strata_of_comparisons, "paired_tests": ["family", "metric"]}
    inputs = {"scores": scores, "predictions": predictions}
    return grouped_tables(analyse_all, inputs, metadata, group_by, strata, s.alpha)


def stage(study: OpenWorldStudyConfig, granularity: dict[str, str]) -> Stage:
    prompts = [p.id for p in study.prompts]
    group_by = study.analysis.group_by

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        run.ray()  # bootstrap blocks run as Ray tasks
        return grouped_analysis(
            run.table("scores"),
            run.table("predictions"),
            run.table("metadata") if group_by else None,
            group_by,
            granularity,
            kinds(study),
            prompts,
            study.statistics,
        )

    return Stage(
        "stats",
        ("scores", "predictions", "metadata") if group_by else ("scores", "predictions"),
        # A study without groups keeps its fingerprint, so its earlier stats stay valid.
        [study.statistics.model_dump(), kinds(study), granularity, prompts, STATS_FORMAT, METHOD_VERSION]
        + ([list(group_by)] if group_by else []),
        compute,
        outputs=("stats", "comparisons", "paired_tests"),
    )
