"""The describe stage: every model describes every image variant, into the `responses` table.

Local models run in Ray actors that load the model once (`num_gpus` per actor where there are GPUs);
images are decoded and masked by Ray tasks on CPU workers and handed to the actors, with at most
two batches in flight per actor, so memory stays flat whatever the number of images. Each finished
batch is saved as a part at once, so a killed run keeps it; rows whose `cache_key` (model, prompt,
image bytes, mask geometry) is already done are never described again.

API models (`remote` backends) do not sit in that actor pool: loader tasks encode their stimuli as
PNG bytes and the requests go to the provider's gateway actor (`vlm_decade.api`) with many in
flight; finished rows are saved as parts every few seconds, and every answer paid for is in the
API cache at once, so a killed run pays for nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from .backends import Backend, Description, Stimulus, backend_class
from .config import AnyStudy, ModelConfig, StudyConfig
from .errors import InputError, Problem
from .masks import MaskSpec, mask_specs
from .progress import Reporter
from .runfolder import RunFolder

RESPONSES_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("variant", pa.string()),
        ("prompt_id", pa.string()),
        ("text", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("latency_s", pa.float64()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("model_version", pa.string()),
        ("cache_key", pa.string()),
    ]
)
RESPONSE_KEY = ("subject", "image_id", "variant", "prompt_id")
IN_FLIGHT_PER_ACTOR = 2
REMOTE_LOAD_BATCH = 8  # stimuli one loader task encodes for an API model
FLUSH_ROWS, FLUSH_S = 32, 2.0  # save API rows as a part this often


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


def model_prompts(model: ModelConfig, study: AnyStudy) -> list[tuple[str, str]]:
    """The (prompt id, prompt) pairs a model answers. Study A: the model's prompt or the study's,
    with a short hash as id (a reworded prompt is a new row). Study B: every prompt of the study,
    by its id; a closed-world baseline answers once, under the first (its prompt is not used)."""
    if isinstance(study, StudyConfig):
        prompt = model.prompt or study.prompt
        return [("p-" + hashlib.sha256(prompt.encode()).hexdigest()[:10], prompt)]
    prompts = study.prompts[:1] if backend_class(model.backend).closed_world else study.prompts
    return [(p.id, p.text) for p in prompts]


def study_masks(study: AnyStudy) -> list[MaskSpec]:
    """The masked variants a study describes (Study B has none)."""
    return mask_specs(study.masks) if isinstance(study, StudyConfig) else []


def model_fingerprint(model: ModelConfig) -> dict:
    return backend_class(model.backend).fingerprint(model)


def plan_jobs(study: AnyStudy, images: pa.Table, classnames: dict[str, tuple[str, ...]] | None = None) -> list[Job]:
    """Every response to produce; `classnames` (dataset -> class names) feed closed-world models."""
    specs = {s.mask_id: s for s in study_masks(study)}
    rows = images.select(["image_id", "dataset", "path", "sha256"]).to_pylist()
    jobs = []
    for model in study.models:
        variants = ["full"] + (list(specs) if model.variants == "all" else [])
        settings = model_fingerprint(model)
        closed = backend_class(model.backend).closed_world
        for prompt_id, prompt in model_prompts(model, study):
            for row in rows:
                classes = tuple((classnames or {}).get(row["dataset"], ())) if closed else ()
                for variant in variants:
                    mask = specs.get(variant)
                    payload = {"model": settings, "prompt": prompt, "image": row["sha256"], "mask": asdict(mask) if mask else None}
                    if closed:
                        payload["classes"] = list(classes)
                    key = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
                    jobs.append(Job(model.name, row["image_id"], variant, prompt_id, prompt, row["path"], mask, key, classes))
    return jobs


def load_stimuli(jobs: list[Job]) -> list[Stimulus | str]:
    """Decode and mask images; a file that fails here becomes an error string for its row only."""
    from PIL import Image

    from .masks import apply_mask

    out: list[Stimulus | str] = []
    for job in jobs:
        try:
            with Image.open(job.path) as im:
                rgb = np.asarray(im.convert("RGB"))
            image = apply_mask(rgb, job.mask) if job.mask else rgb
            out.append(Stimulus(job.image_id, job.variant, image, job.prompt, job.classes))
        except Exception as exc:  # noqa: BLE001 - recorded per row; the run goes on
            out.append(f"could not read image {job.path}: {exc}")
    return out


def load_png(jobs: list[Job]) -> list[bytes | str]:
    """Each job's stimulus as the PNG bytes an API model is sent, or an error string for its row."""
    import io

    from PIL import Image

    out: list[bytes | str] = []
    for stim in load_stimuli(jobs):
        if isinstance(stim, str):
            out.append(stim)
            continue
        buf = io.BytesIO()
        Image.fromarray(stim.image).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def describe_batch(backend: Backend | None, jobs: list[Job], stimuli: list[Stimulus | str]) -> list[dict]:
    ready = [s for s in stimuli if isinstance(s, Stimulus)]
    start = time.perf_counter()
    try:
        answers = iter(backend.describe(ready)) if ready else iter(())
    except Exception as exc:  # noqa: BLE001 - a batch that fails is recorded, not fatal
        answers = iter([Description("", "error", f"{type(exc).__name__}: {exc}")] * len(ready))
    latency = (time.perf_counter() - start) / max(len(ready), 1)
    rows = []
    for job, stim in zip(jobs, stimuli):
        answer = next(answers) if isinstance(stim, Stimulus) else Description("", "error", stim)
        rows.append(
            {
                "subject": job.subject,
                "image_id": job.image_id,
                "variant": job.variant,
                "prompt_id": job.prompt_id,
                "text": answer.text,
                "status": answer.status,
                "error": answer.error,
                "latency_s": latency if isinstance(stim, Stimulus) else 0.0,
                "input_tokens": None,
                "output_tokens": None,
                "cost_usd": 0.0,
                "model_version": answer.model_version,
                "cache_key": job.cache_key,
            }
        )
    return rows


class DescribeActor:
    """Holds one model for the life of the actor; describes batches of decoded stimuli."""

    def __init__(self, model: ModelConfig):
        self.backend = backend_class(model.backend)(model)

    def describe(self, jobs: list[Job], stimuli: list[Stimulus | str]) -> list[dict]:
        return describe_batch(self.backend, jobs, stimuli)


def _batches(jobs: list[Job], size: int) -> list[list[Job]]:
    return [jobs[i : i + size] for i in range(0, len(jobs), size)]


def _key(row) -> tuple:
    return tuple(row[k] for k in RESPONSE_KEY)


def collect_rows(run: RunFolder, jobs: list[Job]) -> dict[tuple, dict]:
    """For each current job, its best row so far (ok over error, later over earlier) from the
    previous table and the parts a crash or this run left; rows of other settings are dropped."""
    wanted = {(j.subject, j.image_id, j.variant, j.prompt_id): j.cache_key for j in jobs}
    old = run.read("responses").cast(RESPONSES_SCHEMA) if run.has("responses") else RESPONSES_SCHEMA.empty_table()
    best: dict[tuple, dict] = {}
    for table in (old, run.read_parts("responses", RESPONSES_SCHEMA)):
        for row in table.to_pylist():
            key = _key(row)
            if wanted.get(key) == row["cache_key"] and best.get(key, {}).get("status") != "ok":
                best[key] = row
    return best


def run_describe(
    study: AnyStudy, images: pa.Table, run: RunFolder, reporter: Reporter, ensure_ray, classnames: dict[str, tuple[str, ...]] | None = None
) -> pa.Table:
    jobs = plan_jobs(study, images, classnames)
    done = {k for k, row in collect_rows(run, jobs).items() if row["status"] == "ok"}
    todo = [j for j in jobs if (j.subject, j.image_id, j.variant, j.prompt_id) not in done]
    if done:
        reporter.say(f"     responses    {len(done)} of {len(jobs)} already done, kept")
    with reporter.track("describe", len(todo)) as advance:
        for model in study.models:
            model_jobs = [j for j in todo if j.subject == model.name]
            if not model_jobs:
                continue
            if backend_class(model.backend).remote:
                _describe_remote(study, model, model_jobs, run, advance, ensure_ray(), reporter)
                continue
            if backend_class(model.backend).needs_images:
                _describe_on_ray(study, model, model_jobs, run, advance, ensure_ray())
                continue
            backend = backend_class(model.backend)(model)
            for batch in _batches(model_jobs, model.batch_size):
                stimuli = [Stimulus(j.image_id, j.variant, np.empty(0, np.uint8), j.prompt, j.classes) for j in batch]
                run.append_part("responses", pa.Table.from_pylist(describe_batch(backend, batch, stimuli), schema=RESPONSES_SCHEMA))
                advance(len(batch))
    rows = sorted(collect_rows(run, jobs).values(), key=_key)
    return pa.Table.from_pylist(rows, schema=RESPONSES_SCHEMA)


def check_actor_fit(study: AnyStudy, ray) -> None:
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


def _describe_on_ray(study: AnyStudy, model: ModelConfig, jobs: list[Job], run: RunFolder, advance, ray) -> None:
    rt = study.runtime
    check_actor_fit(study, ray)
    actor_cls = ray.remote(DescribeActor).options(
        num_cpus=rt.cpus_per_actor, num_gpus=rt.gpus_per_actor, max_restarts=1, max_task_retries=1
    )
    # Loaders reserve no CPU: the actors may hold every CPU there is, and the in-flight cap below
    # already bounds how many loads run at once (two per actor).
    loader = ray.remote(load_stimuli).options(num_cpus=0)
    actors = [actor_cls.remote(model) for _ in range(rt.actors_per_model)]
    queue = iter(_batches(jobs, model.batch_size))
    pending: dict = {}

    def submit(actor) -> None:
        batch = next(queue, None)
        if batch is not None:
            pending[actor.describe.remote(batch, loader.remote(batch))] = (actor, batch)

    for actor in actors:
        for _ in range(IN_FLIGHT_PER_ACTOR):
            submit(actor)
    try:
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            actor, batch = pending.pop(ref)
            try:
                rows = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - a lost actor or batch is recorded per row
                rows = describe_batch_failed(batch, exc)
            run.append_part("responses", pa.Table.from_pylist(rows, schema=RESPONSES_SCHEMA))
            advance(len(batch))
            submit(actor)
    finally:
        for actor in actors:
            ray.kill(actor)


def describe_batch_failed(batch: list[Job], exc: Exception) -> list[dict]:
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return describe_batch(None, batch, [f"{type(exc).__name__}: {first_line}"] * len(batch))


def _job_row(job: Job, answer: dict) -> dict:
    fields = ("text", "status", "error", "latency_s", "input_tokens", "output_tokens", "cost_usd", "model_version")
    return {
        "subject": job.subject,
        "image_id": job.image_id,
        "variant": job.variant,
        "prompt_id": job.prompt_id,
        **{k: answer[k] for k in fields},
        "cache_key": job.cache_key,
    }


def _error_answer(status: str, error: str) -> dict:
    return {"text": "", "status": status, "error": error, "latency_s": 0.0, "input_tokens": None,
            "output_tokens": None, "cost_usd": 0.0, "model_version": ""}


def _describe_remote(study: AnyStudy, model: ModelConfig, jobs: list[Job], run: RunFolder, advance, ray, reporter: Reporter) -> None:
    """An API model: loaders encode PNGs, the provider's gateway actor takes many requests at once."""
    from .api.providers import ChatRequest
    from .api.session import RemoteSession

    cls = backend_class(model.backend)
    settings = cls.settings(model)
    in_flight = 2 * getattr(study.providers, cls.provider).max_concurrency
    loader = ray.remote(load_png).options(num_cpus=0)
    queue = iter(_batches(jobs, REMOTE_LOAD_BATCH))
    loads: dict = {}
    calls: dict = {}
    rows: list[dict] = []
    skipped: list[str] = []
    with RemoteSession(ray, study, run, cls.provider) as session:

        def refill() -> None:
            while len(loads) < 2 and len(calls) + len(loads) * REMOTE_LOAD_BATCH < in_flight:
                batch = next(queue, None)
                if batch is None:
                    return
                loads[loader.remote(batch)] = batch

        def flush() -> None:
            run.append_part("responses", pa.Table.from_pylist(rows, schema=RESPONSES_SCHEMA))
            advance(len(rows))
            session.record()
            rows.clear()

        refill()
        last = time.monotonic()
        while loads or calls:
            ready, _ = ray.wait(list(loads) + list(calls), num_returns=1, timeout=FLUSH_S)
            for ref in ready:
                if ref in loads:
                    batch = loads.pop(ref)
                    try:
                        pngs = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - a lost loader fails its rows only
                        pngs = [f"{type(exc).__name__}: could not load"] * len(batch)
                    for job, png in zip(batch, pngs):
                        if isinstance(png, str):
                            rows.append(_job_row(job, _error_answer("error", png)))
                        else:
                            calls[session.actor.chat.remote(ChatRequest(model.model_id, job.prompt, png, settings))] = job
                else:
                    job = calls.pop(ref)
                    try:
                        answer = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - a lost call is an error row, tried again next run
                        answer = _error_answer("error", f"{type(exc).__name__}: gateway call failed")
                    if answer["status"] == "skipped":
                        skipped.append(answer["error"])
                    rows.append(_job_row(job, answer))
            refill()
            if rows and (len(rows) >= FLUSH_ROWS or time.monotonic() - last >= FLUSH_S or not (loads or calls)):
                flush()
                last = time.monotonic()
    if skipped:
        reporter.say(f"     {model.name}: {len(skipped)} requests not sent: {skipped[0]}")
