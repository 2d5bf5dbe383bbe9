"""The CSV tables a spreadsheet opens: a text cell that would be evaluated as a formula gets a
leading single quote, numbers and every other text stay as they are, and the Parquet tables keep
the text exactly."""

from __future__ import annotations

import copy
import csv

import pyarrow as pa
import pyarrow.parquet as pq

from vlm_decade.core.runfolder import RunFolder
from vlm_decade.report.html import spreadsheet_safe, write_csv
from vlm_decade.stats import COMPARISONS_SCHEMA
from vlm_decade.studies import study_from_dict
from vlm_decade.studies.decade.report import write_report

from .view_runs import DECADE_CONFIG, decade_run, write

# text as it came -> the cell a spreadsheet must get
CASES = {
    '=HYPERLINK("http://x","y")': '\'=HYPERLINK("http://x","y")',
    "+1+cmd|' /C calc'!A0": "'+1+cmd|' /C calc'!A0",
    "-3": "'-3",  # text in a text column is text, whatever it looks like
    "@SUM(A1)": "'@SUM(A1)",
    "\t=1": "'\t=1",
    "\r=1": "'\r=1",
    "a dog = a cat": "a dog = a cat",  # a formula character after the first is harmless
    " =1": " =1",
    "'=1": "'=1",  # already quoted: shown as text
    "line one\n=line two": "line one\n=line two",  # a cell starts once, at its first character
    "": "",
}


def _read_csv(path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def test_text_cells_a_spreadsheet_would_evaluate_get_a_quote_and_numbers_stay_numbers(tmp_path):
    texts = list(CASES)
    table = pa.table(
        {
            "text": texts,
            "delta": pa.array([-(i + 0.5) for i in range(len(texts))]),
            "count": pa.array([-i for i in range(len(texts))], pa.int64()),
            "label": pa.array(["=a" if i % 2 else "b" for i in range(len(texts))]).dictionary_encode(),
        }
    )
    path = tmp_path / "t.csv"
    write_csv(table, path)
    rows = _read_csv(path)
    assert [r["text"] for r in rows] == list(CASES.values())
    assert [float(r["delta"]) for r in rows] == [-(i + 0.5) for i in range(len(texts))]
    assert [r["count"] for r in rows] == [str(-i) for i in range(len(texts))]
    assert [r["label"] for r in rows] == ["'=a" if i % 2 else "b" for i in range(len(texts))]


def test_a_missing_text_stays_missing():
    table = pa.table({"text": pa.array([None, "=1"], pa.string())})
    assert spreadsheet_safe(table).column("text").to_pylist() == [None, "'=1"]


def test_the_reports_csv_tables_are_safe_and_the_parquet_tables_keep_the_text(tmp_path):
    root = decade_run(tmp_path / "src", tables=("references", "responses", "scores", "stats"))
    formula = '=HYPERLINK("http://evil","click")'
    rows = pq.read_table(root / "responses.parquet").to_pylist()
    rows[0]["text"] = formula
    write(root, "responses", rows)
    tables = {n: pq.read_table(root / f"{n}.parquet") for n in ("images", "references", "responses", "scores", "stats")}
    tables["comparisons"] = COMPARISONS_SCHEMA.empty_table()
    out = RunFolder(tmp_path / "out")
    write_report(out, study_from_dict(copy.deepcopy(DECADE_CONFIG)), tables)
    written = _read_csv(out.root / "tables" / "responses.csv")
    assert written[0]["text"] == "'" + formula
    assert [r["text"] for r in written[1:]] == [r["text"] or "" for r in rows[1:]]
    assert pq.read_table(root / "responses.parquet").column("text")[0].as_py() == formula


def test_the_reports_csv_tables_leave_out_the_rows_inputs_hash(tmp_path):
    from vlm_decade.core.reuse import INPUTS

    root = decade_run(tmp_path / "src", tables=("references", "responses", "scores", "stats"))
    tables = {n: pq.read_table(root / f"{n}.parquet") for n in ("images", "references", "responses", "scores", "stats")}
    scores = tables["scores"]
    tables["scores"] = scores.append_column(INPUTS, pa.array(["0" * 64] * scores.num_rows))
    tables["comparisons"] = COMPARISONS_SCHEMA.empty_table()
    out = RunFolder(tmp_path / "out")
    write_report(out, study_from_dict(copy.deepcopy(DECADE_CONFIG)), tables)
    written = _read_csv(out.root / "tables" / "scores.csv")
    assert len(written) == scores.num_rows and list(written[0]) == scores.column_names
