"""The caption metrics of the score stage (Study A): BLEU-1..4, METEOR, ROUGE-L and CIDEr-D of each
description against *all* human descriptions of the full image (`models.metrics.caption_scores`,
pycocoevalcap), beside the embedding similarity to the gold standard.

A model's description is scored against every human description of the image; a member of a human
reference group (`human:top`, `human:bottom`) against every other one (it is not its own reference),
and the group's value per image is the mean over its members, as for the similarity scores. CIDEr-D's
idf comes from the references of the images scored together, so each model (and each member slot
of a group: its first member on every image, its second, ...) is scored in one call over its images.
"""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa

from vlm_decade.models.metrics import caption_scores
from vlm_decade.stats import SCORES_SCHEMA
from vlm_decade.studies.decade.score import HUMAN_GROUPS


def caption_metric_scores(images: pa.Table, references: pa.Table, responses: pa.Table, names) -> pa.Table:
    """One row per subject, image and caption metric in `names` (the scores table's schema)."""
    if shutil.which("java") is None:
        raise RuntimeError(
            "the caption metrics (pycocoevalcap) need a Java runtime on PATH: install one "
            "(Debian: apt-get install default-jre-headless) or remove `caption_metrics` from the study"
        )
    dataset_of = dict(zip(images.column("image_id").to_pylist(), images.column("dataset").to_pylist()))
    full = sorted(
        (r for r in references.to_pylist() if r["condition"] == "full"),
        key=lambda r: (r["image_id"], r["description_id"]),
    )
    humans: dict[str, list[dict]] = {}
    for r in full:
        humans.setdefault(r["image_id"], []).append(r)
    calls: dict[
        tuple[str, int], list[tuple[str, str, list[str]]]
    ] = {}  # (subject, slot) -> (image, candidate, references)
    for r in sorted(responses.to_pylist(), key=lambda r: (r["subject"], r["image_id"])):
        if r["status"] == "ok" and r["variant"] == "full" and r["image_id"] in humans:
            calls.setdefault((r["subject"], 0), []).append(
                (r["image_id"], r["text"], [h["text"] for h in humans[r["image_id"]]])
            )
    for image_id, described in humans.items():
        for role, group in HUMAN_GROUPS.items():
            members = [h for h in described if h["role"] == role]
            for slot, member in enumerate(members):
                others = [h["text"] for h in described if h["description_id"] != member["description_id"]]
                if others:
                    calls.setdefault((group, slot), []).append((image_id, member["text"], others))
    values: dict[tuple[str, str, str], list[float]] = {}
    for (subject, _), items in sorted(calls.items()):
        scored = caption_scores([c for _, c, _ in items], [refs for _, _, refs in items], tuple(names))
        for name, per in scored.items():
            for (image_id, _, _), v in zip(items, per):
                values.setdefault((subject, image_id, name), []).append(float(v))
    rows = [
        {
            "subject": s,
            "image_id": i,
            "dataset": dataset_of[i],
            "variant": "full",
            "metric": m,
            "value": float(np.mean(v)),
        }
        for (s, i, m), v in sorted(values.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1]))
    ]
    return pa.Table.from_pylist(rows, schema=SCORES_SCHEMA)
