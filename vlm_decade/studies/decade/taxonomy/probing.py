"""The probes stage: targeted questions to API models about the objects of each image.

An API model shows no boxes, so for each relevant object its description leaves out we ask it
(with the image) whether there is an object at the place, then what it is; for each object it
mentions that no independent source finds in the image, the same two questions at the place its
description puts it. A verifier model, when the study has one, is first asked whether each such
mentioned object is there at all. Questions go through the gateway actor of the model's provider
or named endpoint like any other request: the same cache (a re-run buys only what was not
answered), limits and budget.
The `probes` table is the transcript, the evidence of every probe-based label.
"""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.config import ModelConfig
from vlm_decade.core.dispatch import batches, bounded
from vlm_decade.core.errors import Problem
from vlm_decade.core.reuse import INPUTS
from vlm_decade.core.runner import StudyRun
from vlm_decade.models.api.answers import failed_answer, gateway_call_failed
from vlm_decade.models.api.endpoints import APIEntry, api_entry_problems, served_by
from vlm_decade.models.backends import backend_class
from vlm_decade.stages.describe.plan import Job
from vlm_decade.stages.describe.remote import REMOTE_BATCH, ask_gateway, finish_queued
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.decade.taxonomy import probes

# The verifier's questions are rows of the probes table too, under this subject prefix and its model id.
VERIFIER_PREFIX = "verifier:"
PROBES_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("round", pa.int32()),
        ("kind", pa.string()),
        ("object", pa.string()),
        ("anchor", pa.string()),
        ("question", pa.string()),
        ("answer", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("cost_usd", pa.float64()),
        (INPUTS, pa.string()),  # the hash of its image's inputs (`stages.probe_inputs`)
    ]
)


def check_verifier(study: StudyConfig) -> list[Problem]:
    """A verifier model's key, endpoint and price, before any work; its endpoint is asked whether it
    answers and serves the model. (The API models' probes go where their descriptions go: checked
    with the models.)"""
    verifier = study.taxonomy.verifier if study.taxonomy is not None else None
    if verifier is None or verifier.kind != "model":
        return []
    what = f"model '{verifier.as_model().name}'"
    entry = APIEntry(("taxonomy", "verifier"), what, verifier.backend, verifier.endpoint, verifier.model_id)
    return api_entry_problems(study.providers, [entry])


def transcripts(table: pa.Table) -> dict[tuple[str, str], list[tuple[probes.Question, str]]]:
    """(subject, image_id) -> the answered questions, from the `probes` table (failed ones left out)."""
    out: dict[tuple[str, str], list] = {}
    for r in table.to_pylist():
        if r["status"] == "ok":
            question = probes.Question(r["kind"], r["object"], r["anchor"] or None, r["question"])
            out.setdefault((r["subject"], r["image_id"]), []).append((question, r["answer"]))
    return out


def _ask(
    run: StudyRun,
    session,
    model: ModelConfig,
    paths: dict[str, str],
    asks: list[tuple[str, probes.Question]],
    tasks: int,
) -> list[dict]:
    """Send each (image_id, question) with its image; one answer per ask, in order."""
    ray = run.ray()
    settings = backend_class(model.backend).settings(model)
    jobs = [Job(model.name, i, "full", "", q.text, paths[i], None, "") for i, q in asks]
    ask = ray.remote(ask_gateway).options(num_cpus=0)

    def submit(chunk, _):
        return ask.remote(
            session.actor, model.model_id, settings, [jobs[k] for k in chunk], session.batch_for(model.mode)
        )

    answers: dict[int, dict] = {}
    for done in bounded(ray, batches(list(range(len(jobs))), REMOTE_BATCH), submit, tasks):
        if done.error is not None:  # a lost task: its probes failed, asked again next run
            answers.update({k: failed_answer("error", gateway_call_failed(done.error)) for k in done.work})
        else:
            answers.update(zip(done.work, done.value))
    from vlm_decade.models.api.session import stop_if_pending

    found = finish_queued(ray, session.actor, [answers[k] for k in range(len(jobs))])
    stop_if_pending(found, f"probes of {model.name}")
    return found


def run_probes(
    study: StudyConfig, run: StudyRun, verifier_asks: dict[str, list[probes.Question]], first_questions
) -> pa.Table:
    """Ask the verifier model `verifier_asks` (image_id -> presence questions), then each API model
    its first-round questions (`first_questions(verifier answers)`: (subject, image_id) -> questions)
    and the follow-ups their answers call for. A question asked twice about one image (two objects
    near one anchor) is sent once; each of its rows gets the answer."""
    from vlm_decade.models.api.session import RemoteSession

    images = run.table("images")
    paths = dict(zip(images.column("image_id").to_pylist(), images.column("path").to_pylist()))
    templates = study.taxonomy.probes.templates()
    rows: list[dict] = []
    answers: dict[str, dict[str, tuple[str, str]]] = {}  # the verifier's: image_id -> object -> (question, answer)

    def ask_rounds(model: ModelConfig, per_pair: dict[tuple[str, str], list[probes.Question]]) -> None:
        asks = [(image_id, q) for (_, image_id), qs in sorted(per_pair.items()) for q in qs]
        if not asks:
            return
        provider = served_by(backend_class(model.backend).provider, model.endpoint)
        tasks = max(1, 2 * study.providers.of(provider).max_concurrency // REMOTE_BATCH)
        with (
            RemoteSession(run.ray(), study.providers, run.folder, provider) as session,
            run.reporter.track(f"probe {model.name}", len(asks)) as advance,
        ):
            for round_no in (1, 2):
                distinct = list(dict.fromkeys((image_id, q.text) for image_id, q in asks))
                sent = _ask(
                    run,
                    session,
                    model,
                    paths,
                    [(i, probes.Question("detection", "", None, text)) for i, text in distinct],
                    tasks,
                )
                answer_of = dict(zip(distinct, sent))
                advance(len(asks) if round_no == 1 else 0)
                answered: dict[str, list] = {}
                for image_id, q in asks:
                    a = answer_of[(image_id, q.text)]
                    rows.append(
                        {
                            "subject": model.name,
                            "image_id": image_id,
                            "round": round_no,
                            "kind": q.kind,
                            "object": q.obj,
                            "anchor": q.anchor or "",
                            "question": q.text,
                            "answer": a["text"],
                            "status": a["status"],
                            "error": a.get("error", ""),
                            "cost_usd": a.get("cost_usd", 0.0),
                        }
                    )
                    if a["status"] == "ok":
                        answered.setdefault(image_id, []).append((q, a["text"]))
                        if q.kind == "presence":
                            answers.setdefault(image_id, {})[q.obj] = (q.text, a["text"])
                asks = [(i, q) for i, pairs in sorted(answered.items()) for q in probes.second_round(pairs, templates)]
                if not asks:
                    break

    if verifier_asks:
        verifier = study.taxonomy.verifier.as_model()
        ask_rounds(verifier, {(verifier.name, i): qs for i, qs in verifier_asks.items()})
    first = first_questions(answers)
    for model in study.models:
        ask_rounds(model, {key: qs for key, qs in first.items() if key[0] == model.name})
    return pa.Table.from_pylist(rows, schema=PROBES_SCHEMA)
