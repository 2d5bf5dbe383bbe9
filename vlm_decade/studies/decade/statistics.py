"""Study A's stats stage: the bootstrap over images of every score, with the paper's comparison
families (era, dataset, against the humans) and BH q-values within each (docs/statistics.md); and
the same again per group of each `analysis.group_by` metadata column (`stats.groups`)."""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.stats import METHOD_VERSION, SCORES_SCHEMA, analyse, warm_workers
from vlm_decade.stats.groups import grouped_tables
from vlm_decade.stats.shard_sums import keep_shard_sums, kept_shard_sums
from vlm_decade.studies.decade.config import StudyConfig

COMPARISON_STRATA = ["family", "metric", "variant"]  # as analyse corrects a family without groups


def grouped_analysis(
    scores: pa.Table, metadata: pa.Table | None, eras: dict[str, str], group_by, statistics: dict
) -> tuple[pa.Table, pa.Table]:
    """(stats, comparisons) on all images, then per group of each `group_by` column of `metadata`."""

    def analyse_all(inputs: dict[str, pa.Table]) -> dict[str, pa.Table]:
        stats, comparisons = analyse(inputs["scores"], eras, **statistics)
        return {"stats": stats, "comparisons": comparisons}

    out = grouped_tables(
        analyse_all, {"scores": scores}, metadata, group_by, {"comparisons": COMPARISON_STRATA}, statistics["alpha"]
    )
    return out["stats"], out["comparisons"]


def stage(study: StudyConfig) -> Stage:
    group_by = study.analysis.group_by

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        run.ray()  # bootstrap blocks run as Ray tasks
        metadata = run.table("metadata") if group_by else None
        # Only what the bootstrap reads: a million images' scores hold hundreds of MB of row hashes.
        scores = run.table("scores", tuple(SCORES_SCHEMA.names))
        # A huge study's Poisson shards whose scores are unchanged are not resampled again.
        kept = kept_shard_sums(run.folder.root, "stats")
        statistics = study.statistics.model_dump() | {"shard_sums": kept}
        stats, comparisons = grouped_analysis(scores, metadata, study.eras, group_by, statistics)
        keep_shard_sums(run.folder.root, "stats", kept)
        return {"stats": stats, "comparisons": comparisons}

    return Stage(
        "stats",
        ("scores", "metadata") if group_by else ("scores",),
        # A study without groups keeps its fingerprint, so its earlier stats stay valid.
        [study.statistics.model_dump(), study.eras, METHOD_VERSION] + ([list(group_by)] if group_by else []),
        compute,
        outputs=("stats", "comparisons"),
        warm=lambda run: run.ray.start_soon(warm_workers),  # the bootstrap's workers, started beside the scores
    )
