"""Study B as one function: check everything, then run its stages in order over the shared spine.

The same spine and the same six functions as Study A's pipeline (`check`, `run`, `estimate`,
`summary`, `redraw_report`, `export`): every input is checked before anything is written, each stage runs
only when its inputs or settings changed, responses resume per row, and Ray starts only when a
stage needs it.
"""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.progress import Reporter, counted
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import given, run_study
from vlm_decade.core.smoke import first_images
from vlm_decade.models.backends import backend_class
from vlm_decade.models.backends.imported import files_held, missing_rows, prompt_problems
from vlm_decade.stages import describe
from vlm_decade.stages.images import ImageCache, transparency_note
from vlm_decade.studies.estimate import Line, describe_lines, response_cache
from vlm_decade.studies.openworld import judging, report, scoring, statistics
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.data import OpenWorldData, load_openworld_form
from vlm_decade.studies.openworld.export import tidy
from vlm_decade.studies.openworld.judging import judge_unavailable


def plan(study: OpenWorldStudyConfig, classnames: dict[str, tuple[str, ...]]) -> describe.Plan:
    """Every open-world model answers every prompt, by its id; a closed-world baseline answers once,
    under the first prompt (which it does not read), choosing among its dataset's class names."""
    closed = {m.name: backend_class(m.backend).closed_world for m in study.models}
    prompts = {
        m.name: tuple((p.id, p.text) for p in (study.prompts[:1] if closed[m.name] else study.prompts))
        for m in study.models
    }
    return describe.Plan(prompts, classnames=classnames, closed=closed)


def check(study: OpenWorldStudyConfig, cache: ImageCache | None = None) -> OpenWorldData:
    """Check data and models; raise every problem together. Writes nothing. (A judge that cannot
    run is no error: LI is skipped with a note, `judge_unavailable`.) `cache`: what earlier runs
    found about unchanged image files (`ImageCache`)."""
    problems: list[Problem] = []
    data = None
    try:
        data = load_openworld_form(
            study.data,
            cache,
            study.analysis.group_by,
            study.limit,  # a smoke run reads only its own images
        )
        image_ids = set(data.images.column("image_id").to_pylist())
    except InputError as exc:
        problems += exc.problems
        image_ids = exc.image_ids  # the ids the table names, when it could be read
    problems += describe.check_models(study, image_ids, ["full"])
    problems += prompt_problems(study.models, [p.id for p in study.prompts])
    if problems:
        raise InputError(problems)
    return first_images(data, study.limit)


@files_held()  # the run reads its imported files once
def run(study: OpenWorldStudyConfig, reporter: Reporter | None = None) -> RunFolder:
    reporter = reporter or Reporter()  # from here: the image checks show their progress
    cache = ImageCache.of(study.output, study.runtime.rehash, reporter.track)
    data = check(study, cache)
    no_judge = judge_unavailable(study)
    stages = [
        given("images", data.images, cache.seconds),  # its time: the image checks
        given("labels", data.labels),
        given("metadata", data.metadata),
        describe.stage(study, plan(study, data.classnames)),
        *([judging.stage(study)] if no_judge is None else []),
        scoring.stage(study, no_judge),
        statistics.stage(study, data.granularity),
        report.stage(study, no_judge),
    ]
    summary = f" (Study B): {counted(data.images.num_rows, 'image')}, {counted(len(study.models), 'model')}"
    notes = ([f"LI skipped: {no_judge}"] if no_judge is not None else []) + incomplete_models(study, data)
    granularity = data.granularity
    del data  # its tables live on in their stages only until written: later stages read the run folder's
    return run_study(study, reporter, summary, stages, notes, cache.save, kind="openworld", granularity=granularity)


def estimate(study: OpenWorldStudyConfig, data: OpenWorldData) -> tuple[list[Line], tuple[str, ...]]:
    """The API requests, tokens and dollars this study would take (`studies.estimate.render` prints
    them), and notes on what they leave out (nothing here)."""
    steps = plan(study, data.classnames)
    lines, _, _ = describe_lines(study, steps, data.images, response_cache(study))
    if study.judge is not None and study.judge.backend in ("openai", "gemini"):
        lines.append(judging.estimate(study, data.images, steps.prompts, data.labels))
    return lines, ()


def incomplete_models(study: OpenWorldStudyConfig, data: OpenWorldData) -> list[str]:
    """Imported models whose files lack some of the answers the study asks for."""
    ids = data.images.column("image_id")
    return missing_rows(study.models, ids, lambda model: ["full"], tuple(p.id for p in study.prompts))


def summary(study: OpenWorldStudyConfig, data: OpenWorldData) -> tuple[str, list[str]]:
    """What `validate` says of a study that passed its checks, and its warnings."""
    datasets = sorted(set(data.images.column("dataset").to_pylist()))
    no_judge = judge_unavailable(study)
    text = (
        (
            f"Study B, {counted(data.images.num_rows, 'labelled image')} in {counted(len(datasets), 'dataset')} "
            f"({', '.join(f'{d}: {data.granularity[d]}' for d in datasets)}), {counted(len(study.models), 'model')}, "
            f"{counted(len(study.prompts), 'prompt')}"
        )
        + study.data.form()
        + transparency_note(data.images)
    )
    return text, ([f"LI will be skipped: {no_judge}"] if no_judge else []) + incomplete_models(study, data)


def export(folder: RunFolder, study: OpenWorldStudyConfig) -> pa.Table:
    """The run as one tidy table (`studies/openworld/export.py`); InputError naming a table it lacks."""
    return tidy(folder)


def redraw_report(folder: RunFolder, study: OpenWorldStudyConfig) -> list[str]:
    """Write report.html again from the run folder's tables; returns the required tables it lacks."""
    return report.redraw(folder, study, judge_unavailable(study))
