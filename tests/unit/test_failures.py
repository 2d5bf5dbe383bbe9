"""A failure says its real cause, and a run that left failed rows says which, per model: the
exception a worker raised is found under Ray's wrappers, its text has no terminal escape codes, and
the failed rows are counted per table and model with their most common error."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from vlm_decade.core.config import RuntimeConfig
from vlm_decade.core.dispatch import original, raised_in
from vlm_decade.core.errors import RemoteError, error_text, plain
from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Failed, Stage, StatusTally, StudyRun, run_failures, tallied
from vlm_decade.core.runtime import LazyRay
from vlm_decade.models.backends import Stimulus
from vlm_decade.stages.describe.local import describe_batch
from vlm_decade.stages.describe.plan import Job

# What Ray 2.60 says when an actor's constructor raised (its colour codes included), as ray.get gives it.
CREATION_FAILED = (
    "The actor died because of an error raised in its creation task, \x1b[36mray::DescribeActor.__init__()\x1b[39m "
    "(pid=18327, ip=192.0.2.2, actor_id=fd4bfad397a55b9220c41cae01000000, repr=<DescribeActor object at 0x7f>)\n"
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/repo/vlm_decade/stages/describe/local.py", line 67, in __init__\n'
    "    self.backend = backend_class(model.backend)(model)\n"
    "                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/repo/vlm_decade/models/backends/ssd_template.py", line 160, in __init__\n'
    '    raise ValueError("ssd-template: score_threshold: at most 1")\n'
    "vlm_decade.core.errors.ValueError: ssd-template: score_threshold: at most 1\n"
    "and a second line of the message"
)


def test_escape_codes_are_removed_and_an_error_is_its_type_and_first_line():
    assert plain("\x1b[36mray::A.f()\x1b[39m \x1b]8;;http://x\x07link\x1b]8;;\x07 \x1b7ok") == "ray::A.f() link ok"
    assert error_text(KeyError("model.bin")) == "KeyError: 'model.bin'"
    assert error_text(ValueError("\x1b[31mbad\x1b[0m value\n  more")) == "ValueError: bad value"
    assert error_text(RuntimeError()) == "RuntimeError"
    assert error_text(RemoteError("error", "OpenCV: cannot parse")) == "error: OpenCV: cannot parse"


def test_the_error_of_an_actors_constructor_is_found_in_rays_text():
    found = raised_in(CREATION_FAILED)
    assert error_text(found) == "ValueError: ssd-template: score_threshold: at most 1"
    assert found.message.endswith("and a second line of the message") and str(found).startswith("ValueError: ")
    assert raised_in("The actor died unexpectedly before finishing this task.") is None


def test_rays_wrappers_give_back_the_exception_the_worker_raised():
    from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

    cause = KeyError("boom")
    wrapped = RayTaskError("f", "\x1b[36mray::A.f()\x1b[39m\nKeyError: 'boom'", cause, proctitle="p", pid=1, ip="h")
    outer = RayTaskError("g", "ray::B.g()", wrapped, proctitle="p", pid=1, ip="h")  # failed on its argument
    assert original(outer) is cause and "\x1b" not in "".join(cause.__notes__)
    died = ActorDiedError()
    RayActorError.__init__(died, "id", CREATION_FAILED, actor_init_failed=True)
    assert error_text(original(died)) == "ValueError: ssd-template: score_threshold: at most 1"
    lost = ActorDiedError()  # its node went: no exception of the work to find
    assert original(lost) is lost


class Raising:
    """A backend whose every batch raises."""

    def describe(self, batch):
        raise OSError("\x1b[1mweights\x1b[0m unreadable\ntraceback lines")


def test_a_batch_that_raises_is_an_error_row_per_stimulus_saying_the_cause():
    jobs = [Job("m", f"i{k}", "full", "p", "", f"/x/i{k}.png", None, f"key{k}") for k in range(3)]
    stimuli = [Stimulus("i0", "full", np.zeros((2, 2, 3), np.uint8), ""), "could not read image /x/i1.png: truncated"]
    stimuli.append(Stimulus("i2", "full", np.zeros((2, 2, 3), np.uint8), ""))
    rows = describe_batch(Raising(), jobs, stimuli)
    assert [(r["image_id"], r["status"], r["error"]) for r in rows] == [
        ("i0", "error", "OSError: weights unreadable"),
        ("i1", "error", "could not read image /x/i1.png: truncated"),
        ("i2", "error", "OSError: weights unreadable"),
    ]


def test_failed_rows_per_table_and_model_with_the_most_common_error():
    statuses = [
        ("alpha", "ok", None),
        ("alpha", "error", "B: timeout"),
        ("alpha", "error", "A: refused"),
        ("alpha", "error", "B: timeout"),
        ("alpha", "skipped", "budget reached"),  # not sent, by the user's budget: not a failure
        ("beta", "error", "\x1b[31mC: red\x1b[0m"),
        ("beta", "error", "A: tie"),  # a tie: the first in order of text
        ("gamma", "skipped", "budget reached"),
        ("delta", "ok", None),
    ]
    table = pa.table({k: [s[i] for s in statuses] for i, k in enumerate(("subject", "status", "error"))})
    expected = [Failed("responses", "alpha", 3, 5, "B: timeout", 2), Failed("responses", "beta", 2, 2, "A: tie", 1)]
    assert tallied("responses", table).failed() == expected
    assert tallied("responses", table).unfinished() == {"error": 5, "skipped": 2}
    in_batches = StatusTally("responses")  # as a table written batch by batch is counted
    for batch in table.to_batches(max_chunksize=2):
        in_batches.add(batch)
    assert in_batches.failed() == expected and in_batches.unfinished() == {"error": 5, "skipped": 2}
    judged = pa.table({"status": ["error", "error", "ok"], "error": ["no verdict", "no verdict", None]})
    (judge,) = tallied("judgments", judged).failed()  # no subject column: the judge's own rows
    assert judge == Failed("judgments", None, 2, 3, "no verdict", 2)
    assert judge.who == "judgments" and tallied("scores", pa.table({"subject": ["a"]})).failed() == []
    assert Failed("responses", "beta", 2, 2, "A: tie", 1).line() == (
        "beta: 2 of 2 responses failed (every one); most common (1): A: tie"
    )


def test_a_run_with_failed_rows_records_them_and_a_fixed_rerun_clears_them(tmp_path):
    folder = RunFolder(tmp_path)
    run = StudyRun(folder, Reporter(quiet=True), LazyRay(RuntimeConfig()))

    def responses(status):
        return Stage(
            "responses",
            (),
            {"s": status},
            lambda _: {"responses": pa.table({"subject": ["m", "m"], "status": ["ok", status], "error": ["", "E: x"]})},
        )

    run(Stage("images", (), {}, lambda _: {"images": pa.table({"x": [1]})}), responses("error"))
    assert run_failures(folder.manifest()) == [Failed("responses", "m", 1, 2, "E: x", 1)]
    run(Stage("images", (), {}, lambda _: {"images": pa.table({"x": [1]})}), responses("ok"))
    assert run_failures(folder.manifest()) == []


@pytest.mark.parametrize("pipeline", [["b", "a"], []])
def test_the_failures_of_a_manifest_in_pipeline_order(pipeline):
    record = {"table": "t", "failed": 1, "rows": 1, "error": "E", "count": 1}
    manifest = {
        "pipeline": pipeline,
        "stages": {"a": {"failed": [{**record, "subject": "x"}]}, "b": {"failed": [{**record, "subject": "y"}]}},
    }
    assert [f.subject for f in run_failures(manifest)] == (["y", "x"] if pipeline else ["x", "y"])


def test_failed_rows_end_the_command_with_status_3_unless_allowed(capsys):
    import typer

    from vlm_decade.cli import _end

    failed = [Failed("responses", "m", 4, 4, "ValueError: no weights", 4)]
    with pytest.raises(typer.Exit) as ended:
        _end(failed, allow_failures=False)
    assert ended.value.exit_code == 3
    said = " ".join(capsys.readouterr().err.split())
    assert "m: 4 of 4 responses failed (every one); most common (4): ValueError: no weights" in said
    _end(failed, allow_failures=True)  # said, and the command goes on to exit 0
    said = " ".join(capsys.readouterr().err.split())
    assert "exit status 0 (--allow-failures)" in said and "m: 4 of 4 responses failed" in said
    _end([], allow_failures=False)
    assert capsys.readouterr().err == ""
