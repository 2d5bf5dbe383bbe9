"""Study B's stats stage: the bootstrap over images of every metric and outcome, per model,
granularity group and prompt, and the open-world models' mean against the closed-world baselines'."""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.models.backends import backend_class
from vlm_decade.stats import ComparisonSpec, Family, Term, analyse
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.scoring import grouped_scores


def kinds(study: OpenWorldStudyConfig) -> dict[str, str]:
    """open-world or closed-world, per model."""
    return {m.name: "closed-world" if backend_class(m.backend).closed_world else "open-world" for m in study.models}


def open_closed_family(study: OpenWorldStudyConfig, groups) -> Family:
    """The open/closed gap: the open-world models' mean against the closed-world baselines', per group."""
    by_kind = kinds(study)
    open_models = sorted(m for m, k in by_kind.items() if k == "open-world")
    closed = sorted(m for m, k in by_kind.items() if k == "closed-world")
    if not (open_models and closed):
        return Family("open-vs-closed", [])
    return Family(
        "open-vs-closed",
        [ComparisonSpec(Term.group("open-world", open_models, g), Term.group("closed-world", closed, g)) for g in sorted(groups)],
        shared_images=True,
    )


def stage(study: OpenWorldStudyConfig, granularity: dict[str, str]) -> Stage:
    def compute(run: StudyRun) -> dict[str, pa.Table]:
        run.ray()  # bootstrap blocks run as Ray tasks
        grouped = grouped_scores(run.table("scores"), run.table("predictions"), granularity)
        groups = set(grouped.column("dataset").to_pylist())
        stats, comparisons = analyse(grouped, {}, **study.statistics.model_dump(), families=[open_closed_family(study, groups)])
        return {"stats": stats, "comparisons": comparisons}

    return Stage("stats", ("scores", "predictions"), [study.statistics.model_dump(), kinds(study), granularity], compute,
                 outputs=("stats", "comparisons"))
