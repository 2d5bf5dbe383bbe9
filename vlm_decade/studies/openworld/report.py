"""Study B's report: the paper's main table (TI, LI, SS, CS per model and granularity group, with
bootstrap CIs), the open/closed gap, the error-type breakdown with examples, the prompt ablation, and
per model a bounded sample of its predictions (lowest and highest CS, thumbnails embedded), so the
page stays a few MB at any number of images; `vlm-decade view` shows every prediction."""

from __future__ import annotations

import html
import math

import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.files import atomic_write_bytes
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage
from vlm_decade.report.html import html_table, page_start, write_csvs
from vlm_decade.report.samples import extremes, thumbnail_img, view_note
from vlm_decade.stats import format_p
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.scoring import METRICS

# Bump when the page changes, so existing runs redraw it.
REPORT_FORMAT = 2
REPORT_TABLES = ("images", "labels", "responses", "predictions", "stats", "comparisons")
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


def _matrix(stats: list[dict], models: list[str], groups: list[str], metrics: list[str], variant: str, label) -> str:
    by = {(r["subject"], r["dataset"], r["metric"], r["variant"]): r for r in stats}
    head = "<th>model</th>" + "".join(f"<th>{html.escape(g)}<br>{html.escape(label(m))}</th>" for g in groups for m in metrics)
    body = "".join(
        f"<tr><td>{html.escape(model)}</td>"
        + "".join(f"<td>{_cell(by.get((model, g, m, variant)))}</td>" for g in groups for m in metrics)
        + "</tr>"
        for model in models
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _prediction_samples(tables: dict[str, pa.Table], study: OpenWorldStudyConfig) -> str:
    """Each model's lowest- and highest-CS predictions under the main prompt, with the image."""
    predictions = tables["predictions"]
    main = predictions.filter(pc.equal(predictions.column("prompt_id"), study.prompts[0].id))
    columns = ["subject", "image_id", "dataset", "granularity", "label", "prediction", "TI", "LI", "SS", "CS", "outcome"]
    by_model: dict[str, list[dict]] = {}
    for r in main.select(columns).to_pylist():
        by_model.setdefault(r["subject"], []).append(r)
    picked = {m.name: extremes(sorted(by_model.get(m.name, []), key=lambda r: r["image_id"]), "CS") for m in study.models}
    ids = sorted({r["image_id"] for low, high in picked.values() for r in low + high})
    images = tables["images"]
    path_of = {r["image_id"]: r["path"] for r in images.filter(pc.is_in(images.column("image_id"), value_set=pa.array(ids, pa.string()))).to_pylist()}
    thumbs = {i: thumbnail_img(path_of.get(i), i) for i in ids}
    parts = ["<h2>Predictions</h2><p class='note'>Each model's predictions with the lowest and the highest CS (main prompt).</p>"]
    for model in study.models:
        low, high = picked[model.name]
        if not low:
            parts.append(f"<h3>{html.escape(model.name)}</h3><p class='note'>No scored predictions.</p>")
            continue
        for title, rows in ((f"{model.name}: lowest CS", low), (f"{model.name}: highest CS", high)):
            if not rows:
                continue
            body = "".join(
                f"<tr><td>{thumbs[r['image_id']]}</td><td>{html.escape(r['image_id'])}<br><span class='note'>{html.escape(r['dataset'])}, "
                f"{html.escape(r['granularity'] or '')}</span></td><td>{html.escape(r['label'] or '')}</td><td>{html.escape(r['prediction'] or '')}</td>"
                + "".join(f"<td>{'' if r[m] is None else (f'{r[m]:.0f}' if m in ('TI', 'LI') else f'{r[m]:.3f}')}</td>" for m in METRICS)
                + f"<td>{html.escape(r['outcome'] or '')}</td></tr>"
                for r in rows
            )
            head = "".join(f"<th>{m}</th>" for m in METRICS)
            parts.append(f"<h3>{html.escape(title)}</h3><table class='sample' data-model='{html.escape(model.name)}'><thead><tr><th></th>"
                         f"<th>image</th><th>label</th><th>prediction</th>{head}<th>outcome</th></tr></thead><tbody>{body}</tbody></table>")
    return "".join(parts)


def _per_dataset(stats: list[dict], models: list[str], metrics: list[str], variant: str) -> str:
    """Each dataset's own estimates (the main prompt), as docs/openworld-data.md promises."""
    datasets = sorted({r["dataset"] for r in stats} - set(GROUPS))
    if not datasets:
        return ""
    return "<h3>Per dataset</h3>" + _matrix(stats, models, datasets, metrics, variant, lambda m: m)


def _ss_shares(stats: list[dict], models: list[str], groups: list[str], variant: str) -> str:
    """SS as the authors' code reports it: the share of predictions at or above 0.5 ... 0.9 and their average."""
    names = [m for m in ("ss@0.5", "ss@0.6", "ss@0.7", "ss@0.8", "ss@0.9", "ss@avg") if any(r["metric"] == m for r in stats)]
    if not names:
        return ""
    return ("<h3>SS at thresholds</h3><p class='note'>Share of predictions whose SS reaches each threshold, and the average "
            "of those shares (percent).</p>" + _matrix(stats, models, groups, names, variant, lambda m: m))


def _comparison_section(comparisons: pa.Table, family: str, title: str, note: str, n_resamples: int) -> str:
    rows = comparisons.filter(pc.equal(comparisons.column("family"), family)) if comparisons.num_rows else comparisons
    if not rows.num_rows:
        return ""
    fmt = {"p": lambda v, r: "" if v is None else format_p(v, n_resamples), "q": lambda v, r: "" if v is None else format_p(v, n_resamples),
           "significant": lambda v, r: "" if v is None else ("yes" if v else "no")}
    return (f"<h2>{html.escape(title)}</h2><p class='note'>{html.escape(note)}</p>"
            + html_table(rows, ["a", "b", "dataset", "metric", "variant", "difference", "ci_low", "ci_high", "p", "q", "significant"], fmt))


def write_openworld_report(run: RunFolder, study: OpenWorldStudyConfig, tables: dict[str, pa.Table], no_judge: str | None = None) -> None:
    """`no_judge` says why LI was skipped, when it was."""
    stats = tables["stats"].to_pylist()
    predictions = tables["predictions"]
    main = study.prompts[0].id
    models = [m.name for m in study.models]
    present_groups = {r["dataset"] for r in stats}
    groups = [g for g in GROUPS if g in present_groups]
    metrics = [m for m in METRICS if any(r["metric"] == m for r in stats)]
    n = study.statistics.n_resamples
    parts = [page_start(f"{study.name}: vlm_decade report", f"{study.name} (Study B: open-world classification)")]
    if study.demo:
        parts.append(
            "<p class='demo'><b>Demo.</b> The photos and their labels are real (ImageNet and CIFAR-10 samples that ship with "
            "foolbox; class names from clip-benchmark), but the \"models\" are offline stand-ins: a COCO detector's top label "
            "and an ImageNet classifier, not LMMs. The numbers show what the tool computes; they are no findings about LMMs.</p>"
        )
    images = tables["images"]
    parts.append(
        f"<p class='note'>{images.num_rows} images in {len(set(images.column('dataset').to_pylist()))} datasets; {len(models)} models; "
        f"{n:,} bootstrap resamples over images (seed {study.statistics.seed}). Values are percentages (SS and CS: cosine x 100) "
        f"with 95% CIs; prompt: <code>{html.escape(study.prompts[0].text)}</code>.</p>"
    )
    if "LI" not in metrics:
        why = html.escape(no_judge or "no judge answers")
        parts.append(f"<p class='note'><b>LI was not computed:</b> {why}. The error types need LI, so they are not shown either.</p>")
    parts.append(view_note())
    parts.append("<h2>Main table</h2><p class='note'>As the paper's table: within each granularity group the mean of its "
                 "datasets' means (each dataset bootstrapped on its own images, the group's resamples the mean of theirs); "
                 "<code>all</code> is the mean over every dataset (docs/openworld.md).</p>")
    parts.append(_matrix(stats, models, groups, metrics, main, lambda m: m))
    parts.append(_per_dataset(stats, models, metrics, main))
    parts.append(_ss_shares(stats, models, groups, main))
    comparisons = tables["comparisons"]
    open_closed = comparisons.filter(pc.equal(comparisons.column("family"), "open-vs-closed")) if comparisons.num_rows else comparisons
    if open_closed.num_rows:
        parts.append("<h2>Open-world against closed-world</h2><p class='note'>Mean of the open-world models minus the mean of the "
                     "closed-world baselines (which were given the class list); two-sided bootstrap p, BH q.</p>")
        parts.append(
            html_table(
                open_closed.filter(pc.equal(open_closed.column("variant"), main)),
                ["a", "b", "dataset", "metric", "difference", "ci_low", "ci_high", "p", "q"],
                {"p": lambda v, r: format_p(v, n), "q": lambda v, r: format_p(v, n)},
            )
        )
    outcome_metrics = [f"outcome:{o}" for o in OUTCOMES if any(r["metric"] == f"outcome:{o}" for r in stats)]
    if outcome_metrics:
        parts.append("<h2>Error types</h2><p class='note'>" + "; ".join(html.escape(v) for v in OUTCOMES.values()) +
                     f". Thresholds: CS &ge; {study.scoring.cs_high}, LI &ge; {study.scoring.li_high} (docs/openworld-metrics.md).</p>")
        parts.append(_matrix(stats, models, groups, outcome_metrics, main, lambda m: m.split(":", 1)[1]))
        for name, meaning in OUTCOMES.items():
            examples = predictions.filter(pc.equal(predictions.column("outcome"), name)).slice(0, 5)
            if examples.num_rows:
                parts.append(f"<h3>{html.escape(meaning)}</h3>")
                parts.append(html_table(examples, ["subject", "image_id", "label", "prediction", "CS", "LI", "best_concept", "judge_answer"],
                                        {"LI": lambda v, r: "" if v is None else f"{v:.0f}"}))
    parts.append(_comparison_section(comparisons, "model-vs-model", "Model against model",
                                     "Each pair of models under the main prompt, per group; BH q within each group family and metric.", n))
    if len(study.prompts) > 1:
        parts.append(_comparison_section(comparisons, "prompt-ablation", "Prompt ablation: differences from the main prompt",
                                         "Each open-world model's mean under a prompt minus its mean under the main prompt, per "
                                         "group; one BH family across prompts, per metric.", n))
        parts.append("<h2>Prompt ablation</h2><p class='note'>All images; one column per prompt and metric. Prompts: "
                     + "; ".join(f"<b>{html.escape(p.id)}</b>: {html.escape(p.text)}" for p in study.prompts) + "</p>")
        for prompt in study.prompts:
            parts.append(f"<h3>{html.escape(prompt.id)}</h3>")
            parts.append(_matrix(stats, models, ["all"], metrics, prompt.id, lambda m: m))
    parts.append(_prediction_samples(tables, study))
    responses = tables["responses"]
    failed = pc.sum(pc.not_equal(responses.column("status"), "ok")).as_py() or 0
    parts.append(f"<p class='note'>{responses.num_rows} responses, {failed} failed.</p>")
    parts.append(write_csvs(run.root, tables, ("stats", "comparisons", "predictions", "responses")))
    atomic_write_bytes(run.root / "report.html", "\n".join(parts).encode("utf-8"))


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
