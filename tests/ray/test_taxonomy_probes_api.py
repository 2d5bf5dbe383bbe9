"""Study A's error taxonomy for an API model, end to end on Ray against the fake server: the model
describes four demo photos, a verifier model is asked whether the objects its descriptions add are
there, the `probes` stage asks the model about the objects its descriptions leave out (and about the
place of each added object nothing else found), and the `errors` rows follow the scripted answers by
the probe rules (paper section 2.5.2). Run again, every stage is skipped and nothing more is sent.

The expectations are worked by hand from the gold descriptions (the consensus choice, as the
dataset has no votes) and the objects spaCy finds in them:

    astronaut  gold: astronaut, suit, helmet, flag, shuttle model
               said: woman (a person, as the astronaut), suit, helmet, flag, guitar
    coffee     gold: espresso, cup, saucer, spoon, table
               said: espresso, cup, saucer, croissant
    camera     gold: man, camera, tripod, field
               said: man, camera, tripod, field, dog
    clock      gold: clock, wall
               said: clock, wall

No human description of these photos names a guitar, a croissant or a dog, so the verifier is asked
about each. A detection question's anchor is the first other gold object no earlier question used
(astronaut; espresso for the spoon, then cup for the table); a location question's reference is the
gold object the description names nearest the added one (the flag, before "a guitar").
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.demo import materialize
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.config import MLLM_PROMPT
from vlm_decade.studies.decade.pipeline import check, estimate
from vlm_decade.studies.decade.pipeline import run as run_study
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig

from .demo_cut import keep_images

pytestmark = pytest.mark.ray

DESCRIPTIONS = {
    "astronaut": "A woman in an orange suit holds a helmet in front of a flag and a guitar.",
    "coffee": "An espresso in a red cup on a saucer, next to a croissant.",
    "camera": "A man filming with a camera on a tripod in a field, with a dog.",
    "clock": "A clock on a wall.",
}
IMAGES = tuple(DESCRIPTIONS)


def detection(anchor: str) -> str:
    """The paper's detection question: it points at the place and names no object."""
    return f"Is there an object near the {anchor} in this image? Answer yes or no."


def presence(obj: str) -> str:
    return f"Is there a {obj} in this image? Answer yes or no."


def recognition(anchor: str) -> str:
    return f"What is the object near the {anchor}? Answer with a short noun phrase."


VERIFIER = "verifier:gpt-4o"
# (subject, image, round, kind, object, anchor, question, the scripted answer), in the order asked.
PROBES = [
    # The verifier, first: is each added object there? Only what it does not confirm is asked about again.
    (VERIFIER, "astronaut", 1, "presence", "guitar", "", presence("guitar"), "No, there is no guitar."),
    (VERIFIER, "camera", 1, "presence", "dog", "", presence("dog"), "Hard to say."),
    (VERIFIER, "coffee", 1, "presence", "croissant", "", presence("croissant"), "Yes, there is a croissant."),
    ("gpt", "astronaut", 1, "detection", "shuttle model", "astronaut", detection("astronaut"), "Yes."),
    # The guitar's place, in the description: near the flag. The model stands by its guitar there.
    ("gpt", "astronaut", 1, "location", "guitar", "flag", detection("flag"), "Yes."),
    ("gpt", "coffee", 1, "detection", "spoon", "espresso", detection("espresso"), "Yes, there is."),
    ("gpt", "coffee", 1, "detection", "table", "cup", detection("cup"), "No."),
    # Follow-ups only for the questions answered yes, with the same anchor.
    (
        "gpt",
        "astronaut",
        2,
        "recognition",
        "shuttle model",
        "astronaut",
        recognition("astronaut"),
        "A model of the space shuttle.",
    ),
    ("gpt", "astronaut", 2, "identification", "guitar", "flag", recognition("flag"), "A guitar."),
    ("gpt", "coffee", 2, "recognition", "spoon", "espresso", recognition("espresso"), "A fork."),
]
ANSWERS = {(image, question): answer for _, image, _, _, _, _, question, answer in PROBES}

# Per image, the error types present by the probe rules:
#   astronaut: shuttle model seen and named ("model of the space shuttle") -> scene understanding;
#              guitar: no human named one, the verifier denies it, and at its place the model names
#              the guitar again -> hallucination (asking the model alone would have confirmed it).
#   coffee:    spoon seen but named "fork" (similarity 0.52 < 0.72) -> recognition; table denied ->
#              detection; croissant confirmed by the verifier -> no hallucination, nothing asked.
#   camera:    the verifier cannot tell about the dog -> no label, the transcript kept as unclear.
#   clock:     nothing to ask -> no error of any kind (decided, not undecided).
PRESENT = {
    "astronaut": {"detection": False, "recognition": False, "scene_understanding": True, "hallucination": True},
    "coffee": {"detection": True, "recognition": True, "scene_understanding": False, "hallucination": False},
    "camera": {"detection": False, "recognition": False, "scene_understanding": False, "hallucination": False},
    "clock": {"detection": False, "recognition": False, "scene_understanding": False, "hallucination": False},
}


class StageLog(Reporter):
    """A quiet reporter that remembers what each stage did."""

    def __init__(self):
        super().__init__(quiet=True)
        self.states: list[tuple[str, str]] = []

    def stage(self, name: str, state: str, detail: str = "") -> None:
        self.states.append((name, state))


def _pixels(png: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("RGB"))


@pytest.fixture
def study_and_server(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-probes0123456789")
    path = materialize(tmp_path / "inputs")
    for table in ("images.csv", "descriptions.csv"):
        keep_images(path.parent / table, IMAGES)
    photos = {i: _pixels((path.parent / "images" / f"{i}.png").read_bytes()) for i in IMAGES}
    unexpected: list[str] = []

    def answer(prompt: str, images: list[bytes]) -> str:
        # Which photo was sent, told by its pixels: the model answers about that photo only.
        sent = [_pixels(png) for png in images]
        image_id = next((i for i, p in photos.items() if len(sent) == 1 and np.array_equal(p, sent[0])), None)
        if image_id is None:
            unexpected.append(f"{len(images)} image(s), none of them one photo of the study: {prompt}")
            return "unscripted"
        if prompt == MLLM_PROMPT:
            return DESCRIPTIONS[image_id]
        if (image_id, prompt) not in ANSWERS:
            unexpected.append(f"{image_id}: {prompt}")
        return ANSWERS.get((image_id, prompt), "unscripted")

    raw = yaml.safe_load(path.read_text())
    # No votes: the gold is each image's consensus description. Ratings, metrics and the STS-B
    # check are not what this test is about.
    for key in ("votes", "ratings", "hand_labels"):
        raw["data"].pop(key)
    raw.pop("metrics")
    raw["stsb_check"] = False
    raw["models"] = [{"name": "gpt", "backend": "openai", "model_id": "gpt-4o-mini", "era": "mllm", "variants": "full"}]
    raw["taxonomy"]["verifier"] = {"kind": "model", "backend": "openai", "model_id": "gpt-4o"}
    raw["statistics"] = {"n_resamples": 200, "seed": 3}
    with FakeAPIServer(answer=answer) as server:
        raw["providers"] = {
            "cache_dir": str(tmp_path / "cache"),
            "openai": {
                "rpm": 6000,
                "tpm": 10**8,
                "timeout_s": 5,
                "max_concurrency": 4,
                "budget_usd": 1.0,
                "base_url": server.openai_url,
            },
        }
        raw["output"] = str(tmp_path / "run")
        path.write_text(yaml.safe_dump(raw))
        yield path, server, unexpected


def test_the_probe_path_labels_an_api_model_from_its_answers_and_reruns_for_free(study_and_server):
    path, server, unexpected = study_and_server
    run = run_study(load_study(path), Reporter(quiet=True))
    assert unexpected == []

    responses = run.read("responses").to_pylist()
    assert {r["image_id"]: r["text"] for r in responses} == DESCRIPTIONS

    probes = run.read("probes").to_pylist()
    asked = sorted(
        (p["subject"], p["image_id"], p["round"], p["kind"], p["object"], p["anchor"], p["question"], p["answer"])
        for p in probes
    )
    assert asked == sorted(PROBES)
    assert all(p["status"] == "ok" and p["cost_usd"] > 0 for p in probes)
    assert len(server.received()) == len(IMAGES) + len(PROBES)  # each description and question once

    errors = run.read("errors").to_pylist()
    labels = {(e["image_id"], e["error_type"]): e for e in errors if e["method"] == "probe"}
    assert {(e["subject"], e["method"]) for e in errors} == {("gpt", "probe")}  # no masked variants: no SDE rows
    assert {image: {t: labels[(image, t)]["present"] for t in PRESENT[image]} for image in IMAGES} == PRESENT

    def findings(image: str, error_type: str) -> list[dict]:
        return json.loads(labels[(image, error_type)]["evidence"])["findings"]

    (seen,) = findings("astronaut", "scene_understanding")
    assert seen["object"] == "shuttle model" and seen["anchor"] == "astronaut"
    assert seen["named_as"] == "model of the space shuttle" and seen["similarity"] >= 0.72
    assert seen["transcript"] == [
        {"kind": "detection", "question": detection("astronaut"), "answer": "Yes.", "reading": "yes"},
        {
            "kind": "recognition",
            "question": recognition("astronaut"),
            "answer": "A model of the space shuttle.",
            "reading": "model of the space shuttle",
        },
    ]
    (invented,) = findings("astronaut", "hallucination")
    assert invented["reference"] == "flag"
    assert invented["existence"]["present"] is False
    assert [(c["source"], c["found"]) for c in invented["existence"]["checks"]] == [
        ("humans", False),
        ("verifier", False),
    ]
    assert invented["existence"]["checks"][1]["answer"] == "No, there is no guitar."
    assert invented["transcript"] == [
        {"kind": "location", "question": detection("flag"), "answer": "Yes.", "reading": "yes"},
        {"kind": "identification", "question": recognition("flag"), "answer": "A guitar.", "reading": "guitar"},
    ]
    (misnamed,) = findings("coffee", "recognition")
    assert misnamed["object"] == "spoon" and misnamed["named_as"] == "fork" and misnamed["similarity"] < 0.72
    assert [t["reading"] for t in misnamed["transcript"]] == ["yes", "fork"]
    (missed,) = findings("coffee", "detection")
    assert missed["object"] == "table" and missed["transcript"][0]["reading"] == "no"
    assert findings("coffee", "hallucination") == []  # the croissant is there
    checked = json.loads(labels[("coffee", "hallucination")]["evidence"])["checked"]
    assert [(c["object"], c["present"]) for c in checked] == [("croissant", True)]
    (doubt,) = findings("camera", "hallucination")
    assert doubt["unclear"] is True and doubt["existence"]["checks"][1]["answer"] == "Hard to say."
    assert all(findings("clock", t) == [] for t in PRESENT["clock"])

    # Again: every stage is current, so nothing runs and the server hears nothing.
    sent = len(server.received())
    log = StageLog()
    run_study(load_study(path), log)
    assert {"responses", "probes", "errors"} <= {name for name, _ in log.states}
    assert {state for _, state in log.states} == {"skip"}
    assert len(server.received()) == sent
    assert RunFolder(run.root).read("probes").to_pylist() == probes


def _providers(path: Path, **update) -> None:
    raw = yaml.safe_load(path.read_text())
    raw["providers"]["openai"].update(update)
    path.write_text(yaml.safe_dump(raw))


def test_a_rerun_asks_again_exactly_the_probes_and_descriptions_that_failed(study_and_server):
    path, server, unexpected = study_and_server
    _providers(path, max_attempts=1)
    server.faults = FaultConfig(rate_500=0.4, seed=1)
    run = run_study(load_study(path), Reporter(quiet=True))
    log_1 = server.received()
    assert "error" in {p["status"] for p in run.read("probes").to_pylist()}
    assert run.manifest()["stages"]["probes"]["state"] == "incomplete"

    server.faults = FaultConfig()
    run_study(load_study(path), Reporter(quiet=True))
    log_2 = server.received()[len(log_1) :]
    answered = {r.payload_sha256 for r in log_1 if r.outcome == "ok"}
    failed = {r.payload_sha256 for r in log_1} - answered
    sent = Counter(r.payload_sha256 for r in log_2)
    # Every request that failed is sent once more, nothing answered is sent again; the rest of the
    # second run are questions the first could not ask yet (about a description it did not get).
    assert failed <= set(sent) and max(sent.values()) == 1 and answered.isdisjoint(sent)
    probes = run.read("probes").to_pylist()
    assert {p["status"] for p in probes} == {"ok"} and unexpected == []
    asked = sorted(
        (p["subject"], p["image_id"], p["round"], p["kind"], p["object"], p["anchor"], p["question"], p["answer"])
        for p in probes
    )
    assert asked == sorted(PROBES)


def test_a_tiny_budget_stops_spending_and_the_study_still_reaches_its_report(study_and_server):
    # A description may cost up to $0.00023-0.00025 (its image's tiles and 300 output tokens) and
    # costs about $0.00003: one or two fit in $0.00027, and no probe question after them.
    path, server, _ = study_and_server
    _providers(path, budget_usd=0.00027)
    run = run_study(load_study(path), Reporter(quiet=True))
    status = Counter(r["status"] for r in run.read("responses").to_pylist())
    assert status["ok"] >= 1 and status["skipped"] >= 1
    assert {p["status"] for p in run.read("probes").to_pylist()} <= {"skipped"}
    manifest = run.manifest()
    assert manifest["stages"]["responses"]["state"] == "incomplete"
    billed = server.billed_usd(lambda model: (0.15, 0.60))  # gpt-4o-mini
    assert manifest["spend_usd"]["openai"] == pytest.approx(billed, abs=1e-6) and billed <= 0.00027
    assert (run.root / "report.html").exists()


def test_the_estimate_bounds_every_request_the_study_sends_probes_included(study_and_server):
    path, server, _ = study_and_server
    study = load_study(path)
    lines, notes = estimate(study, check(study))
    probes = {line.what: line for line in lines}["probes gpt"]
    # Gold objects (module docstring): astronaut 5, coffee 5, camera 4, clock 2; at most two
    # questions each, and one per object a description of at most 300 tokens could mention.
    assert (probes.requests, probes.usd_low) == (2 * (5 + 5 + 4 + 2) + 4 * 300, 0.0)
    run_study(study, Reporter(quiet=True))
    assert len(server.received()) <= sum(line.requests for line in lines)
    billed = server.billed_usd(lambda model: (0.15, 0.60))  # gpt-4o-mini
    assert billed <= sum(line.usd for line in lines)


def test_a_verifier_on_a_named_endpoint_is_asked_there_and_the_labels_are_the_same(study_and_server):
    path, server, unexpected = study_and_server
    with FakeAPIServer(answer=server.answer, models=("gpt-4o",)) as checker:
        raw = yaml.safe_load(path.read_text())
        raw["taxonomy"]["verifier"]["endpoint"] = "checker"
        raw["providers"]["endpoints"] = {"checker": {"base_url": checker.openai_url, "free": True}}
        path.write_text(yaml.safe_dump(raw))
        run = run_study(load_study(path), Reporter(quiet=True))  # its check asks the endpoint what it serves
    assert unexpected == []
    presence = [p for p in PROBES if p[0] == VERIFIER]
    # The verifier's questions went to the endpoint, free; the model's descriptions and probes to OpenAI.
    assert checker.counts() == Counter({"openai.chat": len(presence), "openai.models": 1})
    assert len(server.received()) == len(IMAGES) + len(PROBES) - len(presence)
    probes = run.read("probes").to_pylist()
    asked = sorted(
        (p["subject"], p["image_id"], p["round"], p["kind"], p["object"], p["anchor"], p["question"], p["answer"])
        for p in probes
    )
    assert asked == sorted(PROBES)
    assert all(p["cost_usd"] == 0.0 for p in probes if p["subject"] == VERIFIER)
    errors = run.read("errors").to_pylist()
    labels = {(e["image_id"], e["error_type"]): e["present"] for e in errors if e["method"] == "probe"}
    assert {image: {t: labels[(image, t)] for t in PRESENT[image]} for image in IMAGES} == PRESENT
    assert run.manifest()["spend_usd"]["checker"] == 0.0
