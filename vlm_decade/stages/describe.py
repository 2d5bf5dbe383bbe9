"""The describe stage: every model answers every image variant and prompt, into the `responses` table.

Local models run in Ray actors that load the model once (`num_gpus` per actor where there are GPUs);
images are decoded and masked by Ray tasks on CPU workers and handed to the actors, with at most
two batches in flight per actor, so memory stays flat whatever the number of images. Each finished
batch is saved as a part at once, so a killed run keeps it; rows whose `cache_key` (model, prompt,
image bytes, mask geometry) is already done are never described again.

API models (`remote` backends) do not sit in that actor pool: Ray tasks encode their stimuli as PNG
bytes and send the requests to the provider's gateway actor (`vlm_decade.models.api`) with many in
flight; finished rows are saved as parts every few seconds, and every answer that reaches the
gateway is in the API cache at once, so a killed run buys again at most the requests that were in
flight when it died.

What a study asks of its models (each model's prompts, the masked variants, the class lists of
closed-world baselines) comes in a `Plan`; the study builds it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import first_per_key
from vlm_decade.core.config import ModelConfig, StudyBase
from vlm_decade.core.dispatch import bounded, pool_map
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.imaging.masks import MaskSpec
from vlm_decade.models.api.gateway import failed_answer
from vlm_decade.models.backends import Backend, Description, Stimulus, api_provider, backend_class
from vlm_decade.stages.estimate import Line

RESPONSES_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("variant", pa.string()),
        ("prompt_id", pa.string()),
        ("text", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("latency_s", pa.float64()),  # the provider's (or the local model's) time to answer
        ("queued_s", pa.float64()),  # API rows: time waiting for limits, slots and earlier attempts
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()),  # what the answer cost when it was bought (cached rows too)
        ("paid_usd", pa.float64()),  # what the run that wrote the row paid for it (0 from the cache)
        ("cached", pa.bool_()),  # the answer came from the API cache
        ("mode", pa.string()),  # API rows: how the answer was bought, sync or batch
        ("model_version", pa.string()),
        ("cache_key", pa.string()),
    ]
)
RESPONSE_KEY = ("subject", "image_id", "variant", "prompt_id")
ANSWER_FIELDS = ("text", "status", "error", "latency_s", "queued_s", "input_tokens", "output_tokens", "cost_usd", "paid_usd",
                 "cached", "mode", "model_version")
IN_FLIGHT_PER_ACTOR = 2
REMOTE_BATCH = 8  # stimuli one Ray task encodes and sends for an API model
FLUSH_ROWS, FLUSH_S = 32, 2.0  # save API rows as a part this often
PART_ROWS, PART_S = 4096, 10.0  # save a local model's rows as a part this often


@dataclass(frozen=True)
class Plan:
    """What a study asks of its models: each model's (prompt id, prompt) pairs, the masked variants
    a model with `variants: all` also describes, and each dataset's class names (given to
    closed-world backends only)."""

    prompts: dict[str, tuple[tuple[str, str], ...]]
    masks: tuple[MaskSpec, ...] = ()
    classnames: dict[str, tuple[str, ...]] = field(default_factory=dict)
    closed: dict[str, bool] = field(default_factory=dict)  # model -> closed-world (given the class names)

    def variants(self, model: ModelConfig) -> list[str]:
        return ["full"] + ([s.mask_id for s in self.masks] if model.variants == "all" else [])


@dataclass(frozen=True)
class Job:
    """One response to produce."""

    subject: str
    image_id: str
    variant: str
    prompt_id: str
    prompt: str
    path: str
    mask: MaskSpec | None
    cache_key: str
    classes: tuple[str, ...] = ()  # the dataset's class names, for closed-world backends only


# checks -----------------------------------------------------------------------------------------
def check_models(study: StudyBase, image_ids: set[str] | None, variants: list[str]) -> list[Problem]:
    """Each model's backend and what its `check` finds before any work (weights, files, keys), and a
    price for every API model. Checks that need the images wait until the data could be read
    (`image_ids` None: it could not)."""
    problems = []
    for i, model in enumerate(study.models):
        try:
            cls = backend_class(model.backend)
        except KeyError as exc:
            problems.append(Problem("study file", exc.args[0], field=f"models.{i}.backend"))
            continue
        if image_ids is not None or not cls.needs_images:
            problems += cls.check(model, image_ids or set(), variants)
        provider = api_provider(model.backend)
        if model.mode is not None and not provider:
            problems.append(Problem("study file", f"`mode` is for API models; {model.backend} runs here", field=f"models.{i}.mode"))
        if provider and getattr(study.providers, provider).price(provider, model.model_id) is None:
            problems.append(Problem("study file", f"no price for {provider} model '{model.model_id}'; add one under "
                                    f"providers.{provider}.prices", field=f"models.{i}.model_id"))
    return problems


def api_budgets(study: StudyBase) -> dict[str, float | None]:
    """Budgets of the providers a study's models use: part of the stage's settings, so a run with a
    higher budget takes up the rows an earlier budget skipped."""
    used = {p for m in study.models if (p := api_provider(m.backend))}
    return {p: getattr(study.providers, p).budget_usd for p in sorted(used)}


def model_fingerprint(model: ModelConfig) -> dict:
    return backend_class(model.backend).fingerprint(model)


def check_actor_fit(study: StudyBase, ray) -> None:
    """On a local Ray, actors that ask for more than the machine has would wait forever in silence."""
    if study.runtime.address:
        return  # a cluster may autoscale to fit
    rt, have = study.runtime, ray.cluster_resources()
    for resource, each in (("CPU", rt.cpus_per_actor), ("GPU", rt.gpus_per_actor)):
        need = each * rt.actors_per_model
        if need > have.get(resource, 0):
            raise InputError(
                [
                    Problem(
                        "study file",
                        f"{rt.actors_per_model} actors x {each:g} {resource} = {need:g} {resource}, but this Ray has "
                        f"{have.get(resource, 0):g}; lower actors_per_model or {resource.lower()}s_per_actor",
                        field=f"runtime.{resource.lower()}s_per_actor",
                    )
                ]
            )


# planning and loading ---------------------------------------------------------------------------
JOB_COLUMNS = (*("subject", "image_id", "variant", "prompt_id"), "dataset", "path", "cache_key")


def plan_jobs(study: StudyBase, plan: Plan, images: pa.Table) -> pa.Table:
    """Every response to produce, as a table (one row per job, in plan order: model, prompt, image,
    variant) with its cache key, so a study of any size holds no Python object per job;
    `jobs_from` turns a slice of it into `Job`s."""
    specs = {s.mask_id: s for s in plan.masks}
    rows = images.select(["image_id", "dataset", "path", "sha256"])
    ids, datasets, paths, shas = (rows.column(c).to_pylist() for c in ("image_id", "dataset", "path", "sha256"))
    chunks = []
    for model in study.models:
        settings = model_fingerprint(model)
        closed = plan.closed.get(model.name, False)
        variants = plan.variants(model)
        for prompt_id, prompt in plan.prompts[model.name]:
            keys = []
            for dataset, sha in zip(datasets, shas):
                classes = list(plan.classnames.get(dataset, ())) if closed else None
                for variant in variants:
                    mask = specs.get(variant)
                    payload = {"model": settings, "prompt": prompt, "image": sha, "mask": asdict(mask) if mask else None}
                    if closed:
                        payload["classes"] = classes
                    keys.append(hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest())
            n = len(variants)
            chunks.append(pa.table({
                "subject": pa.array([model.name] * (len(ids) * n), pa.string()),
                "image_id": pa.array([i for i in ids for _ in variants], pa.string()),
                "variant": pa.array(variants * len(ids), pa.string()),
                "prompt_id": pa.array([prompt_id] * (len(ids) * n), pa.string()),
                "dataset": pa.array([d for d in datasets for _ in variants], pa.string()),
                "path": pa.array([p for p in paths for _ in variants], pa.string()),
                "cache_key": pa.array(keys, pa.string()),
            }))
    if not chunks:
        return pa.table({c: pa.array([], pa.string()) for c in JOB_COLUMNS})
    return pa.concat_tables(chunks).combine_chunks()


def jobs_from(table: pa.Table, plan: Plan) -> list[Job]:
    """The `Job`s of some rows of `plan_jobs`' table."""
    specs = {s.mask_id: s for s in plan.masks}
    prompts = {(subject, pid): text for subject, pairs in plan.prompts.items() for pid, text in pairs}
    return [
        Job(r["subject"], r["image_id"], r["variant"], r["prompt_id"], prompts[(r["subject"], r["prompt_id"])], r["path"],
            specs.get(r["variant"]), r["cache_key"], tuple(plan.classnames.get(r["dataset"], ())) if plan.closed.get(r["subject"]) else ())
        for r in table.to_pylist()
    ]


def load_stimuli(jobs: list[Job]) -> list[Stimulus | str]:
    """Decode and mask images; a file that fails here becomes an error string for its row only."""
    from vlm_decade.imaging.decode import load_rgb
    from vlm_decade.imaging.masks import apply_mask

    out: list[Stimulus | str] = []
    for job in jobs:
        try:
            rgb, _ = load_rgb(job.path)
            image = apply_mask(rgb, job.mask) if job.mask else rgb
            out.append(Stimulus(job.image_id, job.variant, image, job.prompt, job.classes))
        except Exception as exc:  # noqa: BLE001 - recorded per row; the run goes on
            out.append(f"could not read image {job.path}: {exc}")
    return out


def load_png(jobs: list[Job]) -> list[bytes | str]:
    """Each job's stimulus as the PNG bytes an API model is sent, or an error string for its row.
    Jobs that share an image and variant (probe questions) share one encoding."""
    import io

    from PIL import Image

    encoded: dict[tuple, bytes | str] = {}
    out: list[bytes | str] = []
    for job in jobs:
        key = (job.path, job.mask)
        if key not in encoded:
            (stim,) = load_stimuli([job])
            if isinstance(stim, str):
                encoded[key] = stim
            else:
                buf = io.BytesIO()
                Image.fromarray(stim.image).save(buf, format="PNG")
                encoded[key] = buf.getvalue()
        out.append(encoded[key])
    return out


# rows -------------------------------------------------------------------------------------------
def response_row(job: Job, answer: dict) -> dict:
    """A `responses` row: the job's key and cache key, and the answer's fields."""
    return {"subject": job.subject, "image_id": job.image_id, "variant": job.variant, "prompt_id": job.prompt_id,
            **{k: answer[k] for k in ANSWER_FIELDS}, "cache_key": job.cache_key}


def _local_answer(description: Description, latency_s: float) -> dict:
    return {"text": description.text, "status": description.status, "error": description.error, "latency_s": latency_s,
            "queued_s": None, "input_tokens": None, "output_tokens": None, "cost_usd": 0.0, "paid_usd": 0.0, "cached": False,
            "mode": None, "model_version": description.model_version}


def describe_batch(backend: Backend | None, jobs: list[Job], stimuli: list[Stimulus | str]) -> list[dict]:
    ready = [s for s in stimuli if isinstance(s, Stimulus)]
    start = time.perf_counter()
    try:
        answers = iter(backend.describe(ready)) if ready else iter(())
    except Exception as exc:  # noqa: BLE001 - a batch that fails is recorded, not fatal
        answers = iter([Description("", "error", f"{type(exc).__name__}: {exc}")] * len(ready))
    latency = (time.perf_counter() - start) / max(len(ready), 1)
    return [
        response_row(job, _local_answer(next(answers), latency) if isinstance(stim, Stimulus) else failed_answer("error", stim))
        for job, stim in zip(jobs, stimuli)
    ]


def failed_batch(batch: list[Job], exc: BaseException) -> list[dict]:
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return [response_row(job, failed_answer("error", f"{type(exc).__name__}: {first_line}")) for job in batch]


class DescribeActor:
    """Holds one model for the life of the actor; describes batches of decoded stimuli."""

    def __init__(self, model: ModelConfig):
        self.backend = backend_class(model.backend)(model)

    def describe(self, jobs: list[Job], stimuli: list[Stimulus | str] | None) -> list[dict]:
        """`stimuli` None: the backend needs no images (it is given empty ones)."""
        if stimuli is None:
            stimuli = [Stimulus(j.image_id, j.variant, np.empty(0, np.uint8), j.prompt, j.classes) for j in jobs]
        return describe_batch(self.backend, jobs, stimuli)


def ask_gateway(gateway, model_id: str, settings: dict, jobs: list[Job], batch: bool = False) -> list[dict]:
    """A Ray task: each job's stimulus as PNG, with its prompt, through the provider's gateway
    actor; one answer per job, in order. Image bytes go from here to the gateway, never through the
    driver. In batch mode the requests are only submitted: an answer not known at once is
    {"status": "queued", "key"}, for `finish_queued`."""
    import ray

    from vlm_decade.models.api.providers import ChatRequest

    def send(req: ChatRequest):
        return gateway.submit.remote(req, True) if batch else gateway.chat.remote(req, False)  # batch: held until the caller flushes

    refs = [png if isinstance(png, str) else send(ChatRequest(model_id, job.prompt, png, settings)) for job, png in zip(jobs, load_png(jobs))]
    answers = []
    for ref in refs:
        if isinstance(ref, str):
            answers.append(failed_answer("error", ref))
            continue
        try:
            answers.append(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - a lost call is an error row, tried again next run
            answers.append(failed_answer("error", f"{type(exc).__name__}: gateway call failed"))
    return answers


def finish_queued(ray, gateway, answers: list[dict]) -> list[dict]:
    """Batch mode: the answers of the queued requests, once their batches are done (or `pending`,
    when the run does not wait)."""
    queued = [i for i, a in enumerate(answers) if a["status"] == "queued"]
    if queued:
        ray.get(gateway.flush.remote())
        for i, answer in zip(queued, ray.get([gateway.result.remote(answers[i]["key"]) for i in queued])):
            answers[i] = answer
    return answers


def batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _composite(table: pa.Table, *extra: str) -> pa.ChunkedArray:
    """One string per row from its key columns (and `extra` columns), for set lookups."""
    return pc.binary_join_element_wise(*(table.column(c) for c in (*RESPONSE_KEY, *extra)), "\x1f")


def conform(table: pa.Table, schema: pa.Schema = RESPONSES_SCHEMA) -> pa.Table:
    """`table` in `schema`: a table written before a column existed gets it as nulls."""
    columns = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def collect_rows(folder: RunFolder, jobs: pa.Table) -> pa.Table:
    """For each current job, its best row so far from the previous table and the parts a crash or
    this run left (the first ok row; else the latest attempt), sorted by key; rows of other settings
    (another cache key) are dropped. Columnar, and the rows are copied once: the choice is made on
    row numbers."""
    old = folder.previous("responses")
    sources = [RESPONSES_SCHEMA.empty_table() if old is None else conform(old), folder.read_parts("responses", RESPONSES_SCHEMA)]
    rows = pa.concat_tables(sources)
    current = pc.is_in(_composite(rows, "cache_key"), value_set=_composite(jobs, "cache_key").combine_chunks())
    at = pa.array(np.flatnonzero(current.to_numpy(zero_copy_only=False)), pa.int64())
    ok = pc.equal(rows.column("status").take(at), "ok")
    keys = pa.table({**{c: rows.column(c).take(at) for c in RESPONSE_KEY}, "_ok": ok,
                     "_rank": pc.if_else(ok, at, pc.negate(at))})  # the first ok row, else the latest
    order = pc.sort_indices(keys, sort_keys=[*((c, "ascending") for c in RESPONSE_KEY), ("_ok", "descending"), ("_rank", "ascending")])
    ranked = keys.select(list(RESPONSE_KEY)).take(order)
    ranked = ranked.append_column("_key", _composite(ranked)).append_column("_row", at.take(order))
    best = first_per_key(ranked, "_key").column("_row")
    return rows.take(best).cast(RESPONSES_SCHEMA)


def _done_keys(folder: RunFolder, jobs: pa.Table) -> pa.Array:
    """The composite keys of the jobs that already have an ok row."""
    done = collect_rows(folder, jobs)
    return _composite(done.filter(pc.equal(done.column("status"), "ok"))).combine_chunks()


def response_states(folder: RunFolder) -> dict[str, Counter]:
    """Per subject, its responses by status so far (the table, and the parts of a stage still
    running or stopped), the best row of each response counted once (ok wins, else the latest)."""
    old = conform(folder.read("responses")) if folder.has("responses") else RESPONSES_SCHEMA.empty_table()
    rows = pa.concat_tables([old, folder.read_parts("responses", RESPONSES_SCHEMA)]).select([*RESPONSE_KEY, "status"])
    ok = pc.equal(rows.column("status"), "ok")
    order = pa.array(np.arange(rows.num_rows), pa.int64())
    rows = rows.append_column("_ok", ok).append_column("_rank", pc.negate(order))
    rows = rows.sort_by([*((c, "ascending") for c in RESPONSE_KEY), ("_ok", "descending"), ("_rank", "ascending")])
    best = first_per_key(rows.append_column("_key", _composite(rows)), "_key")
    out: dict[str, Counter] = defaultdict(Counter)
    for r in best.group_by(["subject", "status"]).aggregate([("status", "count")]).to_pylist():
        out[r["subject"]][r["status"]] = r["status_count"]
    return out


# the stage --------------------------------------------------------------------------------------
def run_describe(study: StudyBase, plan: Plan, run: StudyRun) -> pa.Table:
    jobs = plan_jobs(study, plan, run.table("images"))
    done = _done_keys(run.folder, jobs)
    todo = jobs.filter(pc.invert(pc.is_in(_composite(jobs), value_set=done)))  # still in plan order
    if len(done):
        run.reporter.say(f"     responses    {len(done)} of {jobs.num_rows} already done, kept")
    del done
    with run.reporter.track("describe", todo.num_rows) as advance:
        for model in study.models:
            model_jobs = todo.filter(pc.equal(todo.column("subject"), model.name))
            if not model_jobs.num_rows:
                continue
            cls = backend_class(model.backend)
            if cls.remote:
                _describe_remote(study, model, jobs_from(model_jobs, plan), run, advance)
            else:
                _describe_on_ray(study, model, model_jobs, plan, run, advance)
    del todo, model_jobs
    return collect_rows(run.folder, jobs)


def _describe_on_ray(study: StudyBase, model: ModelConfig, jobs: pa.Table, plan: Plan, run: StudyRun, advance) -> None:
    """A local model in its actors; images decoded and masked by loader tasks (none for backends
    that need no images, such as imported files, which read their own file in the actor)."""
    ray, rt = run.ray(), study.runtime
    check_actor_fit(study, ray)
    needs_images = backend_class(model.backend).needs_images
    actor_cls = ray.remote(DescribeActor).options(num_cpus=rt.cpus_per_actor, num_gpus=rt.gpus_per_actor)
    # Loaders reserve no CPU: the actors may hold every CPU there is, and the in-flight cap
    # already bounds how many loads run at once (two per actor).
    loader = ray.remote(load_stimuli).options(num_cpus=0)
    work = (jobs_from(jobs.slice(i, model.batch_size), plan) for i in range(0, jobs.num_rows, model.batch_size))
    call = lambda actor, batch: actor.describe.remote(batch, loader.remote(batch) if needs_images else None)  # noqa: E731
    with run.folder.parts("responses", RESPONSES_SCHEMA, PART_ROWS, PART_S) as parts:
        for done in pool_map(ray, lambda: actor_cls.remote(model), rt.actors_per_model, work, call, in_flight_per_actor=IN_FLIGHT_PER_ACTOR,
                             max_lost=rt.max_restarts, stall_timeout_s=rt.stall_timeout_s, what=f"describe ({model.name})",
                             needs={"CPU": rt.cpus_per_actor, "GPU": rt.gpus_per_actor}):
            # a batch that failed (or whose actors kept dying) is recorded per row, tried again next run
            parts.add(done.value if done.error is None else failed_batch(done.work, done.error))
            advance(len(done.work))


def _describe_remote(study: StudyBase, model: ModelConfig, jobs: list[Job], run: StudyRun, advance) -> None:
    """An API model: Ray tasks encode PNGs and send them to the provider's gateway actor, many at
    once. In batch mode they only submit them; the answers are then collected as batches finish
    (a run that does not wait stops here, with the rows it has, and a later run collects the rest)."""
    from vlm_decade.models.api.session import RemoteSession, stop_if_pending

    ray = run.ray()
    cls = backend_class(model.backend)
    settings = cls.settings(model)
    tasks = max(1, 2 * getattr(study.providers, cls.provider).max_concurrency // REMOTE_BATCH)
    ask = ray.remote(ask_gateway).options(num_cpus=0)
    answers: list[dict] = []
    with RemoteSession(ray, study.providers, run.folder, cls.provider) as session:
        with run.folder.parts("responses", RESPONSES_SCHEMA, FLUSH_ROWS, FLUSH_S, on_save=session.record) as parts:
            submit = lambda batch, _: ask.remote(session.actor, model.model_id, settings, batch, session.batch_for(model.mode))  # noqa: E731
            queued: list[tuple[Job, str]] = []
            for done in bounded(ray, batches(jobs, REMOTE_BATCH), submit, tasks):
                if done.error is not None:
                    parts.add(failed_batch(done.work, done.error))
                    advance(len(done.work))
                    continue
                queued += [(j, a["key"]) for j, a in zip(done.work, done.value) if a["status"] == "queued"]
                ready = [(j, a) for j, a in zip(done.work, done.value) if a["status"] != "queued"]
                answers += [a for _, a in ready]
                parts.add([response_row(j, a) for j, a in ready])
                advance(len(ready))
            if queued:
                ray.get(session.actor.flush.remote())
            collect = lambda item, _: session.actor.result.remote(item[1])  # noqa: E731
            for done in bounded(ray, queued, collect, max(1, len(queued))):
                answer = done.value if done.error is None else failed_answer("error", f"{type(done.error).__name__}: gateway call failed")
                answers.append(answer)
                parts.add([response_row(done.work[0], answer)])
                advance(1)
    skipped = [a["error"] for a in answers if a["status"] == "skipped"]
    stop_if_pending(answers, f"responses of {model.name}")
    if skipped:
        # The stage ends `incomplete`; the stages after it run on the rows that exist and say so.
        run.reporter.say(f"     [yellow]{model.name}: {len(skipped)} requests not sent[/yellow]: {skipped[0]}; the stages "
                         "after this one use the answers that exist, and the next run sends the rest")


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
    return Stage("responses", ("images",), settings | ({"budgets": budgets} if budgets else {}),
                 lambda run: {"responses": run_describe(study, plan, run)})


# estimate ---------------------------------------------------------------------------------------
def estimate(study: StudyBase, plan: Plan, images: pa.Table, cache) -> tuple[list[Line], int, int]:
    """The API models' requests, built exactly as the stage would send them (a request the cache
    answers is counted as cached and free); and how many answers they give, and the answer tokens
    at most, which the embed stage would then encode."""
    from vlm_decade.models.api.providers import ChatRequest, chat_key, cost, provider_class

    api_models = {m.name: m for m in study.models if backend_class(m.backend).remote}
    by_model = defaultdict(list)
    jobs = plan_jobs(study, plan, images)
    for job in jobs_from(jobs.filter(pc.is_in(jobs.column("subject"), pa.array(list(api_models), pa.string()))), plan):
        by_model[job.subject].append(job)
    lines, answer_tokens = [], 0
    n_answers = sum(len(j) for j in by_model.values())
    for name, model_jobs in by_model.items():
        model = api_models[name]
        cls = backend_class(model.backend)
        provider, settings = cls.provider, cls.settings(model)
        price = getattr(study.providers, provider).price(provider, model.model_id)
        line = Line(provider, name, mode=model.mode)
        for job, png in zip(model_jobs, load_png(model_jobs)):
            if isinstance(png, str):
                continue  # an unreadable image is an error row, never a request
            req = ChatRequest(model.model_id, job.prompt, png, settings)
            line.requests += 1
            answer_tokens += settings["max_output_tokens"]
            if cache.has("chat", chat_key(provider, req)):
                line.cached += 1
                continue
            n_in = provider_class(provider).estimate_input(req)
            line.input_tokens += n_in
            line.output_tokens += settings["max_output_tokens"]
            line.usd += cost(price, n_in, settings["max_output_tokens"]) if price else 0.0
            line.usd_low += cost(price, n_in, 0) if price else 0.0
        lines.append(line)
    return lines, n_answers, answer_tokens
