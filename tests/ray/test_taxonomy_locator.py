"""Study A's error taxonomy with an open-vocabulary locator, end to end on Ray: a tiny OWL-ViT built
from a config (random weights) finds each image's gold and human-named objects, and, as the
verifier, the objects the model mentions that no human named; the detector-based labels are read from
the boxes at each object's place. Random weights give arbitrary boxes, so this checks the wiring:
what was asked, that the labels read the locator's boxes, and that the evidence keeps them."""

from __future__ import annotations

import json

import pytest
import yaml

from vlm_decade.core.progress import Reporter
from vlm_decade.demo import materialize
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.pipeline import run as run_study
from vlm_decade.studies.decade.taxonomy.objects import ObjectExtractor

from .demo_cut import keep_images

pytestmark = pytest.mark.ray
IMAGES = ("astronaut", "coffee")


def test_the_locator_finds_the_objects_and_the_labels_read_its_boxes(tmp_path):
    from tests.hf_tiny import save_owlvit

    path = materialize(tmp_path / "inputs")
    for table in ("images.csv", "descriptions.csv", "imported_captions.csv"):
        keep_images(path.parent / table, IMAGES)
    raw = yaml.safe_load(path.read_text())
    for key in ("votes", "ratings", "hand_labels"):
        raw["data"].pop(key)
    raw.pop("metrics")
    raw["stsb_check"] = False
    raw["models"] = [m for m in raw["models"] if m["name"] == "demo-imported"]
    raw["models"][0]["variants"] = "full"
    raw["statistics"] = {"n_resamples": 200, "seed": 3}
    raw["taxonomy"]["locator"] = {
        "model_id": "tiny-owlvit",
        "path": str(save_owlvit(tmp_path / "owl")),
        "min_score": 0.5,
    }
    raw["taxonomy"]["verifier"] = {"kind": "locator"}
    raw["output"] = str(tmp_path / "run")
    path.write_text(yaml.safe_dump(raw))

    run = run_study(load_study(path), Reporter(quiet=True))
    references = run.read("references").to_pylist()
    extractor = ObjectExtractor()
    gold = {r["image_id"]: [m.name for m in extractor.objects(r["text"])] for r in references if r["role"] == "gold"}
    human = {
        i: {
            m.name
            for r in references
            if r["image_id"] == i and r["condition"] == "full"
            for m in extractor.objects(r["text"])
        }
        for i in IMAGES
    }
    said = {r["image_id"]: [m.name for m in extractor.objects(r["text"])] for r in run.read("responses").to_pylist()}

    locations = {r["image_id"]: r for r in run.read("locations").to_pylist()}
    assert set(locations) == set(IMAGES) and all(r["status"] == "ok" for r in locations.values())
    for image_id, row in locations.items():
        # asked: the gold's objects first, then every human-named object, then mentions no human named
        assert row["queries"][: len(gold[image_id])] == gold[image_id]
        assert human[image_id] <= set(row["queries"])
        extra = set(row["queries"]) - human[image_id]
        assert extra <= set(said[image_id])
        assert {b["label"] for b in row["boxes"]} <= set(row["queries"])
        assert all(sum(b["label"] == q for b in row["boxes"]) <= 3 for q in row["queries"])

    errors = [r for r in run.read("errors").to_pylist() if r["error_type"] != "spatial_dependence"]
    assert {r["method"] for r in errors} == {"detector"} and all(r["present"] is not None for r in errors)
    for r in errors:
        evidence = json.loads(r["evidence"])
        boxes = locations[r["image_id"]]["boxes"]
        for f in evidence["findings"]:
            if r["error_type"] in ("detection", "scene_understanding") and isinstance(f.get("located"), dict):
                best = max((b for b in boxes if b["label"] == f["object"]), key=lambda b: b["score"])
                assert f["located"]["score"] == pytest.approx(best["score"], abs=1e-3) and best["score"] >= 0.5
        if r["error_type"] == "hallucination":
            for verdict in evidence["checked"]:
                sources = [c["source"] for c in verdict["checks"]]
                assert sources == ["humans", "locator"]
                located = [b["score"] for b in boxes if b["label"] == verdict["object"]]
                best = max(located, default=None)
                assert verdict["checks"][1]["found"] == (best is not None and best >= 0.5)
