"""The columnar ingest against row-by-row references: on random damaged tables, the whole-column checks
name the same problems (file, row, field, message, in the same order, so the same first one) and keep
the same rows as checks that walk the rows one at a time, as the loaders did before; on a valid input
the references table is the one the row-by-row ranking builds."""

from __future__ import annotations

import csv
import re
import tempfile
from collections import Counter
from pathlib import Path
from unittest.mock import patch

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlm_decade.core import tables
from vlm_decade.core.config import ModelConfig
from vlm_decade.core.errors import Problems
from vlm_decade.core.tables import _arrow_csv, _plain_header, _python_csv, cell_present, cell_text, read_table
from vlm_decade.models.backends.imported import ImportedBackend, missing_rows
from vlm_decade.stages.images import IMAGE_COLUMNS, check_images
from vlm_decade.studies.decade import data as study_a
from vlm_decade.studies.decade.config import RankingConfig
from vlm_decade.studies.decade.ranking import rank_by_consensus, rank_by_votes

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONDITIONS = ["full", "m1"]
KNOWN = ["i1", "i2", "i3"]


def problem_list(problems: Problems) -> list[tuple]:
    return [(p.file, p.row, p.field, p.message) for p in problems.items]


def written(rows: list[list[str]], header: list[str]) -> Path:
    path = Path(tempfile.mkdtemp()) / "table.csv"
    with open(path, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows([header, *rows])
    return path


# --- the reader: pyarrow.csv where it can, the row-by-row reader as the reference -----------------

CELL = st.sampled_from(["a", "b", "", " ", "x y", "é", "a\x00b", "1", " img "])
RAW_ROW = st.lists(CELL, min_size=2, max_size=4).map(lambda cells: ",".join(cells).encode())
DAMAGE = st.sampled_from([b"", b"\xff", b"\r", b"  "])


@SETTINGS
@given(
    rows=st.lists(st.one_of(RAW_ROW, st.just(b"")), max_size=8),
    damage=DAMAGE,
    at=st.integers(0, 8),
    newline=st.sampled_from([b"\n", b"\r\n"]),
    bom=st.booleans(),
)
def test_the_arrow_csv_reader_reads_what_the_row_by_row_reader_reads(rows, damage, at, newline, bom):
    header = b"id,text,note"
    lines = [header, *rows]
    if damage and at:  # never before the header: a damaged header is the same reader in both
        lines.insert(min(at, len(lines)), damage)
    raw = (b"\xef\xbb\xbf" if bom else b"") + newline.join(lines) + newline
    path = Path(tempfile.mkdtemp()) / "t.csv"
    path.write_bytes(raw)
    got, expected = Problems(), Problems()
    table = read_table(path, ("id", "text"), got, ("note", "absent"))
    reference = _python_csv(path, raw, ("id", "text"), expected, ("note", "absent"))
    assert problem_list(got) == problem_list(expected)
    if reference is None:
        assert table is None
        return
    columns, numbers = reference
    want = [(n, {"absent": ""} | cells) for n, cells in zip(numbers.to_pylist(), columns.to_pylist())]
    assert [(r.number, r.cells) for r in table.rows] == want


# A line ending (\r\n, \r or \n) followed by another, as the row-by-row reader sees a blank line.
BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n)[\r\n]")


@SETTINGS
@given(st.binary(max_size=40).map(lambda b: bytes(b'ab\r\n\n"\x00'[x % 7] for x in b)), st.integers(1, 7))
def test_a_file_scanned_a_block_at_a_time_is_plain_as_the_whole_of_it_is(body, block):
    """A quote or a blank line anywhere, across any block boundary, sends the file to the row-by-row
    reader; a plain file's cells are searched for NUL bytes only when the file holds one."""
    path = Path(tempfile.mkdtemp()) / "t.csv"
    path.write_bytes(body)
    whole = b'"' not in body and BLANK_LINE.search(body) is None
    with patch.object(tables, "_SCAN", block):
        assert tables._scan_body(path) == (whole, not whole or b"\x00" in body)


@SETTINGS
@given(st.lists(st.tuples(*[st.sampled_from(["a", "b", "ab", ""])] * 3), max_size=8), st.integers(1, 3))
def test_rows_are_in_order_when_the_stable_sort_leaves_them_as_they_are(rows, chunks):
    columns = list(zip(*rows)) if rows else [(), (), ()]
    cut = max(1, -(-len(rows) // chunks))  # the columns in chunks, as a file read a block at a time has them
    table = pa.table(
        {
            name: pa.chunked_array([list(values[i : i + cut]) for i in range(0, len(values), cut)] or [[]], pa.string())
            for name, values in zip(("x", "y", "z"), columns)
        }
    )
    order = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in ("x", "y", "z")]).to_pylist()
    assert study_a._in_order(table, ("x", "y", "z")) == (order == list(range(len(rows))))


def test_a_plain_csv_goes_through_pyarrow_a_block_at_a_time():
    path = written([["d1", "i1", "w", "full", "a text"]], study_a.DESCRIPTION_COLUMNS)
    header = _plain_header(path.read_bytes(), study_a.DESCRIPTION_COLUMNS, ())
    read = _arrow_csv(path, header, study_a.DESCRIPTION_COLUMNS, Problems(), ())
    assert read is not None and read[0].column("text").to_pylist() == ["a text"] and read[1].to_pylist() == [2]
    # Many of Arrow's blocks (1 MB each): kept as the blocks' chunks (joining them would copy the
    # file's columns), row for row what the reference reads.
    rows = [[f"d{k}", f"i{k % 7}", "w", "full", f"text {k} " + "x" * (k % 50)] for k in range(60_000)]
    path = written(rows, study_a.DESCRIPTION_COLUMNS)
    columns, numbers = _arrow_csv(path, header, study_a.DESCRIPTION_COLUMNS, Problems(), ())
    reference, reference_numbers = _python_csv(path, path.read_bytes(), study_a.DESCRIPTION_COLUMNS, Problems())
    assert path.stat().st_size > 3 << 20 and all(columns.column(c).num_chunks > 3 for c in columns.column_names)
    assert columns.equals(reference) and numbers.equals(reference_numbers)


# --- Study A's descriptions ---------------------------------------------------------------------------


def reference_descriptions(table, known: set[str], conditions: list[str], problems: Problems) -> dict:
    """The row-by-row check the descriptions had: description_id -> (row, image, worker, condition, text)."""
    descriptions: dict = {}
    for row in table.rows:
        ids_ok = cell_present(row, table, ("description_id", "image_id", "worker_id", "condition"), problems)
        text = cell_text(row, "text")
        if not text:
            problems.add(table.file, "'text' is empty or only whitespace", row=row.number, field="text")
        if not ids_ok:
            continue
        description_id, image_id, condition = (cell_text(row, c) for c in ("description_id", "image_id", "condition"))
        if description_id in descriptions:
            message = f"duplicate description_id '{description_id}' (first at row {descriptions[description_id][0]})"
            problems.add(table.file, message, row=row.number, field="description_id")
            continue
        ok = True
        if image_id not in known:
            message = f"unknown image_id '{image_id}' (not in the images table)"
            problems.add(table.file, message, row=row.number, field="image_id")
            ok = False
        if condition not in conditions:
            message = f"unknown condition '{condition}': expected one of {', '.join(conditions)}"
            problems.add(table.file, message, row=row.number, field="condition")
            ok = False
        if ok:
            descriptions[description_id] = (row.number, image_id, cell_text(row, "worker_id"), condition, text)
    return descriptions


DESCRIPTION_ROW = st.tuples(
    st.sampled_from(["d1", "d2", "d3", "", " d1 "]),
    st.sampled_from(["i1", "i2", "zz", "", " "]),
    st.sampled_from(["w1", ""]),
    st.sampled_from(["full", "m1", "bogus", "", " full "]),
    st.sampled_from(["a text", "", "  ", " padded "]),
).map(list)


@SETTINGS
@given(st.lists(DESCRIPTION_ROW, max_size=12))
def test_the_description_checks_say_what_the_row_by_row_checks_say(rows):
    table = read_table(written(rows, list(study_a.DESCRIPTION_COLUMNS)), study_a.DESCRIPTION_COLUMNS, Problems())
    got, expected = Problems(), Problems()
    kept = study_a._check_descriptions(table, pa.array(KNOWN), CONDITIONS, got)
    reference = reference_descriptions(table, set(KNOWN), CONDITIONS, expected)
    assert problem_list(got) == problem_list(expected)
    columns = ("row", "image_id", "worker_id", "condition", "text")
    assert dict(
        zip(kept.column("description_id").to_pylist(), zip(*(kept.column(c).to_pylist() for c in columns)))
    ) == (reference)


# --- the images table's rows ---------------------------------------------------------------------------


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["i1", "i2", "", " i1"]), st.sampled_from(["d", ""]), st.sampled_from(["f.png", " "])
        ),
        max_size=10,
    )
)
def test_the_image_row_checks_say_what_the_row_by_row_checks_say(rows):
    """With no image folder no file is read, so only the rows' own checks and the folder's problem remain."""
    table = read_table(written([list(r) for r in rows], list(IMAGE_COLUMNS)), IMAGE_COLUMNS, Problems())
    missing = Path(tempfile.mkdtemp()) / "no-such-folder"
    got, expected = Problems(), Problems()
    images = check_images(table, missing, got)
    first: dict[str, int] = {}
    for row in table.rows:
        if not cell_present(row, table, IMAGE_COLUMNS, expected):
            continue
        image_id = cell_text(row, "image_id")
        if image_id in first:
            message = f"duplicate image_id '{image_id}' (first at row {first[image_id]})"
            expected.add(table.file, message, row=row.number, field="image_id")
            continue
        first[image_id] = row.number
    if not table.rows:
        expected.add(table.file, "has no images")
    expected.add(str(missing), "image folder not found", field="data.image_dir")
    assert problem_list(got) == problem_list(expected)
    assert dict(zip(images.column("image_id").to_pylist(), images.column("row").to_pylist())) == first


# --- an imported model's file --------------------------------------------------------------------------


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["i1", "i2", "zz"]),
            st.sampled_from(["full", "m1", "p1"]),
            st.sampled_from(["a caption", "", " "]),
            st.sampled_from(["", "p1", " p1 "]),
        ),
        max_size=10,
    )
)
def test_the_imported_file_checks_say_what_the_row_by_row_checks_say(rows):
    path = written([list(r) for r in rows], ["image_id", "variant", "text", "prompt"])
    model = ModelConfig(name="old", backend="imported", model_id="old", era="pre-mllm", options={"file": str(path)})
    variants = ["full", "m1"]
    expected = Problems()
    seen, unknown = set(), {}
    for number, image_id, variant, text, prompt in ((i + 2, *r) for i, r in enumerate(rows)):
        key = (image_id, variant, prompt.strip())
        if image_id not in KNOWN:
            expected.add(path, f"unknown image_id '{image_id}'", number, "image_id")
        if variant not in variants:
            unknown.setdefault(variant, []).append(number)
        if not text.strip():
            expected.add(path, "empty text", number, "text")
        if key in seen:
            prompt_part = f", prompt '{key[2]}'" if key[2] else ""
            expected.add(
                path, f"duplicate description for image '{key[0]}', variant '{key[1]}'{prompt_part}", number, "image_id"
            )
        seen.add(key)
    if unknown:
        values = ", ".join(f"'{v}' ({len(r)} rows, first row {r[0]})" for v, r in sorted(unknown.items()))
        expected.add(
            path, f"unknown variant {values}: expected one of full, m1", min(map(min, unknown.values())), "variant"
        )
    got = ImportedBackend.check(model, set(KNOWN), variants)
    assert [(p.file, p.row, p.field, p.message) for p in got] == problem_list(expected)


# --- a valid input: the references table the row-by-row ranking builds ----------------------------------


def reference_references(images: dict[str, str], descriptions: dict, tally, methods, cfg: RankingConfig) -> list:
    """The row-by-row references table: images maps image_id -> dataset."""
    by_image: dict[str, list[str]] = {}
    for description_id, d in descriptions.items():
        by_image.setdefault(d[1], []).append(description_id)
    roles: dict[str, str] = {}
    for image_id, ids in by_image.items():
        full = sorted(i for i in ids if descriptions[i][3] == "full")
        if methods[images[image_id]] == study_a.VOTES:
            roles |= rank_by_votes(
                full, tally.votes, tally.shown, cfg.top_k, cfg.bottom_k, seed=cfg.seed, stream=image_id
            )
        else:
            texts = [descriptions[i][4] for i in full]
            roles |= rank_by_consensus(full, texts, cfg.top_k, cfg.bottom_k, seed=cfg.seed, stream=image_id)
    order = sorted(descriptions, key=lambda i: (descriptions[i][1], descriptions[i][3], i))
    return [
        {
            "description_id": i,
            "image_id": descriptions[i][1],
            "dataset": images[descriptions[i][1]],
            "condition": descriptions[i][3],
            "worker_id": descriptions[i][2],
            "role": roles.get(i, study_a.MASKED),
            "votes": tally.votes[i],
            "shown": tally.shown[i],
            "text": descriptions[i][4],
        }
        for i in order
    ]


@SETTINGS
@given(
    counts=st.lists(st.tuples(st.integers(1, 7), st.integers(0, 3)), min_size=1, max_size=6),
    words=st.lists(st.sampled_from("a dog cat red on the mat runs".split()), min_size=40, max_size=40),
    voted=st.booleans(),
    seed=st.integers(0, 5),
)
def test_a_valid_input_gives_the_references_the_row_by_row_ranking_gives(counts, words, voted, seed):
    images = {f"i{j}": "coco" if j % 2 else "vg" for j in range(len(counts))}
    rows, k = [], 0
    for j, (full, masked) in enumerate(counts):
        for n in range(full + masked):
            text = " ".join(words[(k + m) % len(words)] for m in range(3 + n % 4))
            rows.append([f"d{k:03d}", f"i{j}", f"w{n}", "full" if n < full else "m1", text])
            k += 1
    rows.reverse()  # the table's order is not the references' order
    table = read_table(written(rows, list(study_a.DESCRIPTION_COLUMNS)), study_a.DESCRIPTION_COLUMNS, Problems())
    problems = Problems()
    kept = study_a._check_descriptions(table, pa.array(list(images)), CONDITIONS, problems)
    assert not problems
    tally = study_a._Tally()
    if voted:
        tally.votes = Counter({r[0]: (k * 7) % 3 for k, r in enumerate(rows) if r[3] == "full"})
        tally.shown = Counter({r[0]: 3 for r in rows if r[3] == "full"})
    methods = {d: study_a.VOTES if voted else study_a.CONSENSUS for d in set(images.values())}
    checked = pa.table({"image_id": list(images), "dataset": list(images.values())})
    cfg = RankingConfig(top_k=1, bottom_k=1, seed=seed)
    got = study_a._references_table(checked, kept, tally, methods, cfg)
    descriptions = {r[0]: (0, r[1], r[2], r[3], r[4]) for r in rows}
    assert got.to_pylist() == reference_references(images, descriptions, tally, methods, cfg)


def test_the_references_of_more_descriptions_than_a_slab_are_the_same(monkeypatch):
    """The ranking goes a slab of descriptions at a time, each ending where an image does, a slab per
    core at once: the same roles and votes as one slab, and as the row-by-row ranking, by consensus
    and by votes."""
    rows = [[f"d{k:04d}", f"i{k // 5:03d}", "w", "full", f"text {k % 7} {k % 3}"] for k in range(400)]
    table = read_table(written(rows, list(study_a.DESCRIPTION_COLUMNS)), study_a.DESCRIPTION_COLUMNS, Problems())
    images = {f"i{j:03d}": "coco" if j % 3 else "vg" for j in range(80)}
    kept = study_a._check_descriptions(table, pa.array(list(images)), CONDITIONS, Problems())
    checked = pa.table({"image_id": list(images), "dataset": list(images.values())})
    cfg = RankingConfig(top_k=1, bottom_k=1)
    tally = study_a._Tally()
    tally.votes = Counter({r[0]: k % 4 for k, r in enumerate(rows) if images[r[1]] == "vg"})
    tally.shown = Counter({r[0]: 4 for r in rows if images[r[1]] == "vg"})
    methods = {"coco": study_a.CONSENSUS, "vg": study_a.VOTES}
    whole = study_a._references_table(checked, kept, tally, methods, cfg)
    monkeypatch.setattr(study_a, "_SLAB", 7)
    sliced = study_a._references_table(checked, kept, tally, methods, cfg)
    descriptions = {r[0]: (0, *r[1:]) for r in rows}
    expected = reference_references(images, descriptions, tally, methods, cfg)
    assert whole.to_pylist() == sliced.to_pylist() == expected
    assert sliced.column("role").num_chunks > 1


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["i1", "i2", "i3"]),
            st.sampled_from(["full", "m1"]),
            st.sampled_from(["a caption", " "]),
            st.sampled_from(["", "p1", "p2"]),
        ),
        max_size=12,
    ),
    st.sampled_from([("",), ("p1", "p2")]),
)
def test_the_missing_answers_are_counted_as_row_by_row(rows, prompts):
    path = written([list(r) for r in rows], ["image_id", "variant", "text", "prompt"])
    model = ModelConfig(name="old", backend="imported", model_id="old", era="pre-mllm", options={"file": str(path)})
    texts = {(i, v, p): t for i, v, t, p in rows if t.strip()}
    lacking = Counter(
        v for v in ("full", "m1") for i in KNOWN for p in prompts if (i, v, p) not in texts and (i, v, "") not in texts
    )
    (line,) = missing_rows([model], set(KNOWN), lambda m: ["full", "m1"], prompts) or [None]
    if not lacking:
        assert line is None
        return
    each = len(KNOWN) * len(prompts)
    counts = ", ".join(f"{v}: {lacking[v]} of {each}" for v in ("full", "m1") if lacking[v])
    assert f"has no description for {sum(lacking.values())} of the {each * 2} " in line and f"({counts})" in line
