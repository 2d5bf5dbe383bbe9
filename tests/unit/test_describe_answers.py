"""The describe stage's answers, matched one for one to their jobs: a backend that answers each
stimulus gives each row its own answer; one that gives one answer too few fails every row of that
batch with a message saying so (and no row takes another job's answer); an image that could not
be read keeps its own error. And the one stop the API stages raise for what several models or
encoders left."""

from __future__ import annotations

import numpy as np
import pytest

import vlm_decade.models.backends as backends
from vlm_decade.core.config import ModelConfig
from vlm_decade.models.api.gateways import raise_stops
from vlm_decade.models.api.session import APIStopped, BatchesPending, BudgetReached
from vlm_decade.models.backends import Backend, Description, Stimulus
from vlm_decade.stages.describe.local import DescribeActor
from vlm_decade.stages.describe.plan import Job


class EchoBackend(Backend):
    """A made-up backend that names what it was shown."""

    def describe(self, batch: list[Stimulus]) -> list[Description]:
        return [Description(f"{s.image_id}/{s.variant}") for s in batch]


class ShortBackend(EchoBackend):
    """Drops the last answer of every batch."""

    def describe(self, batch: list[Stimulus]) -> list[Description]:
        return super().describe(batch)[:-1]


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(backends.BACKENDS.entries, "echo", f"{__name__}:EchoBackend")
    monkeypatch.setitem(backends.BACKENDS.entries, "short", f"{__name__}:ShortBackend")


def jobs_and_stimuli(ids: list[str]) -> tuple[list[Job], list[Stimulus]]:
    jobs = [Job("m", i, "full", "p", "describe", f"/images/{i}.png", None, f"key-{i}") for i in ids]
    return jobs, [Stimulus(i, "full", np.zeros((2, 2, 3), np.uint8), "describe") for i in ids]


def describe(backend: str, jobs: list[Job], stimuli: list) -> list[dict]:
    return DescribeActor(ModelConfig(name="m", backend=backend, model_id="x")).describe(jobs, stimuli)


def test_each_row_gets_the_answer_of_its_own_stimulus(registered):
    jobs, stimuli = jobs_and_stimuli(["a", "b", "c"])
    rows = describe("echo", jobs, stimuli)
    assert [(r["image_id"], r["status"], r["text"], r["cache_key"]) for r in rows] == [
        ("a", "ok", "a/full", "key-a"),
        ("b", "ok", "b/full", "key-b"),
        ("c", "ok", "c/full", "key-c"),
    ]


def test_one_answer_too_few_fails_every_row_of_the_batch_saying_so(registered):
    jobs, stimuli = jobs_and_stimuli(["a", "b", "c"])
    rows = describe("short", jobs, stimuli)
    assert [r["image_id"] for r in rows] == ["a", "b", "c"]  # no row dropped
    assert {r["status"] for r in rows} == {"error"} and {r["text"] for r in rows} == {""}
    assert rows[0]["error"] == (
        "AnswerCountError: model m gave 2 answers for a batch of 3; none of them is kept, "
        "and the next run tries the batch again"
    )
    assert len({r["error"] for r in rows}) == 1


def test_an_unreadable_image_keeps_its_own_error_and_the_count_is_of_the_stimuli_that_loaded(registered):
    jobs, stimuli = jobs_and_stimuli(["a", "b", "c"])
    stimuli[1] = "could not read image /images/b.png: truncated"
    echo = describe("echo", jobs, stimuli)
    assert [(r["status"], r["text"] or r["error"]) for r in echo] == [
        ("ok", "a/full"),
        ("error", "could not read image /images/b.png: truncated"),
        ("ok", "c/full"),
    ]
    short = describe("short", jobs, stimuli)
    assert short[1]["error"] == "could not read image /images/b.png: truncated"
    count = "AnswerCountError: model m gave 1 answers for a batch of 2"
    assert [short[i]["error"].split(";")[0] for i in (0, 2)] == [count, count]


def test_the_stops_of_several_models_or_encoders_are_one_naming_each():
    raise_stops([])  # nothing left: no stop
    waiting = [BatchesPending("responses of gpt: 64 wait"), BatchesPending("responses of gem: 16 wait")]
    with pytest.raises(BatchesPending, match=r"^responses of gpt: 64 wait; responses of gem: 16 wait$"):
        raise_stops(waiting)
    with pytest.raises(BudgetReached) as budget:
        raise_stops([BatchesPending("encoder A: waits"), BudgetReached("encoder B: budget")])
    assert str(budget.value) == "encoder A: waits; encoder B: budget"
    with pytest.raises(APIStopped) as stopped:
        raise_stops([BudgetReached("encoder A: budget"), APIStopped("encoder B: refused")])
    assert type(stopped.value) is APIStopped and str(stopped.value) == "encoder A: budget; encoder B: refused"
