"""BLEU, METEOR, ROUGE-L and CIDEr-D through pycocoevalcap: values checked by hand against the BLEU
paper's own worked example, ROUGE-L and CIDEr-D by hand, and the score stage's rows (each description
against all human descriptions; a human group member never against itself)."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from tests import required
from vlm_decade.models.metrics import CAPTION_METRICS, caption_scores
from vlm_decade.studies.decade.captions import caption_metric_scores


@pytest.fixture(autouse=True)
def _pycocoevalcap_and_java():
    """The reference implementation and the Java runtime it runs its tokenizer and METEOR in."""
    required.module("pycocoevalcap", "pycocoevalcap (the captions extra)")
    required.tool("java")


# Papineni et al. (2002), section 2.1, Example 1: Candidate 1 and its three references.
CANDIDATE = "It is a guide to action which ensures that the military always obeys the commands of the party."
REFERENCES = [
    "It is a guide to action that ensures that the military will forever heed Party commands.",
    "It is the guiding principle which guarantees the military forces always being under the command of the Party.",
    "It is the practical guide for the army always to heed the directions of the party.",
]


def test_bleu_on_the_bleu_paper_s_example():
    # The paper: Candidate 1's modified unigram precision is 17/18 ("obeys" is in no reference). Its
    # 18 words meet a reference of 18 (the closest length), so no brevity penalty: BLEU-1 = 17/18.
    # Bigrams by hand: 10 of its 17 occur in a reference (it is, is a, a guide, guide to, to action,
    # ensures that, that the, the military, of the, the party): BLEU-2 = sqrt(17/18 * 10/17).
    scores = caption_scores([CANDIDATE], [REFERENCES])
    assert scores["BLEU-1"][0] == pytest.approx(17 / 18, abs=1e-8)
    assert scores["BLEU-2"][0] == pytest.approx(math.sqrt(17 / 18 * 10 / 17), abs=1e-8)
    assert list(scores) == list(CAPTION_METRICS)


def test_rouge_l_by_hand():
    # LCS of "a b c d" and "a c d e" is "a c d": P = R = 3/4, F_beta = (1 + b^2) P R / (R + b^2 P) = 3/4.
    assert caption_scores(["a b c d"], [["a c d e"]], ["ROUGE-L"])["ROUGE-L"][0] == pytest.approx(0.75)


def test_cider_d_by_hand():
    # Two images that share no word, each candidate the same as its one reference: every n-gram's
    # vectors coincide, so the clipped cosine is 1 for n = 1..4 with no length penalty: 10 x 1. One
    # image alone gives 0: every n-gram occurs in all (one) reference sets, so its idf is log 1 = 0.
    both = caption_scores(
        ["red apples on a plate", "two dogs run in snow"],
        [["red apples on a plate"], ["two dogs run in snow"]],
        ["CIDEr-D"],
    )["CIDEr-D"]
    assert both.tolist() == pytest.approx([10.0, 10.0])
    assert caption_scores(["red apples"], [["red apples"]], ["CIDEr-D"])["CIDEr-D"].tolist() == [0.0]


def test_bad_calls_are_refused():
    with pytest.raises(ValueError, match="unknown"):
        caption_scores(["a"], [["a"]], ["SPICE"])
    with pytest.raises(ValueError, match="at least one reference"):
        caption_scores(["a"], [[]])


def test_score_stage_rows_against_all_human_descriptions():
    def ref(description_id, image_id, role, text):
        return {"description_id": description_id, "image_id": image_id, "condition": "full", "role": role, "text": text}

    references = pa.Table.from_pylist(
        [
            ref("g1", "i1", "gold", "a man rides a brown horse on the beach"),
            ref("t1", "i1", "top", "a man riding a horse by the sea"),
            ref("o1", "i1", "other", "a horse and its rider on sand"),
            ref("g2", "i2", "gold", "two dogs play in deep snow"),
            ref("t2", "i2", "top", "dogs playing in the snow"),
            ref("o2", "i2", "other", "two puppies in winter"),
            {**ref("m1", "i1", "masked", "a horse"), "condition": "m1"},
        ]
    )
    responses = pa.Table.from_pylist(
        [
            {"subject": "udc", "image_id": "i1", "variant": "full", "status": "ok", "text": "a man on a horse"},
            {"subject": "udc", "image_id": "i2", "variant": "full", "status": "ok", "text": "a dog in the snow"},
            {"subject": "udc", "image_id": "i1", "variant": "m1", "status": "ok", "text": "ignored"},
        ]
    )
    images = pa.table({"image_id": ["i1", "i2"], "dataset": ["d", "d"]})
    table = caption_metric_scores(images, references, responses, ["BLEU-1", "CIDEr-D"])
    got = {(r["subject"], r["image_id"], r["metric"]): r["value"] for r in table.to_pylist()}
    model = caption_scores(
        ["a man on a horse", "a dog in the snow"],
        [
            [
                "a man rides a brown horse on the beach",
                "a man riding a horse by the sea",
                "a horse and its rider on sand",
            ],
            ["two dogs play in deep snow", "dogs playing in the snow", "two puppies in winter"],
        ],
        ["BLEU-1", "CIDEr-D"],
    )
    assert got[("udc", "i1", "BLEU-1")] == pytest.approx(model["BLEU-1"][0])
    assert got[("udc", "i2", "CIDEr-D")] == pytest.approx(model["CIDEr-D"][1])
    # the top-ranked human is scored against the other two descriptions, never against itself
    human = caption_scores(
        ["a man riding a horse by the sea", "dogs playing in the snow"],
        [
            ["a man rides a brown horse on the beach", "a horse and its rider on sand"],
            ["two dogs play in deep snow", "two puppies in winter"],
        ],
        ["BLEU-1"],
    )
    assert got[("human:top", "i1", "BLEU-1")] == pytest.approx(human["BLEU-1"][0])
    assert human["BLEU-1"][0] < 1.0  # against itself it would be 1
    assert {s for s, _, _ in got} == {"udc", "human:top"} and len(got) == 2 * 2 * 2
