"""The report: `report.html` beside the tables, its figures drawn from the run's tables, and CSVs.

The main figure has the shape of the paper's figure 4b: mean similarity to the gold standard per
model with bootstrap CIs, datasets side by side, and the top- and bottom-ranked humans drawn as
bands. A demo run says on the page that its human data were written for the demo.

Where the human data is too thin for a figure (`data.thin_human_data`), the page says so where the
figure would be; an era of one model is that model, so the era comparisons that repeat a model's
are left out of the page (`era_repeats`), with a line that says so.

With `analysis.group_by`, the statistics table is shown again for each group of each grouping
variable, below the one about all images.

The page stays a few MB at any number of images: figures and statistics tables, and per image only
a sample (each model's worst and best images, thumbnails embedded); `vlm-decade view` shows the rest.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import matplotlib.pyplot as plt
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.files import safe_name
from vlm_decade.core.reuse import INPUTS
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage, run_failures
from vlm_decade.report import samples as report_samples
from vlm_decade.report.figures import COLOURS, save_figure
from vlm_decade.report.html import Grid, grid, render, write_csvs, write_page
from vlm_decade.report.samples import SampleRow, Samples, extremes, sample_tables
from vlm_decade.stats import format_p
from vlm_decade.stats.families import era_label
from vlm_decade.stats.groups import GROUPED_TABLES, per_group, ungrouped
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.decade.data import GOLD_NOTE, GROUPS_NOTE, MASKED_NOTE, thin_human_data
from vlm_decade.studies.decade.human.stage import ALL, ALPHA, STABILITY
from vlm_decade.studies.decade.metric_validation import agreement_summary, write_validation_figure
from vlm_decade.studies.decade.ranking import vote_ties
from vlm_decade.studies.decade.taxonomy.report import taxonomy_section

# Part of the report stage's settings: bump it when the page changes, so existing runs redraw it.
REPORT_FORMAT = 12  # 12: the human data's reliability; 11: each group's statistics; 10: the failed models at the top; 9: the thin-data notes
# The tables every report draws from, and those it adds a section for when the run has them.
REPORT_TABLES = ("images", "references", "responses", "scores", "stats", "comparisons")
# The tables that grow with the texts (several KB per image): the stage leaves them in the run
# folder, and the page reads from them only what it draws on, a batch at a time (`rows_of`).
TEXT_TABLES = ("references", "responses")
OPTIONAL_TABLES = (
    "reliability",
    "metric_validation",
    "stsb",
    "detections",
    "errors",
    "spatial",
    "hand_agreement",
    "error_stats",
    "error_comparisons",
    "impact_stats",
    "impact_comparisons",
)
TEMPLATES = Path(__file__).parent / "templates"
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
                ax.annotate(
                    f"{label} ({dataset})",
                    (max(len(models), 1) - 0.45, r["estimate"]),
                    fontsize=7,
                    color=colour,
                    va="bottom",
                    ha="right",
                )
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
        ax.text(
            0.5,
            0.5,
            "no model has an estimate with a CI",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="#777",
        )
    ax.grid(axis="y", alpha=0.3)
    title = f"Similarity to the gold standard ({metric})"
    ax.set_title(title + ("\nDEMO DATA: not a finding" if study.demo else ""), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def _metric_validation(run: RunFolder, study: StudyConfig, summary: pa.Table) -> dict:
    """Each metric's agreement with the human raters against the inter-rater ceiling (figure A.1a's shape)."""
    write_validation_figure(summary, run.root / "figures" / "metric_validation.png", demo=study.demo)
    n = study.statistics.n_resamples
    reference = {
        "pairwise": "the mean correlation between two raters (the paper's test)",
        "leave-one-out": "each rater against the mean of the others",
    }[study.validation.ceiling]
    table = grid(
        summary,
        [c for c in ("subject",) if c in summary.column_names]
        + ["metric", "kind", "role", "estimate", "ci_low", "ci_high", "difference", "p", "q", "n_raters", "n_pairs"],
        {
            "p": lambda v, r: "" if v is None else format_p(v, n),
            "q": lambda v, r: "" if v is None else format_p(v, n),
            "difference": lambda v, r: "" if v is None else f"{v:.3f}",
        },
    )
    return {
        "reference": reference,
        "table": table,
        "agreement": agreement_summary(summary, [j.name for j in study.judge_metrics]),
    }


def _reliability(table: pa.Table) -> dict:
    """The human data's reliability (the `reliability` table) and the overall values the page says in words."""
    overall = {r["measure"]: r for r in table.to_pylist() if r["dataset"] == ALL}
    value = {"value": lambda v, r: "undefined" if v is None else f"{v:.3f}"}
    return {
        "stability": overall.get(STABILITY),
        "alpha": overall.get(ALPHA),
        "n_resamples": next((r["n_resamples"] for r in overall.values() if r["n_resamples"] is not None), None),
        "table": grid(table, ["dataset", "measure", "value", "participants", "items"], value),
    }


def sample_metric(study: StudyConfig, scores: pa.Table) -> str | None:
    """The metric the report's per-image samples rank by: the taxonomy's, else the first one scored."""
    scored = sorted(pc.unique(scores.column("metric")).to_pylist())
    return study.taxonomy_metric if study.taxonomy_metric in scored else (scored[0] if scored else None)


def samples(
    tables: dict[str, pa.Table], study: StudyConfig
) -> tuple[str | None, dict[str, tuple[list[dict], list[dict]]]]:
    """Per model, its worst and best full images by `sample_metric`: the only per-image rows the report shows."""
    scores = tables["scores"]
    metric = sample_metric(study, scores)
    if metric is None:
        return None, {}
    # The columns first: a filter copies every column it is given.
    full = scores.select(["subject", "image_id", "dataset", "value"]).filter(
        pc.and_(pc.equal(scores.column("variant"), "full"), pc.equal(scores.column("metric"), metric))
    )
    return metric, {m.name: _extremes_of(full.filter(pc.equal(full.column("subject"), m.name))) for m in study.models}


def _extremes_of(rows: pa.Table) -> tuple[list[dict], list[dict]]:
    """`extremes` by value of one model's rows in order of image id, chosen on the columns: only the
    rows picked become Python objects."""
    value = rows.column("value")
    rows = rows.filter(pc.and_(pc.is_valid(value), pc.invert(pc.fill_null(pc.is_nan(value), False))))
    if rows.num_rows <= 2 * report_samples.SAMPLE_SIZE:
        return extremes(rows.sort_by("image_id").to_pylist(), "value")
    order = pc.sort_indices(rows, [("value", "ascending"), ("image_id", "ascending")])  # the rows stay put
    n = report_samples.SAMPLE_SIZE
    return rows.take(order.slice(0, n)).to_pylist(), rows.take(order.slice(len(order) - n)).to_pylist()[::-1]


def rows_of(
    run: RunFolder, tables: Mapping[str, pa.Table], name: str, columns: list[str] | None = None, where=None
) -> pa.Table:
    """Table `name`'s rows that `where` keeps (a table -> a boolean mask over its rows; every row by
    default), in `columns` (every column by default): from `tables` when it holds the table, else streamed from the run folder
    a batch at a time (`TEXT_TABLES`: the page holds only the rows it draws on)."""
    if name in tables:
        parts = [tables[name] if columns is None else tables[name].select(columns)]
    else:
        touches = getattr(where, "touches", None)  # a filter that can rule row groups out (`_Images`)
        batches = run.batches(name, columns=columns, touches=touches, ranged=["image_id"])
        parts = (pa.Table.from_batches([b]) for b in batches)
    kept = [part if where is None else part.filter(where(part)) for part in parts]
    if not kept:  # a table without rows
        schema = run.schema(name)
        return pa.schema([schema.field(c) for c in columns or schema.names]).empty_table()
    table = pa.concat_tables(kept)
    return table if columns is None else table.select(columns)


class _Images:
    """A `rows_of` filter: the rows of the images `ids`. A row group whose image ids all lie between
    two of them is not read (`touches`): the texts of a few sampled images are read from the row
    groups that hold them, not from every row of a million images' responses."""

    def __init__(self, ids):
        self.ids = sorted(ids)
        self.value_set = pa.array(self.ids, pa.string())

    def __call__(self, table: pa.Table) -> pa.ChunkedArray:
        return pc.is_in(table.column("image_id"), value_set=self.value_set)

    def touches(self, ranges: dict) -> bool:
        span = ranges["image_id"]  # (least, greatest) of a row group; None: its footer does not say
        if span is None:
            return True
        at = bisect_left(self.ids, span[0])
        return at < len(self.ids) and self.ids[at] <= span[1]


def voted_references(run: RunFolder, tables: Mapping[str, pa.Table]) -> pa.Table:
    """The rows `vote_ties` counts from: those of the images some description of which was shown to
    voters (an image ranked by consensus has none), so a study without votes hands it none."""
    columns = ["image_id", "condition", "role", "votes", "shown"]
    shown = rows_of(
        run, tables, "references", columns, lambda t: pc.fill_null(pc.not_equal(t.column("shown"), 0), False)
    )
    if not shown.num_rows:
        return shown
    return rows_of(run, tables, "references", columns, _Images(pc.unique(shown.column("image_id")).to_pylist()))


def sampled_ids(picked: dict[str, tuple[list[dict], list[dict]]]) -> list[str]:
    return sorted({r["image_id"] for low, high in picked.values() for r in low + high})


def only_images(table: pa.Table, ids: list[str]) -> pa.Table:
    return table.filter(pc.is_in(table.column("image_id"), value_set=pa.array(ids, pa.string())))


def _examples(tables: dict[str, pa.Table], metric: str, picked: dict[str, tuple[list[dict], list[dict]]]) -> Samples:
    """Each model's worst and best images: thumbnail, its full-image description, the gold standard and the similarity."""
    ids = sampled_ids(picked)
    references = only_images(tables["references"], ids).to_pylist()
    gold = {r["image_id"]: r["text"] for r in references if r["role"] == "gold" and r["condition"] == "full"}
    said = {
        (r["subject"], r["image_id"]): r["text"]
        for r in only_images(tables["responses"], ids).to_pylist()
        if r["variant"] == "full" and r["status"] == "ok"
    }
    path_of = {r["image_id"]: r["path"] for r in only_images(tables["images"], ids).to_pylist()}

    def row(model: str, r: dict) -> SampleRow:
        cells = [f"{r['value']:.3f}", said.get((model, r["image_id"]), "(no description)"), gold.get(r["image_id"], "")]
        return SampleRow(r["image_id"], r["dataset"], cells)

    return sample_tables(
        picked,
        metric,
        [metric, "the model said", "gold standard (human)"],
        row,
        path_of,
        f"No {metric} scores for this model.",
    )


def _failed_responses(
    run: RunFolder, tables: Mapping[str, pa.Table], manifest: dict, shown: int = FAILED_SHOWN
) -> dict:
    """How many responses failed, per model, and the first few of them (`manifest`: the run's)."""
    columns = ["subject", "image_id", "variant", "status", "error"]
    # A table the stage recorded done has no row but ok ones (`StatusTally`): not read to find none.
    recorded = manifest.get("stages", {}).get("responses", {}).get("state")
    if "responses" not in tables and recorded == "done":
        failed = pa.schema([run.schema("responses").field(c) for c in columns]).empty_table()
    else:
        failed = rows_of(run, tables, "responses", columns, lambda t: pc.not_equal(t.column("status"), "ok"))
    total = tables["responses"].num_rows if "responses" in tables else run.num_rows("responses")
    out = {"total": total, "failed": failed.num_rows, "shown": shown, "counts": None, "first": None}
    if failed.num_rows:
        counts = (
            failed.group_by("subject")
            .aggregate([("image_id", "count")])
            .rename_columns(["subject", "failed"])
            .sort_by("subject")
        )
        out["counts"] = grid(counts, ["subject", "failed"])
        out["first"] = grid(failed.slice(0, shown), ["subject", "image_id", "variant", "error"])
    return out


def era_repeats(rows: list[dict], eras: Mapping[str, str]) -> tuple[list[dict], dict[str, str]]:
    """The comparison rows worth showing, and {era label: its model} of the eras whose rows were left out.

    An era of one model is that model: its mean is the model's mean. A row with such an era as a
    term is left out when, read with the model in its place, it is another row of `rows` (the same
    a, b, dataset, metric and variant), as the dataset comparisons of an era and the era against
    the humans repeat the model's; a row that asks something no other row does (one era against
    the other) is kept."""
    single = {}
    for era in ("pre-mllm", "mllm"):
        members = [s for s, e in eras.items() if e == era]
        if len(members) == 1:
            single[era_label(era)] = members[0]

    def read(r: dict) -> tuple:
        return single.get(r["a"], r["a"]), single.get(r["b"], r["b"]), r["dataset"], r["metric"], r["variant"]

    plain = {read(r) for r in rows if not {r["a"], r["b"]} & single.keys()}
    kept, left_out = [], set()
    for r in rows:
        eras_here = {r["a"], r["b"]} & single.keys()
        if eras_here and read(r) in plain:
            left_out |= eras_here
        else:
            kept.append(r)
    return kept, {e: single[e] for e in sorted(left_out)}


def _without_repeats(table: pa.Table, eras: Mapping[str, str]) -> tuple[pa.Table, str | None]:
    """`table` (comparisons) less the era rows that repeat a model's (`era_repeats`), and the line that says so."""
    kept, single = era_repeats(table.to_pylist(), eras)
    if not single:
        return table, None
    who = "; ".join(f"{era} is {model}" for era, model in single.items())
    note = (
        f"An era of one model is that model ({who}): {table.num_rows - len(kept)} era comparisons that repeat "
        "the model's are left out here (the comparisons table keeps them)."
    )
    return pa.Table.from_pylist(kept, schema=table.schema), note


def thin_notes(study: StudyConfig, references: pa.Table, ranking: Mapping[str, str]) -> dict:
    """What the human data is too thin for (`thin_human_data`), by the place the report says it: per
    dataset under its gold standard, under the similarity figures, and in the spatial panel."""
    thin = thin_human_data(study, references, ranking)
    gold: dict[str, list[str]] = {}
    for t in thin:
        if t.topic == GOLD_NOTE:
            gold.setdefault(t.dataset, []).append(t.message)
    return {
        "gold": gold,
        "groups": [t.message for t in thin if t.topic == GROUPS_NOTE],
        "masked": [t.message for t in thin if t.topic == MASKED_NOTE],
    }


def write_report(run: RunFolder, study: StudyConfig, tables: dict[str, pa.Table]) -> None:
    """report.html and its figures and CSVs from `tables`; `TEXT_TABLES` that `tables` lacks are
    read from the run folder, only the rows the page draws on (`rows_of`)."""
    # The page shows the analysis of all images; the tables' CSVs keep the per-group rows too.
    all_rows, tables = tables, {**tables, **{n: ungrouped(t) for n, t in tables.items() if n in GROUPED_TABLES}}
    # The CSVs (a million images' responses are gigabytes) are written on a thread while the page is
    # made here: Arrow's reader and CSV writer leave the interpreter free for the figures.
    with ThreadPoolExecutor(1) as writer:
        csvs = writer.submit(write_csvs, run, all_rows, ("stats", "comparisons", "scores", "responses"))
        page = _page(run, study, tables, all_rows, csvs)
    write_page(run.root / "report.html", page)


def _page(
    run: RunFolder, study: StudyConfig, tables: dict[str, pa.Table], all_rows: dict[str, pa.Table], csvs: Future
) -> str:
    """`write_report`'s page and figures; `csvs`: the CSVs being written (`write_csvs`)."""
    metrics = sorted(pc.unique(tables["stats"].column("metric")).to_pylist())
    for metric in metrics:
        similarity_figure(tables["stats"], study, metric, run.file("figures", f"similarity_{safe_name(metric)}.png"))
    manifest = run.manifest()
    images, n = tables["images"], study.statistics.n_resamples
    ranking = manifest.get("ranking_method", {})
    thin = thin_notes(study, rows_of(run, tables, "references", ["image_id", "dataset", "condition"]), ranking)
    metric, picked = samples(tables, study)
    ids = sampled_ids(picked)
    # The texts of the sampled images: all the page shows of the references and responses.
    tables |= {name: rows_of(run, tables, name, where=_Images(ids)) for name in TEXT_TABLES}
    errors = None
    if "errors" in tables:
        # Per-image parts of the error section (heat maps, examples, errors.html) cover the sampled images;
        # the SDE counts, every image.
        per_image = {"errors": only_images(tables["errors"], ids)}
        error_comparisons, error_era_note = _without_repeats(tables["error_comparisons"], study.eras)
        errors = taxonomy_section(
            run,
            study,
            {**tables, **per_image, "error_comparisons": error_comparisons},
            era_note=error_era_note,
            spatial_notes=thin["masked"],
            shown=ids,
        )
    comparisons, era_note = _without_repeats(tables["comparisons"], study.eras)
    return render(
        TEMPLATES,
        "decade_report.html",
        title=f"{study.name}: vlm_decade report",
        heading=study.name,
        failed_rows=run_failures(manifest),
        study=study,
        n_images=images.num_rows,
        n_datasets=pc.count_distinct(images.column("dataset"), mode="all").as_py(),
        config_hash=manifest.get("config_hash", "")[:12],
        sample_size=report_samples.SAMPLE_SIZE,
        ranking=sorted(ranking.items()),
        consensus=sorted(d for d, m in ranking.items() if m == "consensus"),
        ties=vote_ties(voted_references(run, all_rows).to_pylist()),
        thin=thin,
        metrics=[(m, safe_name(m)) for m in metrics],
        stats=_stats_grid(tables["stats"]),
        by_group=[
            (variable, [(group, _stats_grid(rows)) for group, rows in groups.items()])
            for variable, groups in per_group(all_rows["stats"]).items()
        ],
        era_note=era_note,
        comparisons=grid(
            comparisons,
            ["family", "a", "b", "dataset", "metric", "difference", "ci_low", "ci_high", "p", "q", "significant"],
            {"p": lambda v, r: format_p(v, n), "q": lambda v, r: format_p(v, n)},
        ),
        reliability=_reliability(tables["reliability"]) if "reliability" in tables else None,
        validation=_metric_validation(run, study, tables["metric_validation"])
        if "metric_validation" in tables
        else None,
        stsb=grid(tables["stsb"], ["label", "subset", "n_pairs", "spearman", "ci_low", "ci_high"])
        if "stsb" in tables
        else None,
        errors=errors,
        metric=metric,
        examples=_examples(tables, metric, picked) if metric is not None else None,
        responses=_failed_responses(run, all_rows, manifest),
        csvs=csvs.result(),
    )


def _stats_grid(stats: pa.Table) -> Grid:
    """The statistics table as the page shows it, by metric, subject and dataset."""
    return grid(
        stats.sort_by([("metric", "ascending"), ("subject", "ascending"), ("dataset", "ascending")]),
        ["subject", "dataset", "metric", "variant", "estimate", "ci_low", "ci_high", "n_images"],
    )


def stage(study: StudyConfig, ranking: Mapping[str, str], made: list[str]) -> Stage:
    """report.html from the tables every report draws, and those of `made` it has a section for;
    `ranking`: each dataset's gold-standard method (`StudyData.ranking_method`)."""
    tables = REPORT_TABLES + tuple(n for n in OPTIONAL_TABLES if n in made)
    return Stage(
        "report",
        tables,
        {"demo": study.demo, "ranking": ranking, "format": REPORT_FORMAT},
        lambda run: (
            write_report(
                run.folder, study, {n: run.table(n, _shown(run.folder, n)) for n in tables if n not in TEXT_TABLES}
            )
            or {}
        ),
        outputs=(),
        files=("report.html",),
        needs_ray=False,
    )


def redraw(folder: RunFolder, study: StudyConfig) -> list[str]:
    """Write report.html again from a run folder; returns the tables it needs and lacks (then nothing is written)."""
    missing = [n for n in REPORT_TABLES if not folder.has(n)]
    if not missing:
        names = list(REPORT_TABLES) + [n for n in OPTIONAL_TABLES if folder.has(n)]
        write_report(folder, study, {n: folder.read(n, list(_shown(folder, n))) for n in names if n not in TEXT_TABLES})
    return missing


def _shown(folder: RunFolder, name: str) -> tuple[str, ...]:
    """Table `name`'s columns but the rows' inputs hashes, which neither the page nor its CSVs show
    (a million images' scores hold hundreds of MB of them)."""
    return tuple(c for c in folder.schema(name).names if c != INPUTS)
