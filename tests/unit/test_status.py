"""What `vlm-decade status` and the end of a run say, from run folders written by hand here: the
stages in pipeline order with their time and rows, a cancelled batch's rows told apart from pending
ones, and the rows a run left unfinished."""

import json

import pyarrow as pa
import pytest

from vlm_decade.core.runfolder import RunFolder
from vlm_decade.stages.describe.rows import RESPONSES_SCHEMA, response_states
from vlm_decade.studies import study_from_dict
from vlm_decade.studies.status import kept_lines, status_lines, unfinished_lines

from .view_runs import DECADE_CONFIG

STAGES = {  # as the runner records them; the pipeline runs them in the order of PIPELINE
    "images": {"state": "done", "started": "2026-01-01T10:00:00+00:00", "seconds": 0.4, "rows": {"images": 3}},
    "references": {"state": "done", "started": "2026-01-01T10:00:01+00:00", "seconds": 0.02, "rows": {"references": 9}},
    "responses": {"state": "running", "started": "2026-01-01T10:00:02+00:00"},
    "embeddings": {
        "state": "incomplete",
        "started": "2026-01-01T09:00:00+00:00",
        "seconds": 61.25,
        "rows": {"embeddings": 12},
        "unfinished": {"embeddings": {"error": 1}},
    },
}
PIPELINE = ["images", "references", "responses", "embeddings", "scores"]


def _folder(tmp_path, manifest: dict) -> RunFolder:
    folder = RunFolder(tmp_path)
    folder.save_manifest({"config": DECADE_CONFIG, **manifest})
    return folder


def _status(folder: RunFolder) -> list[str]:
    return status_lines(folder, folder.manifest(), study_from_dict(DECADE_CONFIG))


def test_stages_are_listed_in_pipeline_order_with_their_time_and_rows(tmp_path):
    lines = _status(_folder(tmp_path, {"stages": STAGES, "pipeline": PIPELINE}))
    assert lines == [
        "stage images             done             0.4 s  3 images",
        "stage references         done             0.0 s  9 references",
        "stage responses          running",
        "stage embeddings         incomplete      61.2 s  12 embeddings",
    ]


def test_a_manifest_that_does_not_record_the_order_lists_stages_as_they_started(tmp_path):
    lines = _status(_folder(tmp_path, {"stages": STAGES}))
    assert [line.split()[1] for line in lines] == ["embeddings", "images", "references", "responses"]


def _pending_batch(tmp_path, state: str, answered: int | None) -> RunFolder:
    """beta (openai, gpt-x) has 8 responses, all written `pending` by a run that did not wait for
    their batch; the batch's record as `cancel` or a later run left it."""
    folder = _folder(tmp_path, {"stages": {"responses": STAGES["responses"]}, "spend_usd": {"openai": 0.0012}})
    rows = [
        {
            "subject": "beta",
            "image_id": f"i{n}",
            "variant": "full",
            "prompt_id": "p",
            "text": "",
            "status": "pending",
            "error": "in openai batch b-1; a later run collects it",
            "cache_key": f"k{n}",
        }
        for n in range(8)
    ]
    folder.append_part("responses", pa.Table.from_pylist(rows, schema=RESPONSES_SCHEMA))
    record = {
        "label": "run-chat-1",
        "state": state,
        "kind": "chat",
        "model_id": "gpt-x",
        "id": "b-1",
        "keys": [f"request-{n}" for n in range(8)],
        **({"answered": answered} if answered is not None else {}),
    }
    path = tmp_path / "api" / "batches" / "openai" / "run-chat-1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    return folder


@pytest.mark.parametrize(
    "state, answered, batches, said",
    [
        ("submitted", None, "1 pending (chat, 8 requests waiting)", "0 of 8 done (8 pending)"),
        # cancelled after answering 3: nothing waits; 3 answers are in the cache, 5 requests not sent
        ("cancelled", 3, "1 cancelled (chat)", "0 of 8 done (3 answered in the cache, 5 to send)"),
        ("expired", 0, "1 expired (chat)", "0 of 8 done (8 to send)"),
    ],
)
def test_rows_of_a_batch_are_pending_only_while_the_batch_is(tmp_path, state, answered, batches, said):
    lines = _status(_pending_batch(tmp_path, state, answered))
    assert lines == [
        "stage responses          running",
        f"openai: batches {batches}; spent $0.0012",
        f"  responses beta: {said}",
    ]


def test_the_rows_a_run_left_unfinished_are_counted_per_table_and_model(tmp_path):
    folder = RunFolder(tmp_path)
    statuses = [
        ("alpha", "ok", ""),
        ("alpha", "error", "timeout"),
        ("alpha", "error", "timeout"),
        ("alpha", "skipped", "budget"),
        ("beta", "error", "refused"),
        ("beta", "ok", ""),
    ]
    folder.write(
        "responses",
        pa.table(
            {
                "subject": [s for s, _, _ in statuses],
                "status": [t for _, t, _ in statuses],
                "error": [e for _, _, e in statuses],
            }
        ),
    )
    folder.write(
        "judgments", pa.table({"status": ["ok", "error"], "error": ["", "no verdict"]})
    )  # no subject: the judge's
    folder.write("scores", pa.table({"subject": ["alpha"], "score": [0.5]}))  # no status column: nothing to finish
    assert unfinished_lines(tmp_path) == [
        "  judgments judge: 1 error; most common: no verdict",
        "  responses alpha: 2 error, 1 skipped; most common: timeout",
        "  responses beta: 1 error; most common: refused",
    ]
    # After a run whose failed summary says the errors, only the other rows are left to say.
    assert unfinished_lines(tmp_path, frozenset({"error"})) == ["  responses alpha: 1 skipped; most common: budget"]


def test_a_smoke_run_says_so_first(tmp_path):
    lines = _status(_folder(tmp_path, {"stages": STAGES, "pipeline": PIPELINE, "limit": 2}))
    assert lines[0] == "smoke run: only the first 2 images of each dataset (run --limit 2); not the full study"
    assert lines[1].startswith("stage images")


def test_a_stopped_run_says_the_stages_it_finished_and_the_rows_it_saved(tmp_path):
    folder = _folder(tmp_path, {"stages": STAGES, "pipeline": PIPELINE, "started": "2026-01-01T10:00:00+00:00"})
    rows = pa.table({"image_id": ["a", "b", "c"]})
    folder.append_part("responses", rows)
    folder.append_part("responses", rows.slice(0, 2))
    assert kept_lines(tmp_path) == [
        "kept: the stages finished (images, references, embeddings)",
        "kept: 5 rows of responses, saved before the stop (not done again)",
    ]
    assert kept_lines(tmp_path / "never-run") == ["nothing was kept: the run had not begun"]


def test_each_response_is_counted_once_from_the_table_and_the_parts_ok_first_else_the_latest(tmp_path):
    def rows(*answers, schema=None):
        return pa.Table.from_pylist(
            [
                {"subject": "beta", "image_id": i, "variant": "full", "prompt_id": "p", "text": "", "status": s}
                for i, s in answers
            ],
            schema=schema,
        )

    folder = RunFolder(tmp_path)
    # The table as an older run wrote it, without the columns added since (cache_key, ...).
    folder.write("responses", rows(("i1", "error"), ("i2", "ok"), ("i3", "error")))
    folder.append_part("responses", rows(("i1", "ok"), ("i2", "error"), ("i3", "error"), schema=RESPONSES_SCHEMA))
    folder.append_part("responses", rows(("i3", "skipped"), ("i4", "error"), schema=RESPONSES_SCHEMA))
    assert response_states(folder) == {"beta": {"ok": 2, "skipped": 1, "error": 1}}


def test_a_damaged_part_is_left_out_of_the_counts_and_left_where_it_is(tmp_path):
    """`vlm-decade status` only looks: a truncated part is not counted and not deleted (the next run
    discards it, and says so)."""
    said = []
    folder = RunFolder(tmp_path, say=said.append)
    answers = [{"subject": "m", "image_id": i, "variant": "full", "prompt_id": "p", "status": "ok"} for i in "ab"]
    folder.append_part("responses", pa.Table.from_pylist(answers[:1], schema=RESPONSES_SCHEMA))
    folder.append_part("responses", pa.Table.from_pylist(answers[1:], schema=RESPONSES_SCHEMA))
    damaged = sorted((tmp_path / ".parts" / "responses").iterdir())[1]
    damaged.write_bytes(damaged.read_bytes()[:20])
    assert response_states(folder) == {"m": {"ok": 1}}
    assert damaged.exists() and any("damaged; left out" in line for line in said)
    assert folder.read_parts("responses", RESPONSES_SCHEMA).num_rows == 1  # as a run reads them: discarded
    assert not damaged.exists()
