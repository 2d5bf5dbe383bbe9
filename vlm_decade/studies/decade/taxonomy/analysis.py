"""From descriptions, detections, probe transcripts and masked descriptions to the `errors` table,
and from it to what the statistics engine bootstraps: error rates and error impact.

One row per model x image x error type: `present` (null where it could not be decided, e.g. an SDE
on an image without masked descriptions), `method` (detector, probe, masks or hand) and `evidence`
(JSON: the objects, boxes, words or transcript behind the label), so every label can be audited.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pyarrow as pa

from vlm_decade.stats import SCORES_SCHEMA, ComparisonSpec, Family, Term
from vlm_decade.studies.decade.taxonomy import agreement, probes, rules
from vlm_decade.studies.decade.taxonomy.objects import Mention

SDE = "spatial_dependence"
ERROR_TYPES = (*rules.ERROR_TYPES, SDE)
NO_ERROR = "no error"
ALL_IMAGES = "all"  # the impact pools every dataset's model-image pairs, as the paper's figure 8
ERRORS_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("error_type", pa.string()),
        ("present", pa.bool_()),
        ("method", pa.string()),
        ("evidence", pa.string()),
    ]
)
IMPACT_SCHEMA = SCORES_SCHEMA.append(pa.field("weight", pa.float64()))  # weight: pairs behind the value
AGREEMENT_SCHEMA = pa.schema(
    [("error_type", pa.string()), ("kappa", pa.float64()), ("observed_agreement", pa.float64()), ("n", pa.int64())]
)


def _evidence(payload) -> str:
    return json.dumps(payload, sort_keys=True, default=str)


def object_labels(
    pairs: list[tuple[str, str, str, str]],
    relevant: dict[str, list[Mention]],
    mentioned: dict[tuple[str, str], list[Mention]],
    detections: dict[str, list | None],
    transcripts: dict[tuple[str, str], list],
    probed: set[str],
    matcher,
    confusable: float,
    existence: dict[tuple[str, str], dict[str, dict]] | None = None,
    present: dict[str, list[str]] | None = None,
    located: dict[str, list | None] | None = None,
    min_score: float = 0.0,
    min_iou: float = 0.5,
) -> list[dict]:
    """Detection, recognition, scene-understanding and hallucination rows for each
    (subject, image_id, dataset, text) pair: from the detector's boxes, or from the probe
    transcript for API models (`probed` subjects). Undecidable pairs get null rows saying why.

    `existence`: per pair, the verdict on each mentioned object the gold does not name
    (`existence.check`); the hallucination row's evidence keeps them all (`checked`), cleared ones
    included. `present`: per image, the objects known to be there (gold and human-named), which a
    probed model's answer about a mention's place may name. `located`: per image, the locator's boxes
    (None where it failed), when the study has a locator: detector labels are then read from the
    boxes at each object's place (`rules.located_errors`), with `min_score` and `min_iou`."""
    existence = existence or {}
    present = present or {}
    rows = []
    for subject, image_id, dataset, _ in pairs:
        key = (subject, image_id)
        verdicts = existence.get(key, {})
        objects, said = relevant.get(image_id, []), mentioned.get(key, [])
        gold = [m.name for m in objects]
        known = present.get(image_id, gold)
        if subject in probed:
            method, found = "probe", transcripts.get(key)
            findings = None if found is None else probes.probe_findings(found, matcher, verdicts, gold, known)
            why = "no probe answers for this image"
        elif located is not None:
            method, boxes, spots = "detector", detections.get(image_id), located.get(image_id)
            findings = (
                None
                if boxes is None or spots is None
                else rules.located_errors(objects, boxes, said, matcher, spots, min_score, min_iou, verdicts, known)
            )
            why = "the detector failed on this image" if boxes is None else "the locator failed on this image"
        else:
            method, boxes = "detector", detections.get(image_id)
            findings = (
                None if boxes is None else rules.detector_errors(objects, boxes, said, matcher, confusable, verdicts)
            )
            why = "the detector failed on this image"
        context = {"relevant": gold, "mentioned": [m.name for m in said]}
        rows += _label_rows((subject, image_id, dataset), method, findings, why, context, list(verdicts.values()))
    return rows


def _label_rows(
    where: tuple[str, str, str], method: str, findings, why: str, context: dict, checked: list
) -> list[dict]:
    """One pair's (subject, image_id, dataset) row per error type: null saying `why` where it has
    no `findings`, else each type's presence and evidence, with the pair's `context` (and, for
    hallucination, every existence verdict `checked`)."""
    subject, image_id, dataset = where

    def row(error_type: str, present, payload: dict) -> dict:
        return {
            "subject": subject,
            "image_id": image_id,
            "dataset": dataset,
            "error_type": error_type,
            "present": present,
            "method": method,
            "evidence": _evidence(payload),
        }

    if findings is None:
        return [row(t, None, {"undecided": why}) for t in rules.ERROR_TYPES]
    rows = []
    for error_type, (present, evidence) in rules.summarise(findings).items():
        payload = {**context, "findings": json.loads(evidence)}
        if error_type == "hallucination":
            payload["checked"] = checked
        rows.append(row(error_type, present, payload))
    return rows


def spatial_labels(spatial_rows) -> list[dict]:
    """One spatial-dependence row per model and image, from the SDE computation."""
    return [
        {
            "subject": r.subject,
            "image_id": r.image_id,
            "dataset": r.dataset,
            "error_type": SDE,
            "present": r.sde,
            "method": "masks",
            "evidence": _evidence(
                {
                    "model_r": r.model_r,
                    "human_mean_r": r.human_mean_r,
                    "human_sd_r": r.human_sd_r,
                    "model_profile": r.model_profile,
                    "human_profile": r.human_profile,
                    "reason": r.reason,
                }
            ),
        }
        for r in spatial_rows
    ]


def errors_table(auto_rows: list[dict], hand: pa.Table | None, dataset_of: dict[str, str]) -> tuple[pa.Table, pa.Table]:
    """The errors table with hand labels applied over the automatic ones, and their agreement."""
    if hand is None:
        rows, agree = auto_rows, {}
    else:
        merged, agree = agreement.apply_hand_labels(auto_rows, hand.to_pylist())
        rows = [r if r.get("source") != "hand" else _hand_row(r, dataset_of) for r in merged]
    rows = sorted(rows, key=lambda r: (r["subject"], r["image_id"], ERROR_TYPES.index(r["error_type"])))
    table = pa.Table.from_pylist([{k: r.get(k) for k in ERRORS_SCHEMA.names} for r in rows], schema=ERRORS_SCHEMA)
    agreement_rows = [
        {"error_type": t, "kappa": a["kappa"], "observed_agreement": a["observed_agreement"], "n": a["n"]}
        for t, a in sorted(agree.items())
    ]
    return table, pa.Table.from_pylist(agreement_rows, schema=AGREEMENT_SCHEMA)


def _hand_row(row: dict, dataset_of: dict[str, str]) -> dict:
    """A hand label: the person's note and what the automatic label said, beside its evidence."""
    auto = json.loads(row["evidence"]) if row.get("evidence") else {}
    evidence = {**auto, "hand": row.get("note") or "", "auto_present": row.get("auto_present")}
    return {**row, "dataset": dataset_of[row["image_id"]], "method": "hand", "evidence": _evidence(evidence)}


def error_scores(errors: pa.Table) -> pa.Table:
    """Each label as a 0/1 score (null where undecided), so the statistics engine gives error rates
    per model and dataset with bootstrap CIs, and the era and dataset comparisons."""
    rows = [
        {
            "subject": r["subject"],
            "image_id": r["image_id"],
            "dataset": r["dataset"],
            "variant": "full",
            "metric": r["error_type"],
            "value": None if r["present"] is None else float(r["present"]),
        }
        for r in errors.to_pylist()
    ]
    return pa.Table.from_pylist(rows, schema=SCORES_SCHEMA)


def impact_scores(errors: pa.Table, scores: pa.Table, metric: str) -> pa.Table:
    """The similarity (`metric`) of the model-image pairs that have each error type, and of those with
    none (figure 8), as the statistics engine takes it: per group and image, the mean over the image's
    pairs in the group with their number as `weight`, so each group's estimate is the mean over its
    model-image pairs (the paper's) while the bootstrap resamples images, each with all its pairs.
    Subjects `error:<type>` and `no error`, all datasets pooled.

    A pair has no error only when every label it has is decided and absent, its four object error
    types at least (a model without masked variants has no SDE label): an undecided label is not "no
    error". A pair with an undecided label and no error present is in no group."""
    present: dict[tuple[str, str], set[str]] = defaultdict(set)
    decided: dict[tuple[str, str], set[str]] = defaultdict(set)
    undecided: set[tuple[str, str]] = set()
    for r in errors.to_pylist():
        key = (r["subject"], r["image_id"])
        if r["present"] is None:
            undecided.add(key)
            continue
        decided[key].add(r["error_type"])
        if r["present"]:
            present[key].add(r["error_type"])
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in scores.to_pylist():
        key = (r["subject"], r["image_id"])
        if r["metric"] != metric or r["variant"] != "full" or r["value"] is None:
            continue
        if present[key]:
            names = [f"error:{t}" for t in sorted(present[key])]
        elif key not in undecided and decided[key] >= set(rules.ERROR_TYPES):
            names = [NO_ERROR]
        else:
            continue
        for name in names:
            groups[(name, r["image_id"])].append(r["value"])
    rows = [
        {
            "subject": name,
            "image_id": image_id,
            "dataset": ALL_IMAGES,
            "variant": "full",
            "metric": metric,
            "value": float(np.mean(v)),
            "weight": float(len(v)),
        }
        for (name, image_id), v in sorted(groups.items())
    ]
    return pa.Table.from_pylist(rows, schema=IMPACT_SCHEMA)


def impact_family(impact: pa.Table) -> Family:
    """The paper's comparisons of error impact (figure 8, section 3.2.6), corrected together: each
    error group against the pairs with no error; scene understanding against detection, recognition
    and hallucination; spatial dependence against each of the other four."""
    subjects = set(impact.column("subject").to_pylist())
    group = {t: f"error:{t}" for t in ERROR_TYPES}

    def spec(a: str, b: str) -> ComparisonSpec:
        return ComparisonSpec(Term.subject(a, ALL_IMAGES), Term.subject(b, ALL_IMAGES))

    specs = [spec(group[t], NO_ERROR) for t in ERROR_TYPES if NO_ERROR in subjects and group[t] in subjects]
    scene, sde = group["scene_understanding"], group[SDE]
    specs += [
        spec(scene, group[t])
        for t in ("detection", "recognition", "hallucination")
        if scene in subjects and group[t] in subjects
    ]
    specs += [spec(sde, group[t]) for t in rules.ERROR_TYPES if sde in subjects and group[t] in subjects]
    return Family("impact", specs)


def impact_pairs(impact: pa.Table) -> dict[str, int]:
    """The number of model-image pairs behind each impact group (its estimate's units)."""
    counts: dict[str, int] = defaultdict(int)
    for subject, weight in zip(impact.column("subject").to_pylist(), impact.column("weight").to_pylist()):
        counts[subject] += int(weight)
    return dict(counts)
