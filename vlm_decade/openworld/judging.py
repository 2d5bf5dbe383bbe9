"""Study B's judgements stage: the LI judge on each distinct (label, prediction), once.

A local judge runs in a Ray actor (a GPU per actor where the study gives one); an API judge sends
text-only requests through the provider's gateway, so its answers are cached and paid for once.
The `judgements` table keeps the raw answers: anything but "0"/"1" counts as 0 and stays as evidence.
"""

from __future__ import annotations

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
    ]
)
LOCAL_CHUNK = 256  # prompts per call to the judge actor, so progress shows


def judge_unavailable(study: OpenWorldStudyConfig) -> str | None:
    """Why no judge can run (none configured, weights missing, no key), or None when one can."""
    if study.judge is None:
        return "no judge model is configured (set `judge:` to a local instruct model or an API model)"
    return judge_available(study.judge, study.providers)


def judge_pairs(study: OpenWorldStudyConfig, pairs: list[tuple[str, str]], run, reporter: Reporter, ensure_ray) -> pa.Table:
    prompts = [judge_prompt(label, prediction) for label, prediction in pairs]
    cfg = study.judge
    if cfg.backend == LOCAL_BACKEND:
        ray, rt = ensure_ray(), study.runtime
        actor = ray.remote(LocalJudge).options(num_cpus=rt.cpus_per_actor, num_gpus=rt.gpus_per_actor).remote(cfg)
        answers = []
        try:
            with reporter.track("judge", len(prompts)) as advance:
                for start in range(0, len(prompts), LOCAL_CHUNK):
                    chunk = prompts[start : start + LOCAL_CHUNK]
                    answers += ray.get(actor.judge.remote(chunk))
                    advance(len(chunk))
        finally:
            ray.kill(actor)
    else:
        answers = RemoteJudge(ensure_ray(), study, run, cfg, reporter).judge(prompts)
    rows = [
        {"label": label, "prediction": prediction, "answer": a.text, "valid": judgement_valid(a.text) if a.status == "ok" else False,
         "status": a.status, "error": a.error, "cost_usd": a.cost_usd}
        for (label, prediction), a in zip(pairs, answers)
    ]
    return pa.Table.from_pylist(rows, schema=JUDGEMENTS_SCHEMA)
