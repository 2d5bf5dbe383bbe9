"""Study B's judgements stage: the LI judge on each distinct (label, prediction), once, and once more
with the label's accepted alternatives where it has some (`LI_accepted`).

A local judge runs in a Ray actor (a GPU per actor where the study gives one); an API judge sends
text-only requests through the provider's gateway, so its answers are cached and paid for once.
The `judgements` table keeps the raw answers: anything but "0"/"1" counts as 0 and stays as evidence.
Answers the same judge gave before (the previous table, or the parts a killed run saved) are kept,
so adding a model or a prompt judges only the new pairs.
"""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.dispatch import batches, bounded
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.models.api.endpoints import served_by
from vlm_decade.models.backends import backend_class
from vlm_decade.studies.estimate import Line
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.judge import LOCAL_BACKEND, LocalJudge, RemoteJudge, judge_available, judge_settings
from vlm_decade.studies.openworld.metrics import judge_prompt, judgement_valid
from vlm_decade.studies.openworld.scoring import answered, judgement_key

JUDGEMENTS_SCHEMA = pa.schema(
    [
        ("label", pa.string()),
        ("prediction", pa.string()),
        ("accepted", pa.list_(pa.string())),  # the alternatives named in the question; empty: the paper's
        ("answer", pa.string()),
        ("valid", pa.bool_()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("cost_usd", pa.float64()),
        ("judge_key", pa.string()),
    ]
)
LOCAL_CHUNK = 256  # prompts per call to the judge actor, so progress shows
LOCAL_ANSWER_TOKENS = 64  # what a local model's answer is counted at in an estimate of judge requests


def judge_unavailable(study: OpenWorldStudyConfig) -> str | None:
    """Why no judge can run (none configured, weights missing, no key), or None when one can."""
    if study.judge is None:
        return "no judge model is configured (set `judge:` to a local instruct model or an API model)"
    return judge_available(study.judge, study.providers)


def judge_key(study: OpenWorldStudyConfig) -> str:
    """What decides the judge's answers (not its batch size)."""
    return study.judge.key()


Pair = tuple[str, str, tuple[str, ...]]  # `scoring.judgement_key`: label, prediction, accepted alternatives


def _rows(pairs: list[Pair], answers, key: str) -> pa.Table:
    rows = [
        {
            "label": label,
            "prediction": prediction,
            "accepted": list(accepted),
            "answer": a.text,
            "valid": judgement_valid(a.text) if a.status == "ok" else False,
            "status": a.status,
            "error": a.error,
            "cost_usd": a.cost_usd,
            "judge_key": key,
        }
        for (label, prediction, accepted), a in zip(pairs, answers)
    ]
    return pa.Table.from_pylist(rows, schema=JUDGEMENTS_SCHEMA)


def _pair(row: dict) -> Pair:
    return row["label"], row["prediction"], tuple(row["accepted"])


def _current(table: pa.Table) -> pa.Table:
    """A judgements table (or part) in today's schema: one written before accepted names holds the
    paper's questions alone."""
    if "accepted" not in table.column_names:
        table = table.append_column("accepted", pa.array([[]] * table.num_rows, pa.list_(pa.string())))
    return table.select(JUDGEMENTS_SCHEMA.names).cast(JUDGEMENTS_SCHEMA)


def _parts(folder) -> pa.Table:
    parts = [_current(t) for t in folder.iter_parts("judgements", JUDGEMENTS_SCHEMA)]
    return pa.concat_tables(parts) if parts else JUDGEMENTS_SCHEMA.empty_table()


def _done(run, key: str) -> dict[Pair, dict]:
    """Answers this judge already gave, from the previous table and the parts of a killed run."""
    old = run.previous("judgements")
    if old is None or "judge_key" not in old.column_names:
        old = JUDGEMENTS_SCHEMA.empty_table()
    rows = pa.concat_tables([_current(old), _parts(run)]).to_pylist()
    return {_pair(r): r for r in rows if r["judge_key"] == key and r["status"] == "ok"}


def pairs_to_judge(labels: pa.Table, responses: pa.Table) -> list[Pair]:
    """Each distinct question the judge must see, once: (label, prediction) with no alternatives (the
    paper's), and again with the label's accepted alternatives where it has some."""
    label_of = {r["image_id"]: r for r in labels.select(["image_id", "label", "accepted"]).to_pylist()}
    ok = [r for r in responses.to_pylist() if answered(r) and r["image_id"] in label_of]
    pairs = set()
    for r in ok:
        info = label_of[r["image_id"]]
        pairs.add(judgement_key(info["label"], r["text"]))
        pairs.add(judgement_key(info["label"], r["text"], info["accepted"]))
    return sorted(pairs)


def judge_pairs(study: OpenWorldStudyConfig, pairs: list[Pair], run: StudyRun) -> pa.Table:
    cfg, key, folder = study.judge, judge_key(study), run.folder
    done = _done(folder, key)
    todo = [p for p in pairs if p not in done]
    if done:
        run.reporter.say(f"     judgements   {len(pairs) - len(todo)} of {len(pairs)} already judged, kept")
    if todo and cfg.backend == LOCAL_BACKEND:
        ray, rt = run.ray(), study.runtime
        actor = (
            ray.remote(LocalJudge)
            .options(
                num_cpus=rt.cpus_per_actor,
                num_gpus=rt.gpus_per_actor,
                max_restarts=rt.max_restarts,
                max_task_retries=rt.max_restarts,
            )
            .remote(cfg)
        )
        submit = lambda chunk, _: actor.judge.remote([judge_prompt(*p) for p in chunk])  # noqa: E731
        try:
            with run.reporter.track("judge", len(todo)) as advance:
                for finished in bounded(
                    ray,
                    batches(todo, LOCAL_CHUNK),
                    submit,
                    1,
                    stall_timeout_s=rt.stall_timeout_s,
                    what="judge",
                    needs={"CPU": rt.cpus_per_actor, "GPU": rt.gpus_per_actor},
                ):
                    if finished.error is not None:
                        raise finished.error
                    folder.append_part("judgements", _rows(finished.work, finished.value, key))
                    advance(len(finished.work))
        finally:
            ray.kill(actor)
    elif todo:  # the gateway's cache keeps every answer paid for, so a killed run loses none
        answers = RemoteJudge(run.ray(), study, folder, cfg, run.reporter).judge([judge_prompt(*p) for p in todo])
        folder.append_part("judgements", _rows(todo, answers, key))
    latest = {_pair(r): r for r in _parts(folder).to_pylist() if r["judge_key"] == key}
    rows = [latest.get(p) or done[p] for p in pairs]
    return pa.Table.from_pylist(rows, schema=JUDGEMENTS_SCHEMA)


def stage(study: OpenWorldStudyConfig) -> Stage:
    """The `judgements` table: the judge's answer for each distinct (label, prediction)."""

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        return {"judgements": judge_pairs(study, pairs_to_judge(run.table("labels"), run.table("responses")), run)}

    return Stage("judgements", ("labels", "responses"), study.judge.fingerprint(), compute)


def estimate(
    study: OpenWorldStudyConfig, images: pa.Table, prompts: dict[str, tuple], labels: pa.Table | None = None
) -> Line:
    """An upper bound on the API judge's requests: one text-only request per prediction (every
    model, image and prompt; the judge asks each distinct pair once, and a cached answer is free),
    the prompt with the image's label (`labels`; without them a label counts 4 tokens) and the
    prediction at its model's answer cap (local models: their `max_new_tokens`, else
    LOCAL_ANSWER_TOKENS), each answer at the judge's cap; a label with accepted alternatives asks
    once more, with them. The low end is no request at all."""
    from vlm_decade.models.api.providers import cost, text_tokens

    judge = study.judge
    provider = served_by(judge.backend, judge.endpoint)
    price = study.providers.of(provider).price(provider, judge.model_id)
    out_cap = judge_settings(judge)["max_output_tokens"]
    line = Line(provider, f"judge {judge.model_id}", mode=judge.mode, model_id=judge.model_id)
    template = text_tokens(judge_prompt("", ""))
    label_of = (
        dict(zip(labels.column("image_id").to_pylist(), labels.column("label").to_pylist()))
        if labels is not None
        else {}
    )
    ids = images.column("image_id").to_pylist()
    label_tokens = sum(text_tokens(label_of[i]) if i in label_of else 4 for i in ids)
    alternatives = (
        dict(zip(labels.column("image_id").to_pylist(), labels.column("accepted").to_pylist()))
        if labels is not None
        else {}
    )
    again = [i for i in ids if alternatives.get(i)]  # asked a second time, with the accepted names
    again_tokens = sum(text_tokens(judge_prompt(label_of[i], "", alternatives[i])) for i in again)
    for model in study.models:
        cls = backend_class(model.backend)
        answer = (
            cls.settings(model)["max_output_tokens"]
            if cls.remote
            else int(model.options.get("max_new_tokens", LOCAL_ANSWER_TOKENS))
        )
        n, n_again = images.num_rows * len(prompts[model.name]), len(again) * len(prompts[model.name])
        line.requests += n + n_again
        line.input_tokens += n * (template + answer) + len(prompts[model.name]) * label_tokens
        line.input_tokens += n_again * answer + len(prompts[model.name]) * again_tokens
        line.output_tokens += (n + n_again) * out_cap
    line.usd = cost(price, line.input_tokens, line.output_tokens) if price else 0.0
    return line
