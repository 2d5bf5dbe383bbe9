"""Cohen's kappa (by hand and against sklearn) and merging hand labels into automatic ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from vlm_decade.studies.decade.taxonomy.agreement import apply_hand_labels, cohen_kappa


def test_kappa_by_hand():
    #              rater b
    #              yes   no
    # rater a yes    4    1     (a: 5 yes of 10)
    #         no     2    3     (b: 6 yes of 10)
    # p_o = (4 + 3) / 10 = 0.7;  p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5;  kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
    a = [True] * 4 + [True] * 1 + [False] * 2 + [False] * 3
    b = [True] * 4 + [False] * 1 + [True] * 2 + [False] * 3
    assert cohen_kappa(a, b) == pytest.approx(0.4)


def test_kappa_extremes():
    labels = [True, False, True, True, False]
    assert cohen_kappa(labels, labels) == 1.0
    # always disagreeing: p_o = 0, p_e = 3/5 * 2/5 + 2/5 * 3/5 = 12/25, kappa = -(12/25) / (13/25)
    assert cohen_kappa(labels, [not x for x in labels]) == pytest.approx(-12 / 13)
    # both raters constant and equal: perfect agreement, nothing beyond chance -> undefined
    assert math.isnan(cohen_kappa([True] * 4, [True] * 4))
    assert math.isnan(cohen_kappa([False] * 3, [False] * 3))
    # constant but different: p_e = 0, p_o = 0 -> 0
    assert cohen_kappa([True] * 3, [False] * 3) == 0.0


def test_kappa_matches_sklearn_on_random_labels():
    rng = np.random.default_rng(20240611)
    for _ in range(200):
        n = int(rng.integers(2, 60))
        a = rng.random(n) < rng.random()
        b = np.where(rng.random(n) < 0.7, a, rng.random(n) < 0.5)
        if len(set(a)) == 1 and set(a) == set(b):
            continue  # the undefined case, tested above
        assert cohen_kappa(list(a), list(b)) == pytest.approx(cohen_kappa_score(a, b), abs=1e-12)


def test_kappa_refuses_mismatched_or_empty_input():
    with pytest.raises(ValueError, match="different numbers"):
        cohen_kappa([True], [True, False])
    with pytest.raises(ValueError, match="at least one"):
        cohen_kappa([], [])


def row(subject, image_id, error_type, present, **extra):
    return {"subject": subject, "image_id": image_id, "error_type": error_type, "present": present, **extra}


AUTO = [
    row("udc", "img1", "detection", True, evidence="[]"),
    row("udc", "img1", "hallucination", False, evidence="[]"),
    row("udc", "img2", "detection", False, evidence="[]"),
    row("udc", "img2", "hallucination", True, evidence="[]"),
    row("gpt", "img1", "detection", False, evidence="[]"),
]
HAND = [
    row("udc", "img1", "detection", "false", note="the flashlight is in the detector's box"),
    row("udc", "img2", "detection", "false"),
    row("udc", "img2", "hallucination", True),
    row("gpt", "img1", "detection", "1"),
    row("m2m", "img1", "scene_understanding", True),
]


def test_hand_labels_override_automatic_ones():
    merged, _ = apply_hand_labels(AUTO, HAND)
    assert [(r["subject"], r["image_id"], r["error_type"], r["present"], r["source"]) for r in merged] == [
        ("udc", "img1", "detection", False, "hand"),
        ("udc", "img1", "hallucination", False, "auto"),
        ("udc", "img2", "detection", False, "hand"),
        ("udc", "img2", "hallucination", True, "hand"),
        ("gpt", "img1", "detection", True, "hand"),
        ("m2m", "img1", "scene_understanding", True, "hand"),
    ]
    first = merged[0]
    assert first["note"] == "the flashlight is in the detector's box"
    assert first["auto_present"] is True and first["evidence"] == "[]"
    assert "note" not in merged[2] and "auto_present" not in merged[1]


def test_agreement_per_error_type():
    _, agreement = apply_hand_labels(AUTO, HAND)
    assert list(agreement) == ["detection", "hallucination", "scene_understanding"]
    # detection: hand [F, F, T] vs auto [T, F, F]: p_o = 1/3; p_e = 1/3*1/3 + 2/3*2/3 = 5/9;
    # kappa = (1/3 - 5/9) / (1 - 5/9) = -0.5
    det = agreement["detection"]
    assert det["n"] == 3
    assert det["observed_agreement"] == pytest.approx(1 / 3)
    assert det["kappa"] == pytest.approx(-0.5)
    # hallucination: one row, both say present: agreement 1, kappa undefined
    hal = agreement["hallucination"]
    assert hal["n"] == 1 and hal["observed_agreement"] == 1.0 and math.isnan(hal["kappa"])
    # scene understanding: hand-labelled only, nothing to compare
    scene = agreement["scene_understanding"]
    assert scene["n"] == 0 and math.isnan(scene["kappa"]) and math.isnan(scene["observed_agreement"])


def test_without_hand_labels_everything_is_automatic():
    merged, agreement = apply_hand_labels(AUTO, [])
    assert [r["source"] for r in merged] == ["auto"] * len(AUTO)
    assert agreement == {}


def test_undecided_automatic_labels_are_overridden_but_not_compared():
    auto = [row("udc", "img3", "detection", None), row("udc", "img4", "detection", False)]
    hand = [
        row("udc", "img3", "detection", "true"),
        row("udc", "img4", "detection", False),
        row("udc", "img5", "detection", ""),
    ]  # no label given: ignored
    merged, agreement = apply_hand_labels(auto, hand)
    assert [(r["image_id"], r["present"], r["source"], r.get("auto_present", "-")) for r in merged] == [
        ("img3", True, "hand", None),
        ("img4", False, "hand", False),
    ]
    assert agreement["detection"]["n"] == 1
    # an undecided automatic row without a hand label stays undecided
    merged, agreement = apply_hand_labels(auto, [])
    assert [r["present"] for r in merged] == [None, False] and agreement == {}


@pytest.mark.parametrize(
    "auto, hand, message",
    [
        (AUTO + AUTO[:1], [], "given twice"),
        (AUTO, HAND + HAND[:1], "given twice"),
        (AUTO, [row("udc", "img1", "detection", "perhaps")], "not a yes/no"),
        ([{"subject": "udc", "image_id": "img1", "present": True}], [], "lacks error_type"),
    ],
)
def test_bad_rows_are_refused(auto, hand, message):
    with pytest.raises(ValueError, match=message):
        apply_hand_labels(auto, hand)
