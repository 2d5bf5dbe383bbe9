"""The error taxonomy's glue: labels per (model, image) from detector boxes and probe transcripts, hand
labels over automatic ones with Cohen's kappa, error rates and error impact as scores, the hand-label
file check and the detections stage's rows. Every expectation is worked by hand from hand-set vectors."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import cohen_kappa_score

import vlm_decade.stats.analysis as analysis_module
from vlm_decade.core.errors import Problems
from vlm_decade.models.backends.detection import Detection
from vlm_decade.models.encoders import text_key
from vlm_decade.stages.describe.plan import Job
from vlm_decade.stages.embed import EMBEDDINGS_SCHEMA
from vlm_decade.stats import SCORES_SCHEMA, ComparisonSpec, Term
from vlm_decade.studies import study_from_dict
from vlm_decade.studies.decade.taxonomy import analysis, stages
from vlm_decade.studies.decade.taxonomy.analysis import (
    ERROR_TYPES,
    NO_ERROR,
    error_scores,
    errors_table,
    impact_family,
    impact_scores,
    object_labels,
    spatial_labels,
)
from vlm_decade.studies.decade.taxonomy.detect import DETECTIONS_SCHEMA, DetectActor, detections_of
from vlm_decade.studies.decade.taxonomy.hand import HAND_SCHEMA, check_hand_labels
from vlm_decade.studies.decade.taxonomy.objects import ObjectMatcher
from vlm_decade.studies.decade.taxonomy.probes import Question, first_round
from vlm_decade.studies.decade.taxonomy.probing import PROBES_SCHEMA
from vlm_decade.studies.decade.taxonomy.rules import ERROR_TYPES as OBJECT_ERROR_TYPES
from vlm_decade.studies.decade.taxonomy.spatial import SpatialRow

from .taxonomy_cases import axis_vector, det, hand_matcher, mentions

# Cosines by construction: cat/dog 0.6 (confusable, no match), sofa/couch 0.8 (a match); every
# other pair 0.
VECTORS = {
    "cat": axis_vector((0, 1.0)),
    "dog": axis_vector((0, 0.6), (1, 0.8)),
    "frisbee": axis_vector((2, 1.0)),
    "car": axis_vector((3, 1.0)),
    "tv": axis_vector((4, 1.0)),
    "sofa": axis_vector((5, 1.0)),
    "couch": axis_vector((5, 0.8), (6, 0.6)),
    "remote": axis_vector((7, 1.0)),
}


def fake_matcher() -> ObjectMatcher:
    return hand_matcher(VECTORS.__getitem__)


def by_key(rows):
    return {(r["subject"], r["image_id"], r["error_type"]): r for r in rows}


# -- object labels ----------------------------------------------------------------------------------

RELEVANT = {"i1": mentions("cat", "frisbee", "car"), "i2": mentions("sofa", "remote"), "i3": mentions("cat")}
DETECTIONS = {"i1": [det("cat"), det("car")], "i2": [det("couch"), det("remote")], "i3": None}
PAIRS = [
    ("local", "i1", "d1", "a dog, a car and a tv"),
    ("local", "i2", "d1", "a sofa"),
    ("local", "i3", "d2", "a cat"),
    ("api", "i1", "d1", "a car and a tv"),
    ("api", "i2", "d1", "a sofa"),
]
MENTIONED = {
    ("local", "i1"): mentions("dog", "car", "tv"),
    ("local", "i2"): mentions("sofa"),
    ("local", "i3"): mentions("cat"),
    ("api", "i1"): mentions("car", "tv"),
    ("api", "i2"): mentions("sofa"),
}
TRANSCRIPTS = {  # ("api", "i2") has none: its probes failed
    ("api", "i1"): [
        (Question("detection", "cat", "frisbee", "Is there a cat near the frisbee?"), "Yes."),
        (Question("detection", "frisbee", "cat", "Is there a frisbee near the cat?"), "No."),
        (Question("location", "tv", "car", "Is there an object near the car?"), "No, there is nothing there."),
        (Question("recognition", "cat", "frisbee", "What is the object near the frisbee?"), "A dog."),
    ]
}


# No human named a tv on i1 and no verifier found one (existence.check's verdict).
EXISTENCE = {
    ("api", "i1"): {"tv": {"object": "tv", "present": False, "checks": [{"source": "humans", "found": False}]}}
}


@pytest.fixture(scope="module")
def labels():
    return object_labels(
        PAIRS,
        RELEVANT,
        MENTIONED,
        DETECTIONS,
        TRANSCRIPTS,
        {"api"},
        fake_matcher(),
        0.45,
        EXISTENCE,
        {"i1": ["cat", "frisbee", "car"]},
    )


def present(rows, subject, image_id):
    found = by_key(rows)
    return {t: found[(subject, image_id, t)]["present"] for t in OBJECT_ERROR_TYPES}


def test_detector_labelled_pair_follows_the_rules(labels):
    # i1: frisbee neither mentioned nor detected -> detection; cat detected, unmentioned, and "dog"
    # (cosine 0.6 >= 0.45) names nothing else -> recognition; tv matches nothing -> hallucination.
    assert present(labels, "local", "i1") == {
        "detection": True,
        "recognition": True,
        "scene_understanding": False,
        "hallucination": True,
    }
    # i2: the remote is detected but left out and nothing misnames it -> scene understanding only.
    assert present(labels, "local", "i2") == {
        "detection": False,
        "recognition": False,
        "scene_understanding": True,
        "hallucination": False,
    }
    rec = by_key(labels)[("local", "i1", "recognition")]
    evidence = json.loads(rec["evidence"])
    assert rec["method"] == "detector" and rec["dataset"] == "d1"
    assert evidence["relevant"] == ["cat", "frisbee", "car"] and evidence["mentioned"] == ["dog", "car", "tv"]
    assert [(f["object"], f["named_as"]) for f in evidence["findings"]] == [("cat", "dog")]


def test_probe_labelled_pair_follows_the_transcript(labels):
    # frisbee: "No." -> detection; cat: "Yes.", then "A dog." (0.6 < 0.72) -> recognition; tv: found by
    # no one, and nothing where the description puts it (near the car) -> hallucination. The api
    # model's boxes are never read (no detection labels of i1's detector).
    assert present(labels, "api", "i1") == {
        "detection": True,
        "recognition": True,
        "scene_understanding": False,
        "hallucination": True,
    }
    row = by_key(labels)[("api", "i1", "recognition")]
    assert row["method"] == "probe"
    assert json.loads(row["evidence"])["findings"][0]["named_as"] == "dog"
    # The hallucination row keeps the whole chain: what was checked, where it was asked, the answer.
    evidence = json.loads(by_key(labels)[("api", "i1", "hallucination")]["evidence"])
    assert evidence["checked"] == [EXISTENCE[("api", "i1")]["tv"]]
    (chain,) = evidence["findings"]
    assert chain["existence"]["present"] is False and chain["reference"] == "car"
    assert chain["transcript"] == [
        {
            "kind": "location",
            "question": "Is there an object near the car?",
            "answer": "No, there is nothing there.",
            "reading": "no",
        }
    ]


def test_a_mention_other_humans_named_is_no_hallucination_for_a_detector_labelled_model():
    # "a dog, a car and a tv": the tv is in no detection and not in the gold, but a worker named it.
    seen = {
        ("local", "i1"): {
            "tv": {"object": "tv", "present": True, "checks": [{"source": "humans", "found": True}]},
            "dog": {"object": "dog", "present": False, "checks": []},
        }
    }
    rows = object_labels(PAIRS[:1], RELEVANT, MENTIONED, DETECTIONS, {}, set(), fake_matcher(), 0.45, seen)
    assert present(rows, "local", "i1")["hallucination"] is False
    assert present(rows, "local", "i1")["recognition"] is True  # the dog still misnames the cat


def test_undecidable_pairs_give_null_rows_with_the_reason(labels):
    found = by_key(labels)
    for subject, image_id, method, why in (
        ("local", "i3", "detector", "the detector failed on this image"),
        ("api", "i2", "probe", "no probe answers for this image"),
    ):
        for t in OBJECT_ERROR_TYPES:
            row = found[(subject, image_id, t)]
            assert row["present"] is None and row["method"] == method
            assert json.loads(row["evidence"]) == {"undecided": why}
    assert len(labels) == 4 * len(PAIRS)


def test_spatial_labels_carry_the_sde_and_its_numbers():
    rows = [
        SpatialRow(
            "m", "i1", "d1", ("m1", "m2", "m3"), (0.1, 0.5, 0.9), (0.9, 0.5, 0.1), -1.0, 0.8, 0.1, -18.0, 9, 9, True, ""
        ),
        SpatialRow(
            "m",
            "i2",
            "d2",
            ("m1", "m2", "m3"),
            (0.1, 0.5, 0.9),
            (0.1, 0.5, 0.9),
            None,
            None,
            None,
            None,
            1,
            0,
            None,
            "too few",
        ),
    ]
    out = spatial_labels(rows)
    assert [(r["subject"], r["image_id"], r["dataset"], r["error_type"], r["present"], r["method"]) for r in out] == [
        ("m", "i1", "d1", "spatial_dependence", True, "masks"),
        ("m", "i2", "d2", "spatial_dependence", None, "masks"),
    ]
    assert json.loads(out[0]["evidence"])["model_r"] == -1.0
    assert json.loads(out[1]["evidence"])["reason"] == "too few"


# -- hand labels and agreement ----------------------------------------------------------------------

DATASET_OF = {"i1": "d1", "i2": "d1", "i3": "d2"}
# Automatic detection labels of 2 models x 3 images, hallucination labels of the same pairs ((b, i3)
# undecided).
AUTO_DETECTION = {
    ("a", "i1"): True,
    ("a", "i2"): False,
    ("a", "i3"): False,
    ("b", "i1"): False,
    ("b", "i2"): True,
    ("b", "i3"): True,
}
AUTO_HALLUCINATION = {
    ("a", "i1"): True,
    ("a", "i2"): False,
    ("a", "i3"): False,
    ("b", "i1"): True,
    ("b", "i2"): False,
    ("b", "i3"): None,
}


def auto_rows():
    rows = []
    for error_type, labels_ in (("hallucination", AUTO_HALLUCINATION), ("detection", AUTO_DETECTION)):
        for (subject, image_id), value in labels_.items():
            rows.append(
                {
                    "subject": subject,
                    "image_id": image_id,
                    "dataset": DATASET_OF[image_id],
                    "error_type": error_type,
                    "present": value,
                    "method": "detector",
                    "evidence": json.dumps({"auto": True}),
                }
            )
    return rows


# Hand detection on 5 of the 6 pairs; hand hallucination on 3 decided pairs and on the undecided one;
# a hand SDE label with no automatic row.
HAND = [
    ("a", "i1", "detection", True),
    ("a", "i2", "detection", True),
    ("a", "i3", "detection", False),
    ("b", "i1", "detection", False),
    ("b", "i2", "detection", True),
    ("a", "i1", "hallucination", True),
    ("a", "i2", "hallucination", False),
    ("b", "i1", "hallucination", False),
    ("b", "i3", "hallucination", True),
    ("a", "i2", "spatial_dependence", True),
]


def hand_table():
    return pa.Table.from_pylist([dict(zip(HAND_SCHEMA.names, h)) for h in HAND], schema=HAND_SCHEMA)


def test_errors_table_without_hand_labels_is_sorted_and_untouched():
    table, agreement = errors_table(auto_rows(), None, DATASET_OF)
    rows = table.to_pylist()
    assert table.schema == analysis.ERRORS_SCHEMA and agreement.num_rows == 0
    # Sorted by subject, image, then the error types' order (detection before hallucination).
    assert [(r["subject"], r["image_id"], r["error_type"]) for r in rows][:3] == [
        ("a", "i1", "detection"),
        ("a", "i1", "hallucination"),
        ("a", "i2", "detection"),
    ]
    assert {r["method"] for r in rows} == {"detector"}
    assert by_key(rows)[("b", "i3", "hallucination")]["present"] is None


def test_hand_labels_win_and_are_marked_hand():
    table, _ = errors_table(auto_rows(), hand_table(), DATASET_OF)
    rows = by_key(table.to_pylist())
    for subject, image_id, error_type, value in HAND:
        row = rows[(subject, image_id, error_type)]
        assert (row["present"], row["method"], row["dataset"]) == (value, "hand", DATASET_OF[image_id])
    # The one automatic detection label nobody checked stays as it was.
    assert (rows[("b", "i3", "detection")]["present"], rows[("b", "i3", "detection")]["method"]) == (True, "detector")
    # A hand label over an automatic one keeps the automatic evidence and says what the automatic
    # label was; a hand-only row had none.
    assert json.loads(rows[("a", "i2", "detection")]["evidence"]) == {"auto": True, "hand": "", "auto_present": False}
    assert json.loads(rows[("a", "i2", "spatial_dependence")]["evidence"]) == {"hand": "", "auto_present": None}
    assert table.num_rows == len(auto_rows()) + 1


def test_kappa_per_error_type_matches_hand_computation_and_sklearn():
    _, agreement = errors_table(auto_rows(), hand_table(), DATASET_OF)
    got = {r["error_type"]: r for r in agreement.to_pylist()}
    assert list(got) == ["detection", "hallucination", "spatial_dependence"]
    # detection: hand T T F F T vs auto T F F F T. p_o = 4/5, p_e = 3/5*2/5 + 2/5*3/5 = 0.48,
    # kappa = 0.32 / 0.52 = 8/13.
    hand_d, auto_d = [True, True, False, False, True], [True, False, False, False, True]
    assert got["detection"]["n"] == 5 and got["detection"]["observed_agreement"] == pytest.approx(0.8)
    assert got["detection"]["kappa"] == pytest.approx(8 / 13)
    assert got["detection"]["kappa"] == pytest.approx(cohen_kappa_score(hand_d, auto_d))
    # hallucination: the undecided automatic label is left out; hand T F F vs auto T F T.
    # p_o = 2/3, p_e = 1/3*2/3 + 2/3*1/3 = 4/9, kappa = (2/9) / (5/9) = 0.4.
    assert got["hallucination"]["n"] == 3 and got["hallucination"]["kappa"] == pytest.approx(0.4)
    assert got["hallucination"]["kappa"] == pytest.approx(cohen_kappa_score([True, False, False], [True, False, True]))
    # spatial dependence: hand labels only, nothing to agree with.
    assert got["spatial_dependence"]["n"] == 0 and math.isnan(got["spatial_dependence"]["kappa"])


def test_error_scores_are_zero_one_or_null():
    table, _ = errors_table(auto_rows(), None, DATASET_OF)
    scores = error_scores(table)
    assert scores.schema == SCORES_SCHEMA
    got = {
        (r["subject"], r["image_id"], r["metric"]): (r["value"], r["dataset"], r["variant"]) for r in scores.to_pylist()
    }
    assert got[("a", "i1", "detection")] == (1.0, "d1", "full")
    assert got[("a", "i2", "detection")] == (0.0, "d1", "full")
    assert got[("b", "i3", "hallucination")] == (None, "d2", "full")
    assert len(got) == table.num_rows


# -- error impact -----------------------------------------------------------------------------------

METRIC = "SBERT-SI"


def errors_of(labelled: dict[tuple[str, str], dict[str, bool | None]]) -> pa.Table:
    rows = [
        {
            "subject": s,
            "image_id": i,
            "dataset": DATASET_OF[i],
            "error_type": t,
            "present": v,
            "method": "detector",
            "evidence": "{}",
        }
        for (s, i), types in labelled.items()
        for t, v in types.items()
    ]
    return pa.Table.from_pylist(rows, schema=analysis.ERRORS_SCHEMA)


def flags(*on, undecided=()):
    return {t: (None if t in undecided else t in on) for t in ERROR_TYPES}


def similarity_scores(values: dict[tuple[str, str], float]) -> pa.Table:
    rows = [
        {"subject": s, "image_id": i, "dataset": DATASET_OF[i], "variant": "full", "metric": METRIC, "value": v}
        for (s, i), v in values.items()
    ]
    # Rows that must not count: another metric, a masked variant, a subject without labels.
    rows += [
        {"subject": "a", "image_id": "i1", "dataset": "d1", "variant": "full", "metric": "other", "value": 0.0},
        {"subject": "a", "image_id": "i1", "dataset": "d1", "variant": "m1", "metric": METRIC, "value": 0.0},
        {"subject": "human:top", "image_id": "i1", "dataset": "d1", "variant": "full", "metric": METRIC, "value": 0.0},
    ]
    return pa.Table.from_pylist(rows, schema=SCORES_SCHEMA)


IMPACT_ERRORS = {
    ("a", "i1"): flags("detection", "hallucination"),
    ("b", "i1"): flags("detection"),
    ("a", "i2"): flags(),
    ("b", "i2"): flags(),
    ("a", "i3"): flags("recognition"),
    ("b", "i3"): flags(),
}
IMPACT_SIMILARITY = {
    ("a", "i1"): 0.2,
    ("b", "i1"): 0.6,
    ("a", "i2"): 0.8,
    ("b", "i2"): 0.3,
    ("a", "i3"): 0.4,
    ("b", "i3"): 0.9,
}


def test_impact_is_the_mean_similarity_per_image_and_group_with_its_pairs_as_weight():
    impact = impact_scores(errors_of(IMPACT_ERRORS), similarity_scores(IMPACT_SIMILARITY), METRIC)
    got = {(r["subject"], r["image_id"]): (r["value"], r["weight"]) for r in impact.to_pylist()}
    # (a, i1) has two error types: it counts in both groups, and never as "no error".
    assert got == {
        ("error:detection", "i1"): (pytest.approx((0.2 + 0.6) / 2), 2.0),
        ("error:hallucination", "i1"): (pytest.approx(0.2), 1.0),
        ("error:recognition", "i3"): (pytest.approx(0.4), 1.0),
        (NO_ERROR, "i2"): (pytest.approx((0.8 + 0.3) / 2), 2.0),
        (NO_ERROR, "i3"): (pytest.approx(0.9), 1.0),
    }
    assert set(impact.column("dataset").to_pylist()) == {"all"}
    assert set(impact.column("metric").to_pylist()) == {METRIC}
    assert analysis.impact_pairs(impact) == {
        "error:detection": 2,
        "error:hallucination": 1,
        "error:recognition": 1,
        NO_ERROR: 3,
    }


def test_impact_is_a_mean_over_model_image_pairs_resampled_by_image():
    # The paper's figure 8 averages model-image pairs: "no error" holds (a, i2) 0.8, (b, i2) 0.3 and
    # (b, i3) 0.9, so its estimate is 2.0 / 3, not the mean of the image means ((0.55 + 0.9) / 2).
    from vlm_decade.stats import BootstrapOptions, _core, _streams, bootstrap_study

    impact = impact_scores(errors_of(IMPACT_ERRORS), similarity_scores(IMPACT_SIMILARITY), METRIC)
    result = bootstrap_study(
        impact, {}, BootstrapOptions(1000, 7, families=[impact_family(impact)], keep_distributions=True, use_ray=False)
    )
    stats = {r["subject"]: r for r in result.stats.to_pylist()}
    assert stats[NO_ERROR]["estimate"] == pytest.approx(2.0 / 3) and stats[NO_ERROR]["n_images"] == 2
    assert stats["error:detection"]["estimate"] == pytest.approx(0.4)
    # By hand, from the engine's own resample counts over the three images (i1, i2, i3): per resample
    # the sum of the pairs' values over the sum of their numbers, each image drawn with all its pairs.
    counts = np.vstack(
        [
            _core.multinomial_counts(np.random.default_rng(ss), b, 3)
            for ss, b in zip(_streams.chunk_streams(7, "all", _streams.KIND_MULTINOMIAL, 2), _streams.chunk_sizes(1000))
        ]
    )
    sums, pairs = np.array([0.0, 1.1, 0.9]), np.array([0.0, 2.0, 1.0])
    with np.errstate(invalid="ignore"):
        by_hand = counts @ sums / (counts @ pairs)
    assert result.distributions[(NO_ERROR, "all", METRIC, "full")] == pytest.approx(by_hand, nan_ok=True)


def test_undecided_pair_is_not_counted_as_error_free():
    errors = {**IMPACT_ERRORS, ("b", "i3"): flags(undecided=ERROR_TYPES)}
    impact = impact_scores(errors_of(errors), similarity_scores(IMPACT_SIMILARITY), METRIC)
    got = {(r["subject"], r["image_id"]) for r in impact.to_pylist()}
    assert (NO_ERROR, "i3") not in got


def test_an_undecided_sde_is_not_no_error():
    # (b, i3): its four object labels are decided and absent, but its spatial dependence is undecided.
    errors = {**IMPACT_ERRORS, ("b", "i3"): flags(undecided=("spatial_dependence",))}
    impact = impact_scores(errors_of(errors), similarity_scores(IMPACT_SIMILARITY), METRIC)
    assert (NO_ERROR, "i3") not in {(r["subject"], r["image_id"]) for r in impact.to_pylist()}
    # a model without masked variants has no SDE label at all: its four object labels decide
    no_sde = {key: {t: v for t, v in flags().items() if t != "spatial_dependence"} for key in [("b", "i3")]}
    impact = impact_scores(errors_of({**IMPACT_ERRORS, **no_sde}), similarity_scores(IMPACT_SIMILARITY), METRIC)
    assert (NO_ERROR, "i3") in {(r["subject"], r["image_id"]) for r in impact.to_pylist()}


def test_impact_family_compares_each_error_group_with_no_error_and_the_types_with_each_other():
    impact = impact_scores(errors_of(IMPACT_ERRORS), similarity_scores(IMPACT_SIMILARITY), METRIC)
    family = impact_family(impact)
    base = Term.subject(NO_ERROR, "all")
    assert family.name == "impact"
    assert family.specs == tuple(
        ComparisonSpec(Term.subject(f"error:{t}", "all"), base) for t in ("detection", "recognition", "hallucination")
    )
    # every group present: the paper's scene understanding and SDE comparisons join them
    every = {(s, i): flags(t) for s, i, t in zip("abcde", ("i1", "i2", "i3", "i1", "i2"), ERROR_TYPES)} | {
        ("f", "i3"): flags()
    }
    scores = similarity_scores({key: 0.5 for key in every})
    specs = [(s.a.label, s.b.label) for s in impact_family(impact_scores(errors_of(every), scores, METRIC)).specs]
    group = {t: f"error:{t}" for t in ERROR_TYPES}
    assert specs == [(group[t], NO_ERROR) for t in ERROR_TYPES] + [
        (group["scene_understanding"], group[t]) for t in ("detection", "recognition", "hallucination")
    ] + [
        (group["spatial_dependence"], group[t])
        for t in ("detection", "recognition", "scene_understanding", "hallucination")
    ]


def test_impact_family_is_empty_without_error_free_pairs():
    every_pair_errs = {key: flags("detection") for key in IMPACT_ERRORS}
    impact = impact_scores(errors_of(every_pair_errs), similarity_scores(IMPACT_SIMILARITY), METRIC)
    assert set(impact.column("subject").to_pylist()) == {"error:detection"}
    assert impact_family(impact).specs == ()


# -- the errors stage: an API model whose description needs no probe, or whose probes failed --------


def probe_row(kind, obj, status):
    return {
        "subject": "api",
        "image_id": "i1",
        "round": 1,
        "kind": kind,
        "object": obj,
        "anchor": "",
        "question": "?",
        "answer": "",
        "status": status,
        "error": "",
        "cost_usd": 0.0,
    }


@pytest.mark.parametrize(
    ("said", "probe_rows", "expected"),
    [
        # "A sofa." for an image whose gold names only a sofa: nothing to ask, nothing wrong.
        (["sofa"], [], {t: False for t in OBJECT_ERROR_TYPES}),
        # "A sofa and a tv.": the presence question about the tv failed, so nothing is known.
        (["sofa", "tv"], [probe_row("presence", "tv", "error")], {t: None for t in OBJECT_ERROR_TYPES}),
    ],
)
def test_probed_pair_labels_from_the_errors_stage(monkeypatch, said, probe_rows, expected):
    study = study_from_dict(
        {
            "name": "s",
            "data": {"images": "i.csv", "image_dir": "img", "descriptions": "d.csv"},
            "models": [{"name": "api", "backend": "openai", "model_id": "gpt-4o-mini", "era": "mllm"}],
            "taxonomy": {},
        }
    )
    relevant, mentioned = {"i1": mentions("sofa")}, {("api", "i1"): mentions(*said)}
    absent = [n for n in said if n != "sofa"]
    assert len(first_round(relevant["i1"], mentioned[("api", "i1")], fake_matcher(), absent=absent)) == len(probe_rows)
    monkeypatch.setattr(stages, "objects", lambda references, pairs: (relevant, mentioned))
    monkeypatch.setattr(stages, "human_objects", lambda references: {"i1": (("sofa",),)})
    monkeypatch.setattr(stages, "matcher_for", lambda study: fake_matcher())
    gold, masked = "a sofa in a room", "a room"
    tables = {
        "images": pa.table({"image_id": ["i1"], "dataset": ["d1"]}),
        "references": pa.Table.from_pylist(
            [
                {
                    "description_id": "g",
                    "image_id": "i1",
                    "dataset": "d1",
                    "condition": "full",
                    "worker_id": "w0",
                    "role": "gold",
                    "text": gold,
                },
                {
                    "description_id": "x",
                    "image_id": "i1",
                    "dataset": "d1",
                    "condition": "m1",
                    "worker_id": "w1",
                    "role": "masked",
                    "text": masked,
                },
            ]
        ),
        "responses": pa.Table.from_pylist(
            [{"subject": "api", "image_id": "i1", "variant": "full", "status": "ok", "text": "..."}]
        ),
        "detections": pa.Table.from_pylist(
            [{"image_id": "i1", "status": "ok", "error": "", "detections": []}], schema=DETECTIONS_SCHEMA
        ),
        "probes": pa.Table.from_pylist(probe_rows, schema=PROBES_SCHEMA),
        "embeddings": pa.Table.from_pylist(
            [
                {"text_sha256": text_key(t), "encoder": "SBERT-SI", "encoder_key": "k", "dim": 2, "vector": v}
                for t, v in ((gold, [1.0, 0.0]), (masked, [0.6, 0.8]))
            ],
            schema=EMBEDDINGS_SCHEMA,
        ),
    }
    errors = stages.compute_errors(study, tables.__getitem__, None)["errors"]
    rows = [r for r in errors.to_pylist() if r["subject"] == "api"]
    assert {r["error_type"]: r["present"] for r in rows} == expected
    assert {r["method"] for r in rows} == {"probe"}


# -- the hand-label file ----------------------------------------------------------------------------

SUBJECTS, IMAGES = ["a", "b"], ["i1", "i2"]


def check(path):
    problems = Problems()
    table = check_hand_labels(path, SUBJECTS, IMAGES, ERROR_TYPES, problems)
    return table, problems.items


def test_good_hand_label_file_gives_the_sorted_table(tmp_path):
    path = tmp_path / "hand.csv"
    path.write_text(
        "subject,image_id,error_type,present,note\n"
        "b,i2,hallucination,yes,\n"
        "a,i1,spatial_dependence, FALSE ,\n"
        "a,i1,detection,1,seen by me\n"
        "a,i2,recognition,No,\n"
    )
    table, problems = check(path)
    assert problems == []
    assert table.schema == HAND_SCHEMA
    assert table.to_pylist() == [
        {"subject": "a", "image_id": "i1", "error_type": "detection", "present": True, "note": "seen by me"},
        {"subject": "a", "image_id": "i1", "error_type": "spatial_dependence", "present": False, "note": ""},
        {"subject": "a", "image_id": "i2", "error_type": "recognition", "present": False, "note": ""},
        {"subject": "b", "image_id": "i2", "error_type": "hallucination", "present": True, "note": ""},
    ]


def test_parquet_hand_labels_with_a_boolean_column(tmp_path):
    path = tmp_path / "hand.parquet"
    pq.write_table(
        pa.table(
            {
                "subject": ["b", "a"],
                "image_id": ["i1", "i1"],
                "error_type": ["detection", "detection"],
                "present": [False, True],
            }
        ),
        path,
    )
    table, problems = check(path)
    assert problems == []
    assert table.to_pylist() == [  # no note column: notes are empty
        {"subject": "a", "image_id": "i1", "error_type": "detection", "present": True, "note": ""},
        {"subject": "b", "image_id": "i1", "error_type": "detection", "present": False, "note": ""},
    ]


def test_every_bad_hand_label_names_file_row_and_field(tmp_path):
    path = tmp_path / "hand.csv"
    path.write_text(
        "subject,image_id,error_type,present\n"
        "a,i1,detection,true\n"  # row 2: good
        "zz,i1,detection,true\n"  # row 3
        "a,i9,detection,true\n"  # row 4
        "a,i1,blur,true\n"  # row 5
        "a,i2,detection,maybe\n"  # row 6
        "a,i2,hallucination,\n"  # row 7
        "a,i1,detection,false\n"  # row 8: a second label for row 2's key
    )
    table, problems = check(path)
    where = sorted((p.row, p.field) for p in problems)
    assert where == [
        (3, "subject"),
        (4, "image_id"),
        (5, "error_type"),
        (6, "present"),
        (7, "present"),
        (8, "error_type"),
    ]
    assert {p.file for p in problems} == {str(path)}
    message = {p.row: p.message for p in problems}
    assert "zz" in message[3] and "i9" in message[4] and "blur" in message[5] and "maybe" in message[6]
    assert "empty" in message[7] and "first at row 2" in message[8]
    assert table.to_pylist() == [
        {"subject": "a", "image_id": "i1", "error_type": "detection", "present": True, "note": ""}
    ]


def test_missing_column_is_a_header_problem(tmp_path):
    path = tmp_path / "hand.csv"
    path.write_text("subject,image_id,error_type\na,i1,detection\n")
    table, problems = check(path)
    assert table is None
    assert [(p.file, p.row, p.field) for p in problems] == [(str(path), 1, "present")]


# -- the detections stage -----------------------------------------------------------------------------


class Loaded:
    def __init__(self, image):
        self.image = image


class FakeDetector:
    """Answers per image the detections set for it (by the image's first pixel); records its calls."""

    def __init__(self, answers, fail=False):
        self.answers, self.fail, self.calls = answers, fail, []

    def detect(self, images):
        self.calls.append([int(im[0, 0, 0]) for im in images])
        if self.fail:
            raise RuntimeError("out of memory")
        return [self.answers[int(im[0, 0, 0])] for im in images]


def jobs(*image_ids):
    return [Job("detector", i, "full", "", "", f"/x/{i}.png", None, "") for i in image_ids]


def image(value):
    return np.full((2, 2, 3), value, dtype=np.uint8)


def actor_with(backend) -> DetectActor:
    actor = object.__new__(DetectActor)  # the backend is set by hand, not built from a config
    actor.backend = backend
    return actor


def test_detect_rows_keep_each_image_apart():
    backend = FakeDetector({1: [Detection("cat", 0.8, (0.0, 0.1, 0.5, 0.6))], 3: []})
    rows = actor_with(backend).detect(jobs("i1", "i2", "i3"), [Loaded(image(1)), "cannot decode i2", Loaded(image(3))])
    assert backend.calls == [[1, 3]]  # the undecodable image is never sent
    assert rows == [
        {
            "image_id": "i1",
            "status": "ok",
            "error": "",
            "detections": [{"label": "cat", "score": 0.8, "x0": 0.0, "y0": 0.1, "x1": 0.5, "y1": 0.6}],
        },
        {"image_id": "i2", "status": "error", "error": "cannot decode i2", "detections": []},
        {"image_id": "i3", "status": "ok", "error": "", "detections": []},
    ]
    found = detections_of(pa.Table.from_pylist(rows, schema=DETECTIONS_SCHEMA))
    # No detections ([]) is told apart from a failure (None).
    assert found == {"i1": [Detection("cat", 0.8, (0.0, 0.1, 0.5, 0.6))], "i2": None, "i3": []}


def test_a_failing_batch_is_an_error_on_every_image():
    rows = actor_with(FakeDetector({}, fail=True)).detect(jobs("i1", "i2"), [Loaded(image(1)), "cannot decode i2"])
    assert [(r["image_id"], r["status"], r["error"]) for r in rows] == [
        ("i1", "error", "RuntimeError: out of memory"),
        ("i2", "error", "cannot decode i2"),
    ]
    assert detections_of(pa.Table.from_pylist(rows, schema=DETECTIONS_SCHEMA)) == {"i1": None, "i2": None}


def test_error_stats_of_a_huge_study_keep_their_poisson_shards(monkeypatch):
    """The error_stats stage's analyses (error rates, impact) in Poisson mode, as a study above
    200,000 images has them: a second run with the shards' sums kept resamples none, and gives the
    tables the first (and a run keeping nothing) gave."""
    from vlm_decade.stats import ShardSums

    class Counted(ShardSums):
        computed = 0

        def put(self, key, sums, totals):
            type(self).computed += 1
            super().put(key, sums, totals)

    monkeypatch.setattr(analysis_module, "POISSON_AUTO_IMAGES", 0)
    study = study_from_dict(
        {
            "name": "s",
            "data": {"images": "i.csv", "image_dir": "img", "descriptions": "d.csv"},
            "models": [
                {"name": "a", "backend": "openai", "model_id": "gpt-4o-mini", "era": "mllm"},
                {"name": "b", "backend": "openai", "model_id": "gpt-4o", "era": "pre-mllm"},
            ],
            "taxonomy": {},
            "statistics": {"n_resamples": 500},
        }
    )
    errors, scores = errors_of(IMPACT_ERRORS), similarity_scores(IMPACT_SIMILARITY)
    kept = Counted()
    first = stages.compute_error_stats(study, errors, scores, kept)
    assert Counted.computed == len(kept.used) >= 3  # the error rates' datasets and the impact's
    assert first["error_stats"].column("method").to_pylist()[0] == "poisson-percentile"
    Counted.computed = 0
    again = stages.compute_error_stats(study, errors, scores, Counted.from_table(kept.table()))
    assert Counted.computed == 0
    alone = stages.compute_error_stats(study, errors, scores)
    for name, table in first.items():
        assert again[name].equals(table) and alone[name].equals(table), name
