"""Study B's judgements stage: the LI judge on each distinct (label, prediction), once.

A local judge runs in a Ray actor (a GPU per actor where the study gives one); an API judge sends
text-only requests through the provider's gateway, so its answers are cached and paid for once.
The `judgements` table keeps the raw answers: anything but "0"/"1" counts as 0 and stays as evidence.
Answers the same judge gave before (the previous table, or the parts a killed run saved) are kept,
so adding a model or a prompt judges only the new pairs.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

from ..config import OpenWorldStudyConfig
from ..progress import Reporter
from .judge import LOCAL_BACKEND, LocalJudge, RemoteJudge, judge_available
from .metrics import judge_prompt, judgement_valid

JUDGEMENTS_SCHEMA = pa.schema(
    [
        ("label", pa.string()),
        ("prediction", pa.string()),
        ("answer", pa.string()),
        ("valid", pa.bool_()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("cost_usd", pa.float64()),
        ("judge_key", pa.string()),
    ]
)
LOCAL_CHUNK = 256  # prompts per call to the judge actor, so progress shows


def judge_unavailable(study: OpenWorldStudyConfig) -> str | None:
    """Why no judge can run (none configured, weights missing, no key), or None when one can."""
    if study.judge is None:
        return "no judge model is configured (set `judge:` to a local instruct model or an API model)"
    return judge_available(study.judge, study.providers)


def judge_key(study: OpenWorldStudyConfig) -> str:
    """What decides the judge's answers (not its batch size)."""
    return hashlib.sha256(study.judge.model_dump_json(exclude={"batch_size"}).encode()).hexdigest()[:16]


def _rows(pairs: list[tuple[str, str]], answers, key: str) -> pa.Table:
    rows = [
        {"label": label, "prediction": prediction, "answer": a.text, "valid": judgement_valid(a.text) if a.status == "ok" else False,
         "status": a.status, "error": a.error, "cost_usd": a.cost_usd, "judge_key": key}
        for (label, prediction), a in zip(pairs, answers)
    ]
    return pa.Table.from_pylist(rows, schema=JUDGEMENTS_SCHEMA)


def _done(run, key: str) -> dict[tuple[str, str], dict]:
    """Answers this judge already gave, from the previous table and the parts of a killed run."""
    old = run.read("judgements") if run.has("judgements") else JUDGEMENTS_SCHEMA.empty_table()
    if "judge_key" not in old.column_names:
        old = JUDGEMENTS_SCHEMA.empty_table()
    rows = pa.concat_tables([old.cast(JUDGEMENTS_SCHEMA), run.read_parts("judgements", JUDGEMENTS_SCHEMA)]).to_pylist()
    return {(r["label"], r["prediction"]): r for r in rows if r["judge_key"] == key and r["status"] == "ok"}


def judge_pairs(study: OpenWorldStudyConfig, pairs: list[tuple[str, str]], run, reporter: Reporter, ensure_ray) -> pa.Table:
    cfg, key = study.judge, judge_key(study)
    done = _done(run, key)
    todo = [p for p in pairs if p not in done]
    if done:
        reporter.say(f"     judgements   {len(pairs) - len(todo)} of {len(pairs)} already judged, kept")
    if todo and cfg.backend == LOCAL_BACKEND:
        ray, rt = ensure_ray(), study.runtime
        actor = ray.remote(LocalJudge).options(num_cpus=rt.cpus_per_actor, num_gpus=rt.gpus_per_actor).remote(cfg)
        try:
            with reporter.track("judge", len(todo)) as advance:
                for start in range(0, len(todo), LOCAL_CHUNK):
                    chunk = todo[start : start + LOCAL_CHUNK]
                    answers = ray.get(actor.judge.remote([judge_prompt(label, prediction) for label, prediction in chunk]))
                    run.append_part("judgements", _rows(chunk, answers, key))
                    advance(len(chunk))
        finally:
            ray.kill(actor)
    elif todo:  # the gateway's cache keeps every answer paid for, so a killed run loses none
        answers = RemoteJudge(ensure_ray(), study, run, cfg, reporter).judge([judge_prompt(l, p) for l, p in todo])
        run.append_part("judgements", _rows(todo, answers, key))
    latest = {(r["label"], r["prediction"]): r for r in run.read_parts("judgements", JUDGEMENTS_SCHEMA).to_pylist() if r["judge_key"] == key}
    rows = [latest.get(p) or done[p] for p in pairs]
    return pa.Table.from_pylist(rows, schema=JUDGEMENTS_SCHEMA)
