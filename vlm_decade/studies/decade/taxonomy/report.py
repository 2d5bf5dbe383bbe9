"""The error-analysis section of Study A's report: figures shaped like the paper's 5-6 (error rates
by model and dataset with CIs), 7a (heat maps of the regions that matter), 7b (all error rates at a
glance) and 8 (similarity by error type against pairs with no error), the comparisons, the
agreement with hand labels, and `errors.html`, the evidence behind every label."""

from __future__ import annotations

import html
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pyarrow as pa

from vlm_decade.core.runfolder import RunFolder, atomic_write_bytes
from vlm_decade.report.figures import COLOURS, save_figure
from vlm_decade.report.html import html_table, page_start
from vlm_decade.stats import format_p
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.decade.taxonomy.analysis import ERROR_TYPES, NO_ERROR

EVIDENCE_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1em}table{border-collapse:collapse;font-size:12px}"
    "td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}code{white-space:pre-wrap}"
    "tr.yes{background:#fde2e2}tr.undecided{background:#eee}"
)
NAMES = {
    "detection": "detection",
    "recognition": "recognition",
    "scene_understanding": "scene understanding",
    "hallucination": "hallucination",
    "spatial_dependence": "spatial dependence (SDE)",
}


def error_rate_figure(stats: list[dict], study: StudyConfig, path: Path) -> None:
    """Figures 5-6 and 7b's shape: one panel per error type, each model's rate per dataset with CIs."""
    models = [m.name for m in study.models]
    datasets = sorted({r["dataset"] for r in stats})
    by = {(r["subject"], r["dataset"], r["metric"]): r for r in stats}
    fig, axes = plt.subplots(1, len(ERROR_TYPES), figsize=(3.2 * len(ERROR_TYPES), 3.6), dpi=110, sharey=True)
    width = 0.7 / max(len(datasets), 1)
    for ax, error_type in zip(axes, ERROR_TYPES):
        for d_i, dataset in enumerate(datasets):
            xs, ys, lo, hi = [], [], [], []
            for m_i, model in enumerate(models):
                r = by.get((model, dataset, error_type))
                if r:
                    xs.append(m_i + (d_i - (len(datasets) - 1) / 2) * width)
                    ys.append(r["estimate"])
                    lo.append(r["estimate"] - r["ci_low"])
                    hi.append(r["ci_high"] - r["estimate"])
            ax.bar(xs, ys, width=width, yerr=[lo, hi], capsize=2, color=COLOURS[d_i % len(COLOURS)], label=dataset)
        ax.set_title(NAMES[error_type], fontsize=9)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, fontsize=7, rotation=30, ha="right")
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("share of images with the error (95% CI)")
    axes[0].legend(title="dataset", fontsize=7)
    fig.suptitle("Error rates by model and dataset" + (" (DEMO DATA: not a finding)" if study.demo else ""), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def impact_figure(stats: list[dict], metric: str, demo: bool, path: Path) -> None:
    """Figure 8's shape: mean similarity of the pairs with each error type; dashed: pairs with none."""
    groups = [f"error:{t}" for t in ERROR_TYPES if any(r["subject"] == f"error:{t}" for r in stats)]
    by = {r["subject"]: r for r in stats}
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    ys = [by[g]["estimate"] for g in groups]
    err = [[by[g]["estimate"] - by[g]["ci_low"] for g in groups], [by[g]["ci_high"] - by[g]["estimate"] for g in groups]]
    ax.bar(range(len(groups)), ys, yerr=err, capsize=3, color="#7f7f7f")
    if NO_ERROR in by:
        none = by[NO_ERROR]
        ax.axhline(none["estimate"], ls="--", color="k", lw=1, label=f"no error ({none['estimate']:.2f}, {none['n_images']} images)")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(groups)))
    # With few images a group's CI and p mean little: the counts are on the axis.
    ax.set_xticklabels([f"{NAMES[g.split(':', 1)[1]]}\n({by[g]['n_images']} images)" for g in groups], fontsize=8, rotation=20, ha="right")
    ax.set_ylabel(f"{metric} to gold (mean, 95% CI)")
    ax.set_title("Similarity by error type" + ("\nDEMO DATA: not a finding" if demo else ""), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def heatmap_files(run: RunFolder, study: StudyConfig, images: pa.Table, spatial: pa.Table) -> list[tuple[str, str]]:
    """Figure 7a: one heat map per image with masked descriptions; (image_id, relative path)."""
    from vlm_decade.imaging.decode import load_rgb
    from vlm_decade.imaging.masks import mask_specs
    from vlm_decade.studies.decade.taxonomy.heatmaps import write_heatmap
    from vlm_decade.studies.decade.taxonomy.spatial import HUMANS, importance

    specs = mask_specs(study.masks)
    path_of = dict(zip(images.column("image_id").to_pylist(), images.column("path").to_pylist()))
    panels: dict[str, dict[str, list[float]]] = {}
    for r in spatial.to_pylist():
        if r["sde"] is not None:  # both profiles complete
            profile = panels.setdefault(r["image_id"], {HUMANS: importance(r["human_profile"])})
            profile[r["subject"]] = importance(r["model_profile"])
    out = []
    for image_id, profiles in sorted(panels.items()):
        rel = f"figures/heatmaps/{image_id}.png"
        rgb, _ = load_rgb(path_of[image_id])
        write_heatmap(rgb, specs, profiles, run.root / rel, title=image_id)
        out.append((image_id, rel))
    return out


def _evidence_page(run: RunFolder, study: StudyConfig, errors: pa.Table) -> None:
    rows = []
    for r in errors.to_pylist():
        state = "undecided" if r["present"] is None else ("yes" if r["present"] else "no")
        evidence = json.loads(r["evidence"])
        rows.append(
            f"<tr class='{state}'><td>{html.escape(r['subject'])}</td><td>{html.escape(r['image_id'])}</td>"
            f"<td>{html.escape(NAMES[r['error_type']])}</td><td>{state}</td><td>{html.escape(r['method'])}</td>"
            f"<td><code>{html.escape(json.dumps(evidence, indent=1))}</code></td></tr>"
        )
    page = (
        page_start(f"{study.name}: error labels", "Error labels and their evidence", EVIDENCE_STYLE)
        + "<p><a href='report.html'>back to the report</a>. "
        "method: detector (boxes of the taxonomy's detector), probe (the API model's answers to targeted questions), "
        "masks (masked descriptions), hand (a person's label, overriding the automatic one).</p>"
        "<table><thead><tr><th>model</th><th>image</th><th>error type</th><th>present</th><th>method</th><th>evidence</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></body></html>"
    )
    atomic_write_bytes(run.root / "errors.html", page.encode("utf-8"))


def _finding_words(error_type: str, evidence: dict) -> str:
    """The objects behind a label, in a few words: "spoon", "bowl (for saucer)"."""
    if "hand" in evidence:
        return f"hand label: {evidence['hand']}" if evidence["hand"] else "hand label"
    words = []
    for f in evidence["findings"]:
        said = f.get("named_as")
        words.append(f"{said} (for {f['object']})" if error_type == "recognition" and said else str(f.get("object", "")))
    return ", ".join(w for w in words if w)


def examples_table(tables: dict[str, pa.Table], per_type: int = 3) -> str:
    """A few labelled examples of each object error type (the paper's figures 5-6 show examples)."""
    gold = {r["image_id"]: r["text"] for r in tables["references"].to_pylist() if r["role"] == "gold" and r["condition"] == "full"}
    said = {(r["subject"], r["image_id"]): r["text"] for r in tables["responses"].to_pylist() if r["variant"] == "full" and r["status"] == "ok"}
    labels = [r for r in tables["errors"].to_pylist() if r["present"]]
    rows = []
    for error_type in ERROR_TYPES[:-1]:
        present = [r for r in labels if r["error_type"] == error_type][:per_type]
        for r in present:
            words = _finding_words(error_type, json.loads(r["evidence"]))
            rows.append(
                f"<tr><td>{html.escape(NAMES[error_type])}</td><td>{html.escape(r['image_id'])}</td><td>{html.escape(r['subject'])} "
                f"<span class='note'>({html.escape(r['method'])})</span></td><td>{html.escape(words)}</td>"
                f"<td>{html.escape(said.get((r['subject'], r['image_id']), ''))}</td><td>{html.escape(gold.get(r['image_id'], ''))}</td></tr>"
            )
    if not rows:
        return ""
    return (
        "<h3>Examples</h3><table><thead><tr><th>error</th><th>image</th><th>model</th><th>objects</th><th>the model said</th>"
        f"<th>gold standard</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def taxonomy_section(run: RunFolder, study: StudyConfig, tables: dict[str, pa.Table]) -> str:
    figures = run.root / "figures"
    n = study.statistics.n_resamples
    error_stats = tables["error_stats"].to_pylist()
    error_rate_figure(error_stats, study, figures / "error_rates.png")
    impact = tables["impact_stats"].to_pylist()
    if impact:
        impact_figure(impact, study.taxonomy_metric, study.demo, figures / "impact.png")
    heatmaps = heatmap_files(run, study, tables["images"], tables["spatial"])
    _evidence_page(run, study, tables["errors"])
    fmt = {"p": lambda v, r: format_p(v, n), "q": lambda v, r: format_p(v, n)}
    parts = [
        "<h2>Errors</h2><p class='note'>Local and imported models are labelled from the taxonomy detector's boxes, API models "
        "from their answers to probe questions; spatial dependence from the masked descriptions (docs/taxonomy.md, "
        "docs/spatial-dependence.md). Every label and its evidence: <a href='errors.html'>errors.html</a>.</p>",
        "<img src='figures/error_rates.png' alt='error rates by model and dataset'>",
        html_table(tables["error_stats"].sort_by([("metric", "ascending"), ("subject", "ascending"), ("dataset", "ascending")]),
                   ["subject", "dataset", "metric", "estimate", "ci_low", "ci_high", "n_images"]),
    ]
    parts.append(examples_table(tables))
    if tables["error_comparisons"].num_rows:
        parts.append("<h3>Error-rate comparisons</h3>")
        parts.append(html_table(tables["error_comparisons"], ["family", "a", "b", "dataset", "metric", "difference", "p", "q", "significant"], fmt))
    if impact:
        parts.append(f"<h2>Error impact</h2><p class='note'>Mean {html.escape(study.taxonomy_metric)} of the model-image pairs "
                     "that have each error type, against the pairs with none (all datasets pooled; figure 8).</p>")
        parts.append("<img src='figures/impact.png' alt='similarity by error type'>")
        parts.append(html_table(tables["impact_stats"], ["subject", "estimate", "ci_low", "ci_high", "n_images"]))
        if tables["impact_comparisons"].num_rows:
            parts.append(html_table(tables["impact_comparisons"], ["a", "b", "metric", "difference", "ci_low", "ci_high", "p", "q"], fmt))
    if heatmaps:
        parts.append("<h2>Which regions matter</h2><p class='note'>Importance of each masked region (1 - similarity of the masked "
                     "description to the unmasked one) for humans and each model (figure 7a).</p>")
        parts += [f"<div><img src='{rel}' alt='heat map {html.escape(i)}'></div>" for i, rel in heatmaps]
    if tables["hand_agreement"].num_rows:
        parts.append("<h2>Hand labels against automatic labels</h2><p class='note'>Cohen's kappa per error type on the "
                     "labels both have; hand labels override the automatic ones in every figure above.</p>")
        parts.append(html_table(tables["hand_agreement"], ["error_type", "kappa", "observed_agreement", "n"]))
    return "".join(parts)
