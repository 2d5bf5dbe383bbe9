"""Study B's score stage: TI, LI, SS and CS for every prediction, and its outcome.

`scores` has one row per prediction and metric (the statistics engine's schema, its `variant`
column named `prompt_id` as in `responses` and `predictions`; the stats stage hands it to the engine
under the engine's name, so the prompt ablation falls out of the engine); `predictions` keeps, per prediction, the
label, the answer, the four values, the concept that matched best, the judge's raw answer and the
outcome (correct, granularity, ambiguity, confusion), the evidence a reader checks.
"""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.stats import SCORES_SCHEMA
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.metrics import parse_judgement, similarities, text_inclusion
from vlm_decade.studies.openworld.outcomes import outcome

METRICS = ("TI", "LI", "SS", "CS")


def prompt_named(schema: pa.Schema) -> pa.Schema:
    """A statistics-engine schema as Study B's tables have it: the `variant` column, which holds the
    prompt, is `prompt_id`, the prompt's one name in every Study B table."""
    return pa.schema([f.with_name("prompt_id") if f.name == "variant" else f for f in schema])


SCORES_B_SCHEMA = prompt_named(SCORES_SCHEMA)
PREDICTIONS_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("granularity", pa.string()),
        ("prompt_id", pa.string()),
        ("label", pa.string()),
        ("prediction", pa.string()),
        ("TI", pa.float64()),
        ("LI", pa.float64()),
        ("SS", pa.float64()),
        ("CS", pa.float64()),
        ("best_concept", pa.string()),
        ("judge_answer", pa.string()),
        ("outcome", pa.string()),
    ]
)


# Part of the stage's settings: bump it when the tables' columns change (2: the prompt is `prompt_id` in `scores`).
SCORES_FORMAT = 2


def judgement_key(label: str, prediction: str) -> tuple[str, str]:
    return label.strip(), prediction.strip()


def score_predictions(
    labels: pa.Table,
    responses: pa.Table,
    judged: dict[tuple[str, str], str] | None,
    encode,
    nlp,
    cs_high: float,
    li_high: float,
) -> tuple[pa.Table, pa.Table]:
    """(scores, predictions) for every successful response. `judged` maps (label, prediction) to the
    judge's raw answer; None when no judge ran (LI is then left out, and outcomes are `unjudged`)."""
    label_of = {r["image_id"]: r for r in labels.to_pylist()}
    ok = [r for r in responses.to_pylist() if r["status"] == "ok" and r["image_id"] in label_of]
    gold = [label_of[r["image_id"]]["label"] for r in ok]
    said = [r["text"] for r in ok]
    ss, cs, best = similarities(gold, said, encode, nlp) if ok else ([], [], [])
    predictions, scores = [], []
    for r, label, text, s, c, concept in zip(ok, gold, said, ss, cs, best):
        info = label_of[r["image_id"]]
        answer = None if judged is None else judged.get(judgement_key(label, text))
        li = None if answer is None else parse_judgement(answer)
        values = {"TI": text_inclusion(label, text), "LI": li, "SS": float(s), "CS": float(c)}
        predictions.append(
            {
                "subject": r["subject"],
                "image_id": r["image_id"],
                "dataset": info["dataset"],
                "granularity": info["granularity"],
                "prompt_id": r["prompt_id"],
                "label": label,
                "prediction": text,
                **values,
                "best_concept": concept,
                "judge_answer": answer,
                "outcome": outcome(values["CS"], li, cs_high, li_high),
            }
        )
        scores += [
            {
                "subject": r["subject"],
                "image_id": r["image_id"],
                "dataset": info["dataset"],
                "prompt_id": r["prompt_id"],
                "metric": m,
                "value": v,
            }
            for m, v in values.items()
            if v is not None
        ]
    predictions.sort(key=lambda p: (p["subject"], p["prompt_id"], p["image_id"]))
    scores.sort(key=lambda s: (s["metric"], s["subject"], s["prompt_id"], s["image_id"]))
    return pa.Table.from_pylist(scores, schema=SCORES_B_SCHEMA), pa.Table.from_pylist(
        predictions, schema=PREDICTIONS_SCHEMA
    )


def stage(study: OpenWorldStudyConfig, no_judge: str | None) -> Stage:
    """`scores` and `predictions`; LI from the judge's answers unless `no_judge` says why there are none."""
    inputs = ("labels", "responses") + (("judgements",) if no_judge is None else ())

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        from vlm_decade.models.encoders.sbert import SentenceTransformerEncoder  # torch: only when scoring runs
        from vlm_decade.studies.openworld.metrics import load_nlp

        judged = None
        if no_judge is None:
            judged = {
                judgement_key(r["label"], r["prediction"]): r["answer"]
                for r in run.table("judgements").to_pylist()
                if r["status"] == "ok"
            }
        scores, predictions = score_predictions(
            run.table("labels"),
            run.table("responses"),
            judged,
            SentenceTransformerEncoder(study.scoring.encoder, study.scoring.max_tokens).encode,
            load_nlp(),
            study.scoring.cs_high,
            study.scoring.li_high,
        )
        return {"scores": scores, "predictions": predictions}

    return Stage(
        "scores",
        inputs,
        [study.scoring.fingerprint(), no_judge, SCORES_FORMAT],
        compute,
        outputs=("scores", "predictions"),
    )
