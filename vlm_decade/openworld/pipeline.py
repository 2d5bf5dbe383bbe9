"""Study B as one function: check, then images and labels, responses, judgements, scores, stats, report.

The same spine as Study A (`vlm_decade.pipeline`): every input is checked before anything is
written, each stage runs only when its inputs or settings changed, responses resume per row, and
Ray starts only when a stage needs it.
"""

from __future__ import annotations

import pyarrow as pa

from ..api.checks import api_budgets, study_problems
from ..backends import backend_class
from ..config import OpenWorldStudyConfig
from ..describe import model_fingerprint, model_prompts, run_describe
from ..errors import InputError, Problem
from ..pipeline import LazyRay, model_problems, open_run
from ..progress import Reporter
from ..runfolder import RunFolder, table_fingerprint
from ..stages import Stage, StageRunner, Tables, now
from ..stats import ComparisonSpec, Family, Term, analyse
from .data import OpenWorldData, load_openworld_data
from .judging import judge_pairs, judge_unavailable
from .report import REPORT_FORMAT, REPORT_TABLES, write_openworld_report
from .scoring import grouped_scores, judgement_key, score_predictions


def check_openworld(study: OpenWorldStudyConfig) -> OpenWorldData:
    """Check data and models; raise every problem together. Writes nothing. (A judge that cannot
    run is no error: LI is skipped with a note, `judge_unavailable`.)"""
    problems: list[Problem] = []
    data = None
    try:
        data = load_openworld_data(study.data.labels, study.data.image_dir, study.data.classnames)
    except InputError as exc:
        problems += exc.problems
    image_ids = set(data.images.column("image_id").to_pylist()) if data else set()
    problems += model_problems(study, data is not None, image_ids, ["full"])
    problems += study_problems(study)
    if problems:
        raise InputError(problems)
    return data


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
    )


def run_openworld(study: OpenWorldStudyConfig, reporter: Reporter | None = None) -> RunFolder:
    reporter = reporter or Reporter()
    data = check_openworld(study)
    run = open_run(
        study, reporter, f" (Study B): {data.images.num_rows} images, {len(study.models)} models",
        kind="openworld", granularity=data.granularity,
    )
    stage = StageRunner(run, reporter)
    ray = LazyRay(study)
    tables = Tables(run)
    table, produced = tables.read, tables.produced

    budgets = api_budgets(study)
    scoring = study.scoring
    no_judge = judge_unavailable(study)
    try:
        stage(Stage("images", (), table_fingerprint(data.images), lambda: produced(images=data.images)))
        stage(Stage("labels", (), table_fingerprint(data.labels), lambda: produced(labels=data.labels)))
        stage(
            Stage(
                "responses",
                ("images",),
                {
                    "models": [[m.name, model_fingerprint(m), *model_prompts(m, study)] for m in study.models],
                    "classnames": {d: list(c) for d, c in sorted(data.classnames.items())},
                }
                | ({"budgets": budgets} if budgets else {}),
                lambda: produced(responses=run_describe(study, table("images"), run, reporter, ray, data.classnames)),
            )
        )
        score_inputs = ("labels", "responses")
        if no_judge is None:

            def judge() -> dict[str, pa.Table]:
                return produced(judgements=judge_pairs(study, _pairs(table("labels"), table("responses")), run, reporter, ray))

            stage(Stage("judgements", ("labels", "responses"), study.judge.model_dump(mode="json", exclude={"batch_size"}), judge))
            score_inputs += ("judgements",)
        else:
            reporter.say(f"     [yellow]LI skipped[/yellow]: {no_judge}")

        def score() -> dict[str, pa.Table]:
            from ..encoders.sbert import SentenceTransformerEncoder
            from .metrics import load_nlp

            judged = None
            if no_judge is None:
                judged = {judgement_key(r["label"], r["prediction"]): r["answer"] for r in table("judgements").to_pylist() if r["status"] == "ok"}
            scores, predictions = score_predictions(
                table("labels"), table("responses"), judged, SentenceTransformerEncoder(scoring.encoder).encode, load_nlp(),
                scoring.cs_high, scoring.li_high,
            )
            return produced(scores=scores, predictions=predictions)

        stage(Stage("scores", score_inputs, [scoring.model_dump(mode="json"), no_judge], score, outputs=("scores", "predictions")))

        def compute_stats() -> dict[str, pa.Table]:
            ray()  # bootstrap blocks run as Ray tasks
            s = study.statistics
            grouped = grouped_scores(table("scores"), table("predictions"), data.granularity)
            groups = set(grouped.column("dataset").to_pylist())
            stats, comparisons = analyse(grouped, {}, s.n_resamples, s.seed, s.confidence, s.alpha, families=[open_closed_family(study, groups)])
            return produced(stats=stats, comparisons=comparisons)

        stage(
            Stage("stats", ("scores", "predictions"), [study.statistics.model_dump(), kinds(study), data.granularity], compute_stats,
                  outputs=("stats", "comparisons"))
        )
        report_tables = REPORT_TABLES
        stage(
            Stage(
                "report",
                report_tables,
                {"demo": study.demo, "format": REPORT_FORMAT, "no_judge": no_judge},
                lambda: write_openworld_report(run, study, {n: table(n) for n in report_tables}, no_judge) or {},
                outputs=(),
                files=("report.html",),
            )
        )
    finally:
        ray.close()
    run.update_manifest(finished=now())
    reporter.say(f"report: {run.root / 'report.html'}")
    return run


def _pairs(labels: pa.Table, responses: pa.Table) -> list[tuple[str, str]]:
    """Each distinct (label, prediction) the judge must see, once."""
    label_of = dict(zip(labels.column("image_id").to_pylist(), labels.column("label").to_pylist()))
    ok = [r for r in responses.to_pylist() if r["status"] == "ok" and r["image_id"] in label_of]
    return sorted({judgement_key(label_of[r["image_id"]], r["text"]) for r in ok})
