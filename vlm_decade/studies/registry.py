"""The one registry of studies: each study is registered once, as a `Study` record naming its
config class, pipeline, viewer pages, the tables those pages read, its `ray job submit` script and
its bundled demo; loading a study file, the command line, the job scripts, the viewer and the demo
all find a study here by the name its files give in `study:`.

A new study is one more registration beside the two at the end of this module:

    register(Study(name="mine", config=MyConfig, pipeline="mine.pipeline", pages="mine.view",
                   tables=("images", "responses"), job="jobs/mine.py", demo="mine.demo:demo"))

Only the config class is held as an object (every study file is validated against one). The rest
are named by import path and imported when first asked for (`resolve`): a pipeline pulls in its
stages' dependencies, and the viewer pages and the demo sit in layers above the studies, which
never import them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from vlm_decade.core.config import StudyBase
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig


@dataclass(frozen=True)
class Study:
    """One study, as everything that dispatches on a study's kind finds it."""

    name: str  # its study files' `study:`, its configs' `study`
    config: type[StudyBase]  # the config class its files are validated against
    pipeline: str  # the module that offers `studies.Pipeline`
    pages: str  # the module of its viewer pages (`view.pages.Pages`), templates in `templates/` beside it
    tables: tuple[str, ...]  # the tables its viewer pages may read; `images` first, the only one required
    job: str  # its `ray job submit` script, relative to the working dir
    demo: str  # `module:function`, its bundled offline demo: (run folder) -> the study, inputs laid out


STUDIES: dict[str, Study] = {}
DEFAULT = "decade"  # the study of a file that names none


def register(study: Study) -> Study:
    """Add `study` to the registry. Registering the same record again (a module imported twice)
    changes nothing; another study under a taken name is a ValueError."""
    known = STUDIES.get(study.name)
    if known is not None and known != study:
        raise ValueError(f"a study named '{study.name}' is registered already")
    STUDIES[study.name] = study
    return study


def resolve(target: str) -> Any:
    """What a registration names by import path: a module (`package.module`) or one of its members
    (`package.module:name`), imported now."""
    module, _, member = target.partition(":")
    found = importlib.import_module(module)
    return getattr(found, member) if member else found


def expected() -> str:
    """The registered names, as pydantic lists the values a field takes: `'a', 'b' or 'c'`."""
    names = [f"'{name}'" for name in STUDIES]
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


register(
    Study(
        name="decade",
        config=StudyConfig,
        pipeline="vlm_decade.studies.decade.pipeline",
        pages="vlm_decade.view.decade",
        tables=(
            "images",
            "references",
            "responses",
            "scores",
            "stats",
            "comparisons",
            "detections",
            "probes",
            "errors",
            "spatial",
            "error_stats",
            "metadata",
        ),
        job="jobs/decade_study.py",
        demo="vlm_decade.demo:decade_demo",
    )
)
register(
    Study(
        name="openworld",
        config=OpenWorldStudyConfig,
        pipeline="vlm_decade.studies.openworld.pipeline",
        pages="vlm_decade.view.openworld",
        tables=("images", "labels", "responses", "predictions", "stats", "comparisons", "metadata"),
        job="jobs/openworld_study.py",
        demo="vlm_decade.demo:openworld_demo",
    )
)
