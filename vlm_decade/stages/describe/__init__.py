"""The describe stage: every model answers every image variant and prompt, into the `responses` table.

What a study asks of its models (each model's prompts, the masked variants, the class lists of
closed-world baselines) comes in a `Plan` that the study builds; `plan` turns it into jobs, one per
response, each with a cache key (model, prompt, image bytes, mask geometry), and rows whose key is
already done are never described again (`rows`); a job whose inputs are as the previous table's
keys were made from takes its row's key instead of hashing it again (`keyed`). Local models run in
Ray actors (`local`), but for imported files, looked up in the driver; API models send through
their provider's gateway actor (`remote`). In batch mode every API model's requests are submitted
as batches first, before any local or sync model runs and before any batch is waited on, so the
batches are worked on meanwhile and a study waits one batch turnaround for all its models.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from functools import partial

import pyarrow as pa

from vlm_decade.core.config import StudyBase
from vlm_decade.core.runner import Stage, StudyRun, Written, release_memory
from vlm_decade.models.backends import backend_class
from vlm_decade.stages.describe.keyed import KeyInputs, key_rows
from vlm_decade.stages.describe.local import describe_local, look_up
from vlm_decade.stages.describe.plan import (
    Plan,
    api_budgets,
    check_actor_fit,
    check_models,
    jobs_from,
    key_contexts,
    model_fingerprint,
    planned_slices,
)
from vlm_decade.stages.describe.remote import RemoteModels
from vlm_decade.stages.describe.rows import RowsSoFar, collect_rows

__all__ = ["Plan", "check_models", "run_describe", "stage"]


def _on_actors(model) -> bool:
    """Whether the model runs on Ray actors of its own (neither an API nor a look-up in the driver)."""
    backend = backend_class(model.backend)
    return not (backend.remote or backend.looks_up)


def run_describe(study: StudyBase, plan: Plan, run: StudyRun) -> Written:
    """Every job's best row, written: those done before are kept; of the rest, the batch-mode API models'
    requests are submitted first, then the other models run in the study's order while the
    batches are worked on, and the batches are collected last. The jobs are planned a model at a
    time: those each model has still to do wait on disk until needed (`_Planned`), and all of
    them, spread by the rows so far over their buckets, until the rows are chosen, so that no
    more than one model's are held."""
    images = run.table("images")
    subjects = [m.name for m in study.models]
    # The rows so far are spread over buckets once: to find the jobs still to do and then, caught up
    # with the stage's own answers, to choose each job's row.
    with _Planned(run.folder) as planned, RowsSoFar(run.folder, subjects, images.column("image_id")) as so_far:
        n_done, n_jobs = 0, 0
        keyed = KeyInputs.load(run.folder.root, run.folder.manifest().get("tables", {}).get("responses"))
        for model in study.models:
            for jobs, kept in planned_slices(study, plan, images, [model], keyed, so_far.kept_keys):
                todo, done = so_far.add_jobs(jobs, kept)
                planned.add(model.name, todo)
                n_done, n_jobs = n_done + done, n_jobs + jobs.num_rows
        planned.close()
        if n_done:
            run.reporter.say(f"     responses    {n_done} of {n_jobs} already done, kept")
        release_memory()  # what planning freed, before the models run
        models = [m for m in study.models if planned.todo_count[m.name]]
        remote = [m for m in models if backend_class(m.backend).remote]
        if any(map(_on_actors, models)):
            check_actor_fit(study, run.ray())  # before any batch is submitted
        per_model = {m.name: planned.todo_count[m.name] for m in models}
        total = sum(per_model.values())
        with (
            run.reporter.track("describe", total, per_model) as advance,
            RemoteModels(study, run, remote, advance) as api,
        ):
            batched = {m.name for m in remote if api.in_batches(m)}
            for model in remote:
                if model.name in batched:
                    api.send(model, jobs_from(planned.todo(model.name), plan, images))
            api.submit()
            for model in models:
                if model.name in batched:
                    continue  # sent in batches above
                if backend_class(model.backend).remote:
                    api.send(model, jobs_from(planned.todo(model.name), plan, images))
                elif backend_class(model.backend).looks_up:  # in the driver, a slice of its jobs at a time
                    look_up(model, planned.todo_slices(model.name), run, partial(advance, part=model.name))
                else:
                    describe_local(study, model, planned.todo(model.name), plan, run, partial(advance, part=model.name))
            api.collect()
            api.stop()
        written = collect_rows(run.folder, so_far)
        KeyInputs(key_rows(images), key_contexts(study, plan), written.fingerprint).save(run.folder.root)
        return written


class _Planned:
    """The jobs each model has still to do, on disk (the run folder's `.spill/describe`, removed on
    leaving the context) as they are planned, a slice at a time (`add`, then `close`), until asked
    for a model at a time."""

    def __init__(self, folder):
        self.root = folder.root / ".spill" / "describe"
        self.todo_count: dict[str, int] = {}
        self.writers: dict[str, pa.ipc.RecordBatchStreamWriter] = {}
        self.files: dict[str, str] = {}

    def __enter__(self) -> _Planned:
        shutil.rmtree(self.root, ignore_errors=True)  # what a killed run left is of no use
        self.root.mkdir(parents=True)
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def add(self, name: str, todo: pa.Table) -> None:
        if name not in self.files:
            self.files[name] = str(self.root / f"todo-{len(self.files)}.arrow")
            self.writers[name] = pa.ipc.new_stream(self.files[name], todo.schema)
            self.todo_count[name] = 0
        self.writers[name].write_table(todo)
        self.todo_count[name] += todo.num_rows

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers = {}

    def todo(self, name: str) -> pa.Table:
        with pa.ipc.open_stream(self.files[name]) as reader:
            return reader.read_all()

    def todo_slices(self, name: str):
        """The model's jobs to do as they were planned, a slice at a time, each read into memory:
        a stream read from a path maps the file, and every page read would stay counted against
        the driver until the last slice."""
        with pa.OSFile(self.files[name]) as file, pa.ipc.open_stream(file) as reader:
            for batch in reader:
                yield pa.Table.from_batches([batch])


def stage(study: StudyBase, plan: Plan) -> Stage:
    """The `responses` table: what decides it is each model's settings and prompts, the masks, the
    class lists, and the API budgets (so a higher budget takes up the rows a lower one skipped)."""
    budgets = api_budgets(study)
    settings = {
        "models": [[m.name, m.variants, model_fingerprint(m), *plan.prompts[m.name]] for m in study.models],
        "masks": [asdict(s) for s in plan.masks],
        "classnames": {d: list(c) for d, c in sorted(plan.classnames.items())},
    }
    # Only studies with API models carry budgets, so other studies keep their fingerprints.
    return Stage(
        "responses",
        ("images",),
        settings | ({"budgets": budgets} if budgets else {}),
        lambda run: {"responses": run_describe(study, plan, run)},
        frees_cluster=not any(map(_on_actors, study.models)),
    )
