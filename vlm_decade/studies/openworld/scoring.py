"""Study B's score stage: TI, LI, SS and CS for every prediction, and its outcome.

`scores` has one row per prediction and metric (the statistics engine's schema, its `variant`
column named `prompt_id` as in `responses` and `predictions`; the stats stage hands it to the engine
under the engine's name, so the prompt ablation falls out of the engine); `predictions` keeps, per prediction, the
label, the answer, the four values, the concept that matched best, the judge's raw answer and the
outcome (correct, granularity, ambiguity, confusion), the evidence a reader checks.

Beside the paper's four, each metric's accepted-name form (`TI_accepted`, ...: the label or any of
its accepted alternatives, metrics.py) is kept in `predictions` always and in `scores` when some
label has alternatives; the outcome stays the paper's (single-label CS and LI).

When images are added to a finished run only their predictions are scored: each row of `predictions`
carries `inputs_sha256`, the hash of the stage's settings and the prediction's own inputs (its label,
answer and judge's answers: `score_predictions`), and the last table's rows whose hash is unchanged
are kept (`core.reuse`); `scores` is then built from every row of `predictions`, kept or new, so
both tables are the ones a fresh run writes.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from vlm_decade.core.reuse import INPUTS, reuse, unit_inputs
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.stats import SCORES_SCHEMA
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.data import ACCEPTED_SEPARATOR
from vlm_decade.studies.openworld.metrics import (
    SPACY_MODEL,
    accepted_inclusion,
    name_similarities,
    parse_judgement,
    text_inclusion,
)
from vlm_decade.studies.openworld.outcomes import outcome

METRICS = ("TI", "LI", "SS", "CS")


def prompt_named(schema: pa.Schema) -> pa.Schema:
    """A statistics-engine schema as Study B's tables have it: the `variant` column, which holds the
    prompt, is `prompt_id`, the prompt's one name in every Study B table."""
    return pa.schema([f.with_name("prompt_id") if f.name == "variant" else f for f in schema])


SCORES_B_SCHEMA = prompt_named(SCORES_SCHEMA)


ACCEPTED_METRICS = tuple(f"{m}_accepted" for m in METRICS)
PREDICTIONS_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("granularity", pa.string()),
        ("prompt_id", pa.string()),
        ("label", pa.string()),
        ("accepted", pa.string()),  # the label's accepted alternatives, joined by ACCEPTED_SEPARATOR (a CSV cell)
        ("prediction", pa.string()),
        ("TI", pa.float64()),
        ("LI", pa.float64()),
        ("SS", pa.float64()),
        ("CS", pa.float64()),
        ("best_concept", pa.string()),
        ("judge_answer", pa.string()),
        ("outcome", pa.string()),
        *((m, pa.float64()) for m in ACCEPTED_METRICS),
        ("best_concept_accepted", pa.string()),
        ("judge_answer_accepted", pa.string()),
        (INPUTS, pa.string()),  # the hash of what the row was computed from (`score_predictions`)
    ]
)
UNIT = ["subject", "image_id", "prompt_id"]


# Part of the stage's settings: bump it when the tables' columns change (2: the prompt is `prompt_id` in
# `scores`; 3: `predictions` carries `inputs_sha256`).
SCORES_FORMAT = 3


def judgement_key(label: str, prediction: str, accepted=()) -> tuple[str, str, tuple[str, ...]]:
    """What one judge question is asked about: the label, the prediction and the label's accepted
    alternatives (none for the paper's question)."""
    return label.strip(), prediction.strip(), tuple(accepted)


def answered(response: dict) -> bool:
    """Whether a response is an answer to score (and to judge): ok, and saying something. An ok
    answer with no text (a backend or an imported file that answered nothing) has nothing to
    score: it is counted (`blank_answers`), not scored."""
    return response["status"] == "ok" and bool((response["text"] or "").strip())


def blank_answers(responses: pa.Table) -> dict[str, int]:
    """Per model, its ok answers with no text."""
    rows = responses.select(["subject", "status", "text"]).to_pylist()
    return dict(Counter(r["subject"] for r in rows if r["status"] == "ok" and not answered(r)))


def _answers(judged: dict | None, label: str, text: str, accepted) -> tuple[str | None, str | None]:
    """The judge's raw answers about one prediction, without and with the label's alternatives."""
    if judged is None:
        return None, None
    return judged.get(judgement_key(label, text)), judged.get(judgement_key(label, text, accepted))


def score_predictions(
    labels: pa.Table,
    responses: pa.Table,
    judged: dict[tuple[str, str], str] | None,
    encode,
    nlp,
    cs_high: float,
    li_high: float,
    previous: pa.Table | None = None,
    settings=None,
) -> tuple[pa.Table, pa.Table]:
    """(scores, predictions) for every successful response that says something (`answered`). `judged` maps `judgement_key`s to the
    judge's raw answer; None when no judge ran (LI is then left out, and outcomes are `unjudged`).
    The rows of `previous` (the last predictions) whose `inputs_sha256` (under `settings`, what else
    decides the values: the encoder, the thresholds) is unchanged are kept; only the others are
    computed, their texts encoded together in one call."""
    label_of = {r["image_id"]: r for r in labels.to_pylist()}
    ok = [r for r in responses.to_pylist() if answered(r) and r["image_id"] in label_of]
    # Everything a prediction's row is computed from. Whether some label has alternatives is not:
    # it decides only which rows of `scores` there are, and those are built from every prediction.
    inputs = []
    for r in ok:
        info = label_of[r["image_id"]]
        answers = _answers(judged, info["label"], r["text"], tuple(info["accepted"]))
        inputs.append([info["label"], info["accepted"], info["dataset"], info["granularity"], r["text"], *answers])
    wanted = pa.table(
        {
            **{c: pa.array([r[c] for r in ok], pa.string()) for c in UNIT},
            INPUTS: unit_inputs([settings, SCORES_FORMAT, judged is not None], inputs),
        }
    )

    def compute(todo: pa.Table) -> pa.Table:
        """The predictions of the units of `todo`, in the responses' order (so that a fresh run hands the
        encoder its texts in the order it always has)."""
        asked = set(zip(*(todo.column(c).to_pylist() for c in UNIT)))
        rows = [r for r in ok if tuple(r[c] for c in UNIT) in asked]
        return pa.Table.from_pylist(
            _predictions(rows, label_of, judged, encode, nlp, cs_high, li_high),
            schema=PREDICTIONS_SCHEMA.remove(PREDICTIONS_SCHEMA.get_field_index(INPUTS)),
        )

    # A kept row's SS and CS came from vectors encoded beside other texts than a fresh run's: with a real
    # encoder they may differ from a fresh run's in the last bits (the batch's padding and summation
    # order; well within 1e-6). TI, LI, the outcome and every string are the same exactly.
    predictions, _ = reuse(previous, wanted, UNIT, compute, PREDICTIONS_SCHEMA, ["subject", "prompt_id", "image_id"])
    with_alternatives = any(r["accepted"] for r in label_of.values())
    return scores_of(predictions, with_alternatives), predictions


def _predictions(rows, label_of, judged, encode, nlp, cs_high, li_high) -> list[dict]:
    """The rows of `predictions` (less `inputs_sha256`) of the responses `rows`."""
    names = [(label_of[r["image_id"]]["label"], *label_of[r["image_id"]]["accepted"]) for r in rows]
    said = [r["text"] for r in rows]
    out = []
    for r, group, text, sims in zip(rows, names, said, name_similarities(names, said, encode, nlp) if rows else []):
        info = label_of[r["image_id"]]
        label, accepted = group[0], group[1:]
        answer, answer_accepted = _answers(judged, label, text, accepted)
        ss_accepted, cs_accepted, concept_accepted = sims.accepted()
        values = {
            "TI": text_inclusion(label, text),
            "LI": None if answer is None else parse_judgement(answer),
            "SS": float(sims.ss[0]),
            "CS": float(sims.cs[0]),
        }
        out.append(
            {
                "subject": r["subject"],
                "image_id": r["image_id"],
                "dataset": info["dataset"],
                "granularity": info["granularity"],
                "prompt_id": r["prompt_id"],
                "label": label,
                "accepted": ACCEPTED_SEPARATOR.join(accepted),
                "prediction": text,
                **values,
                "best_concept": sims.best[0],
                "judge_answer": answer,
                "outcome": outcome(values["CS"], values["LI"], cs_high, li_high),
                "TI_accepted": accepted_inclusion(group, text),
                "LI_accepted": None if answer_accepted is None else parse_judgement(answer_accepted),
                "SS_accepted": ss_accepted,
                "CS_accepted": cs_accepted,
                "best_concept_accepted": concept_accepted,
                "judge_answer_accepted": answer_accepted,
            }
        )
    return out


def scores_of(predictions: pa.Table, with_alternatives: bool) -> pa.Table:
    """`scores` from `predictions`: a row per prediction and metric with a value, the accepted-name
    metrics too when some label has alternatives."""
    metrics = METRICS + (ACCEPTED_METRICS if with_alternatives else ())
    scores = [
        {
            "subject": p["subject"],
            "image_id": p["image_id"],
            "dataset": p["dataset"],
            "prompt_id": p["prompt_id"],
            "metric": m,
            "value": p[m],
        }
        for p in predictions.select([*UNIT, "dataset", *metrics]).to_pylist()
        for m in metrics
        if p[m] is not None
    ]
    scores.sort(key=lambda s: (s["metric"], s["subject"], s["prompt_id"], s["image_id"]))
    return pa.Table.from_pylist(scores, schema=SCORES_B_SCHEMA)


def stage(study: OpenWorldStudyConfig, no_judge: str | None) -> Stage:
    """`scores` and `predictions`; LI from the judge's answers unless `no_judge` says why there are none.
    Only the predictions that are new or changed since the last run are scored (`score_predictions`)."""
    inputs = ("labels", "responses") + (("judgements",) if no_judge is None else ())

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        from vlm_decade.studies.openworld.metrics import load_nlp

        def encode(texts: list[str]):
            """The sentence encoder, loaded only when some prediction is to be scored."""
            from vlm_decade.models.encoders.sbert import SentenceTransformerEncoder  # torch: only when scoring runs

            return SentenceTransformerEncoder(study.scoring.encoder, study.scoring.max_tokens).encode(texts)

        judged = None
        if no_judge is None:
            judged = {
                judgement_key(r["label"], r["prediction"], r["accepted"]): r["answer"]
                for r in run.table("judgements").to_pylist()
                if r["status"] == "ok"
            }
        responses = run.table("responses")
        blank = blank_answers(responses)
        if blank:
            each = ", ".join(f"{subject} {n}" for subject, n in sorted(blank.items()))
            run.reporter.say(f"     scores       {sum(blank.values())} ok answers with no text are not scored ({each})")
        scores, predictions = score_predictions(
            run.table("labels"),
            responses,
            judged,
            encode,
            load_nlp(),
            study.scoring.cs_high,
            study.scoring.li_high,
            run.folder.previous("predictions"),
            [study.scoring.fingerprint(), SPACY_MODEL],
        )
        return {"scores": scores, "predictions": predictions}

    return Stage(
        "scores",
        inputs,
        [study.scoring.fingerprint(), no_judge, SCORES_FORMAT],
        compute,
        outputs=("scores", "predictions"),
    )
