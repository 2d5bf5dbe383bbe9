"""The describe stage: every model answers every image variant and prompt, into the `responses` table.

What a study asks of its models (each model's prompts, the masked variants, the class lists of
closed-world baselines) comes in a `Plan` that the study builds; `plan` turns it into jobs, one per
response, each with a cache key (model, prompt, image bytes, mask geometry), and rows whose key is
already done are never described again (`rows`). Local models run in Ray actors (`local`), but for
imported files, looked up in the driver; API models send through their provider's gateway actor
(`remote`). In batch mode every API model's
requests are submitted as batches first, before any local or sync model runs and before any batch
is waited on, so the batches are worked on meanwhile and a study waits one batch turnaround for
all its models.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.config import StudyBase
from vlm_decade.core.runner import Stage, StudyRun, Written, release_memory
from vlm_decade.models.backends import backend_class
from vlm_decade.stages.describe.local import describe_local
from vlm_decade.stages.describe.plan import (
    Plan,
    api_budgets,
    check_actor_fit,
    check_models,
    jobs_from,
    model_fingerprint,
    plan_jobs,
)
from vlm_decade.stages.describe.remote import RemoteModels
from vlm_decade.stages.describe.rows import RESPONSE_KEY, collect_rows, todo_jobs

__all__ = ["Plan", "check_models", "run_describe", "stage"]


def run_describe(study: StudyBase, plan: Plan, run: StudyRun) -> Written:
    """Every job's best row, written: those done before are kept; of the rest, the batch-mode API models'
    requests are submitted first, then the other models run in the study's order while the
    batches are worked on, and the batches are collected last."""
    images = run.table("images")
    jobs = plan_jobs(study, plan, images)
    todo, n_done = todo_jobs(run.folder, jobs)
    if n_done:
        run.reporter.say(f"     responses    {n_done} of {jobs.num_rows} already done, kept")
    jobs = jobs.select([*RESPONSE_KEY, "cache_key"])  # what choosing the rows needs; the todo holds the rest
    release_memory()  # what planning freed, before the models run
    work = model_jobs(study, todo)
    models = [m for m in study.models if work[m.name].num_rows]
    remote = [m for m in models if backend_class(m.backend).remote]
    if any(not (backend_class(m.backend).remote or backend_class(m.backend).looks_up) for m in models):
        check_actor_fit(study, run.ray())  # before any batch is submitted
    total = todo.num_rows
    del todo
    per_model = {m.name: work[m.name].num_rows for m in models}
    with run.reporter.track("describe", total, per_model) as advance, RemoteModels(study, run, remote, advance) as api:
        batched = {m.name for m in remote if api.in_batches(m)}
        for model in remote:
            if model.name in batched:
                api.send(model, jobs_from(work.pop(model.name), plan, images))
        api.submit()
        for model in models:
            if model.name not in work:
                continue  # sent in batches above
            if backend_class(model.backend).remote:
                api.send(model, jobs_from(work.pop(model.name), plan, images))
            else:
                describe_local(study, model, work.pop(model.name), plan, run, partial(advance, part=model.name))
        api.collect()
        api.stop()
    return collect_rows(run.folder, jobs)


def model_jobs(study: StudyBase, todo: pa.Table) -> dict[str, pa.Table]:
    """Each model's jobs of `todo`, as slices of it (not copies): jobs are planned model by model,
    in the study's order, so each model's are one run of rows."""
    subjects, out, start = todo.column("subject"), {}, 0
    for model in study.models:
        n = pc.sum(pc.equal(subjects, model.name)).as_py() or 0
        out[model.name] = todo.slice(start, n)
        start += n
    return out


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
    )
