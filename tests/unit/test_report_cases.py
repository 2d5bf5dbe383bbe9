"""Both studies' reports on the awkward runs: no rows at all, one image, one model, one dataset, no
human votes, no masked variants, and statistics a budget stop left without estimate or CI. Each
report is written from hand-built tables and read back for what it must say; and the bounded
samples that keep it small pick exactly the worst and best rows."""

from __future__ import annotations

import copy
import re

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.figures import assert_drawn, colour_pixels, markers, record_figures, texts, titled
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.report.figures import COLOURS
from vlm_decade.report.samples import extremes, thumbnail_uri
from vlm_decade.stages.describe.rows import RESPONSES_SCHEMA
from vlm_decade.stages.images import IMAGES_SCHEMA
from vlm_decade.stats import COMPARISONS_SCHEMA, SCORES_SCHEMA, STATS_SCHEMA
from vlm_decade.stats.groups import with_group
from vlm_decade.studies import study_from_dict
from vlm_decade.studies.decade.data import REFERENCES_SCHEMA
from vlm_decade.studies.decade.report import era_repeats, redraw, write_report
from vlm_decade.studies.openworld.data import LABELS_SCHEMA
from vlm_decade.studies.openworld.report import write_openworld_report
from vlm_decade.studies.openworld.scoring import PREDICTIONS_SCHEMA, SCORES_B_SCHEMA
from vlm_decade.studies.openworld.statistics import (
    COMPARISONS_B_SCHEMA,
    PAIRED_TESTS_SCHEMA,
    STATS_B_SCHEMA,
    mcnemar_tests,
)

from .pages import PAYLOAD, Page
from .view_runs import DECADE_CONFIG, OPENWORLD_CONFIG, PREDICTIONS, SIMILARITY, STATS, decade_run, openworld_run

SCHEMAS = {
    "images": IMAGES_SCHEMA,
    "references": REFERENCES_SCHEMA,
    "responses": RESPONSES_SCHEMA,
    "scores": SCORES_SCHEMA,
    "stats": STATS_SCHEMA,
    "comparisons": COMPARISONS_SCHEMA,
    "labels": LABELS_SCHEMA,
    "predictions": PREDICTIONS_SCHEMA,
}


def _read(root, name) -> pa.Table:
    table = pq.read_table(root / f"{name}.parquet")
    schema = SCHEMAS[name]
    columns = {
        f.name: table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in schema
    }
    return pa.table(columns, schema=schema)


def _keep(tables: dict[str, pa.Table], **where) -> dict[str, pa.Table]:
    """Every table's rows whose columns named in `where` take one of the given values (tables without the column unchanged)."""
    out = {}
    for name, table in tables.items():
        for column, values in where.items():
            if column in table.column_names:
                table = table.filter(pc.is_in(table.column(column), value_set=pa.array(values)))
        out[name] = table
    return out


@pytest.fixture
def decade_tables(tmp_path):
    root = decade_run(tmp_path / "src", tables=("references", "responses", "scores", "stats"))
    tables = {n: _read(root, n) for n in ("images", "references", "responses", "scores", "stats")}
    tables["comparisons"] = COMPARISONS_SCHEMA.empty_table()
    return tables


def _decade(tmp_path, tables, config=DECADE_CONFIG) -> str:
    out = RunFolder(tmp_path / "out")
    write_report(out, study_from_dict(copy.deepcopy(config)), tables)
    return (out.root / "report.html").read_text()


def sample(page: str, title: str) -> list[str]:
    """The image ids of the sample table headed `title`, in order ([] when there is none)."""
    start = page.find(f"<h3>{title}</h3>")
    if start < 0:
        return []
    return re.findall(r"<td>([\w-]+)<br>", page[start : page.index("</table>", start)])


def _one_model_config():
    config = copy.deepcopy(DECADE_CONFIG)
    config["models"] = config["models"][:1]
    return config


def test_decade_report_with_no_rows_at_all(tmp_path, decade_tables):
    page = _decade(tmp_path, {n: t.schema.empty_table() for n, t in decade_tables.items()})
    assert "0 images in 0 datasets;" in page and "No scores in this run" in page and "0 responses, 0 failed" in page


def test_decade_report_with_one_image(tmp_path, decade_tables):
    page = _decade(tmp_path, _keep(decade_tables, image_id=["a2"]))
    assert "1 image in 1 dataset;" in page
    # The one image is both the worst and the only row of each model's sample, never listed twice.
    assert len(re.findall(r"<td>a2<br>", page)) == 2 and "alpha: highest SIM" not in page
    assert "alpha says a2 full" in page and "gold description of a2" in page


def similarity_points(saved) -> list[tuple[float, float]]:
    """The points of the saved similarity figure of SIM: one per model and dataset with an estimate and CI."""
    (ax,) = titled(saved, "Similarity to the gold standard (SIM)").axes
    return markers(ax)


def test_decade_report_with_one_model(tmp_path, decade_tables, monkeypatch):
    saved = record_figures(monkeypatch)
    tables = _keep(decade_tables, subject=["alpha", "human:top"])
    page = _decade(tmp_path, tables, _one_model_config())
    figure = tmp_path / "out" / "figures" / "similarity_SIM.png"
    assert "beta" not in page and figure.stat().st_size > 5_000
    # alpha's estimate in each dataset, side by side, each dataset in its colour.
    assert [y for _, y in similarity_points(saved)] == [STATS["alpha", "ds-a"][0], STATS["alpha", "ds-b"][0]]
    assert_drawn(figure)
    assert colour_pixels(figure, COLOURS[0]) > 100 and colour_pixels(figure, COLOURS[1]) > 100
    worst = sorted((v[0], i) for i, v in SIMILARITY.items() if v[0] is not None)
    # Five scored images, fewer than the sample's size: all of them, worst first, and no "highest" table.
    assert sample(page, "alpha: lowest SIM") == [i for _, i in worst] and sample(page, "alpha: highest SIM") == []


def test_decade_report_with_one_dataset(tmp_path, decade_tables):
    page = _decade(tmp_path, _keep(decade_tables, dataset=["ds-b"]))
    assert "3 images in 1 dataset;" in page and "ds-a" not in page


def test_decade_report_without_human_votes_or_human_scores(tmp_path, decade_tables):
    tables = _keep(decade_tables, subject=["alpha", "beta"], role=["gold", "other"])
    page = _decade(tmp_path, tables)
    assert "human:top" not in page and "top description" not in page and "gold description of a1" in page


def test_decade_report_without_masked_variants(tmp_path, decade_tables):
    tables = _keep(decade_tables, variant=["full"], condition=["full"])
    page = _decade(tmp_path, tables)
    assert "alpha says a1 full" in page and " m1" not in page.split("<h2>Descriptions</h2>")[1]


def _without_estimates(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """The tables with every estimate and CI of the stats a budget stop left null."""
    stats = tables["stats"]
    nulls = pa.nulls(stats.num_rows, pa.float64())
    return {
        **tables,
        "stats": stats.set_column(4, "estimate", nulls).set_column(5, "ci_low", nulls).set_column(6, "ci_high", nulls),
    }


def test_decade_report_with_estimates_a_budget_stop_left_null(tmp_path, decade_tables, monkeypatch):
    saved = record_figures(monkeypatch)
    page = _decade(tmp_path, _without_estimates(decade_tables))
    assert "<td>SIM</td><td>full</td><td></td><td></td><td></td><td>3</td>" in page
    assert (tmp_path / "out" / "figures" / "similarity_SIM.png").exists()
    (ax,) = titled(saved, "Similarity to the gold standard (SIM)").axes
    assert markers(ax) == [] and texts(ax) == ["no model has an estimate with a CI"]
    assert_drawn(tmp_path / "out" / "figures" / "similarity_SIM.png")
    # Partly null: the rows that have numbers still show them.
    saved.clear()
    page = _decade(tmp_path, decade_tables)
    assert "<td>0.483</td><td>0.200</td><td>0.650</td>" in page
    drawn = sorted(y for _, y in similarity_points(saved))
    assert drawn == sorted(e for e, *_ in STATS.values() if e is not None)


def test_decade_report_comparisons_with_null_numbers(tmp_path, decade_tables):
    row = {f.name: None for f in COMPARISONS_SCHEMA}
    row.update(family="models", a="alpha", b="beta", dataset="ds-a", metric="SIM", variant="full")
    tables = {**decade_tables, "comparisons": pa.Table.from_pylist([row], schema=COMPARISONS_SCHEMA)}
    page = _decade(tmp_path, tables)
    assert (
        "<td>models</td><td>alpha</td><td>beta</td><td>ds-a</td><td>SIM</td><td></td><td></td><td></td><td>n/a</td><td>n/a</td>"
        in page
    )


def test_decade_report_stays_bounded_per_model(tmp_path, decade_tables, monkeypatch):
    import vlm_decade.report.samples as samples

    monkeypatch.setattr(samples, "SAMPLE_SIZE", 2)
    page = _decade(tmp_path, decade_tables)
    assert sample(page, "alpha: lowest SIM") == ["b1", "a1"] and sample(page, "alpha: highest SIM") == ["b2", "a2"]
    assert sample(page, "beta: lowest SIM") == ["a3", "b3"] and sample(page, "beta: highest SIM") == ["a2", "a1"]
    assert "vlm-decade view" in page


@pytest.fixture
def openworld_tables(tmp_path):
    root = openworld_run(tmp_path / "src")
    tables = {n: _read(root, n) for n in ("images", "labels", "responses", "predictions")}
    main = [p for p in tables["predictions"].to_pylist() if p["prompt_id"] == "default"]
    stats = []
    for model in ("alpha", "beta"):
        for group in ("prototypical", "fine-grained", "very fine-grained", "all"):
            mine = [p for p in main if p["subject"] == model and (group == "all" or p["granularity"] == group)]
            values = {m: [p[m] for p in mine] for m in ("TI", "LI", "SS", "CS")}
            values |= {
                f"outcome:{o}": [float(p["outcome"] == o) for p in mine]
                for o in ("correct", "granularity", "ambiguity", "confusion")
            }
            for metric, column in values.items():
                mean = sum(column) / len(column)
                stats.append(
                    {
                        "subject": model,
                        "dataset": group,
                        "metric": metric,
                        "prompt_id": "default",
                        "estimate": mean,
                        "ci_low": mean - 0.1,
                        "ci_high": mean + 0.1,
                        "n_images": len(mine),
                        "n_resamples": 100,
                        "seed": 1,
                        "method": "percentile",
                    }
                )
    tables["stats"] = pa.Table.from_pylist(stats, schema=STATS_B_SCHEMA)
    tables["comparisons"] = COMPARISONS_B_SCHEMA.empty_table()
    tables["paired_tests"] = PAIRED_TESTS_SCHEMA.empty_table()
    return tables


def _openworld(tmp_path, tables, config=OPENWORLD_CONFIG, no_judge=None) -> str:
    out = RunFolder(tmp_path / "out")
    write_openworld_report(out, study_from_dict(copy.deepcopy(config)), tables, no_judge)
    return (out.root / "report.html").read_text()


def test_openworld_report_with_no_rows_at_all(tmp_path, openworld_tables):
    page = _openworld(tmp_path, {n: t.schema.empty_table() for n, t in openworld_tables.items()}, no_judge="no judge")
    assert "0 images in 0 datasets;" in page and "No scored predictions" in page and "0 responses, 0 failed" in page


def test_openworld_report_with_one_image_one_model_one_group(tmp_path, openworld_tables):
    config = copy.deepcopy(OPENWORLD_CONFIG)
    config["models"] = config["models"][:1]
    tables = _keep(openworld_tables, image_id=["a2"], subject=["alpha"])
    tables["stats"] = _keep({"s": openworld_tables["stats"]}, dataset=["prototypical"], subject=["alpha"])["s"]
    page = _openworld(tmp_path, tables, config)
    assert "1 image in 1 dataset;" in page and "beta" not in page
    cs = next(r for r in tables["stats"].to_pylist() if r["metric"] == "CS")
    assert f"{100 * cs['estimate']:.1f} [{100 * cs['ci_low']:.1f}, {100 * cs['ci_high']:.1f}]" in page
    assert len(re.findall(r"<td>a2<br>", page)) == 1 and "alpha: highest CS" not in page


def test_openworld_report_shows_the_rows_about_all_images_and_each_group_apart(tmp_path, openworld_tables):
    config = copy.deepcopy(OPENWORLD_CONFIG)
    config["models"] = config["models"][:1]
    tables = _keep(openworld_tables, image_id=["a2"], subject=["alpha"])
    stats = _keep({"s": openworld_tables["stats"]}, dataset=["prototypical"], subject=["alpha"])["s"]
    # A grouped study's table: the same rows about all images, and one group's with other estimates.
    group = stats.set_column(stats.schema.get_field_index("estimate"), "estimate", pa.array([0.0123] * stats.num_rows))
    tables["stats"] = pa.concat_tables([with_group(stats, None, None), with_group(group, "category", "hard")])
    page = _openworld(tmp_path, tables, config)
    cs = next(r for r in stats.to_pylist() if r["metric"] == "CS")
    main = page[page.index("<h2>Main table</h2>") : page.index("<h3>By category</h3>")]
    assert f"{100 * cs['estimate']:.1f} [{100 * cs['ci_low']:.1f}, {100 * cs['ci_high']:.1f}]" in main
    assert "1.2 [" not in main
    # The group's own table, under its name.
    assert "1.2 [" in page[page.index("<h4>category = hard</h4>") :].split("</table>")[0]
    assert "hard" in (tmp_path / "out" / "tables" / "stats.csv").read_text()  # the CSV keeps every row


def test_openworld_report_with_estimates_a_budget_stop_left_null(tmp_path, openworld_tables):
    page = _openworld(tmp_path, _without_estimates(openworld_tables))
    assert "n/a [n/a, n/a]" in page


def test_openworld_report_samples_the_lowest_and_highest_cs(tmp_path, openworld_tables, monkeypatch):
    import vlm_decade.report.samples as samples

    monkeypatch.setattr(samples, "SAMPLE_SIZE", 2)
    page = _openworld(tmp_path, openworld_tables)
    beta = sorted((p[2], i) for (m, i), p in PREDICTIONS.items() if m == "beta")
    assert sample(page, "beta: lowest CS") == [i for _, i in beta[:2]]
    assert sample(page, "beta: highest CS") == [i for _, i in beta[::-1][:2]]
    # The error types with a few examples each; no table lists every prediction.
    assert "granularity error" in page and "fine-grained confusion" in page
    assert page.count("<td>b1<br>") == len(
        [m for m in ("alpha", "beta") if "b1" in sample(page, f"{m}: lowest CS") + sample(page, f"{m}: highest CS")]
    )


@pytest.mark.parametrize(
    "n_rows, n, low, high",
    [
        (0, 3, [], []),
        (1, 3, [0], []),
        (4, 3, [0, 1, 2], [3]),
        (6, 3, [0, 1, 2], [5, 4, 3]),
        (10, 3, [0, 1, 2], [9, 8, 7]),
    ],
)
def test_extremes_are_disjoint_and_cover_small_sets(n_rows, n, low, high):
    rows = [{"id": i, "v": float(i)} for i in range(n_rows)]
    got_low, got_high = extremes(rows[::-1], "v", n)
    assert [r["id"] for r in got_low] == low and [r["id"] for r in got_high] == high


def test_extremes_leave_out_missing_values_and_keep_the_order_of_ties():
    rows = [
        {"id": "a", "v": 0.5},
        {"id": "b", "v": None},
        {"id": "c", "v": float("nan")},
        {"id": "d", "v": 0.5},
        {"id": "e", "v": 0.1},
    ]
    low, high = extremes(rows, "v", 1)
    assert [r["id"] for r in low] == ["e"] and [r["id"] for r in high] == ["d"]


def test_thumbnails_are_small_and_a_missing_file_is_none(tmp_path):
    from PIL import Image

    path = tmp_path / "big.png"
    Image.new("RGB", (2000, 1000), (10, 200, 30)).save(path)
    uri = thumbnail_uri(str(path))
    assert uri.startswith("data:image/jpeg;base64,") and len(uri) < 4_000
    assert thumbnail_uri(str(tmp_path / "gone.png")) is None


def _renamed(tables: dict[str, pa.Table], old: str, new: str) -> dict[str, pa.Table]:
    """Every table with subject `old` called `new`."""
    out = {}
    for name, table in tables.items():
        if "subject" in table.column_names:
            subjects = pc.if_else(pc.equal(table.column("subject"), old), new, table.column("subject"))
            table = table.set_column(table.column_names.index("subject"), "subject", subjects)
        out[name] = table
    return out


def _with(table: pa.Table, column: str, value: str, where) -> pa.Table:
    """`table` with `column` set to `value` in the rows where `where(row)` holds."""
    rows = [{**r, column: value} if where(r) else r for r in table.to_pylist()]
    return pa.Table.from_pylist(rows, schema=table.schema)


def _escaped_everywhere(page: Page, sections: tuple[str, ...]) -> None:
    assert "script" not in {tag for tag, _ in page.tags}
    for section in sections:
        assert PAYLOAD in page.sections[section], section


def test_decade_report_shows_markup_in_names_and_answers_as_text(tmp_path, decade_tables):
    config = copy.deepcopy(DECADE_CONFIG)
    config["name"] = PAYLOAD
    config["models"][0]["name"] = PAYLOAD
    tables = _renamed(decade_tables, "alpha", PAYLOAD)

    def answer(r):
        return r["subject"] == PAYLOAD and r["variant"] == "full"

    def failed(r):
        return answer(r) and r["image_id"] == "a1"

    responses = _with(tables["responses"], "text", PAYLOAD, answer)
    tables["responses"] = _with(_with(responses, "status", "error", failed), "error", PAYLOAD, failed)
    page = Page(_decade(tmp_path, tables, config))
    # The page head, the statistics, the sample tables (the model's name, its answers) and the failed responses.
    assert page.sections[""].startswith(PAYLOAD + ": vlm_decade report" + PAYLOAD)
    _escaped_everywhere(page, ("Similarity to the gold standard", "Descriptions", "Responses"))
    assert f"{PAYLOAD}: lowest SIM" in page.sections["Descriptions"]
    assert {a["data-model"] for t, a in page.tags if t == "table" and "data-model" in a} == {PAYLOAD, "beta"}


def test_openworld_report_shows_markup_in_names_labels_and_answers_as_text(tmp_path, openworld_tables):
    config = copy.deepcopy(OPENWORLD_CONFIG)
    config["models"][0]["name"] = PAYLOAD
    tables = _renamed(openworld_tables, "alpha", PAYLOAD)

    def mine(r):
        return r["subject"] == PAYLOAD

    tables["predictions"] = _with(_with(tables["predictions"], "label", PAYLOAD, mine), "prediction", PAYLOAD, mine)
    page = Page(_openworld(tmp_path, tables, config))
    _escaped_everywhere(page, ("Main table", "Error types", "Predictions"))
    examples = page.sections["Error types"].split("fine-grained confusion")[-1]
    assert examples.count(PAYLOAD) >= 3  # the model, its label and its prediction
    assert f"{PAYLOAD}: lowest CS" in page.sections["Predictions"]
    assert {a["data-model"] for t, a in page.tags if t == "table" and "data-model" in a} == {PAYLOAD, "beta"}


def test_openworld_report_shows_mcnemars_tests_of_the_binary_metrics(tmp_path, openworld_tables):
    """The McNemar table reads back as the paired_tests table computed from the predictions' TI."""
    scores = pa.Table.from_pylist(
        [
            {
                "subject": p["subject"],
                "image_id": p["image_id"],
                "dataset": p["dataset"],
                "prompt_id": p["prompt_id"],
                "metric": "TI",
                "value": p["TI"],
            }
            for p in openworld_tables["predictions"].to_pylist()
        ],
        schema=SCORES_B_SCHEMA,
    )
    granularity = {p["dataset"]: p["granularity"] for p in openworld_tables["predictions"].to_pylist()}
    paired = mcnemar_tests(scores, granularity, ["alpha", "beta"], "default")
    assert paired.num_rows > 0
    page = Page(_openworld(tmp_path, {**openworld_tables, "paired_tests": paired}))
    text = "".join(page.sections["McNemar's exact test"].split())  # the cells, run together
    for r in paired.to_pylist():
        cells = f"{r['n_pairs']}{r['a_only']}{r['b_only']}{r['p']:.3g}{r['q']:.3g}{r['significant']}"
        assert f"alphabeta{r['dataset'].replace(' ', '')}TI{cells}" in text  # significant: True or False, as in Study A


def comparison(family, a, b, dataset="ds-a", metric="SIM", difference=0.1) -> dict:
    row = {f.name: None for f in COMPARISONS_SCHEMA}
    row.update(family=family, a=a, b=b, dataset=dataset, metric=metric, variant="full", difference=difference)
    return row


ONE_PER_ERA = {"alpha": "pre-mllm", "beta": "mllm", "human:top": "human", "human:bottom": "human"}
ROWS = [
    comparison("era", "era:pre-mllm", "era:mllm"),
    comparison("dataset", "alpha", "alpha", "ds-a vs ds-b"),
    comparison("dataset", "era:pre-mllm", "era:pre-mllm", "ds-a vs ds-b"),
    comparison("dataset", "beta", "beta", "ds-a vs ds-b"),
    comparison("dataset", "era:mllm", "era:mllm", "ds-a vs ds-b"),
    comparison("vs-humans", "alpha", "human:bottom"),
    comparison("era-vs-humans", "era:pre-mllm", "human:bottom"),
    comparison("era-vs-humans", "era:mllm", "human:top"),  # no row of beta against human:top
    comparison("era-vs-humans", "era:pre-mllm", "human:bottom", metric="OTHER"),  # no alpha row on OTHER
]


def test_era_comparisons_of_one_model_eras_that_repeat_a_models_are_left_out():
    kept, single = era_repeats(ROWS, ONE_PER_ERA)
    assert kept == [ROWS[i] for i in (0, 1, 3, 5, 7, 8)]
    assert single == {"era:mllm": "beta", "era:pre-mllm": "alpha"}
    # An era of two models is their mean: its rows ask something new and stay; the one-model era's go.
    two_pre = {**ONE_PER_ERA, "gamma": "pre-mllm"}
    kept, single = era_repeats(ROWS, two_pre)
    assert kept == [r for i, r in enumerate(ROWS) if i != 4] and single == {"era:mllm": "beta"}
    assert era_repeats(ROWS, {**two_pre, "delta": "mllm"}) == (ROWS, {})


def test_decade_report_says_in_one_line_which_era_comparisons_it_left_out(tmp_path, decade_tables):
    page = Page(
        _decade(tmp_path, {**decade_tables, "comparisons": pa.Table.from_pylist(ROWS, schema=COMPARISONS_SCHEMA)})
    )
    section = page.sections["Comparisons"]
    assert (
        "An era of one model is that model (era:mllm is beta; era:pre-mllm is alpha): 3 era comparisons that repeat "
        "the model's are left out here (the comparisons table keeps them)." in " ".join(section.split())
    )
    assert "era:pre-mllmera:pre-mllm" not in "".join(section.split()) and "era:pre-mllmera:mllm" in "".join(
        section.split()
    )


def test_decade_report_says_why_the_human_bands_are_missing_where_they_would_be(tmp_path, decade_tables):
    """One description per image (the gold standard alone): the page says, under each dataset's gold
    standard and right after the similarity figure, what the descriptions are too few for."""
    tables = _keep(decade_tables, subject=["alpha", "beta"], role=["gold"])
    out = RunFolder(tmp_path / "out")
    out.save_manifest({"ranking_method": {"ds-a": "consensus", "ds-b": "votes"}})
    write_report(out, study_from_dict(copy.deepcopy(DECADE_CONFIG)), tables)
    text = (out.root / "report.html").read_text()
    page = Page(text)
    gold = " ".join(page.sections["Gold standard"].split())
    assert "/nowhere/d.csv: 3 of 3 images of dataset 'ds-a' have 1 description; the consensus rule" in gold
    assert "/nowhere/d.csv: 3 of 3 images of dataset 'ds-b' have 1 description; votes choose between" in gold
    similarity = " ".join(page.sections["Similarity to the gold standard"].split())
    for dataset in ("ds-a", "ds-b"):
        assert f"the report has no top- or bottom-ranked human bands for '{dataset}'" in similarity
    # Right where the bands would be: after the figure, before the table of estimates.
    figure, note = text.index("figures/similarity_SIM.png"), text.index("no top- or bottom-ranked human bands")
    assert figure < note < text.index("<table", figure)
    # With every description the study asks for (a gold standard, one top, one bottom), nothing of the kind is said.
    config = {**copy.deepcopy(DECADE_CONFIG), "ranking": {"top_k": 1, "bottom_k": 1}}
    page = _decade(tmp_path, decade_tables, config)
    assert "human bands" not in page and "needs at least" not in page


def test_both_reports_name_the_failed_models_at_the_top(tmp_path, decade_tables, openworld_tables):
    """The failed rows the manifest's stages record (as the run recorded them) head both pages."""
    from dataclasses import asdict

    from vlm_decade.core.runner import Failed

    failed = Failed("responses", "beta", 4, 4, "ValueError: no <weights>", 4)
    pages = []
    for name, write, tables, config in (
        ("a", write_report, decade_tables, DECADE_CONFIG),
        ("b", write_openworld_report, openworld_tables, OPENWORLD_CONFIG),
    ):
        out = RunFolder(tmp_path / name)
        out.update_manifest(pipeline=["responses"], stages={"responses": {"failed": [asdict(failed)]}})
        write(out, study_from_dict(copy.deepcopy(config)), tables)
        pages.append((out.root / "report.html").read_text())
    for page in pages:
        note = page[page.index("<div class='failed'>") : page.index("</div>")]
        assert page.index("<div class='failed'>") < page.index("<h2>") and "<b>Failed:</b> beta." in note
        assert "beta: 4 of 4 responses failed (every one); most common (4): ValueError: no &lt;weights&gt;" in note
    assert "class='failed'" not in _decade(tmp_path / "clean", decade_tables)  # no failures recorded: no note


def _pixels_of(path, colour: str) -> int:
    """How many pixels of a figure have `colour` (#rrggbb)."""
    from PIL import Image

    rgb = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return sum(n for n, c in Image.open(path).convert("RGB").getcolors(1 << 24) if c == rgb)


def test_openworld_report_draws_its_figures_and_shows_ss_thresholds_a_row_per_model_and_group(
    tmp_path, openworld_tables, monkeypatch
):
    from vlm_decade.studies.openworld.report import FIGURES, GROUPS, OUTCOME_COLOURS, outcome_counts

    # Hand-given SS threshold shares for alpha on all images.
    shares = {"ss@0.5": 0.9, "ss@0.6": 0.8, "ss@0.7": 0.5, "ss@0.8": 0.25, "ss@0.9": 0.125, "ss@avg": 0.515}
    rows = openworld_tables["stats"].to_pylist()
    first = next(r for r in rows if r["subject"] == "alpha" and r["dataset"] == "all")
    rows += [{**first, "metric": m, "estimate": v, "ci_low": v - 0.05, "ci_high": v + 0.05} for m, v in shares.items()]
    saved = record_figures(monkeypatch)
    text = _openworld(tmp_path, {**openworld_tables, "stats": pa.Table.from_pylist(rows, schema=STATS_B_SCHEMA)})
    page = Page(text)
    shown = [a["src"] for tag, a in page.tags if tag == "img"]
    for name, file in FIGURES.items():
        path = tmp_path / "out" / file
        assert file in shown and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert_drawn(path)
    # The metrics figure: a panel per metric, a point per model and group (percent), each group in its colour.
    metrics = titled(saved, "Each metric per model")
    assert [ax.get_title() for ax in metrics.axes] == ["TI", "LI", "SS", "CS"]
    for ax in metrics.axes:
        want = [100 * r["estimate"] for r in rows if r["dataset"] in GROUPS and r["metric"] == ax.get_title()]
        assert sorted(y for _, y in markers(ax)) == pytest.approx(sorted(want)) and want, ax.get_title()
    figure = tmp_path / "out" / FIGURES["metrics"]
    assert colour_pixels(figure, COLOURS[0]) > 100 and colour_pixels(figure, COLOURS[1]) > 100
    # The SS thresholds: alpha's curve through its shares (percent), beta none.
    (ax,) = titled(saved, "SS at thresholds").axes
    curve = [m for m in shares if m != "ss@avg"]
    assert [x for x, _ in markers(ax)] == pytest.approx([float(m.split("@")[1]) for m in curve])
    assert [y for _, y in markers(ax)] == pytest.approx([100 * shares[m] for m in curve])
    assert colour_pixels(tmp_path / "out" / FIGURES["ss_thresholds"], COLOURS[0]) > 100
    # The thresholds table: one row for alpha's `all`, its cells the shares in percent.
    table = text[text.index("<table id='ss-thresholds'>") :]
    table = table[: table.index("</table>")]
    assert re.findall(r"<th>([^<]*)</th>", table) == ["model", "group", *shares]
    cells = [f"{100 * v:.1f} [{100 * (v - 0.05):.1f}, {100 * (v + 0.05):.1f}]" for v in shares.values()]
    assert re.findall(r"<tr>(.*?)</tr>", table)[1:] == ["".join(f"<td>{c}</td>" for c in ["alpha", "all", *cells])]
    # Each model's outcomes counted by hand from view_runs' predictions, and drawn: ambiguity only beta had.
    counts = outcome_counts(openworld_tables["predictions"], "default")
    for model in ("alpha", "beta"):
        expected: dict[str, int] = {}
        for (m, _), (*_, outcome) in PREDICTIONS.items():
            if m == model:
                expected[outcome] = expected.get(outcome, 0) + 1
        assert counts[model] == expected
    figure = tmp_path / "out" / FIGURES["outcomes"]
    # A bar is thousands of pixels; a colour drawn nowhere may still turn up in a few antialiased ones.
    assert (
        _pixels_of(figure, OUTCOME_COLOURS["ambiguity"]) > 1000 > 100 > _pixels_of(figure, OUTCOME_COLOURS["unjudged"])
    )
    # The viewer's model pages and confusion view, linked for when the report is opened through it.
    links = {a["href"] for tag, a in page.tags if tag == "a"}
    assert {"../model/alpha", "../model/beta", "../confusions"} <= links


def test_the_report_streamed_from_the_run_folder_is_the_report_of_the_tables_held_whole(tmp_path, monkeypatch):
    """The report stage leaves the references and responses (several KB per image) in the run folder
    and reads only the rows it draws on, a batch at a time: the page, errors.html and the CSVs are
    byte for byte those written from the tables held whole, failed responses and vote ties included
    (the error section's per-image rows come the same way: the demo's page tests draw it)."""
    root = decade_run(tmp_path / "run")
    responses = pq.read_table(root / "responses.parquet")
    failed = pc.equal(pa.array(range(responses.num_rows)), 1)
    responses = responses.set_column(
        responses.schema.get_field_index("status"), "status", pc.if_else(failed, "error", responses.column("status"))
    ).set_column(
        responses.schema.get_field_index("error"),
        "error",
        pc.if_else(failed, "TimeoutError: slow", responses.column("error")),
    )
    folder = RunFolder(root)
    folder.write("responses", responses)
    folder.write("comparisons", COMPARISONS_SCHEMA.empty_table())
    for name in ("errors", "detections", "spatial", "error_stats"):  # this study has no taxonomy
        folder.table_path(name).unlink()
    study = study_from_dict(copy.deepcopy(DECADE_CONFIG))
    names = [p.stem for p in root.glob("*.parquet")]
    held = RunFolder(tmp_path / "held")
    write_report(held, study, {n: folder.read(n) for n in names})

    def whole(self, name, columns=None):
        if name in ("references", "responses"):
            raise AssertionError(f"{name} was read whole")
        return pq.read_table(self.table_path(name), columns=columns)

    monkeypatch.setattr(RunFolder, "read", whole)
    monkeypatch.setattr(RunFolder, "batches", _small_batches(RunFolder.batches))
    assert redraw(folder, study) == []
    written = sorted(p.relative_to(held.root) for p in held.root.rglob("*") if p.suffix in (".html", ".csv"))
    assert [p.name for p in written] == [
        "report.html",
        "comparisons.csv",
        "responses.csv",
        "scores.csv",
        "stats.csv",
    ]
    for path in written:
        assert (root / path).read_bytes() == (held.root / path).read_bytes(), path
    page = (root / "report.html").read_text()
    assert "TimeoutError: slow" in page and "48 responses, 2 failed." in page


def _small_batches(batches):
    """`RunFolder.batches` a few rows at a time, so that what is streamed spans many batches."""
    return lambda self, name, columns=None, batch_size=None, **pruning: batches(self, name, columns, 3, **pruning)


@pytest.mark.parametrize(
    "ids",
    [["img03", "img17"], ["img00", "img29"], ["img13x"], [], [f"img{i:02d}" for i in range(30)]],
)
def test_the_rows_of_sampled_images_are_read_from_the_row_groups_that_can_hold_them(tmp_path, monkeypatch, ids):
    """`rows_of` with `_Images` gives the rows a filter of the whole table gives, in order, reading
    only the row groups whose footer's image_id range holds one of the ids (an id that sorts
    between two groups' images, "img13x", is in none)."""
    from vlm_decade.studies.decade import report

    folder = RunFolder(tmp_path)
    image_ids = [f"img{i:02d}" for i in range(30) for _ in range(3)]  # sorted: a group holds 2 images' rows
    table = pa.table({"image_id": image_ids, "text": [f"t{i}" for i in range(len(image_ids))]})
    folder.write_batches("responses", table.schema, table.to_batches(), row_group_rows=6)
    read_groups = []
    file_batches = RunFolder.file_batches

    def spied(path, columns=None, batch_size=65_536, row_groups=None):
        read_groups.append(row_groups)
        return file_batches(path, columns, batch_size, row_groups)

    monkeypatch.setattr(RunFolder, "file_batches", staticmethod(spied))
    got = report.rows_of(folder, {}, "responses", where=report._Images(ids))
    assert got.equals(table.filter(pc.is_in(table.column("image_id"), value_set=pa.array(ids, pa.string()))))
    expected = sorted({int(i[3:5]) // 2 for i in ids if len(i) == 5})
    assert read_groups == ([expected] if expected else [])


def test_openworld_report_says_which_tables_are_percentages_and_which_cosines(tmp_path, openworld_tables):
    """The header says the tables of means are percentages and the tables of single predictions are on
    the metrics' own scale; the cells are so: a mean CS x 100 in the main table, a prediction's CS as it is."""
    page = Page(_openworld(tmp_path, openworld_tables))
    header = " ".join(page.sections[""].split())
    assert (
        "tables of means (main table, per dataset, SS at thresholds, error types, prompt ablation) are percentages"
        in header
    )
    assert "the tables of single predictions (predictions, error-type examples) are on the metrics' own scale" in header
    cs = next(r for r in openworld_tables["stats"].to_pylist() if r["metric"] == "CS" and r["dataset"] == "all")
    assert f"{100 * cs['estimate']:.1f} [" in page.sections["Main table"]
    lowest = min(p[2] for (m, _), p in PREDICTIONS.items() if m == "alpha")  # alpha's lowest CS, from view_runs
    assert f"{lowest:.3f}" in page.sections["Predictions"] and f"{100 * lowest:.1f}" not in page.sections["Predictions"]


def test_openworld_report_without_a_judge_says_why_every_outcome_is_unjudged(tmp_path, openworld_tables):
    judged = Page(_openworld(tmp_path / "judged", openworld_tables))
    assert not any(a.get("id") == "outcomes-unjudged" for _, a in judged.tags)
    predictions = openworld_tables["predictions"]
    predictions = predictions.set_column(
        predictions.schema.get_field_index("outcome"), "outcome", pa.array(["unjudged"] * predictions.num_rows)
    ).set_column(predictions.schema.get_field_index("LI"), "LI", pa.nulls(predictions.num_rows, pa.float64()))
    stats = openworld_tables["stats"]
    stats = stats.filter(
        pc.invert(pc.or_(pc.equal(stats.column("metric"), "LI"), pc.starts_with(stats.column("metric"), "outcome:")))
    )
    tables = {**openworld_tables, "predictions": predictions, "stats": stats}
    page = Page(_openworld(tmp_path, tables, no_judge="no judge model is configured (study file, field 'judge')"))
    assert any(a.get("id") == "outcomes-unjudged" for _, a in page.tags)
    figures = " ".join(page.sections["Figures"].split())
    assert (
        "Every prediction is unjudged, one grey bar per model: no LI judge ran (no judge model is configured" in figures
    )


def test_the_report_command_names_the_report_by_its_absolute_path(tmp_path, monkeypatch):
    """`report run` from the run's parent folder says the report's absolute path, as `run` does."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from vlm_decade.cli import app

    openworld_run(tmp_path / "run")
    redrawn = SimpleNamespace(redraw_report=lambda folder, study: [])  # the drawing itself is tested above
    monkeypatch.setattr("vlm_decade.studies.pipeline_of", lambda study: redrawn)
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, ["report", "run"], terminal_width=1000)
    assert done.exit_code == 0 and done.output.splitlines() == [f"report: {tmp_path}/run/report.html"]
