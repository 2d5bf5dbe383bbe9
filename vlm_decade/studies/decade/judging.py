"""The judge_scores stage (Study A): each judge metric's questions about every description, sent
through the gateway actor of its provider or named endpoint like any other request (the same cache, so a re-run buys only
what was not answered, limits and budget; sync or batch), and the metric values they give.

The descriptions judged are those the similarity metrics score (`score.scoring_pairs`): every
model's description of the full image and every member of the human reference groups, each against
the image's gold standard. A rating question is text only; a preference question carries the
image and is asked in both orders (`judges`). The `judge_scores` table is the transcript: per
question its raw answer, the reason and the value read from it (NaN where the answer cannot be
read), and its status; `judge_values` turns it into rows of the `scores` table.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from vlm_decade.core.dispatch import batches, bounded
from vlm_decade.core.errors import Problem
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.models.api.answers import failed_answer, gateway_call_failed
from vlm_decade.models.api.endpoints import APIEntry, api_entry_problems, served_by
from vlm_decade.models.api.providers import ChatRequest, provider_class
from vlm_decade.models.api.providers import judge_settings as api_judge_settings
from vlm_decade.models.backends import backend_class
from vlm_decade.stages.describe.plan import Job
from vlm_decade.stages.describe.remote import REMOTE_BATCH, ask_gateway, finish_queued
from vlm_decade.stats import SCORES_SCHEMA
from vlm_decade.studies.decade import judges
from vlm_decade.studies.decade.config import JudgeMetricConfig, StudyConfig
from vlm_decade.studies.decade.score import scoring_pairs
from vlm_decade.studies.estimate import Line

# Part of the stage's settings: bump it when the prompts or the reading of answers change.
JUDGE_FORMAT = 1
MODEL_ANSWER_TOKENS = 300  # what an estimate counts a local or imported model's description at
FRAMING = 10  # message framing tokens, as the providers' input estimate counts them
JUDGE_SCHEMA = pa.schema(
    [
        ("metric", pa.string()),
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("candidate_key", pa.string()),
        ("order", pa.string()),  # preference: candidate-first | gold-first; rating: ""
        ("answer", pa.string()),
        ("reason", pa.string()),
        ("value", pa.float64()),  # rating: 0-100; preference: 1, 0.5 or 0 for the description; NaN: unreadable
        ("status", pa.string()),
        ("error", pa.string()),
        ("cost_usd", pa.float64()),
    ]
)


def check_judges(study: StudyConfig) -> list[Problem]:
    """Each judge's key, options, endpoint and price, before any work; each endpoint named is asked
    whether it answers and serves its judge's model."""
    entries = [
        APIEntry(("judge_metrics", i), f"model 'judge:{judge.name}'", judge.backend, judge.endpoint, judge.model_id)
        for i, judge in enumerate(study.judge_metrics)
    ]
    return api_entry_problems(study.providers, entries)


def judge_settings(judge: JudgeMetricConfig) -> dict:
    """The generation settings the judge sends: the judges' output cap, unless the model thinks (its
    thinking counts against the cap: it keeps the provider's larger one); a rating sends no image."""
    return api_judge_settings(
        judge.backend,
        judge.model_id,
        judge.options,
        judges.JUDGE_MAX_OUTPUT_TOKENS,
        image=judge.kind != "rating",
        room_to_think=True,
    )


def questions(judge: JudgeMetricConfig, pairs: pa.Table) -> list[dict]:
    """One row per question (the JUDGE_SCHEMA key columns and its `prompt`): each distinct
    (subject, image, description) once, a preference question in both orders."""
    seen, out = set(), []
    for r in pairs.select(["subject", "image_id", "candidate", "gold", "candidate_key"]).to_pylist():
        key = (r["subject"], r["image_id"], r["candidate_key"])
        if key in seen:
            continue
        seen.add(key)
        base = {
            "metric": judge.name,
            "subject": r["subject"],
            "image_id": r["image_id"],
            "candidate_key": r["candidate_key"],
        }
        if judge.kind == "rating":
            out.append({**base, "order": "", "prompt": judges.rating_prompt(r["candidate"], [r["gold"]])})
        else:
            out += [
                {**base, "order": o, "prompt": judges.preference_prompt(r["candidate"], r["gold"], o)}
                for o in judges.ORDERS
            ]
    return out


def read_answer(kind: str, order: str, answer: dict) -> dict:
    """The table's answer columns for one gateway answer: an unreadable answer gets NaN, a failed
    request NaN and its error."""
    value, reason = math.nan, ""
    if answer["status"] == "ok":
        if kind == "rating":
            value, reason = judges.read_rating(answer["text"])
        else:
            verdict, reason = judges.read_preference(answer["text"])
            value = judges.order_value(verdict, order)
    return {
        "answer": answer.get("text", ""),
        "reason": reason,
        "value": value,
        "status": answer["status"],
        "error": answer.get("error", ""),
        "cost_usd": answer.get("cost_usd", 0.0),
    }


def _send(
    run: StudyRun, session, study: StudyConfig, judge: JudgeMetricConfig, prompts: list[str], paths: list[str] | None
) -> list[dict]:
    """One gateway answer per prompt, in order: with its image (`paths`) through Ray tasks that
    encode it, as the probes are sent, or text only from here."""
    from vlm_decade.models.api.session import stop_if_pending

    ray = run.ray()
    settings, batch = judge_settings(judge), session.batch_for(judge.mode)
    tasks = max(1, 2 * study.providers.of(served_by(judge.backend, judge.endpoint)).max_concurrency // REMOTE_BATCH)
    answers: dict[int, dict] = {}
    if paths is not None:
        jobs = [Job(judge.name, "", "full", "", p, path, None, "") for p, path in zip(prompts, paths)]
        ask = ray.remote(ask_gateway).options(num_cpus=0)

        def submit(chunk, _):
            return ask.remote(session.actor, judge.model_id, settings, [jobs[k] for k in chunk], batch)

        work, limit = batches(list(range(len(jobs))), REMOTE_BATCH), tasks
    else:

        def submit(chunk, _):
            req = ChatRequest(judge.model_id, prompts[chunk[0]], settings=settings)
            return session.actor.submit.remote(req, True) if batch else session.actor.chat.remote(req, False)

        work, limit = [[k] for k in range(len(prompts))], len(prompts) if batch else tasks * REMOTE_BATCH
    for done in bounded(ray, work, submit, max(1, limit)):
        if done.error is not None:  # a lost call: its questions failed, asked again next run
            answers.update({k: failed_answer("error", gateway_call_failed(done.error)) for k in done.work})
        else:
            answers.update(zip(done.work, done.value if paths is not None else [done.value]))
    found = finish_queued(ray, session.actor, [answers[k] for k in range(len(prompts))])
    stop_if_pending(found, f"judge metric {judge.name}")
    return found


def judge_table(study: StudyConfig, run: StudyRun) -> pa.Table:
    """Every judge metric's questions and answers (JUDGE_SCHEMA), sorted by their key. A question
    asked twice (two descriptions with one text) is sent once."""
    from vlm_decade.models.api.session import RemoteSession

    images = run.table("images")
    path_of = dict(zip(images.column("image_id").to_pylist(), images.column("path").to_pylist()))
    pairs = scoring_pairs(run.table("references"), run.table("responses"))
    rows = []
    for judge in study.judge_metrics:
        asked = questions(judge, pairs)
        distinct = list(dict.fromkeys((q["image_id"], q["prompt"]) for q in asked))
        if not distinct:
            continue
        paths = [path_of[i] for i, _ in distinct] if judge.kind == "preference" else None
        with (
            RemoteSession(run.ray(), study.providers, run.folder, served_by(judge.backend, judge.endpoint)) as session,
            run.reporter.track(f"judge {judge.name}", len(distinct)) as advance,
        ):
            sent = dict(zip(distinct, _send(run, session, study, judge, [p for _, p in distinct], paths)))
            advance(len(distinct))
        for q in asked:
            rows.append(
                {k: q[k] for k in ("metric", "subject", "image_id", "candidate_key", "order")}
                | read_answer(judge.kind, q["order"], sent[(q["image_id"], q["prompt"])])
            )
    rows.sort(key=lambda r: (r["metric"], r["subject"], r["image_id"], r["candidate_key"], r["order"]))
    return pa.Table.from_pylist(rows, schema=JUDGE_SCHEMA)


def judge_values(study: StudyConfig, table: pa.Table, images: pa.Table) -> pa.Table:
    """The judge metrics' rows of the `scores` table: per description, the rating / 100 or the mean
    of the two orders' preference values (NaN when either is); per (subject, image), the mean over
    its descriptions with a value (a human group's members), NaN when none has one."""
    kinds = {j.name: j.kind for j in study.judge_metrics}
    dataset_of = dict(zip(images.column("image_id").to_pylist(), images.column("dataset").to_pylist()))
    per_text: dict[tuple, list[float]] = {}
    for r in table.to_pylist():
        value = math.nan if r["value"] is None else r["value"]
        per_text.setdefault((r["metric"], r["subject"], r["image_id"], r["candidate_key"]), []).append(value)
    per_pair: dict[tuple, list[float]] = {}
    for (metric, subject, image_id, _), values in per_text.items():
        if kinds.get(metric) == "rating":
            v = values[0] / 100.0
        else:
            v = float(np.mean(values)) if len(values) == len(judges.ORDERS) else math.nan  # NaN when either order is
        per_pair.setdefault((metric, subject, image_id), []).append(v)
    rows = []
    for (metric, subject, image_id), values in sorted(per_pair.items()):
        finite = [v for v in values if not math.isnan(v)]
        rows.append(
            {
                "subject": subject,
                "image_id": image_id,
                "dataset": dataset_of[image_id],
                "variant": "full",
                "metric": metric,
                "value": float(np.mean(finite)) if finite else math.nan,
            }
        )
    return pa.Table.from_pylist(rows, schema=SCORES_SCHEMA)


def estimate(study: StudyConfig, data) -> list[Line]:
    """One line per judge metric, for `vlm-decade estimate`: a question (two for a preference) about
    every model's description and every human group member of each image, the prompt with the gold
    standard and the description (a model's at its `max_output_tokens` cap, a local or imported
    model's at MODEL_ANSWER_TOKENS), a preference with its image, each answer at the judge's cap.
    The low end is nothing: the descriptions decide the questions, and a cached answer is free."""
    from vlm_decade.models.api.providers import cost, text_tokens

    full = [r for r in data.references.to_pylist() if r["condition"] == "full"]
    gold = {r["image_id"]: text_tokens(r["text"]) for r in full if r["role"] == "gold"}
    humans = [
        (r["image_id"], text_tokens(r["text"]))
        for r in full
        if r["role"] in ("top", "bottom") and r["image_id"] in gold
    ]
    answers = [
        backend_class(m.backend).settings(m)["max_output_tokens"]
        if backend_class(m.backend).remote
        else MODEL_ANSWER_TOKENS
        for m in study.models
    ]
    sizes = {r["image_id"]: (r["width"], r["height"]) for r in data.images.to_pylist()}
    lines = []
    for judge in study.judge_metrics:
        settings, asks = judge_settings(judge), len(judges.ORDERS) if judge.kind == "preference" else 1
        template = text_tokens(
            judges.rating_prompt("", [])
            if judge.kind == "rating"
            else judges.preference_prompt("", "", judges.ORDERS[0])
        )
        candidates = [(i, a) for i in gold for a in answers] + humans
        image = {
            i: provider_class(judge.backend).image_tokens_of_size(*sizes[i], settings)
            if judge.kind == "preference"
            else 0
            for i in gold
        }
        provider = served_by(judge.backend, judge.endpoint)
        line = Line(provider, f"judge {judge.name}", mode=judge.mode, model_id=judge.model_id)
        line.requests = asks * len(candidates)
        line.input_tokens = asks * sum(template + FRAMING + gold[i] + n + image[i] for i, n in candidates)
        line.output_tokens = line.requests * settings["max_output_tokens"]
        price = study.providers.of(provider).price(provider, judge.model_id)
        line.usd = cost(price, line.input_tokens, line.output_tokens) if price else 0.0
        lines.append(line)
    return lines


def stage(study: StudyConfig) -> Stage:
    """The `judge_scores` table: the judges' answers about every description."""

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        return {"judge_scores": judge_table(study, run)}

    settings = [[j.fingerprint() for j in study.judge_metrics], JUDGE_FORMAT]
    return Stage("judge_scores", ("images", "references", "responses"), settings, compute)
