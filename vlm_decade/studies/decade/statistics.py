"""Study A's stats stage: the bootstrap over images of every score, with the paper's comparison
families (era, dataset, against the humans) and BH q-values within each (docs/statistics.md)."""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.stats import METHOD_VERSION, analyse
from vlm_decade.studies.decade.config import StudyConfig


def stage(study: StudyConfig) -> Stage:
    def compute(run: StudyRun) -> dict[str, pa.Table]:
        run.ray()  # bootstrap blocks run as Ray tasks
        stats, comparisons = analyse(run.table("scores"), study.eras, **study.statistics.model_dump())
        return {"stats": stats, "comparisons": comparisons}

    return Stage(
        "stats",
        ("scores",),
        [study.statistics.model_dump(), study.eras, METHOD_VERSION],
        compute,
        outputs=("stats", "comparisons"),
    )
