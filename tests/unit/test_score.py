"""Similarity to the gold standard, checked on hand-made vectors whose cosines are known."""

import numpy as np
import pyarrow as pa
import pytest

from vlm_decade.models.encoders import text_key
from vlm_decade.stages.embed import EMBEDDINGS_SCHEMA
from vlm_decade.studies.decade.score import similarity_scores

VECTORS = {  # text -> vector; cosines worked by hand below
    "gold one": [1.0, 0.0, 0.0],
    "top a": [1.0, 1.0, 0.0],  # cos 1/sqrt(2) to gold one
    "top b": [1.0, 0.0, 0.0],  # cos 1
    "bottom a": [0.0, 1.0, 0.0],  # cos 0
    "model says": [3.0, 4.0, 0.0],  # cos 0.6
    "gold two": [0.0, 0.0, 2.0],
    "model two": [0.0, 1.0, -1.0],  # cos -1/sqrt(2)
}


def _tables():
    images = pa.table({"image_id": ["i1", "i2"], "dataset": ["d1", "d2"]})
    refs = pa.table(
        {
            "image_id": ["i1", "i1", "i1", "i1", "i1", "i2"],
            "condition": ["full", "full", "full", "full", "m1", "full"],
            "role": ["gold", "top", "top", "bottom", "masked", "gold"],
            "text": ["gold one", "top a", "top b", "bottom a", "top a", "gold two"],
        }
    )
    responses = pa.table(
        {
            "subject": ["m", "m", "m", "m"],
            "image_id": ["i1", "i1", "i2", "i2"],
            "variant": ["full", "m1", "full", "m2"],
            "status": ["ok", "ok", "ok", "error"],
            "text": ["model says", "top b", "model two", ""],
        }
    )
    emb = pa.Table.from_pylist(
        [
            {
                "text_sha256": text_key(t),
                "encoder": "E",
                "encoder_key": "k",
                "dim": 3,
                "vector": np.asarray(v, np.float32) * 2,
            }
            for t, v in VECTORS.items()
        ],
        schema=EMBEDDINGS_SCHEMA,
    )
    return images, refs, responses, emb


def test_similarities_match_hand_worked_cosines():
    scores = similarity_scores(*_tables(), ["E"])
    got = {(r["subject"], r["image_id"]): (r["value"], r["dataset"], r["variant"]) for r in scores.to_pylist()}
    assert got[("m", "i1")][0] == pytest.approx(0.6)
    assert got[("m", "i2")][0] == pytest.approx(-1 / np.sqrt(2))
    assert got[("human:top", "i1")][0] == pytest.approx((1 / np.sqrt(2) + 1) / 2)
    assert got[("human:bottom", "i1")][0] == pytest.approx(0.0, abs=1e-7)
    assert got[("m", "i2")][1:] == ("d2", "full")
    # Masked variants and failed responses are not scored against the gold standard.
    assert len(got) == 4


class _Length:
    """A pairwise metric with known values: candidate length minus reference length."""

    name = "LEN"

    def score(self, candidates, references):
        return np.array([len(c) - len(r) for c, r in zip(candidates, references)], dtype=float)


def test_pairwise_metrics_score_the_same_pairs_and_humans_average():
    scores = similarity_scores(*_tables(), ["E"], pair_metrics=[_Length()])
    got = {(r["subject"], r["image_id"]): r["value"] for r in scores.to_pylist() if r["metric"] == "LEN"}
    assert got[("m", "i1")] == len("model says") - len("gold one")
    assert got[("human:top", "i1")] == ((len("top a") - 8) + (len("top b") - 8)) / 2
    assert len(got) == 4


class _Counted(_Length):
    """The pairwise metric, counting the pairs it scores."""

    def __init__(self):
        self.pairs = 0

    def score(self, candidates, references):
        self.pairs += len(candidates)
        return super().score(candidates, references)


def test_an_added_image_is_the_only_one_scored_and_the_scores_equal_a_fresh_run():
    images, refs, responses, emb = _tables()
    first = images.slice(0, 1)  # i1 alone, then i2 added
    only_i1 = [t.filter(pa.compute.equal(t.column("image_id"), "i1")) for t in (refs, responses)]
    before = similarity_scores(first, *only_i1, emb, ["E"], [_Counted()], settings="s")
    metric = _Counted()
    grown = similarity_scores(images, refs, responses, emb, ["E"], [metric], previous=before, settings="s")
    assert metric.pairs == 1  # the model's description of i2; i1's four pairs were kept
    fresh = similarity_scores(images, refs, responses, emb, ["E"], [_Counted()], settings="s")
    assert grown.equals(fresh)
    again = _Counted()
    changed = similarity_scores(images, refs, responses, emb, ["E"], [again], previous=before, settings="t")
    assert again.pairs == 5 and changed.drop_columns(["inputs_sha256"]).equals(fresh.drop_columns(["inputs_sha256"]))
