"""The error-analysis section of Study A's report: figures shaped like the paper's 5-6 (error rates
by model and dataset with CIs), 7a (heat maps of the regions that matter), 7b (all error rates at a
glance) and 8 (similarity by error type against pairs with no error), the comparisons, the
agreement with hand labels, and `errors.html`, the evidence behind every label."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import pyarrow as pa
import pyarrow.compute as pc
from markupsafe import Markup
from matplotlib.patches import Patch

from vlm_decade.core.files import safe_name
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.report.figures import COLOURS, save_figure
from vlm_decade.report.html import grid, render, write_page
from vlm_decade.stats import format_p
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.decade.taxonomy.analysis import ERROR_TYPES, NO_ERROR

TEMPLATES = Path(__file__).parent / "templates"
EVIDENCE_STYLE = Markup(
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


def _point(r: dict | None) -> tuple[float, float, float] | None:
    """A stats row as (estimate, lower bar, upper bar); None when it has no estimate (a group with no
    decided label, a budget stop). A row with no interval draws its point without a bar."""
    if r is None or r.get("estimate") is None or math.isnan(r["estimate"]):
        return None
    est, lo, hi = r["estimate"], r.get("ci_low"), r.get("ci_high")
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return est, 0.0, 0.0
    return est, max(est - lo, 0.0), max(hi - est, 0.0)


def error_rate_figure(stats: list[dict], study: StudyConfig, path: Path) -> None:
    """Figures 5-6 and 7b's shape (`error_rate_plot`), written to `path`."""
    save_figure(error_rate_plot(stats, study), path)


def error_rate_plot(stats: list[dict], study: StudyConfig):
    """One panel per error type, each model's rate per dataset with CIs: two rows of panels sized
    by the number of models and datasets, and the legend in a cell of its own, so no bar is hidden;
    a panel without a rate says so."""
    models = [m.name for m in study.models]
    datasets = sorted({r["dataset"] for r in stats})
    by = {(r["subject"], r["dataset"], r["metric"]): r for r in stats}
    panel_width = max(3.8, 0.3 * len(models) * max(len(datasets), 1) + 1.8)
    columns = 3 if panel_width <= 5.5 else 2  # wide panels two abreast, so the page need not shrink them
    rows = math.ceil((len(ERROR_TYPES) + 1) / columns)  # one cell more: the legend's
    fig, grid_axes = plt.subplots(rows, columns, figsize=(panel_width * columns, 4.1 * rows), dpi=110, squeeze=False)
    axes = list(grid_axes.flat)
    width = 0.8 / max(len(datasets), 1)
    for i, (ax, error_type) in enumerate(zip(axes, ERROR_TYPES)):
        drawn = False
        for d_i, dataset in enumerate(datasets):
            xs, ys, lo, hi = [], [], [], []
            for m_i, model in enumerate(models):
                point = _point(by.get((model, dataset, error_type)))
                if point is not None:
                    xs.append(m_i + (d_i - (len(datasets) - 1) / 2) * width)
                    ys.append(point[0])
                    lo.append(point[1])
                    hi.append(point[2])
            drawn = drawn or bool(xs)
            ax.bar(
                xs,
                ys,
                width=width,
                yerr=[lo, hi] if xs else None,
                capsize=3,
                color=COLOURS[d_i % len(COLOURS)],
                label=dataset,
            )
        if not drawn:
            ax.text(0.5, 0.5, "no decided labels", transform=ax.transAxes, ha="center", va="center", color="#777")
        ax.set_title(NAMES[error_type], fontsize=11)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(
            models, fontsize=9, rotation=30 if len(models) > 2 else 0, ha="right" if len(models) > 2 else "center"
        )
        ax.set_xlim(-0.6, max(len(models), 1) - 0.4)
        ax.set_ylim(0, 1)
        ax.tick_params(axis="y", labelsize=9)
        ax.grid(axis="y", alpha=0.3)
        if i % columns == 0:
            ax.set_ylabel("share of images with the error (95% CI)", fontsize=10)
    legend_cell = axes[len(ERROR_TYPES)]
    for ax in axes[len(ERROR_TYPES) :]:
        ax.axis("off")
    if datasets:
        handles = [Patch(color=COLOURS[d_i % len(COLOURS)], label=d) for d_i, d in enumerate(datasets)]
        legend_cell.legend(handles=handles, title="dataset", fontsize=10, title_fontsize=10, loc="center")
    fig.suptitle(
        "Error rates by model and dataset" + (" (DEMO DATA: not a finding)" if study.demo else ""), fontsize=12
    )
    fig.tight_layout()
    return fig


def _units(r: dict) -> str:
    pairs = r.get("n_pairs")
    return f"{pairs} pairs, {r['n_images']} images" if pairs is not None else f"{r['n_images']} images"


def impact_figure(stats: list[dict], metric: str, demo: bool, path: Path) -> None:
    """Figure 8's shape: mean similarity of the model-image pairs with each error type; dashed: pairs
    with none.
    A group with no estimate is left out; a group without an interval is drawn without a bar."""
    by = {r["subject"]: r for r in stats}
    groups = [f"error:{t}" for t in ERROR_TYPES if _point(by.get(f"error:{t}")) is not None]
    points = [_point(by[g]) for g in groups]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    ax.bar(
        range(len(groups)),
        [p[0] for p in points],
        yerr=[[p[1] for p in points], [p[2] for p in points]] if points else None,
        capsize=3,
        color="#7f7f7f",
    )
    none = _point(by.get(NO_ERROR))
    if none is not None:
        ax.axhline(none[0], ls="--", color="k", lw=1, label=f"no error ({none[0]:.2f}, {_units(by[NO_ERROR])})")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(groups)))
    # With few images a group's CI and p mean little: the counts are on the axis.
    ax.set_xticklabels(
        [f"{NAMES[g.split(':', 1)[1]]}\n({_units(by[g])})" for g in groups], fontsize=8, rotation=20, ha="right"
    )
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
        name = f"{safe_name(image_id)}.png"  # an image id is the user's data: never a path
        rel = f"figures/heatmaps/{name}"
        rgb, _ = load_rgb(path_of[image_id])
        write_heatmap(rgb, specs, profiles, run.file("figures", "heatmaps", name), title=image_id)
        out.append((image_id, rel))
    return out


SDE_COUNTS_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("images", pa.int64()),
        ("decided", pa.int64()),
        ("sde", pa.int64()),
        ("undecided", pa.int64()),
        ("why_undecided", pa.string()),
    ]
)


def sde_counts(spatial: pa.Table) -> pa.Table:
    """Per model: its images with an SDE row, how many were decided, how many had an SDE, and how many
    could not be decided, with each reason and its count (most frequent first)."""
    by: dict[str, list[dict]] = {}
    for r in spatial.to_pylist():
        by.setdefault(r["subject"], []).append(r)
    rows = []
    for subject, here in sorted(by.items()):
        reasons = Counter(r["reason"] for r in here if r["sde"] is None)
        rows.append(
            {
                "subject": subject,
                "images": len(here),
                "decided": sum(r["sde"] is not None for r in here),
                "sde": sum(r["sde"] is True for r in here),
                "undecided": sum(reasons.values()),
                "why_undecided": "; ".join(
                    f"{why} ({n})" for why, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
                ),
            }
        )
    return pa.Table.from_pylist(rows, schema=SDE_COUNTS_SCHEMA)


def _check_words(check: dict) -> str:
    """One existence check in words: who was asked and what came back."""
    found = "found" if check.get("found") else "not found"
    if check["source"] == "humans":
        named = ", ".join(check.get("named_as") or [])
        return f"humans: {check.get('naming', 0)} of {check.get('descriptions', 0)} descriptions name it{f' ({named})' if named else ''}: {found}"
    if check["source"] == "locator":
        return f"locator: best box score {check.get('best_score')} (min {check.get('min_score')}): {found}"
    return f"verifier {check.get('model', '')}: \u201c{check.get('question')}\u201d \u2192 \u201c{check.get('answer')}\u201d ({check.get('reading')}): {found}"


def _chain(error_type: str, finding: dict) -> list[str]:
    """A finding's evidence chain, step by step: existence checks, the boxes at its place, the questions."""
    steps = []
    existence = finding.get("existence")
    if isinstance(existence, dict):
        steps += [_check_words(c) for c in existence.get("checks", [])]
    located = finding.get("located")
    if isinstance(located, dict):
        steps.append(f"located at {located.get('box')} (score {located.get('score')})")
    elif isinstance(located, str):
        steps.append(f"locator: {located}")
    for box in finding.get("boxes_there", []):
        steps.append(f"box there: {box.get('label')} (IoU {box.get('iou')}, score {box.get('score')})")
    if isinstance(finding.get("detection"), dict):
        steps.append(f"detector box: {finding['detection'].get('label')} {finding['detection'].get('box')}")
    for t in finding.get("transcript", []):
        steps.append(
            f"{t.get('kind')}: \u201c{t.get('question')}\u201d \u2192 \u201c{t.get('answer')}\u201d (read: {t.get('reading')})"
        )
    if "location" in finding:
        steps.append(f"location: {finding['location']}")
    if finding.get("named_as"):
        steps.append(
            f"named as: {finding['named_as']}"
            + (f" (similarity {finding['similarity']})" if "similarity" in finding else "")
        )
    if not steps and error_type == "detection":
        steps.append("not mentioned, and no detector box names it")
    if not steps and error_type == "hallucination":
        steps.append("mentioned; no gold object and no detector box match it")
    if finding.get("unclear"):
        steps.append("unclear: no label")
    return steps


def _chain_items(error_type: str, evidence: dict) -> list[dict]:
    """Each finding of a label (for hallucinations, each mention checked too; for SDE the correlations;
    for a hand label the person's note): `text`, and for an object its name (`object`) and chain of `steps`."""
    items = []
    if "hand" in evidence:
        auto = evidence.get("auto_present")
        said = "undecided" if auto is None else ("present" if auto else "absent")
        note = f": {evidence['hand']}" if evidence["hand"] else ""
        items.append({"text": f"hand label{note} (the automatic label: {said})"})
    if "model_r" in evidence:
        r = {k: _number(evidence.get(k), None) or "none" for k in ("model_r", "human_mean_r", "human_sd_r")}
        items.append(
            {
                "text": f"model r {r['model_r']}; humans' mean r {r['human_mean_r']}, SD {r['human_sd_r']}"
                f"{'; ' + evidence['reason'] if evidence.get('reason') else ''}"
            }
        )
    if "undecided" in evidence:
        items.append({"text": f"undecided: {evidence['undecided']}"})
    for f in evidence.get("findings", []) if isinstance(evidence.get("findings"), list) else []:
        items.append({"object": str(f.get("object", "")), "text": "", "steps": _chain(error_type, f)})
    for c in [c for c in evidence.get("checked", []) if c.get("present") is True]:
        items.append(
            {
                "object": c["object"],
                "text": " (mentioned, there: no error)",
                "steps": [_check_words(x) for x in c.get("checks", [])],
            }
        )
    return items


def _evidence_page(run: RunFolder, study: StudyConfig, errors: pa.Table) -> None:
    rows = []
    for r in errors.to_pylist():
        evidence = json.loads(r["evidence"])
        rows.append(
            {
                **r,
                "state": "undecided" if r["present"] is None else ("yes" if r["present"] else "no"),
                "name": NAMES[r["error_type"]],
                "chain": _chain_items(r["error_type"], evidence),
                "json": json.dumps(evidence, indent=1),
            }
        )
    page = render(
        TEMPLATES,
        "errors.html",
        title=f"{study.name}: error labels",
        heading="Error labels and their evidence",
        page_style=EVIDENCE_STYLE,
        rows=rows,
    )
    write_page(run.root / "errors.html", page)


def _finding_words(error_type: str, evidence: dict) -> str:
    """The objects behind a label, in a few words: "spoon", "bowl (for saucer)"."""
    if "hand" in evidence:
        return f"hand label: {evidence['hand']}" if evidence["hand"] else "hand label"
    words = []
    for f in evidence["findings"]:
        said = f.get("named_as")
        words.append(
            f"{said} (for {f['object']})" if error_type == "recognition" and said else str(f.get("object", ""))
        )
    return ", ".join(w for w in words if w)


def examples_table(tables: dict[str, pa.Table], per_type: int = 3) -> list[dict]:
    """A few labelled examples of each object error type (the paper's figures 5-6 show examples)."""
    gold = {
        r["image_id"]: r["text"]
        for r in tables["references"].to_pylist()
        if r["role"] == "gold" and r["condition"] == "full"
    }
    said = {
        (r["subject"], r["image_id"]): r["text"]
        for r in tables["responses"].to_pylist()
        if r["variant"] == "full" and r["status"] == "ok"
    }
    labels = [r for r in tables["errors"].to_pylist() if r["present"]]
    rows = []
    for error_type in ERROR_TYPES[:-1]:
        for r in [r for r in labels if r["error_type"] == error_type][:per_type]:
            rows.append(
                {
                    "error": NAMES[error_type],
                    "image_id": r["image_id"],
                    "subject": r["subject"],
                    "method": r["method"],
                    "objects": _finding_words(error_type, json.loads(r["evidence"])),
                    "said": said.get((r["subject"], r["image_id"]), ""),
                    "gold": gold.get(r["image_id"], ""),
                }
            )
    return rows


def _number(v, r) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def stat_formats(n_resamples: int, min_images: int) -> dict:
    """Cells of the stats and comparisons tables: nulls blank, p and q as `format_p`, a comparison with
    too few images said so, a group on too few images flagged."""

    def p_cell(v, r):
        if v is not None and not math.isnan(v):
            return format_p(v, n_resamples)
        small = r.get("n_a") is not None and r.get("n_b") is not None and min(r["n_a"], r["n_b"]) < min_images
        return f"not tested (< {min_images} images)" if small else "n/a"

    return {
        "p": p_cell,
        "q": p_cell,
        "n_images": lambda v, r: "" if v is None else (f"{v} (too few: not tested)" if v < min_images else str(v)),
        **{c: _number for c in ("estimate", "ci_low", "ci_high", "difference")},
    }


def checks(study: StudyConfig) -> dict[str, str]:
    """What the labels were checked with: the locator (`boxes`), the verifier (`verifier`)."""
    cfg = study.taxonomy
    if cfg.locator is not None:
        boxes = f"read at each object's place, found by the open-vocabulary locator {cfg.locator.model_id}"
    else:
        boxes = (
            "read by name: no locator is configured (an open-vocabulary detector such as OWL-ViT finds each object's "
            "place; its weights cannot be had offline, so the demo runs without one)"
        )
    if cfg.verifier is None:
        verifier = " (no verifier is configured: no second check)"
    elif cfg.verifier.kind == "locator":
        verifier = ", or the locator, queried with the mention's name, finds it"
    else:
        verifier = f", or the verifier model {cfg.verifier.model_id} says it is there"
    return {"boxes": boxes, "verifier": verifier}


def spatial_empty(study: StudyConfig, spatial: pa.Table, thin: list[str]) -> str:
    """Why the report has no heat map, said where the heat maps would be: no model describes the
    masked variants, the human data is too thin for them (`thin`: `data.thin_human_data`'s
    messages), or else why the spatial dependence of the images shown was left undecided."""
    if not any(m.variants == "all" for m in study.models):
        return "no model describes the masked variants (a model's `variants: all`), so there is no spatial dependence."
    if thin:
        return " ".join(thin)
    reasons = Counter(r["reason"] for r in spatial.to_pylist() if r["sde"] is None)
    if not reasons:
        return "this run has no spatial-dependence rows for the images shown."
    return "no image shown has a decided spatial dependence: " + "; ".join(
        f"{why} ({n})" for why, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    )


def taxonomy_section(
    run: RunFolder,
    study: StudyConfig,
    tables: dict[str, pa.Table],
    era_note: str | None = None,
    spatial_notes: tuple[str, ...] | list[str] = (),
    shown: list[str] | None = None,
) -> Markup:
    """The section of report.html; draws its figures and writes errors.html. `era_note`: the line
    that says which era comparisons were left out; `spatial_notes`: what the human data is too thin
    for in spatial dependence (`data.thin_human_data`); `shown`: the images that get a heat map
    (None: all), while the SDE counts are over every image."""
    figures = run.root / "figures"
    error_stats = tables["error_stats"].to_pylist()
    error_rate_figure(error_stats, study, figures / "error_rates.png")
    impact = tables["impact_stats"].to_pylist()
    if impact:
        impact_figure(impact, study.taxonomy_metric, study.demo, figures / "impact.png")
    spatial = tables["spatial"]
    if shown is not None:
        spatial = spatial.filter(pc.is_in(spatial.column("image_id"), value_set=pa.array(shown, pa.string())))
    heatmaps = heatmap_files(run, study, tables["images"], spatial)
    _evidence_page(run, study, tables["errors"])
    fmt = stat_formats(study.statistics.n_resamples, study.taxonomy.min_images)
    impact_stats = tables["impact_stats"]
    counts = sde_counts(tables["spatial"])
    return render(
        TEMPLATES,
        "errors_section.html",
        study=study,
        checks=checks(study),
        examples=examples_table(tables),
        heatmaps=heatmaps,
        spatial_empty=None if heatmaps else spatial_empty(study, spatial, list(spatial_notes)),
        spatial_notes=list(spatial_notes) if heatmaps else [],
        era_note=era_note,
        impact=bool(impact),
        error_stats=grid(
            tables["error_stats"].sort_by(
                [("metric", "ascending"), ("subject", "ascending"), ("dataset", "ascending")]
            ),
            ["subject", "dataset", "metric", "estimate", "ci_low", "ci_high", "n_images"],
            fmt,
        ),
        error_comparisons=grid(
            tables["error_comparisons"],
            ["family", "a", "b", "dataset", "metric", "difference", "n_a", "n_b", "p", "q", "significant"],
            fmt,
        ),
        impact_stats=grid(
            impact_stats,
            ["subject", "estimate", "ci_low", "ci_high", "n_images"]
            + (["n_pairs"] if "n_pairs" in impact_stats.column_names else []),
            fmt,
        ),
        impact_comparisons=grid(
            tables["impact_comparisons"],
            ["a", "b", "metric", "difference", "ci_low", "ci_high", "n_a", "n_b", "p", "q"],
            fmt,
        ),
        sde_counts=grid(counts, counts.column_names),
        hand_agreement=grid(tables["hand_agreement"], ["error_type", "kappa", "observed_agreement", "n"]),
    )
