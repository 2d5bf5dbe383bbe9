"""Local models in Ray actors: each actor loads its model once (`num_gpus` per actor where there are
GPUs); images are decoded and masked by Ray tasks on CPU workers and handed to the actors, with at
most two batches in flight per actor (`dispatch.IN_FLIGHT_PER_ACTOR`), so memory stays flat
whatever the number of images. Each finished batch is saved as a part at once, so a killed run
keeps it. A backend must give one answer per stimulus: a batch answered with another count is an
error row per job, saying so."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from vlm_decade.core.config import ModelConfig, StudyBase
from vlm_decade.core.errors import error_text
from vlm_decade.core.runner import StudyRun
from vlm_decade.models.api.answers import failed_answer
from vlm_decade.models.backends import Backend, Description, Stimulus, backend_class
from vlm_decade.stages.describe.plan import Job, Plan, jobs_from, load_stimuli
from vlm_decade.stages.describe.rows import RESPONSES_SCHEMA, failed_batch, one_for_one, response_row

PART_ROWS, PART_S = 4096, 10.0  # save a local model's rows as a part this often


def _local_answer(description: Description, latency_s: float) -> dict:
    return {
        "text": description.text,
        "status": description.status,
        "error": description.error,
        "latency_s": latency_s,
        "queued_s": None,
        "input_tokens": None,
        "output_tokens": None,
        "cost_usd": 0.0,
        "paid_usd": 0.0,
        "cached": False,
        "mode": None,
        "model_version": description.model_version,
    }


def describe_batch(backend: Backend, jobs: list[Job], stimuli: list[Stimulus | str]) -> list[dict]:
    """One row per job: the backend's answer for each stimulus that loaded, an error row for each
    that did not. A batch that raises, or is answered with a count other than its stimuli's, is an
    error row for each of its stimuli."""
    ready = [s for s in stimuli if isinstance(s, Stimulus)]
    start = time.perf_counter()
    try:
        answers = one_for_one(ready, list(backend.describe(ready)), f"model {jobs[0].subject}") if ready else []
    except Exception as exc:  # noqa: BLE001 - a batch that fails is recorded, not fatal
        answers = [Description("", "error", error_text(exc))] * len(ready)
    latency = (time.perf_counter() - start) / max(len(ready), 1)
    answer = iter(answers)
    return [
        response_row(
            job, _local_answer(next(answer), latency) if isinstance(stim, Stimulus) else failed_answer("error", stim)
        )
        for job, stim in zip(jobs, stimuli)
    ]


class DescribeActor:
    """Holds one model for the life of the actor; describes batches of decoded stimuli."""

    def __init__(self, model: ModelConfig):
        self.backend = backend_class(model.backend)(model)

    def describe(self, jobs: list[Job], stimuli: list[Stimulus | str] | None) -> list[dict]:
        """`stimuli` None: the backend needs no images (it is given empty ones)."""
        if stimuli is None:
            stimuli = [
                Stimulus(j.image_id, j.variant, np.empty(0, np.uint8), j.prompt, j.classes, j.prompt_id) for j in jobs
            ]
        return describe_batch(self.backend, jobs, stimuli)


def describe_local(study: StudyBase, model: ModelConfig, jobs: pa.Table, plan: Plan, run: StudyRun, advance) -> None:
    """A local model in its actors; images decoded and masked by loader tasks (none for backends
    that need no images). The caller has checked that the actors fit (`plan.check_actor_fit`). A
    backend that looks its answers up (an imported file) answers in the driver instead (`look_up`)."""
    ray, rt = run.ray(), study.runtime
    needs_images = backend_class(model.backend).needs_images
    actor_cls = ray.remote(DescribeActor).options(num_cpus=rt.cpus_per_actor, num_gpus=rt.gpus_per_actor)
    # Loaders reserve no CPU: the actors may hold every CPU there is, and the in-flight cap
    # already bounds how many loads run at once (two per actor).
    loader = ray.remote(load_stimuli).options(num_cpus=0)
    images = run.table("images")
    work = (jobs_from(jobs.slice(i, model.batch_size), plan, images) for i in range(0, jobs.num_rows, model.batch_size))
    call = lambda actor, batch: actor.describe.remote(batch, loader.remote(batch) if needs_images else None)  # noqa: E731
    with run.folder.parts("responses", RESPONSES_SCHEMA, PART_ROWS, PART_S) as parts:
        make = lambda: actor_cls.remote(model)  # noqa: E731
        for done in run.actor_pool(rt, make, rt.actors_per_model, work, call, f"describe ({model.name})"):
            # a batch that failed (or whose actors kept dying) is recorded per row, tried again next run
            parts.add(done.value if done.error is None else failed_batch(done.work, done.error))
            advance(len(done.work))


LOOKUP_ROWS = 65_536  # questions a looked-up model answers at a time


def look_up(model: ModelConfig, tables, run: StudyRun, advance) -> None:
    """A backend whose answers are a lookup answers in the driver, `LOOKUP_ROWS` jobs at a time, each
    slice saved as a part: no actors and no images (in actors, a Ray call per batch of a few rows
    cost more than the lookup itself). The jobs come as `tables` (an iterable of tables, taken one
    at a time). A backend that cannot be made (its file unreadable) is an error row per job, saying
    why, as an actor that cannot be made is."""
    try:
        backend, failed = backend_class(model.backend)(model), None
    except Exception as exc:  # noqa: BLE001 - recorded per row, tried again by the next run
        backend, failed = None, failed_answer("error", error_text(exc))
    parts_of = ((jobs, start) for jobs in tables for start in range(0, jobs.num_rows, LOOKUP_ROWS))
    with run.folder.parts("responses", RESPONSES_SCHEMA, PART_ROWS, PART_S) as parts:
        for jobs, start in parts_of:
            part = jobs.slice(start, LOOKUP_ROWS)
            began = time.perf_counter()
            found = None if backend is None else backend.answer_rows(part.select(["image_id", "variant", "prompt_id"]))
            latency = (time.perf_counter() - began) / max(part.num_rows, 1)
            fields = failed if backend is None else _local_answer(Description(""), latency)
            answers = {
                k: pa.repeat(pa.scalar(v, RESPONSES_SCHEMA.field(k).type), part.num_rows) for k, v in fields.items()
            }
            if found is not None:  # the looked-up fields; the rest as every local row has them
                answers |= {c: found.column(c) for c in found.column_names}
            columns = {c: part.column(c) for c in ("subject", "image_id", "variant", "prompt_id", "cache_key")}
            parts.add(
                pa.table({f.name: (columns | answers)[f.name] for f in RESPONSES_SCHEMA}, schema=RESPONSES_SCHEMA)
            )
            advance(part.num_rows)
