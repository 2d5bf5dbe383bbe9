"""The score stage (Study A): cosine similarity of each description to the image's gold standard.

Models are scored on their description of the full image; the human reference groups
`human:top` and `human:bottom` get, per image, the mean similarity of their descriptions to the
gold standard (as the paper draws them as bands). One metric per encoder (e.g. SBERT-SI, GPT-SI).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .embed import text_key

SCORES_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("variant", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
    ]
)
HUMAN_GROUPS = {"top": "human:top", "bottom": "human:bottom"}


def _vectors(embeddings: pa.Table, encoder: str) -> dict[str, np.ndarray]:
    table = embeddings.filter(pc.equal(embeddings.column("encoder"), encoder))
    return {k: np.asarray(v, dtype=np.float32) for k, v in zip(table.column("text_sha256").to_pylist(), table.column("vector").to_pylist())}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def similarity_scores(images: pa.Table, references: pa.Table, responses: pa.Table, embeddings: pa.Table, metrics: list[str]) -> pa.Table:
    dataset_of = dict(zip(images.column("image_id").to_pylist(), images.column("dataset").to_pylist()))
    full_refs = [r for r in references.to_pylist() if r["condition"] == "full"]
    gold = {r["image_id"]: r["text"] for r in full_refs if r["role"] == "gold"}
    groups: dict[tuple[str, str], list[str]] = {}
    for r in full_refs:
        if r["role"] in HUMAN_GROUPS:
            groups.setdefault((HUMAN_GROUPS[r["role"]], r["image_id"]), []).append(r["text"])
    answers = [r for r in responses.to_pylist() if r["status"] == "ok" and r["variant"] == "full"]

    rows = []
    for metric in metrics:
        vec = _vectors(embeddings, metric)

        def similarity(text: str, image_id: str) -> float:
            return cosine(vec[text_key(text)], vec[text_key(gold[image_id])])

        values = [(r["subject"], r["image_id"], similarity(r["text"], r["image_id"])) for r in answers if r["image_id"] in gold]
        values += [
            (subject, image_id, float(np.mean([similarity(t, image_id) for t in texts])))
            for (subject, image_id), texts in groups.items()
        ]
        rows += [
            {"subject": s, "image_id": i, "dataset": dataset_of[i], "variant": "full", "metric": metric, "value": v}
            for s, i, v in values
        ]
    rows.sort(key=lambda r: (r["metric"], r["subject"], r["image_id"]))
    return pa.Table.from_pylist(rows, schema=SCORES_SCHEMA)
