"""`vlm-decade export`: each study's tidy table equals a join of the run's tables done by hand in
Python (rows and every cell), carries the user's metadata columns (renamed `metadata:<name>` where
the export has the name already), has exactly the columns docs/export.md lists, leaves the scores
of a failed response and the labels of a masked variant empty, and is written as Parquet or as
spreadsheet-safe CSV."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from vlm_decade.cli import app
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.stages.images import IMAGES_SCHEMA
from vlm_decade.studies.decade.export import tidy as decade_tidy
from vlm_decade.studies.decade.taxonomy.analysis import ERROR_TYPES
from vlm_decade.studies.openworld.data import LABELS_SCHEMA
from vlm_decade.studies.openworld.export import tidy as openworld_tidy
from vlm_decade.studies.openworld.scoring import PREDICTIONS_SCHEMA

from .view_runs import decade_run, openworld_run, write

DOC = Path(__file__).parents[2] / "docs" / "export.md"

FORMULA = '=HYPERLINK("http://evil","click")'


def _rows(root, name) -> list[dict]:
    return pq.read_table(root / f"{name}.parquet").to_pylist()


def _with_metadata(root, columns: dict) -> None:
    """The run's `metadata` table, as a run keeps the user's own columns of its images or labels
    table: `columns` maps each column's name to its value of an image's row."""
    rows = [
        {"image_id": r["image_id"]} | {c: value_of(r) for c, value_of in columns.items()} for r in _rows(root, "images")
    ]
    write(root, "metadata", rows, pa.schema([(c, pa.string()) for c in ("image_id", *columns)]))


def _decade_by_hand(root, labelled: bool = True) -> list[dict]:
    metadata = {r["image_id"]: r for r in _rows(root, "metadata")} if (root / "metadata.parquet").exists() else {}
    images = {r["image_id"]: r | metadata.get(r["image_id"], {}) for r in _rows(root, "images")}
    scores = {(r["subject"], r["image_id"], r["variant"], r["metric"]): r["value"] for r in _rows(root, "scores")}
    metrics = sorted({m for *_, m in scores})
    errors = (
        {(r["subject"], r["image_id"], r["error_type"]): r["present"] for r in _rows(root, "errors")}
        if labelled
        else {}
    )
    out = []
    for r in _rows(root, "responses"):
        key = (r["subject"], r["image_id"], r["variant"])
        out.append(
            {"model": r["subject"], **images[r["image_id"]], "variant": r["variant"], "prompt_id": r["prompt_id"]}
            | {"response": r["text"], "response_status": r["status"], "response_error": r["error"]}
            | {m: scores.get((*key, m)) for m in metrics}
            | {
                f"error:{t}": errors.get((r["subject"], r["image_id"], t)) if r["variant"] == "full" else None
                for t in ERROR_TYPES
            }
        )
    return sorted(out, key=lambda r: (r["model"], r["image_id"], r["variant"]))


def test_study_a_export_is_the_join_of_its_tables_with_the_users_image_columns(tmp_path):
    root = decade_run(tmp_path / "run")
    _with_metadata(root, {"category": lambda r: f"cat-{r['image_id'][0]}"})
    got = decade_tidy(RunFolder(root))
    assert got.to_pylist() == _decade_by_hand(root)
    assert got.num_rows == 2 * 6 * 4  # models x images x variants
    assert got.column_names[:3] == ["model", "image_id", "dataset"] and "category" in got.column_names
    row = {(r["model"], r["image_id"], r["variant"]): r for r in got.to_pylist()}
    # Hand-read from view_runs: alpha's SIM on a1 is 0.30 and its detection error present; beta's b3 m2 failed.
    assert row[("alpha", "a1", "full")]["SIM"] == 0.30 and row[("alpha", "a1", "full")]["error:detection"] is True
    assert row[("alpha", "a1", "m1")]["error:detection"] is None  # a masked variant is not labelled
    failed = row[("beta", "b3", "m2")]
    assert (failed["response_status"], failed["SIM"], failed["category"]) == ("error", None, "cat-b")


def test_study_a_export_without_the_error_analysis_has_its_columns_empty(tmp_path):
    root = decade_run(tmp_path / "run", tables=("responses", "scores"))
    got = decade_tidy(RunFolder(root))
    assert got.to_pylist() == _decade_by_hand(root, labelled=False)
    assert all(got.column(f"error:{t}").null_count == got.num_rows for t in ERROR_TYPES)


def test_study_b_export_is_the_join_of_its_tables_per_prompt_with_the_users_label_columns(tmp_path):
    root = openworld_run(tmp_path / "run")
    _with_metadata(root, {"source": lambda r: f"src-{r['dataset']}"})
    responses = _rows(root, "responses")
    failed = next(r for r in responses if (r["subject"], r["image_id"], r["prompt_id"]) == ("beta", "b3", "specific"))
    failed.update(text=None, status="error", error="RateLimitError: budget reached")
    write(root, "responses", responses)
    write(
        root,
        "predictions",
        [
            p
            for p in _rows(root, "predictions")
            if (p["subject"], p["image_id"], p["prompt_id"]) != ("beta", "b3", "specific")
        ],
    )

    images = {r["image_id"]: r for r in _rows(root, "images")}
    labels = {r["image_id"]: r for r in _rows(root, "labels")}
    metadata = {r["image_id"]: {"source": r["source"]} for r in _rows(root, "metadata")}
    predictions = {(p["subject"], p["image_id"], p["prompt_id"]): p for p in _rows(root, "predictions")}
    scored = ("TI", "LI", "SS", "CS", "best_concept", "judge_answer", "outcome")
    want = []
    for r in responses:
        p = predictions.get((r["subject"], r["image_id"], r["prompt_id"]), {})
        label = {k: v for k, v in labels[r["image_id"]].items() if k not in ("image_id", "dataset")}
        want.append(
            {"model": r["subject"], **images[r["image_id"]], **label, **metadata[r["image_id"]]}
            | {"prompt_id": r["prompt_id"]}
            | {"response": r["text"], "response_status": r["status"], "response_error": r["error"]}
            | {c: p.get(c) for c in scored}
        )
    want.sort(key=lambda r: (r["model"], r["image_id"], r["prompt_id"]))
    got = openworld_tidy(RunFolder(root)).to_pylist()
    assert got == want and len(got) == 2 * 6 * 2  # models x images x prompts
    first = got[0]  # alpha on a1 under default, from view_runs: "dog" for a dalmatian, a granularity error
    assert (first["label"], first["response"], first["CS"], first["outcome"], first["source"]) == (
        "dalmatian",
        "dog",
        0.70,
        "granularity",
        "src-ds-a",
    )
    assert got[-1]["model"] == "beta" and got[-1]["response_status"] == "error" and got[-1]["outcome"] is None


def test_a_metadata_column_named_as_an_export_column_is_prefixed_and_the_export_keeps_its_own(tmp_path):
    root = decade_run(tmp_path / "run", tables=("responses", "scores"))
    _with_metadata(
        root,
        {"width": lambda r: "wide", "SIM": lambda r: "user's SIM", "metadata:width": lambda r: "taken", "site": str},
    )
    got = decade_tidy(RunFolder(root))
    metadata = ["metadata:width", "metadata:SIM", "metadata:metadata:width", "site"]
    assert [c for c in got.column_names if c.startswith("metadata:") or c == "site"] == metadata
    first = got.to_pylist()[0]
    assert (first["width"], first["SIM"]) == (64, 0.30)  # the export's own columns, as without the metadata
    assert [first[c] for c in metadata[:3]] == ["wide", "user's SIM", "taken"]


def _documented(study: str) -> list[str]:
    """The names in the first column of docs/export.md's table for `study` ("A" or "B"): columns, or
    `<patterns>` standing for several."""
    section = DOC.read_text(encoding="utf-8").split(f"\n## Study {study}")[1].split("\n## ")[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return [name for cell in first_cells for name in re.findall(r"`([^`]+)`", cell)]


def _expanded(names: list[str], patterns: dict[str, list[str]]) -> list[str]:
    unknown = [n for n in names if n.startswith("<") and n not in patterns]
    assert not unknown, f"docs/export.md names a pattern this test does not know: {unknown}"
    return [column for n in names for column in patterns.get(n, [n])]


@pytest.mark.parametrize("study", ["A", "B"])
def test_the_export_has_every_column_docs_export_md_lists_and_no_other(tmp_path, study):
    """On a run whose tables have every column a run writes (the images', labels' and predictions'
    schemas), with the user's metadata: each column (or each one a pattern stands for) the doc's
    table names is in the export, and the export has no column the table does not name."""
    metadata = {"category": lambda r: "c", "source": lambda r: "s"}
    if study == "A":
        root = decade_run(tmp_path / "run")
        patterns = {"<metric>": sorted({r["metric"] for r in _rows(root, "scores")})}
    else:
        root = openworld_run(tmp_path / "run")
        write(root, "labels", [r | {"accepted": []} for r in _rows(root, "labels")], LABELS_SCHEMA)
        write(root, "predictions", _rows(root, "predictions"), PREDICTIONS_SCHEMA)
        patterns = {}
    write(root, "images", [r | {"mode": "RGB"} for r in _rows(root, "images")], IMAGES_SCHEMA)
    _with_metadata(root, metadata)
    got = (decade_tidy if study == "A" else openworld_tidy)(RunFolder(root)).column_names
    documented = _expanded(_documented(study), patterns | {"<metadata column>": list(metadata)})
    assert [c for c in documented if c not in got] == []
    assert [c for c in got if c not in documented] == []


def test_the_command_writes_parquet_or_safe_csv_and_names_a_missing_table(tmp_path, monkeypatch):
    root = decade_run(tmp_path / "run", tables=("responses", "scores"))
    responses = _rows(root, "responses")
    responses[0]["text"] = FORMULA
    write(root, "responses", responses)
    runner = CliRunner()
    parquet, table = tmp_path / "out.parquet", decade_tidy(RunFolder(root))
    done = runner.invoke(app, ["export", str(root), "--out", str(parquet)])
    assert done.exit_code == 0, done.output
    assert pq.read_table(parquet).equals(table) and table.column("response")[0].as_py() == FORMULA
    csv_file = tmp_path / "out.csv"
    assert runner.invoke(app, ["export", str(root), "--format", "csv", "--out", str(csv_file)]).exit_code == 0
    with csv_file.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["response"] for r in rows] == ["'" + FORMULA] + [
        r or "" for r in table.column("response").to_pylist()[1:]
    ]
    assert [float(r["SIM"]) if r["SIM"] else None for r in rows] == table.column("SIM").to_pylist()

    monkeypatch.chdir(tmp_path)  # without --out: <run folder's name>-export.<format> here
    assert runner.invoke(app, ["export", str(root)]).exit_code == 0
    assert pq.read_table(tmp_path / "run-export.parquet").equals(table)

    (root / "scores.parquet").unlink()
    missing = runner.invoke(app, ["export", str(root), "--out", str(tmp_path / "x.parquet")])
    said = missing.output.replace("\n", "")  # the console wraps long lines
    assert missing.exit_code == 2 and f"{root}/scores.parquet: missing" in said and "run the study first" in said
    assert not (tmp_path / "x.parquet").exists()


def test_list_columns_go_to_csv_as_text_joined_by_bars():
    """A labels table's `accepted` names are a list in Parquet; in a CSV cell they are written as the
    labels table takes them in CSV: joined by `|`."""
    import pyarrow as pa

    from vlm_decade.studies.export import joined_lists

    table = pa.table({"id": ["a", "b", "c"], "accepted": pa.array([["doe", "deer"], [], None], pa.list_(pa.string()))})
    assert joined_lists(table).to_pylist() == [
        {"id": "a", "accepted": "doe|deer"},
        {"id": "b", "accepted": ""},
        {"id": "c", "accepted": None},
    ]
