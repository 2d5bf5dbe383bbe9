"""Reading the user's tables: a strict CSV reader that never loses rows silently, NUL bytes named,
and Parquet columns of the wrong type named. Properties are checked over generated tables
(hypothesis), against what Python's csv writer wrote."""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vlm_decade.core.errors import Problems
from vlm_decade.core.tables import Table, read_table

COLUMNS = ("id", "text")
# Text cells as people write them: commas, quotes and line breaks included (CSV writers quote them).
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00\r"), max_size=12)


def csv_bytes(rows: list[list[str]], header=COLUMNS) -> bytes:
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8")


def read(data: bytes, suffix: str = ".csv", **kw):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"t{suffix}"
        path.write_bytes(data)
        problems = Problems()
        table = read_table(path, COLUMNS, problems, **kw)
        return table, problems.items


def looks_like_a_row(line: str) -> bool:
    return len(next(csv.reader([line]), [])) == len(COLUMNS)


def rows_of(texts: list[str]) -> list[list[str]]:
    return [[f"r{i}", t] for i, t in enumerate(texts)]


@settings(max_examples=200, deadline=None)
@given(st.lists(TEXT, max_size=6))
def test_what_a_csv_writer_wrote_reads_back_exactly(texts):
    # A text whose later lines each read as a whole row is taken for a missing quote (documented).
    assume(not any(looks_like_a_row(line) for t in texts for line in t.splitlines()[1:]))
    table, problems = read(csv_bytes(rows_of(texts)))
    assert problems == []
    assert [r.cells for r in table.rows] == [{"id": f"r{i}", "text": t} for i, t in enumerate(texts)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.lists(TEXT, min_size=1, max_size=6), st.data())
def test_a_lost_quote_never_loses_rows_silently(texts, data):
    """Delete any one quote character of a valid file: either a problem is reported, or no row is
    lost (a lost opening quote can split a text into more rows, whose empty cells are then named)."""
    raw = csv_bytes(rows_of(texts))
    quotes = [i for i, b in enumerate(raw) if b == ord('"')]
    assume(quotes)
    cut = data.draw(st.sampled_from(quotes))
    table, problems = read(raw[:cut] + raw[cut + 1 :])
    assert problems or len(table.rows) >= len(texts)


def test_an_unterminated_quote_names_the_row_where_it_opens():
    raw = b'id,text\nr0,fine\nr1,"never closed\nr2,swallowed\nr3,swallowed too\n'
    table, (problem,) = read(raw)
    assert table is None
    assert problem.row == 3 and "never closes" in problem.message and "line 3" in problem.message


def test_a_quote_that_closes_rows_later_is_caught():
    # The quote opened in r1 closes only at the end of r3's text: without a check, r2 and r3 would be
    # one cell of r1 and the file would read as two rows, silently.
    raw = b'id,text\nr0,fine\nr1,"opens here\nr2,swallowed\nr3,ends here"\nr4,fine\n'
    table, (problem,) = read(raw)
    assert (problem.row, problem.field) == (3, "text")
    assert "closes only at line 5" in problem.message and "2 line(s) that look like rows" in problem.message


def test_a_line_break_inside_quotes_is_one_text():
    table, problems = read(b'id,text\nr0,"two\nlines"\nr1,x\n')
    assert problems == [] and [r.cells["text"] for r in table.rows] == ["two\nlines", "x"]


def test_text_after_a_closing_quote_is_refused():
    table, (problem,) = read(b'id,text\nr0,"quoted"tail\n')
    assert table is None and problem.row == 2 and "line 2" in problem.message


@settings(max_examples=100, deadline=None)
@given(st.lists(TEXT, min_size=1, max_size=5), st.data())
def test_a_nul_byte_in_a_text_is_named(texts, data):
    row = data.draw(st.integers(0, len(texts) - 1))
    at = data.draw(st.integers(0, len(texts[row])))
    texts = list(texts)
    texts[row] = texts[row][:at] + "\x00" + texts[row][at:]
    assume(not any(looks_like_a_row(line) for t in texts for line in t.splitlines()[1:]))
    _, problems = read(csv_bytes(rows_of(texts)))
    assert [(p.row, p.field) for p in problems] == [(row + 2, "text")]
    assert "NUL" in problems[0].message


def test_a_utf16_file_is_named_as_such():
    table, (problem,) = read("id,text\nr0,x\n".encode("utf-16"))
    assert table is None and "UTF-16" in problem.message


# --- Parquet column types --------------------------------------------------------------------------


def parquet(columns: dict) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue().to_pybytes()


def test_string_and_integer_ids_are_read_as_text():
    table, problems = read(parquet({"id": pa.array([7, 8], pa.int64()), "text": ["a", "b"]}), ".parquet")
    assert problems == [] and [r.cells["id"] for r in table.rows] == ["7", "8"]


@pytest.mark.parametrize(
    ("column", "says"),
    [
        (pa.array([1.0, 2.0]), "double"),
        (pa.array([b"a", b"b"], pa.binary()), "binary"),
        (pa.array([["a", "b"], ["c"]]), "list<"),
        (pa.array([True, False]), "bool"),
        (pa.array([{"x": 1}, {"x": 2}]), "struct<"),
    ],
)
def test_other_id_types_are_named(column, says):
    table, (problem,) = read(parquet({"id": column, "text": ["a", "b"]}), ".parquet")
    assert table is None
    assert (problem.row, problem.field) == (1, "id") and says in problem.message


def test_declared_list_and_number_columns():
    data = parquet({"id": ["a", "b"], "text": [["x", "y"], ["z"]]})
    assert read(data, ".parquet")[0] is None
    table, problems = read(data, ".parquet", lists=("text",))
    assert problems == [] and [r.cells["text"] for r in table.rows] == [["x", "y"], ["z"]]
    table, problems = read(parquet({"id": ["a"], "text": [4.5]}), ".parquet", numbers=("text",))
    assert problems == [] and table.rows[0].cells["text"] == "4.5"


def test_a_nul_in_a_parquet_string_is_named():
    _, (problem,) = read(parquet({"id": ["a", "b"], "text": ["ok", "b\x00d"]}), ".parquet")
    assert (problem.row, problem.field) == (3, "text") and "NUL" in problem.message


# Cells with Python's whitespace (str.isspace: the ideographic space, NEL, ...) at either edge or inside.
SPACED = st.text(st.sampled_from(["a", "é", " ", "\t", "\u3000", "\x85", "\u2028", "b"]), max_size=5)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(SPACED, max_size=4), min_size=1, max_size=4))
def test_a_column_text_is_each_cell_as_str_strip_leaves_it_and_untrimmed_chunks_are_not_copied(chunks):
    column = pa.chunked_array([pa.array(c, pa.string()) for c in chunks], pa.string())
    table = Table("t.csv", "t.csv", pa.table({"text": column}), pa.array(range(len(column)), pa.int64()))
    text = table.text("text")
    assert text.to_pylist() == [cell.strip() for chunk in chunks for cell in chunk]
    assert list(table.blank("text")) == [not cell.strip() for chunk in chunks for cell in chunk]
    for before, after, cells in zip(column.chunks, text.chunks, chunks):
        if all(cell == cell.strip() for cell in cells) and cells:  # nothing to take off: the same bytes
            assert after.buffers()[2].address == before.buffers()[2].address
