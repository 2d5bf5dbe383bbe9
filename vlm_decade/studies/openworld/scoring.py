"""Study B's score stage: TI, LI, SS and CS for every prediction, and its outcome.

`scores` has one row per prediction and metric (the statistics engine's schema, its `variant`
column named `prompt_id` as in `responses` and `predictions`; the stats stage hands it to the engine
under the engine's name, so the prompt ablation falls out of the engine); `predictions` keeps, per prediction, the
label, the answer, the four values, the concept that matched best, the judge's raw answer and the
outcome (correct, granularity, ambiguity, confusion), the evidence a reader checks.

Beside the paper's four, each metric's accepted-name form (`TI_accepted`, ...: the label or any of
its accepted alternatives, metrics.py) is kept in `predictions` always and in `scores` when some
label has alternatives; the outcome stays the paper's (single-label CS and LI).
"""

from __future__ import annotations

import pyarrow as pa

from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.stats import SCORES_SCHEMA
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.data import ACCEPTED_SEPARATOR
from vlm_decade.studies.openworld.metrics import accepted_inclusion, name_similarities, parse_judgement, text_inclusion
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
    ]
)


# Part of the stage's settings: bump it when the tables' columns change (2: the prompt is `prompt_id` in `scores`).
SCORES_FORMAT = 2


def judgement_key(label: str, prediction: str, accepted=()) -> tuple[str, str, tuple[str, ...]]:
    """What one judge question is asked about: the label, the prediction and the label's accepted
    alternatives (none for the paper's question)."""
    return label.strip(), prediction.strip(), tuple(accepted)


def score_predictions(
    labels: pa.Table,
    responses: pa.Table,
    judged: dict[tuple[str, str], str] | None,
    encode,
    nlp,
    cs_high: float,
    li_high: float,
) -> tuple[pa.Table, pa.Table]:
    """(scores, predictions) for every successful response. `judged` maps `judgement_key`s to the
    judge's raw answer; None when no judge ran (LI is then left out, and outcomes are `unjudged`)."""
    label_of = {r["image_id"]: r for r in labels.to_pylist()}
    ok = [r for r in responses.to_pylist() if r["status"] == "ok" and r["image_id"] in label_of]
    names = [(label_of[r["image_id"]]["label"], *label_of[r["image_id"]]["accepted"]) for r in ok]
    said = [r["text"] for r in ok]
    with_alternatives = any(r["accepted"] for r in label_of.values())
    predictions, scores = [], []
    for r, group, text, sims in zip(ok, names, said, name_similarities(names, said, encode, nlp) if ok else []):
        info = label_of[r["image_id"]]
        label, accepted = group[0], group[1:]
        answer, answer_accepted = (
            (None, None)
            if judged is None
            else (judged.get(judgement_key(label, text)), judged.get(judgement_key(label, text, accepted)))
        )
        ss_accepted, cs_accepted, concept_accepted = sims.accepted()
        values = {
            "TI": text_inclusion(label, text),
            "LI": None if answer is None else parse_judgement(answer),
            "SS": float(sims.ss[0]),
            "CS": float(sims.cs[0]),
        }
        values_accepted = {
            "TI_accepted": accepted_inclusion(group, text),
            "LI_accepted": None if answer_accepted is None else parse_judgement(answer_accepted),
            "SS_accepted": ss_accepted,
            "CS_accepted": cs_accepted,
        }
        predictions.append(
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
                **values_accepted,
                "best_concept_accepted": concept_accepted,
                "judge_answer_accepted": answer_accepted,
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
            for m, v in (values | values_accepted if with_alternatives else values).items()
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
                judgement_key(r["label"], r["prediction"], r["accepted"]): r["answer"]
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
