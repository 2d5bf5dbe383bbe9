"""Probe questions for API models: planning, reading answers, and the labels of hand-made transcripts
(paper section 2.5.2)."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from vlm_decade.studies.decade.taxonomy.objects import Mention
from vlm_decade.studies.decade.taxonomy.probes import (
    ProbeTemplates,
    Question,
    answer_names,
    first_round,
    parse_yes_no,
    presence_questions,
    probe_findings,
    reference,
    second_round,
)
from vlm_decade.studies.decade.taxonomy.rules import summarise

from .taxonomy_cases import axis_vector, hand_matcher

DIM = 64
# Hand-set: sofa/couch 0.8 (synonyms), flashlight/gun 0.5 (related, no match). Any other text gets
# its own fixed pseudo-random direction, nearly orthogonal to everything else.
KNOWN = {"sofa": {0: 1.0}, "couch": {0: 0.8, 1: 0.6}, "flashlight": {2: 1.0}, "gun": {2: 0.5, 3: 0.75**0.5}}


def vector(name):
    if name in KNOWN:
        return axis_vector(*KNOWN[name].items(), dim=DIM)
    v = np.random.default_rng(zlib.crc32(name.encode())).normal(size=DIM)
    v[:4] = 0.0  # keep clear of the hand-set axes
    return v / np.linalg.norm(v)


@pytest.fixture()
def matcher():
    return hand_matcher(vector)


def mentions(*names):
    return [Mention(name, f"the {name}") for name in names]


# -- templates ----------------------------------------------------------------------------------------


def test_default_templates_read_as_in_the_paper():
    # The paper: "Is there an object in the hand of the person standing by the wall?", then "What is
    # the object in the hand of ...?": the detection question points at the place, naming no object.
    t = ProbeTemplates()
    assert t.detection.format(article="a", object="flashlight", anchor="man") == (
        "Is there an object near the man in this image? Answer yes or no."
    )
    assert t.recognition.format(anchor="man") == "What is the object near the man? Answer with a short noun phrase."


def test_the_older_naming_form_can_still_be_configured():
    t = ProbeTemplates(detection="Is there {article} {object} near the {anchor}? Answer yes or no.")
    assert (
        t.detection.format(article="a", object="flashlight", anchor="man")
        == "Is there a flashlight near the man? Answer yes or no."
    )


def _ask_all(relevant, mentioned, matcher, answer):
    """Both rounds against a scripted model (question text -> answer), as the probes stage runs them."""
    first = first_round(relevant, mentioned, matcher)
    answered = [(q, answer(q.text)) for q in first]
    answered += [(q, answer(q.text)) for q in second_round(answered)]
    return answered


def test_a_model_that_sees_the_object_but_would_misname_it_makes_a_recognition_error(matcher):
    # It denies a flashlight (it sees a gun there), but there is an object near the man, and it is "a gun".
    script = {
        "Is there an object near the man in this image? Answer yes or no.": "Yes.",
        "Is there a flashlight near the man in this image? Answer yes or no.": "No.",
        "What is the object near the man? Answer with a short noun phrase.": "A gun.",
    }
    answered = _ask_all(mentions("man", "flashlight"), mentions("man"), matcher, script.__getitem__)
    assert [q.text for q, _ in answered] == [
        "Is there an object near the man in this image? Answer yes or no.",
        "What is the object near the man? Answer with a short noun phrase.",
    ]
    (finding,) = probe_findings(answered, matcher)
    assert (finding.error_type, finding.obj, finding.evidence["named_as"]) == ("recognition", "flashlight", "gun")


def test_a_model_that_says_yes_to_everything_shows_its_detection_error_as_a_misnaming(matcher):
    # Asked "Is there a flashlight near the man?" it would say yes and hide that it sees nothing; asked
    # for the object's name, it has to give one, and "a hat" is not the flashlight.
    answered = _ask_all(
        mentions("man", "flashlight"),
        mentions("man"),
        matcher,
        lambda q: "Yes." if q.startswith("Is there") else "A hat.",
    )
    (finding,) = probe_findings(answered, matcher)
    assert (finding.error_type, finding.evidence["named_as"]) == ("recognition", "hat")


@pytest.mark.parametrize(
    "field, template, message",
    [
        ("recognition", "What is the {object} near the {anchor}?", "must not use"),
        ("detection", "Is there {article} {object} in this image?", "needs"),
        ("presence", "Is there {article} {thing} here?", "unknown field"),
        ("detection_no_anchor", "Is there {article} {object} near the {anchor}?", "must not use"),
    ],
)
def test_templates_are_checked(field, template, message):
    with pytest.raises(ValueError, match=message):
        ProbeTemplates(**{field: template})


# -- planning -----------------------------------------------------------------------------------------


def test_first_round(matcher):
    questions = first_round(
        mentions("man", "flashlight", "wall"), mentions("man", "umbrella"), matcher, absent=["umbrella"]
    )
    assert questions == [
        Question("detection", "flashlight", "man", "Is there an object near the man in this image? Answer yes or no."),
        # "man" already anchors the flashlight: a second object gets the next free anchor, so the
        # two questions and their recognition follow-ups differ
        Question(
            "detection", "wall", "flashlight", "Is there an object near the flashlight in this image? Answer yes or no."
        ),
        # the umbrella, which nothing independent finds, is asked about where the description puts it: near the man
        Question("location", "umbrella", "man", "Is there an object near the man in this image? Answer yes or no."),
    ]


def test_a_mention_found_in_the_image_or_without_a_place_gets_no_location_question(matcher):
    assert first_round(mentions("man"), mentions("man", "umbrella"), matcher, absent=[]) == []
    # nothing the gold names is mentioned: the description places the umbrella near nothing known
    assert first_round(mentions("man"), mentions("umbrella"), matcher, absent=["umbrella"])[1:] == []


def test_the_reference_is_the_nearest_mentioned_gold_object_the_earlier_on_a_tie(matcher):
    gold = ["man", "dog", "tree"]
    assert reference("frisbee", ["man", "frisbee", "dog"], gold, matcher) == "man"
    assert reference("frisbee", ["hat", "frisbee", "dog"], gold, matcher) == "dog"
    assert reference("frisbee", ["tree", "hat", "frisbee", "kite", "dog"], gold, matcher) == "tree"
    assert reference("frisbee", ["frisbee", "kite"], gold, matcher) is None


def test_anchor_is_the_first_other_gold_object_that_is_not_the_same_thing(matcher):
    # nothing mentioned: every gold object is probed; "couch" cannot anchor "sofa" (synonyms)
    questions = first_round(mentions("sofa", "couch", "lamp"), [], matcher)
    # "lamp" is couch's only possible anchor, so it is shared once every candidate is taken
    assert [(q.obj, q.anchor) for q in questions] == [("sofa", "lamp"), ("couch", "lamp"), ("lamp", "sofa")]


def test_lone_object_gets_the_no_anchor_wording(matcher):
    (question,) = first_round(mentions("cat"), mentions("dog"), matcher)[:1]
    assert question == Question("detection", "cat", None, "Is there a cat in this image? Answer yes or no.")


def test_synonym_mentions_need_no_probe(matcher):
    assert first_round(mentions("sofa"), mentions("couch"), matcher) == []


def test_second_round_asks_recognition_only_after_yes(matcher):
    flashlight = Question("detection", "flashlight", "man", "...")
    wall = Question("detection", "wall", "man", "...")
    cat = Question("detection", "cat", None, "...")
    presence = Question("presence", "umbrella", None, "...")
    gun = Question("location", "gun", "wall", "...")
    asked = second_round([(flashlight, "Yes."), (wall, "No."), (cat, "yes, there is"), (presence, "Yes"), (gun, "Yes")])
    assert asked == [
        Question(
            "recognition", "flashlight", "man", "What is the object near the man? Answer with a short noun phrase."
        ),
        Question("recognition", "cat", None, ProbeTemplates().recognition_no_anchor),
        Question("identification", "gun", "wall", "What is the object near the wall? Answer with a short noun phrase."),
    ]


def test_the_verifier_is_asked_about_each_object_by_name():
    assert presence_questions(["umbrella", "cat", "umbrella"]) == [
        Question("presence", "umbrella", None, "Is there an umbrella in this image? Answer yes or no."),
        Question("presence", "cat", None, "Is there a cat in this image? Answer yes or no."),
    ]


# -- reading answers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, reading",
    [
        ("Yes.", True),
        ("yes, there is", True),
        ("YES", True),
        ("Yeah, on the table.", True),
        ("There is a flashlight in his hand.", True),
        ("I can see a cat on the sofa.", True),
        ("No", False),
        ("No.", False),
        ("There is no flashlight.", False),
        ("There isn't one.", False),
        ("I don't see any cat.", False),
        ("Not that I can see.", False),
        ("None.", False),
        ("I'm not sure.", None),
        ("Maybe.", None),
        ("It is hard to tell.", None),
        ("", None),
        ("The image is too dark.", None),
        ("Possibly a cat.", None),
    ],
)
def test_parse_yes_no(text, reading):
    assert parse_yes_no(text) is reading


@pytest.mark.parametrize(
    "text, names",
    [
        ("A flashlight.", ["flashlight"]),
        ("It is a small black flashlight", ["small black flashlight"]),
        ("The object near the man is a gun.", ["gun"]),
        ("a cup, a spoon and two saucers", ["cup", "spoon", "saucers"]),
        ("I don't know.", []),
        ("Nothing.", []),
    ],
)
def test_answer_names(text, names):
    assert answer_names(text) == names


# -- labels from transcripts --------------------------------------------------------------------------

DETECT = Question("detection", "flashlight", "man", "Is there an object near the man in this image? Answer yes or no.")
RECOGNISE = Question(
    "recognition", "flashlight", "man", "What is the object near the man? Answer with a short noun phrase."
)
PRESENT = Question("presence", "frisbee", None, "Is there a frisbee in this image? Answer yes or no.")


def labels(findings):
    return [(f.error_type, f.obj, f.unclear) for f in findings]


def test_no_to_detection_is_a_detection_error(matcher):
    (finding,) = probe_findings([(DETECT, "No.")], matcher)
    assert (finding.error_type, finding.obj, finding.unclear) == ("detection", "flashlight", False)
    assert finding.evidence == {
        "object": "flashlight",
        "anchor": "man",
        "transcript": [{"kind": "detection", "question": DETECT.text, "answer": "No.", "reading": "no"}],
    }


def test_seen_and_named_right_but_left_out_is_scene_understanding(matcher):
    (finding,) = probe_findings([(DETECT, "Yes."), (RECOGNISE, "A flashlight.")], matcher)
    assert (finding.error_type, finding.obj) == ("scene_understanding", "flashlight")
    assert finding.evidence["named_as"] == "flashlight" and finding.evidence["similarity"] == 1.0
    assert [e["reading"] for e in finding.evidence["transcript"]] == ["yes", "flashlight"]


def test_seen_but_named_wrong_is_recognition(matcher):
    (finding,) = probe_findings([(DETECT, "Yes, there is."), (RECOGNISE, "It is a gun.")], matcher)
    assert (finding.error_type, finding.obj) == ("recognition", "flashlight")
    assert finding.evidence["named_as"] == "gun" and finding.evidence["similarity"] == pytest.approx(0.5)


def test_synonym_and_longer_answers_count_as_named(matcher):
    couch = Question("detection", "couch", "man", "...")
    recognise_couch = Question("recognition", "couch", "man", "...")
    assert labels(probe_findings([(couch, "Yes"), (recognise_couch, "A big sofa with cushions.")], matcher)) == [
        ("scene_understanding", "couch", False)
    ]


def test_anchor_named_back_is_unclear(matcher):
    # "What is the object near the man?" - "A man." says nothing about the flashlight
    assert labels(probe_findings([(DETECT, "Yes"), (RECOGNISE, "A man.")], matcher)) == [
        ("recognition", "flashlight", True)
    ]


def test_listed_objects_without_anchor(matcher):
    detect = Question("detection", "sofa", None, "...")
    recognise = Question("recognition", "sofa", None, "...")
    found = probe_findings([(detect, "Yes"), (recognise, "A lamp, a couch and a rug.")], matcher)
    assert labels(found) == [("scene_understanding", "sofa", False)]
    assert found[0].evidence["named_as"] == "couch"


def verdict(obj, present):
    """An existence verdict as `existence.check` gives it (the checks themselves do not matter here)."""
    return {"object": obj, "present": present, "checks": [{"source": "humans", "found": present is True}]}


LOCATE_GUN = Question("location", "gun", "man", "Is there an object near the man in this image? Answer yes or no.")
IDENTIFY_GUN = Question(
    "identification", "gun", "man", "What is the object near the man? Answer with a short noun phrase."
)


def test_a_mention_an_independent_source_found_is_no_error(matcher):
    assert probe_findings([], matcher, {"frisbee": verdict("frisbee", True)}) == []


def test_a_mention_whose_existence_is_undecided_gives_no_label(matcher):
    (finding,) = probe_findings([], matcher, {"frisbee": verdict("frisbee", None)})
    assert (finding.error_type, finding.unclear) == ("hallucination", True)
    assert finding.evidence["existence"]["present"] is None


def test_nothing_where_the_description_puts_it_is_a_hallucination(matcher):
    (finding,) = probe_findings(
        [(LOCATE_GUN, "No.")], matcher, {"gun": verdict("gun", False)}, ["man", "lamp"], ["man", "lamp"]
    )
    assert (finding.error_type, finding.obj, finding.unclear) == ("hallucination", "gun", False)
    assert finding.evidence["reference"] == "man" and finding.evidence["transcript"][0]["reading"] == "no"


def test_a_model_consistent_with_its_own_hallucination_is_caught(matcher):
    # Asked about its own mention it would say "yes, a gun"; no human named a gun and no verifier found
    # one, and what it names at the place is the gun again: a hallucination.
    answered = [(LOCATE_GUN, "Yes."), (IDENTIFY_GUN, "A gun.")]
    (finding,) = probe_findings(answered, matcher, {"gun": verdict("gun", False)}, ["man", "lamp"], ["man", "lamp"])
    assert (finding.error_type, finding.obj, finding.unclear) == ("hallucination", "gun", False)
    assert [t["reading"] for t in finding.evidence["transcript"]] == ["yes", "gun"]


def test_a_present_object_named_at_the_place_makes_the_mention_a_misidentification(matcher):
    # The paper's figure 5b: the lamp on the wall called a second gun. At the place the description
    # puts the gun the model names the lamp, which is there: a recognition error about the lamp.
    answered = [(LOCATE_GUN, "Yes."), (IDENTIFY_GUN, "A lamp on the wall.")]
    (finding,) = probe_findings(
        answered, matcher, {"gun": verdict("gun", False)}, ["man", "lamp"], ["man", "lamp", "wall"]
    )
    assert (finding.error_type, finding.obj) == ("recognition", "lamp")
    assert finding.evidence["named_as"] == "gun" and finding.evidence["relevant"] is True
    assert finding.evidence["said_there"] == "lamp on the wall" and finding.evidence["existence"]["present"] is False


def test_a_mention_with_no_place_is_a_hallucination_by_its_existence_alone(matcher):
    (finding,) = probe_findings([], matcher, {"gun": verdict("gun", False)}, ["man"], ["man"])
    assert finding.error_type == "hallucination" and "not asked" in finding.evidence["location"]


def test_the_name_given_for_a_relevant_object_is_that_misnaming_not_a_hallucination(matcher):
    # Asked about the object near the man (the flashlight) it said "a gun", and it mentions a gun.
    answered = [(DETECT, "Yes"), (RECOGNISE, "A gun.")]
    found = probe_findings(
        answered, matcher, {"gun": verdict("gun", False)}, ["man", "flashlight"], ["man", "flashlight"]
    )
    assert labels(found) == [("recognition", "flashlight", False)]


def test_unclear_answers_give_no_label_but_keep_the_transcript(matcher):
    found = probe_findings(
        [(DETECT, "I'm not sure."), (LOCATE_GUN, "Maybe.")], matcher, {"gun": verdict("gun", False)}, ["man"], ["man"]
    )
    assert labels(found) == [("detection", "flashlight", True), ("hallucination", "gun", True)]
    assert found[0].evidence["transcript"][0]["reading"] == "unclear"
    summary = summarise(found)
    assert summary["detection"][0] is False and summary["hallucination"][0] is False
    assert json.loads(summary["detection"][1])[0]["unclear"] is True


def test_yes_without_a_recognition_answer_is_unclear(matcher):
    (finding,) = probe_findings([(DETECT, "Yes")], matcher)
    assert (finding.error_type, finding.unclear) == ("recognition", True)
    assert finding.evidence["transcript"][-1]["reading"] == "unasked"


def test_a_whole_transcript(matcher):
    cat = Question("detection", "cat", "man", "...")
    answered = [(DETECT, "Yes"), (cat, "No"), (LOCATE_GUN, "No"), (RECOGNISE, "a hat")]
    found = probe_findings(
        answered, matcher, {"gun": verdict("gun", False), "hat": verdict("hat", True)}, ["man"], ["man"]
    )
    assert labels(found) == [
        ("recognition", "flashlight", False),
        ("detection", "cat", False),
        ("hallucination", "gun", False),
    ]


# -- the verifier model on a named endpoint -----------------------------------------------------------


def verifier_study(verifier: dict, endpoints: dict):
    from vlm_decade.studies import study_from_dict

    return study_from_dict(
        {
            "name": "s",
            "data": {"images": "images.csv", "image_dir": "imgs", "descriptions": "d.csv"},
            "models": [{"name": "m", "backend": "imported", "model_id": "x", "era": "mllm"}],
            "taxonomy": {"verifier": {"kind": "model", "backend": "openai", **verifier}},
            "providers": {"endpoints": endpoints},
        }
    )


def test_validate_asks_the_verifiers_endpoint_and_its_probes_go_there(monkeypatch):
    from vlm_decade.models.api.endpoints import served_by
    from vlm_decade.models.backends import backend_class
    from vlm_decade.studies.decade.taxonomy.probing import check_verifier
    from vlm_decade.testing.fake_api import FakeAPIServer

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # an endpoint without `key_env` needs no key
    with FakeAPIServer(models=("qwen-vl",)) as engine:
        endpoints = {"checker": {"base_url": engine.openai_url, "free": True}}
        good = verifier_study({"model_id": "qwen-vl", "endpoint": "checker"}, endpoints)
        assert check_verifier(good) == [] and engine.counts()["openai.models"] == 1
        (unserved,) = check_verifier(verifier_study({"model_id": "qwen-7b", "endpoint": "checker"}, endpoints))
        (typo,) = check_verifier(verifier_study({"model_id": "qwen-vl", "endpoint": "checkr"}, endpoints))
    assert unserved.field == "taxonomy.verifier.model_id"
    assert unserved.message == f"endpoint 'checker' at {engine.openai_url} does not serve 'qwen-7b'; it serves: qwen-vl"
    assert typo.field == "taxonomy.verifier.endpoint"
    assert typo.message == "no endpoint 'checkr' under providers.endpoints (did you mean 'checker'?); known: checker"
    # Without an endpoint the verifier is OpenAI's: its key is needed.
    (no_key,) = check_verifier(verifier_study({"model_id": "gpt-4o"}, {}))
    assert no_key.file == "environment" and "needs an API key" in no_key.message
    # The verifier's questions are sent through the gateway of its endpoint (probing.ask_rounds).
    model = good.taxonomy.verifier.as_model()
    assert served_by(backend_class(model.backend).provider, model.endpoint) == "checker"


def test_a_locator_verifier_takes_no_endpoint():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="the locator verifier takes no backend, model_id or endpoint"):
        verifier_study({"kind": "locator", "backend": None, "endpoint": "checker"}, {})
