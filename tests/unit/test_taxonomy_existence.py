"""Whether a mentioned object the gold does not name is in the image, from sources other than the
model (existence.check), and the open-vocabulary locator that is one of them (a tiny OWL-ViT built
from a config, checked against transformers run by hand)."""

from __future__ import annotations

import numpy as np
import pytest

from vlm_decade.models.backends.detection import Detection
from vlm_decade.studies.decade.taxonomy.existence import ImageEvidence, candidates, check
from vlm_decade.studies.decade.taxonomy.rules import best_located

from .taxonomy_cases import hand_matcher, mentions

NAMES = ("guitar", "man", "flag", "suit", "lamp", "gun", "banjo")


def matcher():
    # Each name its own axis (no two match), except banjo, 0.8 of the way to guitar (a match at 0.72).
    def vec(name):
        v = np.zeros(len(NAMES))
        v[NAMES.index(name)] = 1.0
        if name == "banjo":
            v[:] = 0.0
            v[NAMES.index("guitar")], v[NAMES.index("banjo")] = 0.8, 0.6
        return v

    return hand_matcher(vec)


def test_candidates_are_the_mentions_the_gold_does_not_name():
    assert candidates(mentions("man", "flag"), mentions("man", "guitar", "gun", "guitar"), matcher()) == [
        "guitar",
        "gun",
    ]


def by_source(verdict):
    return {c["source"]: c for c in verdict["checks"]}


def test_humans_other_than_the_gold_count_one_description_at_a_time():
    humans = (("man", "banjo"), ("man", "flag"), ("guitar",))
    verdict = check("guitar", ImageEvidence(humans=humans), matcher())
    # two descriptions name it (one as a banjo, a synonym at 0.8)
    assert verdict["present"] is True
    assert by_source(verdict)["humans"] == {
        "source": "humans",
        "descriptions": 3,
        "naming": 2,
        "min": 1,
        "found": True,
        "named_as": ["banjo", "guitar"],
    }
    assert check("guitar", ImageEvidence(humans=humans, min_humans=3), matcher())["present"] is False
    assert check("lamp", ImageEvidence(humans=humans), matcher())["present"] is False


def test_the_locator_finds_an_object_when_its_best_box_reaches_the_minimum_score():
    boxes = (
        Detection("guitar", 0.05, (0, 0, 0.5, 0.5)),
        Detection("guitar", 0.3, (0.1, 0.1, 0.4, 0.6)),
        Detection("lamp", 0.08, (0.6, 0, 1, 0.2)),
    )
    assert best_located(boxes, "guitar").score == 0.3 and best_located(boxes, "gun") is None
    found = check("guitar", ImageEvidence(located=boxes, min_score=0.1), matcher())
    assert found["present"] is True
    assert by_source(found)["locator"] == {
        "source": "locator",
        "found": True,
        "min_score": 0.1,
        "best_score": 0.3,
        "box": [0.1, 0.1, 0.4, 0.6],
    }
    assert check("lamp", ImageEvidence(located=boxes, min_score=0.1), matcher())["present"] is False
    assert (
        by_source(check("gun", ImageEvidence(located=boxes, min_score=0.1), matcher()))["locator"]["best_score"] is None
    )


@pytest.mark.parametrize(
    ("answer", "present", "reading"),
    [
        ("Yes, by the wall.", True, "yes"),
        ("No, there is no gun.", False, "no"),
        ("It is hard to tell.", None, "unclear"),
        (None, None, "unasked"),
    ],
)
def test_the_verifier_model_says_whether_it_is_there(answer, present, reading):
    asked = {} if answer is None else {"gun": ("Is there a gun in this image? Answer yes or no.", answer)}
    verdict = check("gun", ImageEvidence(verifier=asked, verifier_name="gpt-4o"), matcher())
    assert verdict["present"] is present
    assert by_source(verdict)["verifier"]["reading"] == reading and by_source(verdict)["verifier"]["model"] == "gpt-4o"


def test_a_locator_that_failed_on_the_image_leaves_it_undecided():
    verdict = check("gun", ImageEvidence(locator_failed=True), matcher())
    assert verdict["present"] is None and by_source(verdict)["locator"] == {
        "source": "locator",
        "found": False,
        "failed": True,
    }


def test_the_humans_outweigh_a_verifier_that_cannot_tell():
    verdict = check("gun", ImageEvidence(humans=(("gun",),), verifier={"gun": ("?", "Maybe.")}), matcher())
    assert verdict["present"] is True


# -- the locator ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def owl(tmp_path_factory):
    from tests.hf_tiny import save_owlvit

    return save_owlvit(tmp_path_factory.mktemp("owl"))


def test_the_locator_returns_the_best_boxes_of_each_name_as_transformers_scores_them(owl):
    import torch
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    from vlm_decade.core.config import ModelConfig
    from vlm_decade.models.backends.hf_locator import PER_QUERY, HFLocator

    rgb = (np.random.default_rng(1).random((40, 60, 3)) * 255).astype(np.uint8)
    names = ["cat", "dog", "cup", "red cup"]
    locator = HFLocator(ModelConfig(name="locator", backend="hf-locator", model_id="tiny", path=owl))
    (found,) = locator.locate([rgb], [names + ["cat"]])  # a repeated name is asked once

    processor, net = AutoProcessor.from_pretrained(owl), AutoModelForZeroShotObjectDetection.from_pretrained(owl).eval()
    with torch.inference_mode():
        out = net(**processor(text=[names], images=[rgb], return_tensors="pt", padding=True))
    logits = out.logits[0]  # (boxes, names): each box goes to its best name, scored by the sigmoid
    scores, best = torch.sigmoid(logits.max(dim=-1).values), logits.argmax(dim=-1)
    for k, name in enumerate(names):
        mine = [d for d in found if d.label == name]
        expected = sorted(scores[best == k].tolist(), reverse=True)[:PER_QUERY]
        assert [d.score for d in mine] == pytest.approx(expected, abs=1e-6)
        assert all(0.0 <= v <= 1.0 for d in mine for v in d.box)
    assert {d.label for d in found} <= set(names)
    assert locator.locate([rgb], [[]]) == [[]]
