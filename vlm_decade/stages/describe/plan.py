"""What the describe stage is asked to do, checked before any work: the study's `Plan` (each model's
prompts, the masked variants, the class lists of closed-world baselines), the checks of its models,
every response to produce as a table of jobs with its cache key, and each job's stimulus as a local
model sees it (decoded and masked) or as an API model is sent it (PNG bytes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import json_strings, sha256_hex
from vlm_decade.core.config import ModelConfig, RuntimeConfig, StudyBase, field_path
from vlm_decade.core.errors import STUDY_FILE, InputError, Problem
from vlm_decade.core.runtime import gpus_available
from vlm_decade.imaging.masks import MaskSpec
from vlm_decade.models.api.endpoints import APIEntry, api_entry_problems
from vlm_decade.models.backends import Stimulus, backend_class
from vlm_decade.models.encoders import text_keys
from vlm_decade.models.routing import api_provider
from vlm_decade.stages.describe.keyed import KeyInputs, key_rows


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
    background: str | None = None  # what a transparent image is composited onto; None: it is opaque


# checks -----------------------------------------------------------------------------------------
def _within(entry: tuple, problem: Problem) -> Problem:
    """A backend's problem with the study file names the field inside its entry (`options.file`);
    located here, where the entry's place in the file is known (`models[1].options.file`)."""
    if problem.file != STUDY_FILE or problem.field is None:
        return problem
    return replace(problem, field=field_path((*entry, *problem.field.split("."))))


def check_models(study: StudyBase, image_ids: set[str] | pa.ChunkedArray | None, variants: list[str]) -> list[Problem]:
    """What each model's backend `check` finds before any work (weights, files), a key, endpoint
    and price for every API model (`api_entry_problems`), and GPUs for the local ones' actors
    (`gpu_problems`). Checks that need the images wait until the
    data could be read (`image_ids`, a set or a column of them; None: it could not). Every backend is
    known: `load_study` said which is not (`studies.backend_problems`)."""
    problems, entries = [], []
    for i, model in enumerate(study.models):
        cls = backend_class(model.backend)
        if image_ids is not None or not cls.needs_images:
            problems += [_within(("models", i), p) for p in cls.check(model, image_ids or set(), variants)]
        provider = api_provider(model.backend)
        for own in ("mode", "endpoint"):
            if getattr(model, own) is not None and not provider:
                problems.append(
                    Problem(
                        STUDY_FILE,
                        f"`{own}` is for API models; {model.backend} runs here",
                        field=field_path(("models", i, own)),
                    )
                )
        if provider:
            entries.append(APIEntry(("models", i), f"model '{model.name}'", provider, model.endpoint, model.model_id))
    return problems + api_entry_problems(study.providers, entries) + gpu_problems(study)


def api_budgets(study: StudyBase) -> dict[str, float | None]:
    """Budgets of the providers a study's models use: part of the stage's settings, so a run with a
    higher budget takes up the rows an earlier budget skipped."""
    used = {p for m in study.models if (p := api_provider(m.backend, m.endpoint))}
    return {p: study.providers.of(p).budget_usd for p in sorted(used)}


def model_fingerprint(model: ModelConfig) -> dict:
    return backend_class(model.backend).fingerprint(model)


def fit_problems(rt: RuntimeConfig, have: dict[str, float], where: str = "this Ray has") -> list[Problem]:
    """Each resource of `have` (CPU, GPU -> amount there is) that a model's actors ask more of than
    there is, naming its field: actors that cannot all be placed would wait forever in silence."""
    problems = []
    for resource, each in (("CPU", rt.cpus_per_actor), ("GPU", rt.gpus_per_actor)):
        need = each * rt.actors_per_model
        if resource in have and need > have[resource]:
            problems.append(
                Problem(
                    STUDY_FILE,
                    f"{rt.actors_per_model} actors x {each:g} {resource} = {need:g} {resource}, but {where} "
                    f"{have[resource]:g}; lower actors_per_model or {resource.lower()}s_per_actor",
                    field=field_path(("runtime", f"{resource.lower()}s_per_actor")),
                )
            )
    return problems


def gpu_problems(study: StudyBase) -> list[Problem]:
    """A study whose local models' actors ask for more GPUs than there are, found before any work
    (`validate`): on a machine without them, or fewer than the actors need (`gpus_available`)."""
    rt = study.runtime
    local = [m for m in study.models if not (c := backend_class(m.backend)).remote and not c.looks_up]
    found = gpus_available(rt) if local and rt.gpus_per_actor > 0 else None
    return [] if found is None else fit_problems(rt, {"GPU": found[0]}, found[1])


def check_actor_fit(study: StudyBase, ray) -> None:
    """On a local Ray, actors that ask for more than the machine has would wait forever in silence."""
    if study.runtime.address:
        return  # a cluster may autoscale to fit
    have = ray.cluster_resources()
    problems = fit_problems(study.runtime, {r: have.get(r, 0) for r in ("CPU", "GPU")})
    if problems:
        raise InputError(problems)


# jobs -------------------------------------------------------------------------------------------
# `image`: the job's row of the images table, where its dataset, file and background are (not a
# copy of them per job: the table has a row per response).
JOB_COLUMNS = (*("subject", "image_id", "variant", "prompt_id"), "image", "cache_key")


PLAN_IMAGES = 65_536  # images planned at a time: their jobs become columns before the next are read


def plan_jobs(study: StudyBase, plan: Plan, images: pa.Table, models: list[ModelConfig] | None = None) -> pa.Table:
    """Every response to produce (of the study's `models`, by default all), as a table (one row per
    job, in plan order: model, prompt, image, variant) with its cache key: `planned_slices` as
    chunks of one table (never copied into one); `jobs_from` turns a slice of it, with `images`,
    into `Job`s."""
    chunks = [jobs for jobs, _ in planned_slices(study, plan, images, models)]
    if not chunks:
        return pa.table({c: pa.array([], pa.int32() if c == "image" else pa.string()) for c in JOB_COLUMNS})
    return pa.concat_tables(chunks)


def planned_slices(
    study: StudyBase,
    plan: Plan,
    images: pa.Table,
    models: list[ModelConfig] | None = None,
    keyed: KeyInputs | None = None,
    kept_keys: Callable[[pa.Table], pa.Array] | None = None,
):
    """`plan_jobs`' table a slice of `PLAN_IMAGES` images (of one model and prompt) at a time, in plan
    order, so that a study of any size holds no Python object per job, and a caller that puts each
    slice aside holds no more than one; each slice with the jobs whose key was `kept` (a mask; None:
    none). With `keyed` (what the previous `responses` table's keys were made from) and `kept_keys`
    (`RowsSoFar.kept_keys` of that table's rows), a job whose model and image are as they were then
    has its row's key, if that row is ok (and holds the file's answer): its key is not made again,
    and the job is done."""
    rows = key_rows(images)
    unchanged = keyed.unchanged(rows) if keyed is not None and kept_keys is not None else None
    for model in study.models if models is None else models:
        backend = backend_class(model.backend)
        settings, answers = backend.key_settings(model), backend.answers(model)  # once per model: a file is read once
        as_before = unchanged is not None and keyed.contexts.get(model.name) == key_context(plan, model, settings)
        for prompt_id, prompt in plan.prompts[model.name]:
            keys = KeyTemplate(settings, prompt)
            for start in range(0, rows.num_rows, PLAN_IMAGES):
                reuse = (unchanged[start : start + PLAN_IMAGES], kept_keys) if as_before else None
                yield _plan_slice(plan, model, keys, answers, prompt_id, rows, start, reuse)


def key_context(plan: Plan, model: ModelConfig, settings: dict) -> str:
    """The constant part of a model's jobs' cache keys (`settings`: its backend's `key_settings`), as
    one string: each prompt id's `KeyTemplate.tail`, each variant's mask and, for a closed-world
    model, each dataset's class names. Two runs whose model has the same context key the jobs of an
    image that is as it was alike, but for a file's answers (`KeyInputs`)."""
    tails = [[prompt_id, KeyTemplate(settings, prompt).tail] for prompt_id, prompt in plan.prompts[model.name]]
    masks = dict(zip(plan.variants(model), _masks(plan, model)))
    closed = plan.closed.get(model.name, False)
    classes = {d: list(c) for d, c in sorted(plan.classnames.items())} if closed else None
    return json.dumps({"tails": tails, "masks": masks, "classes": classes}, sort_keys=True)


def key_contexts(study: StudyBase, plan: Plan) -> dict[str, str]:
    """Each of the study's models' `key_context`."""
    return {m.name: key_context(plan, m, backend_class(m.backend).key_settings(m)) for m in study.models}


def _masks(plan: Plan, model: ModelConfig) -> list[str]:
    """Each of the model's variants' mask as its part of a cache key (`json.dumps(mask, sort_keys=True)`)."""
    specs = {s.mask_id: s for s in plan.masks}
    return [json.dumps(asdict(specs[name]) if name in specs else None, sort_keys=True) for name in plan.variants(model)]


def _plan_slice(
    plan: Plan,
    model: ModelConfig,
    keys: KeyTemplate,
    answers,
    prompt_id: str,
    images: pa.Table,
    start: int,
    reuse: tuple[np.ndarray, Callable[[pa.Table], pa.Array]] | None = None,
) -> tuple[pa.Table, np.ndarray | None]:
    """The jobs of one model and prompt over `PLAN_IMAGES` images (`key_rows`) from row `start`
    (`plan_jobs`' columns), and which kept their key (None: none); `answers`: the model's
    backend's. `reuse`: per image of the slice, whether it is as the previous table's keys were
    made from it, and `kept_keys`."""
    variants = plan.variants(model)
    masks = _masks(plan, model)  # once, not once per job
    n = len(variants)
    rows = images.slice(start, PLAN_IMAGES)
    of_slice = np.repeat(np.arange(rows.num_rows, dtype=np.int32), n)  # each image once per variant
    within, image = pa.array(of_slice), pa.array(of_slice + np.int32(start))  # its row of the slice, of `images`
    image_ids = rows.column("image_id").combine_chunks().take(within)
    variant = pa.array(variants * rows.num_rows, pa.string())
    texts = answers(image_ids, variant, prompt_id) if answers else None
    size = len(image_ids)
    jobs = pa.table(
        {
            "subject": pa.repeat(pa.scalar(model.name, pa.string()), size),
            "image_id": image_ids,
            "variant": variant,
            "prompt_id": pa.repeat(pa.scalar(prompt_id, pa.string()), size),
            "image": image,
        }
    )
    inputs = {"at": within, "masks": pa.array(masks * rows.num_rows, pa.string()), "classes": None, "answers": texts}
    if plan.closed.get(model.name, False):  # the dataset's class names, given to closed-world models only
        datasets = pc.dictionary_encode(rows.column("dataset").combine_chunks().take(within))
        listed = [json.dumps(list(plan.classnames.get(d, ()))) for d in datasets.dictionary.to_pylist()]
        inputs["classes"] = pa.array(listed, pa.string()).take(datasets.indices)
    asked, kept = None, None  # the jobs whose rows were asked for their keys, and the keys found (null: none)
    if reuse is not None:
        candidate = np.repeat(reuse[0], n)
        if texts is not None:
            candidate &= pc.is_valid(texts).to_numpy(zero_copy_only=False)
        if candidate.any():
            asked = pa.array(np.flatnonzero(candidate))
            questions = jobs.select(["subject", "image_id", "variant", "prompt_id"]).take(asked)
            kept = reuse[1](questions if texts is None else questions.append_column("text", texts.take(asked)))
    if kept is None or kept.null_count == len(kept):  # every key made
        made = keys.keys(images=rows.column("sha256"), backgrounds=rows.column("background"), **_answer_keys(inputs))
        return jobs.append_column("cache_key", made), None
    found = np.zeros(size, bool)
    found[asked.filter(pc.is_valid(kept)).to_numpy()] = True
    todo = pa.array(np.flatnonzero(~found))
    made = keys.keys(
        images=rows.column("sha256"),
        backgrounds=rows.column("background"),
        **_answer_keys({k: v if v is None else v.take(todo) for k, v in inputs.items()}),
    )
    # the keys made, then those kept, each put back in its job's place
    place = np.empty(size, np.int64)
    place[~found] = np.arange(len(todo))
    place[found] = len(todo) + np.arange(int(found.sum()))
    return jobs.append_column("cache_key", pa.concat_arrays([made, kept.drop_null()]).take(pa.array(place))), found


def _answer_keys(inputs: dict) -> dict:
    """`KeyTemplate.keys`' arguments from a slice's: each answer as its `text_key`."""
    answers = inputs["answers"]
    return inputs | {"answers": None if answers is None else text_keys(answers)}


class KeyTemplate:
    """Cache keys of one model's and prompt's jobs: the sha256 of the job's payload as
    `json.dumps(payload, sort_keys=True)` writes it, put together on the columns of the jobs, in the
    sorted order of the payload's keys (answer, background, classes, image, mask, model, prompt),
    the constant parts serialised once, for the millions of jobs of a large study."""

    def __init__(self, settings: dict, prompt: str):
        self.tail = ', "model": ' + json.dumps(settings, sort_keys=True) + ', "prompt": ' + json.dumps(prompt) + "}"

    def keys(
        self,
        at: pa.Array,
        images: pa.Array | pa.ChunkedArray,
        backgrounds: pa.Array | pa.ChunkedArray,
        masks: pa.Array,
        classes: pa.Array | None = None,
        answers: pa.Array | None = None,
    ) -> pa.Array:
        """One key per job, `at` its image's row of `images` (the images' sha256) and `backgrounds`
        (null: an opaque image, whose key is what it always was); and per job, its mask's JSON
        (`json.dumps(mask, sort_keys=True)`), its class names' JSON (None: an open-world model's
        jobs have none) and its answer's key (None: not a file's rows; null: the file has no row
        for it). An image's part of the payload is put together once for all its jobs."""
        parts: list = []
        if answers is not None:
            parts += ['"answer": ', json_strings(answers), ", "]
        if backgrounds.null_count < len(backgrounds):
            named = pc.binary_join_element_wise('"background": ', json_strings(backgrounds), ", ", "")
            parts.append(pc.if_else(pc.is_null(backgrounds), "", named).take(at))
        if classes is not None:
            parts += ['"classes": ', classes, ", "]
        image = pc.binary_join_element_wise('"image": ', json_strings(images), ', "mask": ', "")
        parts += [image.take(at), masks, self.tail]
        return sha256_hex(pc.binary_join_element_wise("{", *parts, ""))


def jobs_from(table: pa.Table, plan: Plan, images: pa.Table) -> list[Job]:
    """The `Job`s of some rows of `plan_jobs`' table over `images`."""
    specs = {s.mask_id: s for s in plan.masks}
    prompts = {(subject, pid): text for subject, pairs in plan.prompts.items() for pid, text in pairs}
    at = table.column("image")
    datasets, paths = (images.column(c).take(at).to_pylist() for c in ("dataset", "path"))
    # an images table written before transparency was recorded has every image opaque
    opaque = "background" not in images.column_names
    backgrounds = [None] * table.num_rows if opaque else images.column("background").take(at).to_pylist()
    return [
        Job(
            r["subject"],
            r["image_id"],
            r["variant"],
            r["prompt_id"],
            prompts[(r["subject"], r["prompt_id"])],
            path,
            specs.get(r["variant"]),
            r["cache_key"],
            tuple(plan.classnames.get(dataset, ())) if plan.closed.get(r["subject"]) else (),
            background,
        )
        for r, dataset, path, background in zip(table.to_pylist(), datasets, paths, backgrounds)
    ]


# stimuli ----------------------------------------------------------------------------------------
def load_stimuli(jobs: list[Job]) -> list[Stimulus | str]:
    """Decode and mask images; a file that fails here becomes an error string for its row only."""
    from vlm_decade.imaging.decode import WHITE, load_rgb
    from vlm_decade.imaging.masks import apply_mask

    out: list[Stimulus | str] = []
    for job in jobs:
        try:
            rgb, _ = load_rgb(job.path, job.background or WHITE)
            image = apply_mask(rgb, job.mask) if job.mask else rgb
            out.append(Stimulus(job.image_id, job.variant, image, job.prompt, job.classes, job.prompt_id))
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
