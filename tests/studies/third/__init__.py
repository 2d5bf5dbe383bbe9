"""A third study, defined only here, to show that a study is one registration: `THIRD` names its
config class, pipeline, viewer pages and their tables, job script and demo, and nothing else in the
package changes for it. It measures each image's mean brightness (a table the pipeline writes
through the spine, `core.runner`), needs no Ray and no model, and its viewer shows the numbers.

A test registers it for its own duration (`studies.registry.register`), as its job script does
for the job's; the rest of the suite knows the two studies alone.
"""

from __future__ import annotations

from tests.studies.third.config import ThirdConfig
from vlm_decade.studies.registry import Study

THIRD = Study(
    name="third",
    config=ThirdConfig,
    pipeline="tests.studies.third.pipeline",
    pages="tests.studies.third.pages",
    tables=("images", "brightness"),
    job="tests/studies/third/job.py",
    demo="tests.studies.third.pipeline:demo",
)
