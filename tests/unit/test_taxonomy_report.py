"""The error-analysis section of the report on constructed tables: every figure and table copes with
empty groups, one image, one model, one dataset, no decided label and rows whose estimate or interval
is null; the SDE decision counts per model; every label's evidence chain on errors.html."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pyarrow as pa
import pytest

from tests.figures import AREA, assert_drawn, bar_heights, colour_pixels, panels, record_figures, texts, titled
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.report.figures import COLOURS
from vlm_decade.stats import COMPARISONS_SCHEMA, STATS_SCHEMA
from vlm_decade.studies import study_from_dict
from vlm_decade.studies.decade.taxonomy.analysis import ERRORS_SCHEMA, NO_ERROR
from vlm_decade.studies.decade.taxonomy.report import (
    error_rate_figure,
    error_rate_plot,
    impact_figure,
    sde_counts,
    spatial_empty,
    stat_formats,
    taxonomy_section,
)
from vlm_decade.studies.decade.taxonomy.spatial import SPATIAL_SCHEMA

from .pages import PAYLOAD, Page

TYPES = ("detection", "recognition", "scene_understanding", "hallucination", "spatial_dependence")


def make_study(models=("m1",), demo=False, variants="full"):
    return study_from_dict(
        {
            "name": "s",
            "demo": demo,
            "data": {"images": "i.csv", "image_dir": "img", "descriptions": "d.csv"},
            "models": [
                {
                    "name": m,
                    "backend": "imported",
                    "model_id": m,
                    "era": "pre-mllm",
                    "variants": variants,
                    "options": {"file": "x.csv"},
                }
                for m in models
            ],
            "taxonomy": {},
        }
    )


def stat(subject, dataset, metric, estimate, lo=None, hi=None, n=1):
    return {
        "subject": subject,
        "dataset": dataset,
        "metric": metric,
        "variant": "full",
        "estimate": estimate,
        "ci_low": lo,
        "ci_high": hi,
        "n_images": n,
        "n_resamples": 200,
        "seed": 1,
        "method": "percentile",
    }


def assert_error_rates(fig, path, models, rows) -> None:
    """The error-rate figure as saved at `path`: a panel per error type, each with a bar for every
    model's rate the rows give (the first dataset's in the first colour, drawn large in the PNG), and
    a panel without one saying so."""
    rates = {t: [r["estimate"] for r in rows if r["metric"] == t and r["subject"] in models] for t in TYPES}
    rates = {t: sorted(e for e in estimates if e is not None) for t, estimates in rates.items()}
    assert len(panels(fig)) == len(TYPES)
    for ax, error_type in zip(panels(fig), TYPES):
        assert sorted(bar_heights(ax)) == pytest.approx(rates[error_type]), error_type
        assert texts(ax) == ([] if rates[error_type] else ["no decided labels"]), error_type
    assert_drawn(path)
    first = sorted({r["dataset"] for r in rows})[:1]
    drawn = any(r["estimate"] is not None and r["subject"] in models and r["dataset"] in first for r in rows)
    assert (colour_pixels(path, COLOURS[0]) > AREA) == drawn


@pytest.mark.parametrize(
    "rows",
    [
        [],  # nothing at all
        [stat("m1", "d1", "detection", 1.0, 1.0, 1.0)],  # one model, one dataset, one image: a CI that is a point
        [stat("m1", "d1", t, None, None, None, 0) for t in TYPES],  # no decided label: every estimate null
        [
            stat("m1", "d1", "detection", 0.5, None, None, 2),
            stat("m1", "d1", "hallucination", None, None, None, 0),
        ],  # budget stop
        [
            stat("m1", "d1", "detection", 0.5, 0.2, 0.8, 9),
            stat("ghost", "d2", "detection", 0.3, 0.1, 0.5, 9),
        ],  # an unknown subject
    ],
)
def test_the_error_rate_figure_draws_whatever_the_table_holds(tmp_path, rows, monkeypatch):
    saved = record_figures(monkeypatch)
    error_rate_figure(rows, make_study(), tmp_path / "rates.png")
    assert_error_rates(saved[0], tmp_path / "rates.png", ["m1"], rows)


def test_the_error_rate_figure_with_no_model(tmp_path, monkeypatch):
    study = make_study()
    saved = record_figures(monkeypatch)
    rows = [stat("m1", "d1", "detection", 0.5, 0.4, 0.6)]
    error_rate_figure(rows, study.model_copy(update={"models": ()}), tmp_path / "r.png")
    assert_error_rates(saved[0], tmp_path / "r.png", [], rows)


def test_the_error_rate_figure_is_large_and_its_legend_clear_of_every_bar():
    models = ("m1", "m2", "m3")
    # Tall bars in every corner of every panel with a rate: a legend inside a panel would cover one.
    rows = [stat(m, d, t, 0.95, 0.9, 1.0, 9) for m in models for d in ("d1", "d2") for t in TYPES[:-1]]
    fig = error_rate_plot(rows, make_study(models=models))
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    (legend,) = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    box = legend.get_window_extent(renderer)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == len(TYPES) and [t.get_text() for t in legend.get_texts()] == ["d1", "d2"]
    for ax in panels:
        assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()
        assert ax.get_window_extent(renderer).width > 300  # pixels: each panel readable at the page's size
    assert sum(len(ax.patches) for ax in panels) == len(rows)
    # The SDE panel has no rate, and says so.
    sde = next(ax for ax in panels if ax.get_title() == "spatial dependence (SDE)")
    assert [t.get_text() for t in sde.texts] == ["no decided labels"] and not sde.patches
    width, height = fig.get_size_inches() * fig.dpi
    assert width >= 1200 and height >= 800
    plt.close(fig)


def test_an_empty_spatial_panel_says_why():
    no_masks = make_study()
    masked = make_study(variants="all")
    empty = SPATIAL_SCHEMA.empty_table()
    assert spatial_empty(no_masks, empty, []).startswith("no model describes the masked variants (a model's")
    thin = ["d.csv has no masked descriptions (condition m1, m2, m3) and m1 describes the masked variants"]
    assert spatial_empty(masked, empty, thin) == thin[0]
    undecided = pa.Table.from_pylist(
        [
            spatial_row("m1", "i1", None, "constant profile"),
            spatial_row("m1", "i2", None, "constant profile"),
            spatial_row("m1", "i3", None, "no masked description"),
            spatial_row("m1", "i4", True),
        ],
        schema=SPATIAL_SCHEMA,
    )
    assert spatial_empty(masked, undecided, []) == (
        "no image shown has a decided spatial dependence: constant profile (2); no masked description (1)"
    )
    assert spatial_empty(masked, empty, []) == "this run has no spatial-dependence rows for the images shown."


def test_sde_counts_cover_every_image_and_the_empty_panel_the_images_shown(tmp_path):
    tables = section_tables(tmp_path)
    tables["spatial"] = pa.Table.from_pylist(
        [spatial_row("m1", "i1", None, "constant profile"), spatial_row("m1", "i2", None, "no masked description")],
        schema=SPATIAL_SCHEMA,
    )
    page = Page(taxonomy_section(RunFolder(tmp_path), make_study(variants="all"), tables, shown=["i1"]))
    counts = "".join(page.sections["Errors"].split("decided and undecided images")[1].split())
    # subject, images, decided, sde, undecided and why: over both images
    assert "m12002constantprofile(1);nomaskeddescription(1)" in counts
    assert page.sections["Which regions matter"].strip() == (
        "No heat map: no image shown has a decided spatial dependence: constant profile (1)"
    )


def test_the_section_says_why_there_is_no_heat_map_where_the_heat_maps_would_be(tmp_path):
    note = "d.csv has no masked descriptions (condition m1, m2, m3) and m1 describes the masked variants"
    page = taxonomy_section(
        RunFolder(tmp_path), make_study(variants="all"), section_tables(tmp_path), spatial_notes=[note]
    )
    assert Page(page).sections["Which regions matter"].strip() == f"No heat map: {note}"


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [stat(NO_ERROR, "all", "SI", 0.7, 0.7, 0.7)],  # only pairs with no error
        [stat("error:detection", "all", "SI", 0.4, None, None)],  # no interval, no baseline
        [stat("error:detection", "all", "SI", None, None, None, 0), stat(NO_ERROR, "all", "SI", None, None, None, 0)],
        [
            {**stat("error:recognition", "all", "SI", 0.5, 0.4, 0.6, 3), "n_pairs": 4},
            {**stat(NO_ERROR, "all", "SI", 0.7, 0.6, 0.8, 6), "n_pairs": 9},
        ],
    ],
)
def test_the_impact_figure_draws_whatever_the_table_holds(tmp_path, rows, monkeypatch):
    saved = record_figures(monkeypatch)
    impact_figure(rows, "SI", True, tmp_path / "impact.png")
    (ax,) = saved[0].axes
    # A grey bar per error type with an estimate, in the order of the types; pairs with no error a dashed line.
    by = {r["subject"]: r["estimate"] for r in rows if r["estimate"] is not None}
    assert bar_heights(ax) == pytest.approx([by[f"error:{t}"] for t in TYPES if f"error:{t}" in by])
    dashed = [line.get_ydata()[0] for line in ax.lines if line.get_linestyle() == "--"]
    assert dashed == ([by[NO_ERROR]] if NO_ERROR in by else [])
    assert_drawn(tmp_path / "impact.png")
    assert (colour_pixels(tmp_path / "impact.png", "#7f7f7f") > AREA) == any(s != NO_ERROR for s in by)


def spatial_row(subject, image_id, sde, reason=""):
    return {
        "subject": subject,
        "image_id": image_id,
        "dataset": "d",
        "mask_ids": ["m1", "m2", "m3"],
        "model_profile": [0.1, 0.2, 0.3],
        "human_profile": [0.3, 0.2, 0.1],
        "model_r": None,
        "human_mean_r": None,
        "human_sd_r": None,
        "z": None,
        "n_human": 6,
        "n_pseudo": 0,
        "sde": sde,
        "reason": reason,
    }


def test_sde_counts_per_model_with_the_reasons_it_could_not_be_decided():
    spatial = pa.Table.from_pylist(
        [
            spatial_row("a", "i1", True),
            spatial_row("a", "i2", False),
            spatial_row("a", "i3", None, "no masked description"),
            spatial_row("b", "i1", None, "constant profile"),
            spatial_row("b", "i2", None, "constant profile"),
            spatial_row("b", "i3", None, "no masked description"),
        ],
        schema=SPATIAL_SCHEMA,
    )
    assert sde_counts(spatial).to_pylist() == [
        {
            "subject": "a",
            "images": 3,
            "decided": 2,
            "sde": 1,
            "undecided": 1,
            "why_undecided": "no masked description (1)",
        },
        {
            "subject": "b",
            "images": 3,
            "decided": 0,
            "sde": 0,
            "undecided": 3,
            "why_undecided": "constant profile (2); no masked description (1)",
        },
    ]
    assert sde_counts(SPATIAL_SCHEMA.empty_table()).num_rows == 0


def test_cells_say_why_a_comparison_has_no_p():
    fmt = stat_formats(10_000, 5)
    assert fmt["p"](None, {"n_a": 1, "n_b": 40}) == "not tested (< 5 images)"
    assert fmt["p"](None, {"n_a": 40, "n_b": 40}) == "n/a"
    assert fmt["p"](2 / 10_001, {}) == "< 2.0e-4"
    assert fmt["n_images"](3, {}) == "3 (too few: not tested)" and fmt["n_images"](5, {}) == "5"
    assert fmt["estimate"](None, {}) == ""


def section_tables(tmp_path, model="m1", said="a dog", errors=()) -> dict[str, pa.Table]:
    """The section's tables for one image: `errors` rows, and every other table empty but the description."""
    return {
        "images": pa.table({"image_id": ["i1"], "dataset": ["d1"], "path": [str(tmp_path / "i1.png")]}),
        "references": pa.Table.from_pylist([{"image_id": "i1", "role": "gold", "condition": "full", "text": "a cat"}]),
        "responses": pa.Table.from_pylist(
            [{"subject": model, "image_id": "i1", "variant": "full", "status": "ok", "text": said}]
        ),
        "errors": pa.Table.from_pylist(list(errors), schema=ERRORS_SCHEMA),
        "error_stats": pa.Table.from_pylist(
            [stat(model, "d1", r["error_type"], 1.0, 1.0, 1.0) for r in errors], schema=STATS_SCHEMA
        ),
        "error_comparisons": COMPARISONS_SCHEMA.empty_table(),
        "impact_stats": STATS_SCHEMA.empty_table(),
        "impact_comparisons": COMPARISONS_SCHEMA.empty_table(),
        "spatial": SPATIAL_SCHEMA.empty_table(),
        "hand_agreement": pa.table(
            {
                "error_type": pa.array([], pa.string()),
                "kappa": pa.array([], pa.float64()),
                "observed_agreement": pa.array([], pa.float64()),
                "n": pa.array([], pa.int64()),
            }
        ),
    }


def test_the_whole_section_on_empty_tables(tmp_path, monkeypatch):
    saved = record_figures(monkeypatch)
    page = taxonomy_section(RunFolder(tmp_path), make_study(), section_tables(tmp_path))
    assert "<h2>Errors</h2>" in page and (tmp_path / "errors.html").is_file()
    assert_error_rates(titled(saved, "Error rates"), tmp_path / "figures" / "error_rates.png", ["m1"], [])


def test_markup_in_a_model_name_its_answer_and_a_hand_label_is_shown_as_text(tmp_path):
    label = {
        "subject": PAYLOAD,
        "image_id": "i1",
        "dataset": "d1",
        "error_type": "recognition",
        "present": True,
        "method": "hand",
        "evidence": json.dumps({"findings": [], "hand": PAYLOAD, "auto_present": False}),
    }
    tables = section_tables(tmp_path, PAYLOAD, PAYLOAD, [label])
    section = Page(taxonomy_section(RunFolder(tmp_path), make_study(models=(PAYLOAD,)), tables))
    evidence = Page((tmp_path / "errors.html").read_text())
    for page in (section, evidence):
        assert "script" not in {tag for tag, _ in page.tags}
    # The error rates (the model), the examples (the model, its hand label, its answer); errors.html: the model and the
    # label's note in its chain, and the note in the JSON.
    assert section.sections["Errors"].count(PAYLOAD) == 4
    assert evidence.sections[""].count(PAYLOAD) == 2 and json.dumps(PAYLOAD) in evidence.sections[""]


def test_errors_html_shows_each_labels_whole_evidence_chain(tmp_path):
    chain = {
        "relevant": ["man"],
        "mentioned": ["man", "guitar"],
        "findings": [
            {
                "object": "guitar",
                "existence": {
                    "present": False,
                    "checks": [
                        {"source": "humans", "found": False},
                        {
                            "source": "verifier",
                            "model": "gpt-4o",
                            "question": "Is there a guitar?",
                            "answer": "No.",
                            "reading": "no",
                            "found": False,
                        },
                    ],
                },
                "reference": "man",
                "transcript": [
                    {
                        "kind": "location",
                        "question": "Is there an object near the man?",
                        "answer": "Yes.",
                        "reading": "yes",
                    },
                    {
                        "kind": "identification",
                        "question": "What is the object near the man?",
                        "answer": "A guitar.",
                        "reading": "guitar",
                    },
                ],
            }
        ],
    }
    hand = {"findings": [], "hand": "the saucer is called a bowl", "auto_present": False}
    sde = {"model_r": -0.5, "human_mean_r": 0.8, "human_sd_r": 0.2, "reason": ""}
    undecided = {"undecided": "the detector failed on this image"}
    errors = pa.Table.from_pylist(
        [
            {
                "subject": "m1",
                "image_id": "i1",
                "dataset": "d1",
                "error_type": "hallucination",
                "present": True,
                "method": "probe",
                "evidence": json.dumps(chain),
            },
            {
                "subject": "m1",
                "image_id": "i2",
                "dataset": "d1",
                "error_type": "recognition",
                "present": True,
                "method": "hand",
                "evidence": json.dumps(hand),
            },
            {
                "subject": "m1",
                "image_id": "i2",
                "dataset": "d1",
                "error_type": "spatial_dependence",
                "present": True,
                "method": "masks",
                "evidence": json.dumps(sde),
            },
            {
                "subject": "m1",
                "image_id": "i3",
                "dataset": "d1",
                "error_type": "detection",
                "present": None,
                "method": "detector",
                "evidence": json.dumps(undecided),
            },
        ],
        schema=ERRORS_SCHEMA,
    )
    from vlm_decade.studies.decade.taxonomy.report import _evidence_page

    _evidence_page(RunFolder(tmp_path), make_study(), errors)
    page = (tmp_path / "errors.html").read_text()
    # the chain in words, step by step, then every field as JSON
    assert "<li>verifier gpt-4o: \u201cIs there a guitar?\u201d \u2192 \u201cNo.\u201d (no): not found</li>" in page
    assert (
        "<li>identification: \u201cWhat is the object near the man?\u201d \u2192 \u201cA guitar.\u201d (read: guitar)</li>"
        in page
    )
    assert "<details><summary>all evidence (JSON)</summary>" in page and "&#34;reference&#34;: &#34;man&#34;" in page
    assert "<li>hand label: the saucer is called a bowl (the automatic label: absent)</li>" in page
    assert "<li>model r -0.500; humans&#39; mean r 0.800, SD 0.200</li>" in page
    assert "<li>undecided: the detector failed on this image</li>" in page
