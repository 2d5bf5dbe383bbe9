"""Study A as one function: check everything, then run its stages in order over the shared spine.

Everything is checked before anything is written (`check`); each stage then runs only if its
inputs or settings changed, and Ray starts only when a stage needs it. The same six functions as
Study B's pipeline: `check`, `run`, `estimate`, `summary`, `redraw_report`, `export`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, replace

import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.errors import STUDY_FILE, InputError, Problem, Problems
from vlm_decade.core.progress import Reporter, counted
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage, given, release_memory, run_study
from vlm_decade.core.runtime import LazyRay
from vlm_decade.core.smoke import first_images, first_rows_per_dataset
from vlm_decade.imaging.masks import mask_specs
from vlm_decade.models.backends import backend_class
from vlm_decade.models.backends.imported import files_held, missing_rows
from vlm_decade.stages import describe, embed
from vlm_decade.stages.images import ImageCache, transparency_note
from vlm_decade.studies.decade import judging, metric_validation, report, score, statistics, stsb
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.decade.data import StudyData, load_study_data, thin_human_data
from vlm_decade.studies.decade.export import tidy
from vlm_decade.studies.decade.human import stage as reliability
from vlm_decade.studies.decade.taxonomy import stages as taxonomy
from vlm_decade.studies.decade.taxonomy.analysis import ERROR_TYPES
from vlm_decade.studies.decade.taxonomy.hand import check_hand_labels
from vlm_decade.studies.decade.taxonomy.probe_estimate import probe_lines
from vlm_decade.studies.decade.taxonomy.probing import check_verifier
from vlm_decade.studies.estimate import Line, describe_lines, embed_lines, response_cache


def plan(study: StudyConfig) -> describe.Plan:
    """Each model's prompt (its own or the study's, with a short hash as id, so a reworded prompt is
    a new row) and the masked variants."""
    prompts = {}
    for m in study.models:
        text = m.prompt or study.prompt
        prompts[m.name] = (("p-" + hashlib.sha256(text.encode()).hexdigest()[:10], text),)
    return describe.Plan(prompts, masks=tuple(mask_specs(study.masks)))


def check(study: StudyConfig, cache: ImageCache | None = None) -> StudyData:
    """Check data and models; raise every problem together. Writes nothing. `cache`: what earlier
    runs found about unchanged image files (`ImageCache`)."""
    return _check(study, cache)


def _check(
    study: StudyConfig,
    cache: ImageCache | None = None,
    images_passed: Callable[[], None] | None = None,
    images_named: Callable[[pa.Array], None] = lambda image_ids: None,
) -> StudyData:
    """`check`, calling `images_named` with the ids the images table names as soon as it is read,
    and `images_passed` when every image has passed its checks, before the models' files and the
    descriptions are checked (`run` starts Ray at the first that shows images added to a finished run)."""
    problems: list[Problem] = []
    data = None
    models: list[Problem] = []
    incomplete: list[str] = []

    def check_models(image_ids, images) -> None:
        if images is not None and images_passed is not None:
            images_passed()
        # Before the descriptions are read, so that the models' files (an imported one is as long
        # as the descriptions) are not held beside them: their checks, and what they lack.
        models.extend(describe.check_models(study, image_ids, ["full"] + [s.mask_id for s in mask_specs(study.masks)]))
        if images is not None and not models:
            if study.limit is not None:  # a smoke run's images: the first of each dataset, as `first_images` takes them
                images = images.take(first_rows_per_dataset(images, study.limit))
            incomplete.extend(missing_rows(study.models, images.column("image_id"), plan(study).variants))
        release_memory()

    try:
        data = load_study_data(
            study.data,
            study.ranking,
            study.masks,
            cache,
            study.analysis.group_by,
            check_models,
            images_named,
            study.limit,  # a smoke run reads only its own images
        )
        image_ids = data.images.column("image_id")  # a column, not a Python string per image
    except InputError as exc:
        problems += exc.problems
        image_ids = exc.image_ids  # the ids the table names, when it could be read
    problems += models
    problems += embed.check_encoders(study)
    problems += judging.check_judges(study)
    problems += check_verifier(study)
    ratings = hand_labels = None
    found = Problems()
    if image_ids is not None and (study.data.ratings is not None or study.data.hand_labels is not None):
        image_ids = image_ids if isinstance(image_ids, set) else set(image_ids.to_pylist())
    if study.data.ratings is not None and image_ids is not None:
        ratings = metric_validation.check_ratings(study.data.ratings, [m.name for m in study.models], image_ids, found)
    if study.data.hand_labels is not None and image_ids is not None:
        if study.taxonomy is None:
            found.add(
                STUDY_FILE, "hand labels need the error taxonomy: add a `taxonomy:` section", field="data.hand_labels"
            )
        else:
            hand_labels = check_hand_labels(
                study.data.hand_labels, [m.name for m in study.models], image_ids, ERROR_TYPES, found
            )
    if study.taxonomy is not None:
        problems += backend_class(study.taxonomy.detector.backend).check(
            study.taxonomy.detector.as_model(), image_ids or set(), ["full"]
        )
    problems += found.items
    if problems:
        raise InputError(problems)
    return first_images(
        replace(data, ratings=ratings, hand_labels=hand_labels, incomplete=tuple(incomplete)), study.limit
    )


@files_held()  # the run reads its imported files once
def run(study: StudyConfig, reporter: Reporter | None = None) -> RunFolder:
    reporter = reporter or Reporter()  # from here: the image checks show their progress
    ray = LazyRay(study.runtime)
    try:
        folder = _run(study, reporter, ray)
    except InputError:
        # Ray started ahead for the images a refused run adds: its start is seen through and Ray
        # shut down on a thread while the problems are said (the process ends once that is done).
        ray.close_soon()
        raise
    except BaseException:
        ray.close()  # what a folder that could not be opened left started
        raise
    ray.close()  # after a run, nothing: the run closed it
    return folder


def _run(study: StudyConfig, reporter: Reporter, ray: LazyRay) -> RunFolder:
    cache = ImageCache.of(study.output, study.runtime.rehash, reporter.track)
    responses, warm = describe.stage(study, plan(study)), {}

    def start_ahead(image_ids: pa.Array | None = None) -> None:
        # Ray and the encoder actors start now, while the driver checks the images, the descriptions
        # and the models' files on one core, rather than as the stages begin: their start took
        # longer than the stages before the embed stage of a run with images added. New ids are seen
        # as the images table is read; new files of known ids once the images are checked.
        if "embeddings" not in warm and adds_to_a_finished_run(study.output, responses, cache, image_ids):
            future = embed.start_ahead(study, ray)
            if future is not None:
                warm["embeddings"] = future

    data = _check(study, cache, start_ahead, start_ahead)
    stages = [
        given("images", data.images, cache.seconds),  # its time: the image checks
        given("references", data.references),
        given("metadata", data.metadata),
        responses,
        embed.stage(study),
        *([judging.stage(study)] if study.judge_metrics else []),
        score.stage(study),
        statistics.stage(study),
    ]
    if data.ratings is not None and metric_validation.too_few_ratings(data.ratings, "") is None:
        stages.append(metric_validation.stage(study, data.ratings))
    if study.data.votes is not None or data.ratings is not None:
        stages.append(reliability.stage(study, data.ratings))
    if study.stsb_check:
        stages.append(stsb.stage(study))
    if study.taxonomy is not None:
        stages += taxonomy.stages(study, data.hand_labels)
    stages.append(report.stage(study, data.ranking_method, [t for s in stages for t in s.tables]))
    summary = f": {counted(data.images.num_rows, 'image')}, {counted(len(study.models), 'model')}"
    warnings, ranking = input_warnings(study, data), data.ranking_method
    del data  # its tables live on in their stages only until written: later stages read the run folder's
    masks = [asdict(s) for s in mask_specs(study.masks)]
    return run_study(
        study, reporter, summary, stages, warnings, cache.save, ray, warm, ranking_method=ranking, masks=masks
    )


def adds_to_a_finished_run(
    output, responses: Stage, cache: ImageCache | None = None, image_ids: pa.Array | None = None
) -> bool:
    """Whether images were added to (or changed in) a run whose embed stage finished before: the run
    folder at `output` records the stage as done, and the images table names an image its images
    table lacks (`image_ids`, every id the table names), or (without `image_ids`) the image checks
    read files the `cache` did not know. Only past a `responses` stage that leaves the cluster free
    (`Stage.frees_cluster`: the encoder actors could take a local model's CPUs first)."""
    if not responses.frees_cluster or (image_ids is None and not cache.unknown):
        return False
    folder = RunFolder(output)
    try:
        stages = folder.manifest().get("stages", {})
    except ValueError:  # a manifest that cannot be read: the run says so once it holds the folder
        return False
    if stages.get("embeddings", {}).get("state") != "done":
        return False
    if image_ids is None:
        return True
    try:
        known = folder.read("images", ["image_id"]).column("image_id").combine_chunks()
    except (OSError, ValueError, pa.ArrowException):  # a table that cannot be read: the run says so as above
        return False
    return not pc.all(pc.is_in(image_ids, value_set=known)).as_py()


def estimate(study: StudyConfig, data: StudyData) -> tuple[list[Line], tuple[str, ...]]:
    """The API requests, tokens and dollars this study would take (`studies.estimate.render` prints
    them), and notes on what they leave out."""
    cache = response_cache(study)
    lines: list[Line]
    lines, n_answers, answer_tokens = describe_lines(study, plan(study), data.images, cache)
    lines += embed_lines(study, data.references.column("text").to_pylist(), n_answers, answer_tokens, cache)
    lines += judging.estimate(study, data)
    probes = probe_lines(study, data)
    notes = (
        (
            "Probe questions depend on the descriptions: from none to an upper bound (two per object of the gold "
            "description, one per object a description could mention); see docs/api.md.",
        )
        if probes
        else ()
    )
    return lines + probes, notes


def input_warnings(study: StudyConfig, data: StudyData) -> list[str]:
    """What `validate` warns of and a run says before it starts: imported models that lack rows, and
    human data too thin for what the study asks (`thin_human_data`)."""
    thin = thin_human_data(study, data.references, data.ranking_method)
    few = data.ratings is not None and metric_validation.too_few_ratings(data.ratings, str(study.data.ratings))
    return list(data.incomplete) + [t.message for t in thin] + ([few] if few else [])


def summary(study: StudyConfig, data: StudyData) -> tuple[str, list[str]]:
    """What `validate` says of a study that passed its checks, and its warnings (`input_warnings`)."""
    datasets = sorted(set(data.images.column("dataset").to_pylist()))
    return (
        f"{counted(data.images.num_rows, 'image')} in {counted(len(datasets), 'dataset')} ({', '.join(datasets)}), "
        f"{counted(data.references.num_rows, 'human description')}, {counted(len(study.models), 'model')}; "
        "gold standard by "
        + ", ".join(f"{d}: {m}" for d, m in sorted(data.ranking_method.items()))
        + study.data.form()
        + transparency_note(data.images)
    ), input_warnings(study, data)


def export(folder: RunFolder, study: StudyConfig) -> pa.Table:
    """The run as one tidy table (`studies/decade/export.py`); InputError naming a table it lacks."""
    return tidy(folder)


def redraw_report(folder: RunFolder, study: StudyConfig) -> list[str]:
    """Write report.html again from the run folder's tables; returns the required tables it lacks."""
    return report.redraw(folder, study)
