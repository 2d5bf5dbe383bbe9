"""The describe stage's jobs and rows do not depend on how many are handled at a time: an imported
model's cache keys are those of its own rows as found by hand, however the images are sliced, and
each job's row (the first ok row, else the latest attempt; rows of other settings dropped) is the
one a plain loop over the rows picks, however many rows are matched at a time."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vlm_decade.models.backends.imported as imported
import vlm_decade.stages.describe.plan as plan_module
import vlm_decade.stages.describe.rows as rows_module
from vlm_decade.core.config import ModelConfig
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.tables import read_table
from vlm_decade.imaging.masks import MaskSpec
from vlm_decade.models.backends.imported import ImportedBackend
from vlm_decade.stages.describe.rows import (
    RESPONSE_KEY,
    RESPONSES_SCHEMA,
    RowsSoFar,
    collect_rows,
)


def test_an_imported_models_keys_are_its_own_rows_whatever_the_slice(tmp_path, monkeypatch):
    file = tmp_path / "answers.csv"
    file.write_text(
        "image_id,variant,prompt,text\n"
        "i1,full,p1, a red bird \n"
        "i1,full,,any prompt\n"  # i1 for p1 has its own row; this one answers p2
        "i2,full,p2,a cat\n"  # none for i2 p1
        "i3,full,,first\n"
        "i3,full,,last\n"  # repeated: the last row answers, as a dict of the rows would
    )
    model = ModelConfig(name="m", backend="imported", model_id="m", era="pre-mllm", options={"file": str(file)})
    answers = ImportedBackend.answers(model)
    ids, variants = pa.array(["i1", "i2", "i3", "i4"]), pa.array(["full"] * 4)
    assert answers(ids, variants, "p1").to_pylist() == ["a red bird", None, "last", None]  # as the rows hold them
    assert answers(ids, variants, "p2").to_pylist() == ["any prompt", "a cat", "last", None]

    from vlm_decade.stages.describe.plan import Plan, plan_jobs
    from vlm_decade.studies import study_from_dict

    study = study_from_dict(
        {
            "name": "slices",
            "data": {"images": "x.csv", "image_dir": str(tmp_path), "descriptions": "d.csv"},
            "models": [model.model_dump(mode="json") | {"variants": "all"}],
        }
    )
    images = pa.table(
        {
            "image_id": [f"i{i}" for i in range(1, 6)],
            "dataset": ["everyday"] * 5,
            "path": [f"/x/i{i}.png" for i in range(1, 6)],
            "sha256": [f"{i}" * 64 for i in range(1, 6)],
        }
    )
    plan = Plan({"m": (("p1", "say"), ("p2", "say more"))}, masks=(MaskSpec("m1", (0.25, 0.25, 0.75, 0.75), 0.0),))
    whole = plan_jobs(study, plan, images)
    monkeypatch.setattr(plan_module, "PLAN_IMAGES", 2)
    sliced = plan_jobs(study, plan, images)
    assert sliced.num_rows == 5 * 2 * 2 and sliced.equals(whole)
    # one row of the file changed: only the responses that row answers get a new key
    file.write_text(file.read_text().replace("a cat", "a dog"))
    changed = plan_jobs(study, plan, images).column("cache_key").to_pylist()
    moved = [tuple(j[c] for c in RESPONSE_KEY) for j, k in zip(whole.to_pylist(), changed) if j["cache_key"] != k]
    assert moved == [("m", "i2", "full", "p2")]


def test_a_run_parses_an_imported_file_once_and_a_changed_file_again(tmp_path, monkeypatch):
    """In a run (`files_held`) the file's check, what it lacks, the plan's keys and the look-up
    parse it once between them, each seeing what it saw on its own (the bad row's problem too);
    a file rewritten meanwhile is parsed again, and outside a run every reader parses it."""
    file = tmp_path / "answers.csv"
    file.write_text("image_id,variant,text\ni1,full,a bird\ni2,full,\n")  # i2's text empty: a problem
    model = ModelConfig(name="m", backend="imported", model_id="m", era="pre-mllm", options={"file": str(file)})
    parsed = []
    monkeypatch.setattr(imported, "read_table", lambda path, *a: parsed.append(path) or read_table(path, *a))
    ids, full = pa.array(["i1", "i2"]), pa.array(["full", "full"])

    def everything():
        problems = ImportedBackend.check(model, {"i1", "i2"}, ["full"])
        lacking = imported.missing_rows([model], {"i1", "i2"}, lambda m: ["full"])
        keys = ImportedBackend.answers(model)(ids, full, "p")
        looked_up = ImportedBackend(model).answer_rows(
            pa.table({"image_id": ids, "variant": full, "prompt_id": ["p"] * 2})
        )
        return [(p.row, p.field, p.message) for p in problems], lacking, keys.to_pylist(), looked_up.to_pylist()

    alone = everything()
    assert len(parsed) == 4 and alone[0] == [(3, "text", "empty text")]
    assert alone[2][0] == "a bird" and alone[3][0]["text"] == "a bird"
    parsed.clear()
    with imported.files_held():
        assert everything() == alone and len(parsed) == 1
        assert everything() == alone and len(parsed) == 1  # as long as the run lasts
        file.write_text("image_id,variant,text\ni1,full,a red bird\ni2,full,a cat\n")
        again = everything()
        assert len(parsed) == 2 and again[0] == [] and again[3][0]["text"] == "a red bird"
    everything()
    assert len(parsed) == 2 + 4  # the run over: nothing held


@pytest.mark.parametrize("by_image", [False, True])
def test_an_imported_file_answers_a_few_questions_at_a_time_as_a_dict_of_its_rows_does(tmp_path, by_image):
    """Questions asked a few at a time, as an actor does, of a file in no order (or in image order,
    which is kept as read) with repeated questions, rows per prompt and rows for every prompt: what a
    plain dict of the rows answers."""
    rng = np.random.default_rng(7)
    rows = [
        (
            f"img{int(rng.integers(0, 40)):02d}",
            str(rng.choice(["full", "m1"])),
            str(rng.choice(["", "p1", "p2"])),
            f"t{k}",
        )
        for k in range(300)
    ]
    if by_image:
        rows.sort(key=lambda r: r[0])  # stable: an image's repeated questions stay in the file's order
    file = tmp_path / "answers.csv"
    file.write_text("image_id,variant,prompt,text\n" + "".join(",".join(r) + "\n" for r in rows))
    last = {(i, v, p): t for i, v, p, t in rows}  # a later row of the same question wins
    model = ModelConfig(name="m", backend="imported", model_id="m", era="pre-mllm", options={"file": str(file)})
    answers = ImportedBackend.answers(model)
    for _ in range(60):
        n = int(rng.integers(1, 9))
        ids = [f"img{int(rng.integers(0, 45)):02d}" for _ in range(n)]  # some the file has no row for
        variants = [str(rng.choice(["full", "m1"])) for _ in range(n)]
        prompt = str(rng.choice(["p1", "p2"]))
        expected = []
        for i, v in zip(ids, variants):
            text = last.get((i, v, prompt), last.get((i, v, "")))
            expected.append(None if text is None else text.strip())
        assert answers(pa.array(ids), pa.array(variants), prompt).to_pylist() == expected


def _row(subject, image_id, variant, status, cache_key, text):
    return {
        "subject": subject,
        "image_id": image_id,
        "variant": variant,
        "prompt_id": "p",
        "text": text,
        "status": status,
        "error": "" if status == "ok" else "failed",
        "cache_key": cache_key,
    }


@pytest.fixture
def folder(tmp_path):
    """A previous table and two parts of rows: answers, failures, retries and rows of other settings."""
    folder = RunFolder(tmp_path)
    previous = [
        _row("b", "i2", "full", "ok", "kb2", "kept"),
        _row("a", "i1", "full", "error", "ka1", "old failure"),
        _row("a", "i3", "full", "ok", "old-key", "other settings"),
    ]
    table = pa.Table.from_pylist(previous, schema=RESPONSES_SCHEMA)
    fingerprint, record = folder.write("responses", table)
    folder.save_manifest({"tables": {"responses": fingerprint}, "files": {"responses": record}})
    parts = [
        [
            _row("a", "i1", "full", "error", "ka1", "latest failure"),
            _row("a", "i3", "full", "skipped", "ka3", "first try"),
            _row("b", "i2", "full", "ok", "kb2", "second ok"),
            _row("a", "i2", "full", "ok", "ka2", "first ok"),
        ],
        [
            _row("a", "i3", "full", "error", "ka3", "second try"),
            _row("a", "i2", "full", "ok", "ka2", "later ok"),
            _row("z", "i9", "full", "ok", "kz9", "no such job"),
        ],
    ]
    for rows in parts:
        folder.append_part("responses", pa.Table.from_pylist(rows, schema=RESPONSES_SCHEMA))
    return folder


JOBS = pa.table(
    {
        "subject": ["b", "a", "a", "a", "a"],
        "image_id": ["i2", "i3", "i1", "i2", "i4"],
        "variant": ["full"] * 5,
        "prompt_id": ["p"] * 5,
        "cache_key": ["kb2", "ka3", "ka1", "ka2", "ka4"],
    }
)


def _by_hand(folder: RunFolder) -> list[str]:
    """The texts of the rows a plain loop picks, in key order."""
    rows = folder.read("responses").to_pylist() + folder.read_parts("responses", RESPONSES_SCHEMA).to_pylist()
    jobs = {tuple(j[c] for c in RESPONSE_KEY): j["cache_key"] for j in JOBS.to_pylist()}
    best: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(row[c] for c in RESPONSE_KEY)
        if jobs.get(key) != row["cache_key"]:
            continue
        if key not in best or best[key]["status"] != "ok":  # the first ok row stays; else the latest
            best[key] = row
    return [best[k]["text"] for k in sorted(best)]


@pytest.mark.parametrize("held", [True, False])
@pytest.mark.parametrize(("match_rows", "collect_images"), [(1, 1), (2, 2), (rows_module.MATCH_ROWS, 3)])
def test_each_jobs_row_is_the_one_a_plain_loop_picks_however_many_are_matched_at_once(
    folder, monkeypatch, match_rows, collect_images, held
):
    """However many rows are matched at a time and however many images' rows are chosen at a time
    (a bucket of the spill per model and range of images), and whether the buckets are held in
    memory or spread over files, the table written is the same; the rows spread once find the jobs
    still to do, and, caught up with the answers saved after that, choose each job's row."""
    monkeypatch.setattr(rows_module, "MATCH_ROWS", match_rows)
    monkeypatch.setattr(rows_module, "COLLECT_IMAGES", collect_images)
    monkeypatch.setattr(rows_module, "HOLD_FILES_BYTES", 2**40 if held else -1)
    subjects, image_ids = ["a", "b"], pa.array(["i1", "i2", "i3", "i4"])
    jobs_of = lambda s: JOBS.filter(pc.equal(JOBS.column("subject"), s))  # noqa: E731
    with RowsSoFar(folder, subjects, image_ids) as so_far:  # each subject's jobs on their own
        todo = [so_far.add_jobs(jobs_of(s)) for s in ("b", "a")]
        # This run's answers, saved after the rows so far were spread: a/i3 done at last, a/i4 failed.
        answers = [_row("a", "i4", "full", "error", "ka4", "new failure"), _row("a", "i3", "full", "ok", "ka3", "done")]
        folder.append_part("responses", pa.Table.from_pylist(answers, schema=RESPONSES_SCHEMA))
        by_hand = _by_hand(folder)
        written = collect_rows(folder, so_far)
    n_done = sum(done for _, done in todo)
    todo = pa.concat_tables([jobs for jobs, _ in todo])
    assert n_done == 2  # a/i2 and b/i2; a/i1 and a/i3 failed, a/i4 was never tried
    assert todo.column("image_id").to_pylist() == ["i3", "i1", "i4"]  # still in the jobs' order
    table = folder.read("responses")
    assert table.schema == RESPONSES_SCHEMA and written.rows == table.num_rows == 5
    assert table.column("text").to_pylist() == by_hand
    assert table.column("text").to_pylist() == ["latest failure", "first ok", "done", "new failure", "kept"]
    assert written.status.unfinished() == {"error": 2}  # a/i1's latest attempt and a/i4's
    assert [(f.subject, f.failed, f.rows) for f in written.status.failed()] == [("a", 2, 4)]
    assert not (folder.root / ".spill" / "responses").exists()


def test_a_fresh_runs_own_answers_are_spread_on_disk_when_many_though_none_were_there_before(tmp_path, monkeypatch):
    """A fresh run finds no rows so far, and holds those (none) in memory. Its own answers, caught up
    before the table is written, are every row it writes: they are judged on their own bytes and go
    to disk when too many to hold (at a million images, 8 million rows held took the driver to
    4.4 GB). The table is the one a plain loop picks either way."""
    monkeypatch.setattr(rows_module, "HOLD_FILES_BYTES", 0)  # only rows of no bytes at all are held
    folder = RunFolder(tmp_path / "fresh")
    spill = folder.root / ".spill" / "responses"
    with RowsSoFar(folder, ["a", "b"], pa.array(["i1", "i2", "i3", "i4"])) as so_far:
        assert not list(spill.rglob("*.arrow"))  # no rows so far, held
        answers = [
            _row("a", "i1", "full", "ok", "ka1", "one"),
            _row("a", "i3", "full", "error", "ka3", "failed"),
            _row("b", "i2", "full", "ok", "kb2", "two"),
        ]
        folder.append_part("responses", pa.Table.from_pylist(answers[:2], schema=RESPONSES_SCHEMA))
        folder.append_part("responses", pa.Table.from_pylist(answers[2:], schema=RESPONSES_SCHEMA))
        so_far.add_jobs(JOBS)
        written = collect_rows(folder, so_far)
        on_disk = sorted(p.parent.name for p in spill.rglob("*.arrow"))
    assert on_disk and set(on_disk) == {"1", "jobs"}  # the answers caught up and the jobs, each bucket a file
    table = folder.read("responses")
    assert written.rows == 3 and table.column("text").to_pylist() == ["one", "failed", "two"]


def test_an_imported_model_looked_up_in_the_driver_gives_the_rows_its_actors_gave(tmp_path, monkeypatch):
    """The driver's lookup, slices straddling prompts, against the actor path's `describe` over the
    same jobs: every field but the timing, rows found and rows missing alike; an unreadable file is
    an error row per job saying why."""
    from types import SimpleNamespace

    import vlm_decade.stages.describe.local as local_module
    from vlm_decade.stages.describe.local import DescribeActor
    from vlm_decade.stages.describe.plan import Plan, jobs_from, plan_jobs
    from vlm_decade.studies import study_from_dict

    file = tmp_path / "answers.csv"
    file.write_text(
        "image_id,variant,prompt,text\n"
        "i1,full,p1, a red bird \n"
        "i1,m1,,every prompt\n"
        "i2,full,p2,a cat\n"
        "i3,full,,first\n"
        "i3,full,,last\n"
    )
    model = ModelConfig(name="m", backend="imported", model_id="m", era="pre-mllm", options={"file": str(file)})
    study = study_from_dict(
        {
            "name": "lookup",
            "data": {"images": "x.csv", "image_dir": str(tmp_path), "descriptions": "d.csv"},
            "models": [model.model_dump(mode="json") | {"variants": "all"}],
        }
    )
    images = pa.table(
        {
            "image_id": ["i1", "i2", "i3", "i4"],
            "dataset": ["everyday"] * 4,
            "path": [f"/x/i{i}.png" for i in range(1, 5)],
            "sha256": [f"{i}" * 64 for i in range(1, 5)],
        }
    )
    plan = Plan({"m": (("p1", "say"), ("p2", "say more"))}, masks=(MaskSpec("m1", (0.25, 0.25, 0.75, 0.75), 0.0),))
    jobs = plan_jobs(study, plan, images)
    by_actor = DescribeActor(model).describe(jobs_from(jobs, plan, images), None)

    def looked_up(name: str) -> list[dict]:
        folder = RunFolder(tmp_path / name)
        advanced = []
        local_module.look_up(model, [jobs], SimpleNamespace(folder=folder), advanced.append)
        assert sum(advanced) == jobs.num_rows
        return folder.read_parts("responses", RESPONSES_SCHEMA).to_pylist()

    monkeypatch.setattr(local_module, "LOOKUP_ROWS", 3)  # slices of 3 over 16 jobs: some hold both prompts
    rows = looked_up("driver")
    untimed = lambda rows: [{k: v for k, v in r.items() if k != "latency_s"} for r in rows]  # noqa: E731
    assert untimed(rows) == untimed(by_actor) and len(rows) == 16
    texts = {(r["image_id"], r["variant"], r["prompt_id"]): (r["status"], r["text"]) for r in rows}
    assert texts[("i1", "full", "p1")] == ("ok", "a red bird") and texts[("i1", "m1", "p2")] == ("ok", "every prompt")
    assert texts[("i3", "full", "p2")] == ("ok", "last") and texts[("i4", "full", "p1")][0] == "error"
    file.unlink()
    (failed,) = {(r["status"], r["error"]) for r in looked_up("unreadable")}
    assert failed[0] == "error" and "answers.csv" in failed[1]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    JSON,
    st.text(max_size=20),
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    st.none() | st.dictionaries(st.text(max_size=5), JSON, max_size=3),
    st.none() | st.lists(st.text(max_size=6), max_size=3),
    st.none() | st.text(max_size=9),
    st.none() | st.just("absent") | st.text(max_size=64),
)
def test_a_cache_key_put_together_from_its_pieces_is_the_sha256_of_its_payload_as_sorted_json(
    settings_, prompt, image, mask, classes, background, answer
):
    """The keys of every run before: what `json.dumps(payload, sort_keys=True)` hashed, for each
    job of a column of them (here an image's two masks, the second without an answer)."""
    from vlm_decade.stages.describe.plan import KeyTemplate

    payload = {"model": settings_, "prompt": prompt, "image": image, "mask": mask}
    if classes is not None:
        payload["classes"] = classes
    if background is not None:
        payload["background"] = background
    if answer != "absent":
        payload["answer"] = answer
    other = {"id": "m2", "box": [0.1, 0.2]}
    payload2 = payload | {"mask": other} | ({} if answer == "absent" else {"answer": None})
    want = [hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest() for p in (payload, payload2)]
    keys = KeyTemplate(settings_, prompt).keys(
        pa.array([0, 0]),
        pa.array([image], pa.string()),
        pa.array([background], pa.string()),
        pa.array([json.dumps(mask, sort_keys=True), json.dumps(other, sort_keys=True)], pa.string()),
        None if classes is None else pa.array([json.dumps(classes)] * 2, pa.string()),
        None if answer == "absent" else pa.array([answer, None], pa.string()),
    )
    assert keys.to_pylist() == want
