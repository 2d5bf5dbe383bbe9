"""Study B's report: the paper's main table (TI, LI, SS, CS per model and granularity group, with
bootstrap CIs), the open/closed gap, the error-type breakdown with examples, the prompt ablation, and
per model a bounded sample of its predictions (lowest and highest CS, thumbnails embedded), so the
page stays a few MB at any number of images; `vlm-decade view` shows every prediction."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage
from vlm_decade.report import samples as report_samples
from vlm_decade.report.html import Grid, grid, render, write_csvs, write_page
from vlm_decade.report.samples import SampleRow, Samples, extremes, sample_tables
from vlm_decade.stats import format_p
from vlm_decade.stats.groups import GROUPED_TABLES, ungrouped
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.scoring import METRICS

# Bump when the page changes, so existing runs redraw it.
REPORT_FORMAT = 4  # 4: McNemar's tests
TEMPLATES = Path(__file__).parent / "templates"
REPORT_TABLES = ("images", "labels", "responses", "predictions", "stats", "comparisons", "paired_tests")
GROUPS = ("prototypical", "fine-grained", "very fine-grained", "all")
OUTCOMES = {
    "granularity": "granularity error (CS high, LI low: right but too generic)",
    "ambiguity": "label ambiguity (LI high, CS low: another valid name)",
    "confusion": "fine-grained confusion (both low: wrong but specific)",
}


def _percent(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{100 * value:.1f}"


def _cell(r: dict | None) -> str:
    """An estimate and its CI in percent; a null one (a budget stop can leave them) reads n/a."""
    if r is None:
        return ""
    return f"{_percent(r['estimate'])} [{_percent(r['ci_low'])}, {_percent(r['ci_high'])}]"


def _matrix(
    stats: list[dict], models: list[str], groups: list[str], metrics: list[str], variant: str, label=str
) -> dict:
    """Per model, an estimate with its CI per group and metric; the header names each (group, label(metric))."""
    by = {(r["subject"], r["dataset"], r["metric"], r["variant"]): r for r in stats}
    return {
        "head": [(g, label(m)) for g in groups for m in metrics],
        "rows": [(model, [_cell(by.get((model, g, m, variant))) for g in groups for m in metrics]) for model in models],
    }


def _metric_cell(value: float | None, metric: str) -> str:
    return "" if value is None else (f"{value:.0f}" if metric in ("TI", "LI") else f"{value:.3f}")


def _prediction_samples(tables: dict[str, pa.Table], study: OpenWorldStudyConfig) -> Samples:
    """Each model's lowest- and highest-CS predictions under the main prompt, with the image."""
    predictions = tables["predictions"]
    main = predictions.filter(pc.equal(predictions.column("prompt_id"), study.prompts[0].id))
    columns = [
        "subject",
        "image_id",
        "dataset",
        "granularity",
        "label",
        "prediction",
        "TI",
        "LI",
        "SS",
        "CS",
        "outcome",
    ]
    by_model: dict[str, list[dict]] = {}
    for r in main.select(columns).to_pylist():
        by_model.setdefault(r["subject"], []).append(r)
    picked = {
        m.name: extremes(sorted(by_model.get(m.name, []), key=lambda r: r["image_id"]), "CS") for m in study.models
    }
    ids = sorted({r["image_id"] for low, high in picked.values() for r in low + high})
    images = tables["images"]
    sampled = images.filter(pc.is_in(images.column("image_id"), value_set=pa.array(ids, pa.string())))
    path_of = {r["image_id"]: r["path"] for r in sampled.to_pylist()}

    def row(model: str, r: dict) -> SampleRow:
        cells = [r["label"] or "", r["prediction"] or "", *(_metric_cell(r[m], m) for m in METRICS), r["outcome"] or ""]
        return SampleRow(r["image_id"], f"{r['dataset']}, {r['granularity'] or ''}", cells)

    head = ["label", "prediction", *METRICS, "outcome"]
    return sample_tables(picked, "CS", head, row, path_of, "No scored predictions.")


def _comparisons(comparisons: pa.Table, family: str, n_resamples: int) -> Grid:
    rows = comparisons.filter(pc.equal(comparisons.column("family"), family)) if comparisons.num_rows else comparisons
    fmt = {
        "p": lambda v, r: "" if v is None else format_p(v, n_resamples),
        "q": lambda v, r: "" if v is None else format_p(v, n_resamples),
        "significant": lambda v, r: "" if v is None else ("yes" if v else "no"),
    }
    columns = ["a", "b", "dataset", "metric", "variant", "difference", "ci_low", "ci_high", "p", "q", "significant"]
    return grid(rows, columns, fmt)


def _outcome_examples(predictions: pa.Table) -> list[tuple[str, Grid]]:
    """A few predictions of each error type that has any."""
    examples = []
    for name, meaning in OUTCOMES.items():
        rows = predictions.filter(pc.equal(predictions.column("outcome"), name)).slice(0, 5)
        if rows.num_rows:
            columns = ["subject", "image_id", "label", "prediction", "CS", "LI", "best_concept", "judge_answer"]
            examples.append((meaning, grid(rows, columns, {"LI": lambda v, r: "" if v is None else f"{v:.0f}"})))
    return examples


def write_openworld_report(
    run: RunFolder, study: OpenWorldStudyConfig, tables: dict[str, pa.Table], no_judge: str | None = None
) -> None:
    """`no_judge` says why LI was skipped, when it was."""
    # The page shows the analysis of all images; the tables' CSVs keep the per-group rows too.
    all_rows, tables = tables, {**tables, **{n: ungrouped(t) for n, t in tables.items() if n in GROUPED_TABLES}}
    stats = tables["stats"].to_pylist()
    main = study.prompts[0].id
    models = [m.name for m in study.models]
    present = {r["dataset"] for r in stats}
    groups = [g for g in GROUPS if g in present]
    datasets = sorted(present - set(GROUPS))  # each dataset's own estimates, as docs/openworld-data.md promises
    metrics = [m for m in METRICS if any(r["metric"] == m for r in stats)]
    # SS as the authors' code reports it: the share of predictions at or above 0.5 ... 0.9 and their average.
    shares = [
        m for m in ("ss@0.5", "ss@0.6", "ss@0.7", "ss@0.8", "ss@0.9", "ss@avg") if any(r["metric"] == m for r in stats)
    ]
    outcome_metrics = [f"outcome:{o}" for o in OUTCOMES if any(r["metric"] == f"outcome:{o}" for r in stats)]
    n = study.statistics.n_resamples
    comparisons = tables["comparisons"]
    open_closed = (
        comparisons.filter(pc.equal(comparisons.column("family"), "open-vs-closed"))
        if comparisons.num_rows
        else comparisons
    )
    images, responses = tables["images"], tables["responses"]
    page = render(
        TEMPLATES,
        "openworld_report.html",
        title=f"{study.name}: vlm_decade report",
        heading=f"{study.name} (Study B: open-world classification)",
        study=study,
        models=models,
        metrics=metrics,
        n_images=images.num_rows,
        n_datasets=len(set(images.column("dataset").to_pylist())),
        no_judge=no_judge or "no judge answers",
        sample_size=report_samples.SAMPLE_SIZE,
        main=_matrix(stats, models, groups, metrics, main),
        per_dataset=_matrix(stats, models, datasets, metrics, main) if datasets else None,
        shares=_matrix(stats, models, groups, shares, main) if shares else None,
        open_closed=grid(
            open_closed.filter(pc.equal(open_closed.column("variant"), main)),
            ["a", "b", "dataset", "metric", "difference", "ci_low", "ci_high", "p", "q"],
            {"p": lambda v, r: format_p(v, n), "q": lambda v, r: format_p(v, n)},
        )
        if open_closed.num_rows
        else None,
        outcomes=list(OUTCOMES.values()),
        outcome_matrix=_matrix(stats, models, groups, outcome_metrics, main, lambda m: m.split(":", 1)[1])
        if outcome_metrics
        else None,
        outcome_examples=_outcome_examples(tables["predictions"]),
        model_vs_model=_comparisons(comparisons, "model-vs-model", n),
        prompt_ablation=_comparisons(comparisons, "prompt-ablation", n),
        mcnemar=grid(
            tables["paired_tests"],
            ["a", "b", "dataset", "metric", "n_pairs", "a_only", "b_only", "p", "q", "significant"],
            {
                "p": lambda v, r: f"{v:.3g}",
                "q": lambda v, r: f"{v:.3g}",
                "significant": lambda v, r: "yes" if v else "no",
            },
        ),
        prompts=[(p, _matrix(stats, models, ["all"], metrics, p.id)) for p in study.prompts],
        predictions=_prediction_samples(tables, study),
        responses=responses.num_rows,
        failed=pc.sum(pc.not_equal(responses.column("status"), "ok")).as_py() or 0,
        csvs=write_csvs(run.root, all_rows, ("stats", "comparisons", "paired_tests", "predictions", "responses")),
    )
    write_page(run.root / "report.html", page)


def stage(study: OpenWorldStudyConfig, no_judge: str | None) -> Stage:
    return Stage(
        "report",
        REPORT_TABLES,
        {"demo": study.demo, "format": REPORT_FORMAT, "no_judge": no_judge},
        lambda run: write_openworld_report(run.folder, study, {n: run.table(n) for n in REPORT_TABLES}, no_judge) or {},
        outputs=(),
        files=("report.html",),
    )


def redraw(folder: RunFolder, study: OpenWorldStudyConfig, no_judge: str | None) -> list[str]:
    """Write report.html again from a run folder; returns the tables it needs and lacks (then nothing is written)."""
    missing = [n for n in REPORT_TABLES if not folder.has(n)]
    if not missing:
        write_openworld_report(folder, study, {n: folder.read(n) for n in REPORT_TABLES}, no_judge)
    return missing
