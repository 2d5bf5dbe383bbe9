"""The probes stage: targeted questions to API models about the objects of each image.

An API model shows no boxes, so for each relevant object its description leaves out we ask it
(with the image) whether the object is there, then what it is; and for each object it mentions
that no human named, whether that object is there. Questions go through the provider's gateway
actor like any other request: the same cache (a re-run pays for nothing twice), limits and budget.
The `probes` table is the transcript, the evidence of every probe-based label.
"""

from __future__ import annotations

import pyarrow as pa

from ..backends import backend_class
from ..config import ModelConfig, StudyConfig
from ..describe import Job, load_png
from ..progress import Reporter
from . import probes

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
    ]
)


def transcripts(table: pa.Table) -> dict[tuple[str, str], list[tuple[probes.Question, str]]]:
    """(subject, image_id) -> the answered questions, from the `probes` table (failed ones left out)."""
    out: dict[tuple[str, str], list] = {}
    for r in table.to_pylist():
        if r["status"] == "ok":
            question = probes.Question(r["kind"], r["object"], r["anchor"] or None, r["question"])
            out.setdefault((r["subject"], r["image_id"]), []).append((question, r["answer"]))
    return out


def _ask(ray, session, model: ModelConfig, paths: dict[str, str], asks: list[tuple[str, probes.Question]]) -> list[dict]:
    """Send each (image_id, question) with its image; one dict per ask, in order."""
    from ..api.providers import ChatRequest

    settings = backend_class(model.backend).settings(model)
    image_ids = sorted({i for i, _ in asks})
    pngs = dict(zip(image_ids, ray.get(ray.remote(load_png).options(num_cpus=0).remote(
        [Job(model.name, i, "full", "", "", paths[i], None, "") for i in image_ids]
    ))))
    refs = []
    for image_id, question in asks:
        png = pngs[image_id]
        refs.append(None if isinstance(png, str) else session.actor.chat.remote(ChatRequest(model.model_id, question.text, png, settings)))
    answers = []
    for (image_id, _), ref in zip(asks, refs):
        if ref is None:
            answers.append({"text": "", "status": "error", "error": pngs[image_id], "cost_usd": 0.0})
            continue
        try:
            answers.append(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - a lost call is a failed probe, asked again next run
            answers.append({"text": "", "status": "error", "error": f"{type(exc).__name__}: gateway call failed", "cost_usd": 0.0})
    return answers


def run_probes(
    study: StudyConfig,
    images: pa.Table,
    first: dict[tuple[str, str], list[probes.Question]],
    run,
    reporter: Reporter,
    ray,
) -> pa.Table:
    """Ask each API model its first-round questions, then the follow-ups their answers call for."""
    from ..api.session import RemoteSession

    paths = dict(zip(images.column("image_id").to_pylist(), images.column("path").to_pylist()))
    templates = study.taxonomy.probes.templates()
    rows: list[dict] = []
    for model in study.models:
        asks = [(image_id, q) for (subject, image_id), qs in sorted(first.items()) if subject == model.name for q in qs]
        if not asks:
            continue
        with RemoteSession(ray, study, run, backend_class(model.backend).provider) as session, reporter.track(f"probe {model.name}", len(asks)) as advance:
            for round_no in (1, 2):
                answers = _ask(ray, session, model, paths, asks)
                advance(len(asks) if round_no == 1 else 0)
                answered: dict[str, list] = {}
                for (image_id, q), a in zip(asks, answers):
                    rows.append(
                        {"subject": model.name, "image_id": image_id, "round": round_no, "kind": q.kind, "object": q.obj,
                         "anchor": q.anchor or "", "question": q.text, "answer": a["text"], "status": a["status"],
                         "error": a.get("error", ""), "cost_usd": a.get("cost_usd", 0.0)}
                    )
                    if a["status"] == "ok":
                        answered.setdefault(image_id, []).append((q, a["text"]))
                asks = [(i, q) for i, pairs in sorted(answered.items()) for q in probes.second_round(pairs, templates)]
                if not asks:
                    break
    return pa.Table.from_pylist(rows, schema=PROBES_SCHEMA)
