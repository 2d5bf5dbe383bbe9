"""The report: `report.html` beside the tables, its figures drawn from the run's tables, and CSVs.

The main figure has the shape of the paper's figure 4b: mean similarity to the gold standard per
model with bootstrap CIs, datasets side by side, and the top- and bottom-ranked humans drawn as
bands. A demo run says on the page that its human data were written for the demo.

The page stays a few MB at any number of images: figures and statistics tables, and per image only
a sample (each model's worst and best images, thumbnails embedded); `vlm-decade view` shows the rest.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.runfolder import RunFolder, atomic_write_bytes, safe_name
from vlm_decade.core.runner import Stage
from vlm_decade.report.figures import COLOURS, save_figure
from vlm_decade.report.html import html_table, page_start, write_csvs
from vlm_decade.report.samples import extremes, thumbnail_img, view_note
from vlm_decade.stats import format_p
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.decade.metric_validation import agreement_summary, write_validation_figure
from vlm_decade.studies.decade.ranking import vote_ties
from vlm_decade.studies.decade.taxonomy.report import taxonomy_section

# Part of the report stage's settings: bump it when the page changes, so existing runs redraw it.
REPORT_FORMAT = 7
# The tables every report draws from, and those it adds a section for when the run has them.
REPORT_TABLES = ("images", "references", "responses", "scores", "stats", "comparisons")
OPTIONAL_TABLES = ("metric_validation", "stsb", "detections", "errors", "spatial", "hand_agreement", "error_stats",
                   "error_comparisons", "impact_stats", "impact_comparisons")
FAILED_SHOWN = 20  # failed responses listed on the page; the view lists them all
HUMAN_BANDS = {"human:top": ("top-ranked humans", 0.25), "human:bottom": ("bottom-ranked humans", 0.12)}


def _complete(r: dict | None) -> bool:
    """A stats row with an estimate and both CI ends (a budget stop can leave them null)."""
    return r is not None and all(r[k] is not None and not math.isnan(r[k]) for k in ("estimate", "ci_low", "ci_high"))


def similarity_figure(stats: pa.Table, study: StudyConfig, metric: str, path: Path) -> None:
    """Figure 4b's shape for one metric, from the `stats` table; rows without an estimate or CI are left out."""
    rows = [r for r in stats.to_pylist() if r["metric"] == metric and r["variant"] == "full" and _complete(r)]
    datasets = sorted({r["dataset"] for r in rows})
    models = [m.name for m in study.models if any(r["subject"] == m.name for r in rows)]
    era = {m.name: m.era for m in study.models}
    by_key = {(r["subject"], r["dataset"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(max(4.5, 1.3 * len(models) + 2.5), 4.2), dpi=120)
    width = 0.7 / max(len(datasets), 1)
    for d_i, dataset in enumerate(datasets):
        colour = COLOURS[d_i % len(COLOURS)]
        for subject, (label, alpha) in HUMAN_BANDS.items():
            r = by_key.get((subject, dataset))
            if r:
                ax.axhspan(r["ci_low"], r["ci_high"], color=colour, alpha=alpha, lw=0)
                ax.axhline(r["estimate"], color=colour, lw=1, ls="--" if subject == "human:bottom" else "-")
                ax.annotate(f"{label} ({dataset})", (max(len(models), 1) - 0.45, r["estimate"]), fontsize=7, color=colour, va="bottom", ha="right")
        xs, ys, lo, hi = [], [], [], []
        for m_i, model in enumerate(models):
            r = by_key.get((model, dataset))
            if r:
                xs.append(m_i + (d_i - (len(datasets) - 1) / 2) * width)
                ys.append(r["estimate"])
                lo.append(r["estimate"] - r["ci_low"])
                hi.append(r["ci_high"] - r["estimate"])
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", color=colour, capsize=3, label=dataset)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([f"{m}\n({era[m]})" if era[m] else m for m in models], fontsize=8)
    ax.set_xlim(-0.6, max(len(models), 1) - 0.4)
    ax.set_ylabel(f"{metric} to gold standard (mean, 95% CI)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title="dataset", fontsize=8, loc="lower left")
    else:
        ax.text(0.5, 0.5, "no model has an estimate with a CI", transform=ax.transAxes, ha="center", va="center", color="#777")
    ax.grid(axis="y", alpha=0.3)
    title = f"Similarity to the gold standard ({metric})"
    ax.set_title(title + ("\nDEMO DATA: not a finding" if study.demo else ""), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def _metric_validation(run: RunFolder, study: StudyConfig, summary: pa.Table) -> str:
    """Each metric's agreement with the human raters against the inter-rater ceiling (figure A.1a's shape)."""
    write_validation_figure(summary, run.root / "figures" / "metric_validation.png", demo=study.demo)
    n = study.statistics.n_resamples
    note = " These ratings were simulated for the demo." if study.demo else ""
    reference = {"pairwise": "the mean correlation between two raters (the paper's test)",
                 "leave-one-out": "each rater against the mean of the others"}[study.validation.ceiling]
    return (
        "<h2>The metrics against human ratings</h2><p class='note'>Correlation of each metric with each rater, "
        f"averaged over raters, against {reference}; p and q test the difference from it, over all rated pairs "
        f"(subject \"all\") and, as the paper's figure A.1a, for each rated model (docs/metrics.md).{note} "
        f"{html.escape(agreement_summary(summary, [j.name for j in study.judge_metrics]))}</p>"
        "<img src='figures/metric_validation.png' alt='metric validation against human ratings'>"
        + html_table(
            summary,
            [c for c in ("subject",) if c in summary.column_names]
            + ["metric", "kind", "role", "estimate", "ci_low", "ci_high", "difference", "p", "q", "n_raters", "n_pairs"],
            {"p": lambda v, r: "" if v is None else format_p(v, n), "q": lambda v, r: "" if v is None else format_p(v, n),
             "difference": lambda v, r: "" if v is None else f"{v:.3f}"},
        )
    )


def sample_metric(study: StudyConfig, scores: pa.Table) -> str | None:
    """The metric the report's per-image samples rank by: the taxonomy's, else the first one scored."""
    scored = sorted(set(scores.column("metric").to_pylist()))
    return study.taxonomy_metric if study.taxonomy_metric in scored else (scored[0] if scored else None)


def samples(tables: dict[str, pa.Table], study: StudyConfig) -> tuple[str | None, dict[str, tuple[list[dict], list[dict]]]]:
    """Per model, its worst and best full images by `sample_metric`: the only per-image rows the report shows."""
    scores = tables["scores"]
    metric = sample_metric(study, scores)
    if metric is None:
        return None, {}
    full = scores.filter(pc.and_(pc.equal(scores.column("variant"), "full"), pc.equal(scores.column("metric"), metric)))
    rows: dict[str, list[dict]] = {}
    for r in full.select(["subject", "image_id", "dataset", "value"]).to_pylist():
        rows.setdefault(r["subject"], []).append(r)
    return metric, {m.name: extremes(sorted(rows.get(m.name, []), key=lambda r: r["image_id"]), "value") for m in study.models}


def sampled_ids(picked: dict[str, tuple[list[dict], list[dict]]]) -> list[str]:
    return sorted({r["image_id"] for low, high in picked.values() for r in low + high})


def only_images(table: pa.Table, ids: list[str]) -> pa.Table:
    return table.filter(pc.is_in(table.column("image_id"), value_set=pa.array(ids, pa.string())))


def _examples(tables: dict[str, pa.Table], study: StudyConfig, metric: str | None, picked: dict[str, tuple[list[dict], list[dict]]]) -> str:
    """Each model's worst and best images: thumbnail, its full-image description, the gold standard and the similarity."""
    if metric is None:
        return "<h2>Descriptions</h2><p class='note'>No scores in this run, so no images to show.</p>"
    ids = sampled_ids(picked)
    references = only_images(tables["references"], ids).to_pylist()
    gold = {r["image_id"]: r["text"] for r in references if r["role"] == "gold" and r["condition"] == "full"}
    said = {(r["subject"], r["image_id"]): r["text"] for r in only_images(tables["responses"], ids).to_pylist()
            if r["variant"] == "full" and r["status"] == "ok"}
    path_of = {r["image_id"]: r["path"] for r in only_images(tables["images"], ids).to_pylist()}
    thumbs = {i: thumbnail_img(path_of.get(i), i) for i in ids}
    parts = [f"<h2>Descriptions</h2><p class='note'>Each model's worst and best images by {html.escape(metric)} to the gold standard "
             "(full image).</p>"]
    for model in study.models:
        low, high = picked.get(model.name, ([], []))
        if not low:
            parts.append(f"<h3>{html.escape(model.name)}</h3><p class='note'>No {html.escape(metric)} scores for this model.</p>")
            continue
        for title, rows in ((f"{model.name}: lowest {metric}", low), (f"{model.name}: highest {metric}", high)):
            if not rows:
                continue
            body = "".join(
                f"<tr><td>{thumbs[r['image_id']]}</td><td>{html.escape(r['image_id'])}<br><span class='note'>{html.escape(r['dataset'])}</span></td>"
                f"<td>{r['value']:.3f}</td><td>{html.escape(said.get((model.name, r['image_id']), '(no description)'))}</td>"
                f"<td>{html.escape(gold.get(r['image_id'], ''))}</td></tr>"
                for r in rows
            )
            parts.append(
                f"<h3>{html.escape(title)}</h3><table class='sample' data-model='{html.escape(model.name)}'><thead><tr><th></th><th>image</th>"
                f"<th>{html.escape(metric)}</th><th>the model said</th><th>gold standard (human)</th></tr></thead><tbody>{body}</tbody></table>"
            )
    return "".join(parts)


def _failed_responses(responses: pa.Table, shown: int = FAILED_SHOWN) -> str:
    """How many responses failed, per model, and the first few of them."""
    failed = responses.filter(pc.not_equal(responses.column("status"), "ok"))
    parts = [f"<h2>Responses</h2><p class='note'>{responses.num_rows} responses, {failed.num_rows} failed.</p>"]
    if failed.num_rows:
        counts = failed.group_by("subject").aggregate([("image_id", "count")]).rename_columns(["subject", "failed"]).sort_by("subject")
        parts.append(html_table(counts, ["subject", "failed"]))
        if failed.num_rows > shown:
            parts.append(f"<p class='note'>The first {shown}; the view's model pages list every failed response.</p>")
        parts.append(html_table(failed.slice(0, shown), ["subject", "image_id", "variant", "error"]))
    return "".join(parts)


def _ranking_ties(references: pa.Table, study: StudyConfig) -> str:
    """How many role cuts of the vote ranking fell between descriptions the votes could not tell apart."""
    ties = vote_ties(references.to_pylist())
    if not ties["images"]:
        return ""
    return (
        f"<p class='note'>{ties['tied']} of {ties['cuts']} role cuts (gold | top | other | bottom) over {ties['images']} "
        f"vote-ranked images fell between descriptions with equal votes and win rates, {ties['gold_tied']} of them choosing "
        f"the gold standard; a seeded draw decided them (ranking.seed {study.ranking.seed}; docs/data-format.md).</p>"
    )


def write_report(run: RunFolder, study: StudyConfig, tables: dict[str, pa.Table]) -> None:
    metrics = sorted(set(tables["stats"].column("metric").to_pylist()))
    for metric in metrics:
        similarity_figure(tables["stats"], study, metric, run.file("figures", f"similarity_{safe_name(metric)}.png"))
    manifest = run.manifest()
    parts = [page_start(f"{study.name}: vlm_decade report", study.name)]
    if study.demo:
        parts.append(
            "<p class='demo'><b>Demo data.</b> The photos are real (they ship with scikit-image), but the human "
            "descriptions, masked descriptions and imported captions were written for this demo and the ranking "
            "votes were simulated. These numbers show what the tool computes; they are not findings about people "
            "or models.</p>"
        )
    images = tables["images"]
    parts.append(
        f"<p class='note'>{images.num_rows} images in {len(set(images.column('dataset').to_pylist()))} datasets; "
        f"{len(study.models)} models; {study.statistics.n_resamples:,} bootstrap resamples over images "
        f"(seed {study.statistics.seed}); config hash <code>{manifest.get('config_hash', '')[:12]}</code>.</p>"
    )
    parts.append(view_note())
    ranking = manifest.get("ranking_method", {})
    consensus = sorted(d for d, m in ranking.items() if m == "consensus")
    parts.append("<h2>Gold standard</h2><ul>")
    for dataset, method in sorted(ranking.items()):
        how = "chosen by ranking votes" if method == "votes" else "no votes: consensus rule (the description most similar to the others)"
        parts.append(f"<li>{html.escape(dataset)}: {how}</li>")
    parts.append("</ul>")
    if consensus:
        parts.append(f"<p class='note'>Datasets without votes ({', '.join(consensus)}) use the consensus fallback; see docs/data-format.md.</p>")
    parts.append(_ranking_ties(tables["references"], study))

    parts.append("<h2>Similarity to the gold standard</h2>")
    for metric in metrics:
        parts.append(f"<img src='figures/similarity_{html.escape(safe_name(metric))}.png' alt='{html.escape(metric)} per model and dataset'>")
    parts.append(
        html_table(
            tables["stats"].sort_by([("metric", "ascending"), ("subject", "ascending"), ("dataset", "ascending")]),
            ["subject", "dataset", "metric", "variant", "estimate", "ci_low", "ci_high", "n_images"],
        )
    )
    if tables["comparisons"].num_rows:
        parts.append("<h2>Comparisons</h2><p class='note'>Two-sided bootstrap p; q = Benjamini-Hochberg within each family.</p>")
        n = study.statistics.n_resamples
        parts.append(
            html_table(
                tables["comparisons"],
                ["family", "a", "b", "dataset", "metric", "difference", "ci_low", "ci_high", "p", "q", "significant"],
                {"p": lambda v, r: format_p(v, n), "q": lambda v, r: format_p(v, n)},
            )
        )
    if "metric_validation" in tables:
        parts.append(_metric_validation(run, study, tables["metric_validation"]))
    if "stsb" in tables:
        parts.append(
            "<h2>The metrics against STS-B's human ratings</h2><p class='note'>Real human similarity ratings "
            "(STS-B test split, and its photo-caption pairs), through the same encoder and metric code as this study: "
            "Spearman correlation with a bootstrap CI over sentence pairs (docs/metrics.md).</p>"
        )
        parts.append(html_table(tables["stsb"], ["label", "subset", "n_pairs", "spearman", "ci_low", "ci_high"]))
    metric, picked = samples(tables, study)
    if "errors" in tables:
        # Per-image parts of the error section (heat maps, examples, errors.html) cover the sampled images.
        ids = sampled_ids(picked)
        per_image = {n: only_images(tables[n], ids) for n in ("errors", "spatial", "references", "responses")}
        parts.append(taxonomy_section(run, study, {**tables, **per_image}))
    parts.append(_examples(tables, study, metric, picked))
    parts.append(_failed_responses(tables["responses"]))
    parts.append(write_csvs(run.root, tables, ("stats", "comparisons", "scores", "responses")))
    atomic_write_bytes(run.root / "report.html", "\n".join(parts).encode("utf-8"))


def stage(study: StudyConfig, data, made: list[str]) -> Stage:
    """report.html from the tables every report draws, and those of `made` it has a section for."""
    tables = REPORT_TABLES + tuple(n for n in OPTIONAL_TABLES if n in made)
    return Stage(
        "report",
        tables,
        {"demo": study.demo, "ranking": data.ranking_method, "format": REPORT_FORMAT},
        lambda run: write_report(run.folder, study, {n: run.table(n) for n in tables}) or {},
        outputs=(),
        files=("report.html",),
    )


def redraw(folder: RunFolder, study: StudyConfig) -> list[str]:
    """Write report.html again from a run folder; returns the tables it needs and lacks (then nothing is written)."""
    missing = [n for n in REPORT_TABLES if not folder.has(n)]
    if not missing:
        names = list(REPORT_TABLES) + [n for n in OPTIONAL_TABLES if folder.has(n)]
        write_report(folder, study, {n: folder.read(n) for n in names})
    return missing
