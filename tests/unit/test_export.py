"""`vlm-decade export`: each study's tidy table equals a join of the run's tables done by hand in
Python (rows and every cell), carries the user's own image and label columns, leaves the scores
of a failed response and the labels of a masked variant empty, and is written as Parquet or as
spreadsheet-safe CSV."""

from __future__ import annotations

import csv

import pyarrow.parquet as pq
from typer.testing import CliRunner

from vlm_decade.cli import app
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.studies.decade.export import tidy as decade_tidy
from vlm_decade.studies.decade.taxonomy.analysis import ERROR_TYPES
from vlm_decade.studies.openworld.export import tidy as openworld_tidy

from .view_runs import decade_run, openworld_run, write

FORMULA = '=HYPERLINK("http://evil","click")'


def _rows(root, name) -> list[dict]:
    return pq.read_table(root / f"{name}.parquet").to_pylist()


def _with_metadata(root, name, column, value_of) -> None:
    """The user's own column added to table `name`, as their images or labels table would bring it."""
    write(root, name, [{**r, column: value_of(r)} for r in _rows(root, name)])


def _decade_by_hand(root, labelled: bool = True) -> list[dict]:
    images = {r["image_id"]: r for r in _rows(root, "images")}
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
    _with_metadata(root, "images", "category", lambda r: f"cat-{r['image_id'][0]}")
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
    _with_metadata(root, "labels", "source", lambda r: f"src-{r['dataset']}")
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
    predictions = {(p["subject"], p["image_id"], p["prompt_id"]): p for p in _rows(root, "predictions")}
    scored = ("TI", "LI", "SS", "CS", "best_concept", "judge_answer", "outcome")
    want = []
    for r in responses:
        p = predictions.get((r["subject"], r["image_id"], r["prompt_id"]), {})
        label = {k: v for k, v in labels[r["image_id"]].items() if k not in ("image_id", "dataset")}
        want.append(
            {"model": r["subject"], **images[r["image_id"]], **label, "prompt_id": r["prompt_id"]}
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
