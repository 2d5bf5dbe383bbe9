"""A whole study as one function: check, then ingest, describe, embed, score, stats, report.

Everything is checked before anything is written; each stage then runs only if its inputs or
settings changed (`stages`), and Ray starts only when a stage needs it.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, replace
from importlib import metadata

import pyarrow as pa

from .api.checks import api_budgets, study_problems
from .backends import backend_class
from .config import AnyStudy, StudyConfig
from .describe import model_fingerprint, model_prompts, run_describe
from .embed import run_embed, texts_to_embed
from .errors import InputError, Problem, Problems
from .ingest import StudyData, load_study_data
from .masks import mask_specs
from .metric_validation import check_ratings, validate_metrics
from .metrics import build_metric, cosine_metric
from .progress import Reporter
from .report import REPORT_FORMAT, REPORT_TABLES, write_report
from .runfolder import RunFolder, table_fingerprint
from .runtime import start_ray
from .score import similarity_scores
from .stages import Stage, StageRunner, Tables, now
from .stats import analyse
from .stsb import run_stsb_check
from .taxonomy.analysis import ERROR_TYPES
from .taxonomy.hand import check_hand_labels

REPORTED_PACKAGES = ("vlm-decade", "ray", "torch", "transformers", "sentence-transformers", "numpy", "scipy", "pyarrow")


def model_problems(study: AnyStudy, data_read: bool, image_ids: set[str], variants: list[str]) -> list[Problem]:
    """Each model's backend, and what its `check` finds before any work (weights, files); checks
    that need the images wait until the data could be read."""
    problems = []
    for i, model in enumerate(study.models):
        try:
            cls = backend_class(model.backend)
        except KeyError as exc:
            problems.append(Problem("study file", exc.args[0], field=f"models.{i}.backend"))
            continue
        if data_read or not cls.needs_images:
            problems += cls.check(model, image_ids, variants)
    return problems


def check_study(study: StudyConfig) -> StudyData:
    """Check data and models; raise every problem together. Writes nothing."""
    problems: list[Problem] = []
    data = None
    try:
        data = load_study_data(study.data, study.ranking, study.masks)
    except InputError as exc:
        problems += exc.problems
    image_ids = set(data.images.column("image_id").to_pylist()) if data else set()
    problems += model_problems(study, data is not None, image_ids, ["full"] + [s.mask_id for s in mask_specs(study.masks)])
    problems += study_problems(study)
    ratings = hand_labels = None
    found = Problems()
    if study.data.ratings is not None and data is not None:
        ratings = check_ratings(study.data.ratings, [m.name for m in study.models], image_ids, found)
    if study.data.hand_labels is not None and data is not None:
        if study.taxonomy is None:
            found.add("study file", "hand labels need the error taxonomy: add a `taxonomy:` section", field="data.hand_labels")
        else:
            hand_labels = check_hand_labels(study.data.hand_labels, [m.name for m in study.models], image_ids, ERROR_TYPES, found)
    if study.taxonomy is not None:
        problems += backend_class(study.taxonomy.detector.backend).check(study.taxonomy.detector.as_model(), image_ids, ["full"])
    problems += found.items
    if problems:
        raise InputError(problems)
    return replace(data, ratings=ratings, hand_labels=hand_labels)


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in REPORTED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def open_run(study: AnyStudy, reporter: Reporter, summary: str, **manifest) -> RunFolder:
    """The run folder, with the manifest's record of this run begun: the config and its hash,
    package versions, the start; `manifest` adds what the study kind records."""
    run = RunFolder(study.output)
    run.root.mkdir(parents=True, exist_ok=True)
    run.update_manifest(
        study=study.name,
        demo=study.demo,
        config=study.model_dump(mode="json"),
        config_hash=study.hash(),
        versions=package_versions(),
        started=now(),
        finished=None,
        spend_usd=run.manifest().get("spend_usd", {}),  # the run folder's total across resumed runs
        **manifest,
    )
    reporter.say(f"[bold]{study.name}[/bold]{summary} -> {run.root}")
    return run


def eras(study: StudyConfig) -> dict[str, str]:
    return {m.name: m.era for m in study.models} | {"human:top": "human", "human:bottom": "human"}


class LazyRay:
    """Starts (or joins) Ray the first time a stage needs it; shuts down only what it started."""

    def __init__(self, study: StudyConfig):
        self.runtime = study.runtime
        self.ray = None

    def __call__(self):
        if self.ray is None:
            import ray

            self.started = not ray.is_initialized()
            self.ray = start_ray(self.runtime.address, self.runtime.num_cpus)
        return self.ray

    def close(self) -> None:
        if self.ray is not None and self.started:
            self.ray.shutdown()


def taxonomy_stages(study: StudyConfig, stage, table, produced, ray, data: StudyData, run: RunFolder, reporter: Reporter) -> list[str]:
    """Detections, probes (API models), error labels with spatial dependence, and their statistics;
    returns the tables the report draws from."""
    from .taxonomy import stages as tax
    from .taxonomy.detect import run_detections
    from .taxonomy.probing import run_probes

    cfg = study.taxonomy
    matching = [cfg.matcher.model_dump(mode="json", exclude={"batch_size"}), cfg.match_threshold, cfg.confusable_threshold]
    stage(
        Stage(
            "detections",
            ("images",),
            cfg.detector.model_dump(mode="json", exclude={"batch_size"}),
            lambda: produced(detections=run_detections(cfg.detector, study.runtime, table("images"), reporter, ray(), study)),
        )
    )
    error_inputs = ("images", "references", "responses", "embeddings", "detections")
    if tax.probed_models(study):
        stage(
            Stage(
                "probes",
                ("images", "references", "responses"),
                [matching, cfg.probes.model_dump(), api_budgets(study)],
                lambda: produced(
                    probes=run_probes(
                        study, table("images"), tax.first_probe_questions(study, table("images"), table("references"), table("responses")),
                        run, reporter, ray(),
                    )
                ),
            )
        )
        error_inputs += ("probes",)
    hand = data.hand_labels

    def error_stats() -> dict[str, pa.Table]:
        ray()  # bootstrap blocks run as Ray tasks
        return produced(**tax.compute_error_stats(study, table("errors"), table("scores")))

    stage(
        Stage(
            "errors",
            error_inputs,
            [matching, cfg.sde_n_sd, study.taxonomy_metric, None if hand is None else table_fingerprint(hand)],
            lambda: produced(**tax.compute_errors(study, table, hand)),
            outputs=("errors", "spatial", "hand_agreement"),
        )
    )
    stage(
        Stage(
            "error_stats",
            ("errors", "scores"),
            [study.statistics.model_dump(), eras(study), study.taxonomy_metric],
            error_stats,
            outputs=("error_stats", "error_comparisons", "impact_stats", "impact_comparisons"),
        )
    )
    return ["detections", "errors", "spatial", "hand_agreement", "error_stats", "error_comparisons", "impact_stats", "impact_comparisons"]


def run_study(study: StudyConfig, reporter: Reporter | None = None) -> RunFolder:
    reporter = reporter or Reporter()
    data = check_study(study)
    run = open_run(
        study, reporter, f": {data.images.num_rows} images, {len(study.models)} models",
        ranking_method=data.ranking_method, masks=[asdict(s) for s in mask_specs(study.masks)],
    )
    stage = StageRunner(run, reporter)
    ray = LazyRay(study)
    tables = Tables(run)
    table, produced = tables.read, tables.produced

    metrics = [e.name for e in study.encoders]
    statistics = study.statistics
    budgets = api_budgets(study)
    try:
        stage(Stage("images", (), table_fingerprint(data.images), lambda: produced(images=data.images)))
        stage(Stage("references", (), table_fingerprint(data.references), lambda: produced(references=data.references)))
        stage(
            Stage(
                "responses",
                ("images",),
                {
                    "models": [[m.name, m.variants, model_fingerprint(m), *model_prompts(m, study)] for m in study.models],
                    "masks": [asdict(s) for s in mask_specs(study.masks)],
                }
                # Only studies with API models carry budgets, so other studies keep their fingerprints.
                | ({"budgets": budgets} if budgets else {}),
                lambda: produced(responses=run_describe(study, table("images"), run, reporter, ray)),
            )
        )
        stage(
            Stage(
                "embeddings",
                ("references", "responses"),
                [e.model_dump(mode="json", exclude={"batch_size"}) for e in study.encoders],
                lambda: produced(
                    embeddings=run_embed(study, texts_to_embed(table("references"), table("responses")), run, reporter, ray)
                ),
            )
        )
        stage(
            Stage(
                "scores",
                ("images", "references", "responses", "embeddings"),
                [metrics, [m.model_dump(mode="json", exclude={"batch_size"}) for m in study.metrics]],
                lambda: produced(
                    scores=similarity_scores(
                        table("images"),
                        table("references"),
                        table("responses"),
                        table("embeddings"),
                        metrics,
                        [build_metric(m) for m in study.metrics],
                    )
                ),
            )
        )

        def compute_stats() -> dict[str, pa.Table]:
            ray()  # bootstrap blocks run as Ray tasks
            stats, comparisons = analyse(
                table("scores"), eras(study), statistics.n_resamples, statistics.seed, statistics.confidence, statistics.alpha
            )
            return produced(stats=stats, comparisons=comparisons)

        stage(Stage("stats", ("scores",), [statistics.model_dump(), eras(study)], compute_stats, outputs=("stats", "comparisons")))
        report_tables = list(REPORT_TABLES)
        if data.ratings is not None:
            stage(
                Stage(
                    "metric_validation",
                    ("scores",),
                    [table_fingerprint(data.ratings), statistics.model_dump()],
                    lambda: produced(
                        metric_validation=validate_metrics(
                            data.ratings, table("scores"), statistics.n_resamples, statistics.seed, statistics.confidence
                        ).summary
                    ),
                )
            )
            report_tables.append("metric_validation")
        if study.stsb_check:
            checked = [cosine_metric(e) for e in study.encoders if e.backend == "sentence-transformers"] + list(study.metrics)
            stage(
                Stage(
                    "stsb",
                    (),
                    [m.model_dump(mode="json", exclude={"batch_size"}) for m in checked],
                    lambda: produced(stsb=run_stsb_check(checked)[0]),
                )
            )
            report_tables.append("stsb")
        if study.taxonomy is not None:
            report_tables += taxonomy_stages(study, stage, table, produced, ray, data, run, reporter)
        stage(
            Stage(
                "report",
                tuple(report_tables),
                {"demo": study.demo, "ranking": data.ranking_method, "format": REPORT_FORMAT},
                lambda: write_report(run, study, {n: table(n) for n in report_tables}) or {},
                outputs=(),
                files=("report.html",),
            )
        )
    finally:
        ray.close()
    run.update_manifest(finished=now())
    reporter.say(f"report: {run.root / 'report.html'}")
    return run
