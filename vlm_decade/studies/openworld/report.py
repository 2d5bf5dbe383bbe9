"""Study B's report: the paper's main table (TI, LI, SS, CS per model and granularity group, with
bootstrap CIs, each beside its accepted-name form where labels have accepted names), the same table
for each group of a grouping variable (`analysis.group_by`), the open/closed gap, the error-type breakdown with examples, the prompt ablation, and
per model a bounded sample of its predictions (lowest and highest CS, thumbnails embedded), so the
page stays a few MB at any number of images; `vlm-decade view` shows every prediction.

Three figures, drawn from the tables into `figures/`: each metric per model with its CIs per group,
the share of predictions at each SS threshold as a curve per model, and the outcomes' shares per model.
The stats table's prompt column is named once, `statistics.PROMPT`."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage, run_failures
from vlm_decade.report import samples as report_samples
from vlm_decade.report.figures import COLOURS, save_figure
from vlm_decade.report.html import Grid, grid, render, write_csvs, write_page
from vlm_decade.report.samples import SampleRow, Samples, extremes, sample_tables
from vlm_decade.stats import format_p
from vlm_decade.stats.groups import GROUPED_TABLES, per_group, ungrouped
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.outcomes import OUTCOMES as OUTCOME_NAMES
from vlm_decade.studies.openworld.scoring import METRICS
from vlm_decade.studies.openworld.statistics import PROMPT

# Bump when the page changes, so existing runs redraw it.
REPORT_FORMAT = 7  # 5: figures, SS thresholds by row; 6: the failed models at the top; 7: accepted names, groups
TEMPLATES = Path(__file__).parent / "templates"
REPORT_TABLES = ("images", "labels", "responses", "predictions", "stats", "comparisons", "paired_tests")
GROUPS = ("prototypical", "fine-grained", "very fine-grained", "all")
THRESHOLDS = ("ss@0.5", "ss@0.6", "ss@0.7", "ss@0.8", "ss@0.9")
FIGURES = {
    "metrics": "figures/openworld_metrics.png",
    "ss_thresholds": "figures/openworld_ss_thresholds.png",
    "outcomes": "figures/openworld_outcomes.png",
}
# As the viewer's badges: right, too generic, another valid name, wrong, not judged.
OUTCOME_COLOURS = {
    "correct": "#4caf50",
    "granularity": "#f0a830",
    "ambiguity": "#9575cd",
    "confusion": "#e05050",
    "unjudged": "#bdbdbd",
}
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
    stats: list[dict], models: list[str], groups: list[str], metrics: list[str], prompt: str, label=str
) -> dict:
    """Per model, an estimate with its CI per group and metric; the header names each (group, label(metric))."""
    by = {(r["subject"], r["dataset"], r["metric"], r[PROMPT]): r for r in stats}
    return {
        "head": [(g, label(m)) for g in groups for m in metrics],
        "rows": [(model, [_cell(by.get((model, g, m, prompt))) for g in groups for m in metrics]) for model in models],
    }


def _by_group(stats: list[dict], models: list[str], groups: list[str], metrics: list[str], variant: str) -> dict:
    """One row per model and group, one column per metric: narrow enough for many metrics."""
    by = {(r["subject"], r["dataset"], r["metric"], r[PROMPT]): r for r in stats}
    return {
        "head": list(metrics),
        "rows": [
            (model, g, [_cell(by.get((model, g, m, variant))) for m in metrics])
            for model in models
            for g in groups
            if any((model, g, m, variant) in by for m in metrics)
        ],
    }


def _by_variable(stats: pa.Table, models: list[str], metrics: list[str], prompt: str) -> list[tuple[str, list]]:
    """The main table on each group's images alone: (variable, [(group, its matrix)]) for each
    grouping variable (`analysis.group_by`)."""
    out = []
    for variable, groups in per_group(stats).items():
        tables = []
        for group, rows in groups.items():
            found = rows.to_pylist()
            present = {r["dataset"] for r in found}
            tables.append((group, _matrix(found, models, [g for g in GROUPS if g in present], metrics, prompt)))
        out.append((variable, tables))
    return out


def _complete(r: dict | None) -> bool:
    """A stats row with an estimate and both CI ends (a budget stop can leave them null)."""
    return r is not None and all(r[k] is not None and not math.isnan(r[k]) for k in ("estimate", "ci_low", "ci_high"))


def _empty(ax, why: str) -> None:
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="#777")


def _title(fig, title: str, demo: bool) -> None:
    fig.suptitle(title + ("\nDEMO DATA: not a finding" if demo else ""), fontsize=10)


def metrics_figure(
    stats: list[dict], models: list[str], groups: list[str], metrics: list[str], prompt: str, demo: bool, path: Path
) -> None:
    """Each metric per model (percent, 95% CI), the granularity groups side by side; one panel per metric."""
    by = {(r["subject"], r["dataset"], r["metric"]): r for r in stats if r[PROMPT] == prompt and _complete(r)}
    panels = metrics or ["TI"]
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(max(6.0, (1.2 + 0.5 * len(models)) * len(panels)), 3.8),
        dpi=110,
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    width = 0.7 / max(len(groups), 1)
    drawn: dict[str, object] = {}  # group -> a handle for the legend
    for ax, metric in zip(axes[0], panels):
        for g_i, group in enumerate(groups):
            xs, ys, lo, hi = [], [], [], []
            for m_i, model in enumerate(models):
                r = by.get((model, group, metric))
                if r:
                    xs.append(m_i + (g_i - (len(groups) - 1) / 2) * width)
                    ys.append(100 * r["estimate"])
                    lo.append(100 * (r["estimate"] - r["ci_low"]))
                    hi.append(100 * (r["ci_high"] - r["estimate"]))
            if xs:
                colour = COLOURS[g_i % len(COLOURS)]
                drawn[group] = ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, color=colour, label=group)
        ax.set_title(metric, fontsize=10)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, fontsize=7, rotation=20, ha="right")
        ax.set_xlim(-0.6, max(len(models), 1) - 0.4)
        ax.grid(axis="y", alpha=0.3)
        if not ax.get_legend_handles_labels()[0]:
            _empty(ax, "no estimate with a CI")
    axes[0][0].set_ylabel("percent (mean, 95% CI)")
    if drawn:
        order = [g for g in groups if g in drawn]
        fig.legend(
            [drawn[g] for g in order], order, fontsize=8, loc="outside lower center", ncol=len(order), frameon=False
        )
    _title(fig, f"Each metric per model (prompt {prompt})", demo)
    save_figure(fig, path)


def ss_thresholds_figure(stats: list[dict], models: list[str], prompt: str, demo: bool, path: Path) -> None:
    """The share of a model's predictions whose SS reaches each threshold (all images), with its 95% CI band."""
    by = {
        (r["subject"], r["metric"]): r for r in stats if r[PROMPT] == prompt and r["dataset"] == "all" and _complete(r)
    }
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=110, layout="constrained")
    cuts = [float(t.split("@")[1]) for t in THRESHOLDS]
    for m_i, model in enumerate(models):
        points = [(c, by[(model, t)]) for c, t in zip(cuts, THRESHOLDS) if (model, t) in by]
        if points:
            colour = COLOURS[m_i % len(COLOURS)]
            xs = [c for c, _ in points]
            ax.plot(xs, [100 * r["estimate"] for _, r in points], "o-", color=colour, label=model)
            ax.fill_between(
                xs,
                [100 * r["ci_low"] for _, r in points],
                [100 * r["ci_high"] for _, r in points],
                color=colour,
                alpha=0.15,
                lw=0,
            )
    ax.set_xticks(cuts)
    ax.set_xlabel("SS threshold")
    ax.set_ylabel("predictions with SS at or above it (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper right")
    else:
        _empty(ax, "no SS threshold shares with a CI")
    _title(fig, f"SS at thresholds, all images (prompt {prompt})", demo)
    save_figure(fig, path)


def outcome_counts(predictions: pa.Table, prompt: str) -> dict[str, dict[str, int]]:
    """Per model, its predictions under `prompt` of each outcome."""
    main = predictions.filter(pc.equal(predictions.column("prompt_id"), prompt))
    counts: dict[str, dict[str, int]] = {}
    for r in main.group_by(["subject", "outcome"]).aggregate([("image_id", "count")]).to_pylist():
        counts.setdefault(r["subject"], {})[r["outcome"]] = r["image_id_count"]
    return counts


def outcomes_figure(counts: dict[str, dict[str, int]], models: list[str], prompt: str, demo: bool, path: Path) -> None:
    """Each model's predictions as shares of the outcomes, one stacked bar per model."""
    fig, ax = plt.subplots(figsize=(6.4, max(2.6, 0.45 * len(models) + 1.8)), dpi=110, layout="constrained")
    shown = [m for m in models if sum(counts.get(m, {}).values())]
    present = [name for name in OUTCOME_NAMES if any(counts[m].get(name) for m in shown)]
    for y, model in enumerate(shown):
        total, left = sum(counts[model].values()), 0.0
        for name in present:
            share = 100 * counts[model].get(name, 0) / total
            ax.barh(y, share, left=left, color=OUTCOME_COLOURS[name], label=name if y == 0 else None)
            left += share
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels(shown, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the model's predictions (%)")
    if shown:
        fig.legend(fontsize=8, loc="outside lower center", ncol=len(present), frameon=False)
    else:
        _empty(ax, "no predictions")
    _title(fig, f"Outcomes per model (prompt {prompt})", demo)
    save_figure(fig, path)


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
    }
    columns = ["a", "b", "dataset", "metric", PROMPT, "difference", "ci_low", "ci_high", "p", "q", "significant"]
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
    # Each metric beside its accepted-name form (scored when some label has accepted names).
    shown = [name for m in metrics for name in (m, f"{m}_accepted") if any(r["metric"] == name for r in stats)]
    # SS as the authors' code reports it: the share of predictions at or above 0.5 ... 0.9 and their average.
    shares = [m for m in (*THRESHOLDS, "ss@avg") if any(r["metric"] == m for r in stats)]
    outcome_metrics = [f"outcome:{o}" for o in OUTCOMES if any(r["metric"] == f"outcome:{o}" for r in stats)]
    n = study.statistics.n_resamples
    comparisons = tables["comparisons"]
    open_closed = (
        comparisons.filter(pc.equal(comparisons.column("family"), "open-vs-closed"))
        if comparisons.num_rows
        else comparisons
    )
    images, responses = tables["images"], tables["responses"]
    metrics_figure(stats, models, groups, metrics, main, study.demo, run.file(*FIGURES["metrics"].split("/")))
    ss_thresholds_figure(stats, models, main, study.demo, run.file(*FIGURES["ss_thresholds"].split("/")))
    counts = outcome_counts(tables["predictions"], main)
    outcomes_figure(counts, models, main, study.demo, run.file(*FIGURES["outcomes"].split("/")))
    page = render(
        TEMPLATES,
        "openworld_report.html",
        title=f"{study.name}: vlm_decade report",
        heading=f"{study.name} (Study B: open-world classification)",
        failed_rows=run_failures(run.manifest()),
        study=study,
        models=models,
        metrics=metrics,
        n_images=images.num_rows,
        n_datasets=len(set(images.column("dataset").to_pylist())),
        no_judge=no_judge or "no judge answers",
        sample_size=report_samples.SAMPLE_SIZE,
        accepted=len(shown) > len(metrics),
        main=_matrix(stats, models, groups, shown, main),
        per_dataset=_matrix(stats, models, datasets, shown, main) if datasets else None,
        grouped=_by_variable(all_rows["stats"], models, shown, main),
        shares=_by_group(stats, models, groups, shares, main) if shares else None,
        figures=FIGURES,
        open_closed=grid(
            open_closed.filter(pc.equal(open_closed.column(PROMPT), main)),
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
            {"p": lambda v, r: f"{v:.3g}", "q": lambda v, r: f"{v:.3g}"},
        ),
        prompts=[(p, _matrix(stats, models, ["all"], metrics, p.id)) for p in study.prompts],
        predictions=_prediction_samples(tables, study),
        responses=responses.num_rows,
        failed=pc.sum(pc.not_equal(responses.column("status"), "ok")).as_py() or 0,
        csvs=write_csvs(run, all_rows, ("stats", "comparisons", "paired_tests", "predictions", "responses")),
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
        needs_ray=False,
    )


def redraw(folder: RunFolder, study: OpenWorldStudyConfig, no_judge: str | None) -> list[str]:
    """Write report.html again from a run folder; returns the tables it needs and lacks (then nothing is written)."""
    missing = [n for n in REPORT_TABLES if not folder.has(n)]
    if not missing:
        write_openworld_report(folder, study, {n: folder.read(n) for n in REPORT_TABLES}, no_judge)
    return missing
