"""The score stage (Study A): cosine similarity of each description to the image's gold standard.

Models are scored on their description of the full image; the human reference groups
`human:top` and `human:bottom` get, per image, the mean similarity of their descriptions to the
gold standard (as the paper draws them as bands). One metric per encoder (e.g. SBERT-SI, GPT-SI).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.models.encoders import text_key
from vlm_decade.models.metrics import build_metric
from vlm_decade.stats import SCORES_SCHEMA
from vlm_decade.studies.decade.config import StudyConfig

HUMAN_GROUPS = {"top": "human:top", "bottom": "human:bottom"}


def encoder_vectors(embeddings: pa.Table, encoder: str) -> dict[str, np.ndarray]:
    """text_sha256 -> vector, for one encoder of the `embeddings` table."""
    table = embeddings.filter(pc.equal(embeddings.column("encoder"), encoder))
    return {k: np.asarray(v, dtype=np.float32) for k, v in zip(table.column("text_sha256").to_pylist(), table.column("vector").to_pylist())}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def scoring_pairs(references: pa.Table, responses: pa.Table) -> list[tuple[str, str, str, str]]:
    """(subject, image_id, candidate, gold) for every model's full-image description and every
    member of a human reference group; a group's value per image is the mean over its members."""
    full_refs = [r for r in references.to_pylist() if r["condition"] == "full"]
    gold = {r["image_id"]: r["text"] for r in full_refs if r["role"] == "gold"}
    pairs = [
        (r["subject"], r["image_id"], r["text"], gold[r["image_id"]])
        for r in responses.to_pylist()
        if r["status"] == "ok" and r["variant"] == "full" and r["image_id"] in gold
    ]
    pairs += [(HUMAN_GROUPS[r["role"]], r["image_id"], r["text"], gold[r["image_id"]]) for r in full_refs if r["role"] in HUMAN_GROUPS]
    return pairs


def similarity_scores(
    images: pa.Table, references: pa.Table, responses: pa.Table, embeddings: pa.Table, metrics: list[str], pair_metrics=()
) -> pa.Table:
    """Cosine to the gold standard for each encoder in `metrics` (from the `embeddings` table), and
    each loaded pairwise metric in `pair_metrics` (e.g. BERTScore, `vlm_decade.models.metrics`)."""
    dataset_of = dict(zip(images.column("image_id").to_pylist(), images.column("dataset").to_pylist()))
    pairs = scoring_pairs(references, responses)
    candidates = [p[2] for p in pairs]
    golds = [p[3] for p in pairs]
    values_by_metric: dict[str, list[float]] = {}
    for metric in metrics:
        vec = encoder_vectors(embeddings, metric)
        values_by_metric[metric] = [cosine(vec[text_key(c)], vec[text_key(g)]) for c, g in zip(candidates, golds)]
    for metric in pair_metrics:
        values_by_metric[metric.name] = [float(v) for v in metric.score(candidates, golds)]

    rows = []
    for metric, values in values_by_metric.items():
        grouped: dict[tuple[str, str], list[float]] = {}
        for (subject, image_id, _, _), value in zip(pairs, values):
            grouped.setdefault((subject, image_id), []).append(value)
        rows += [
            {"subject": s, "image_id": i, "dataset": dataset_of[i], "variant": "full", "metric": metric, "value": float(np.mean(v))}
            for (s, i), v in grouped.items()
        ]
    rows.sort(key=lambda r: (r["metric"], r["subject"], r["image_id"]))
    return pa.Table.from_pylist(rows, schema=SCORES_SCHEMA)


def stage(study: StudyConfig) -> Stage:
    """The `scores` table: one metric per encoder, the study's pairwise `metrics`, and its caption
    metrics (`caption_metrics`, against all human descriptions: studies/decade/captions.py)."""
    encoders = [e.name for e in study.encoders]

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        tables = [run.table(n) for n in ("images", "references", "responses", "embeddings")]
        scores = similarity_scores(*tables, encoders, [build_metric(m) for m in study.metrics])
        if study.caption_metrics:
            from vlm_decade.studies.decade.captions import caption_metric_scores

            scores = pa.concat_tables([scores, caption_metric_scores(*tables[:3], study.caption_metrics)])
        return {"scores": scores}

    settings = [encoders, [m.fingerprint() for m in study.metrics]] + ([list(study.caption_metrics)] if study.caption_metrics else [])
    return Stage("scores", ("images", "references", "responses", "embeddings"), settings, compute)
