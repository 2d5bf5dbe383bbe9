"""Study A's judge metrics end to end on Ray against the fake server: a CLAIR rating through OpenAI
(text only, sync) and a CapArena preference through Gemini's batches (with the image, in both
orders) judge the demo's imported captions of five photos and every human group member; the scores
and the validation against the demo's raters follow the scripted answers, and a re-run sends nothing.

Hand-worked from the scripted answers (humans: every rating 50, every preference a tie):

    image      CLAIR answer           CLAIR   preference (description first / second)   CapArena
    astronaut  score 80               0.80    Caption 1 better / Caption 2 better        1     (preferred in both)
    coffee     score 65, in a fence   0.65    Caption 1 better / Caption 1 better        0.5   (position bias: split)
    chelsea    score 30               0.30    Caption 2 better / Caption 1 better        0     (in neither)
    rocket     score 95               0.95    Tie / Caption 2 better                     0.75
    camera     "No idea." (no score)  NaN     Caption 1 better / Caption 2 better        1

so the validation's pairs are the four images where every metric has a value (camera is left out).
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as sps

from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.demo import materialize
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.pipeline import check, estimate
from vlm_decade.studies.decade.pipeline import run as run_study
from vlm_decade.testing.fake_api import FakeAPIServer

from .demo_cut import keep_images

pytestmark = pytest.mark.ray

IMAGES = ("astronaut", "coffee", "chelsea", "rocket", "camera")
CLAIR_ANSWERS = {
    "astronaut": '{"score": 80, "reason": "Same astronaut and flag."}',
    "coffee": '```json\n{"score": 65, "reason": "The cup, not the saucer."}\n```',
    "chelsea": '{"score": 30, "reason": "A different animal."}',
    "rocket": '{"score": 95, "reason": "The same launch."}',
    "camera": "No idea.",
}
CLAIR = {"astronaut": 0.80, "coffee": 0.65, "chelsea": 0.30, "rocket": 0.95, "camera": math.nan}
# image -> (the verdict with the description as caption 1, with it as caption 2)
VERDICTS = {
    "astronaut": ("Caption 1 is better", "Caption 2 is better"),
    "coffee": ("Caption 1 is better", "Caption 1 is better"),
    "chelsea": ("Caption 2 is better", "Caption 1 is better"),
    "rocket": ("Tie", "Caption 2 is better"),
    "camera": ("Caption 1 is better", "Caption 2 is better"),
}
ARENA = {"astronaut": 1.0, "coffee": 0.5, "chelsea": 0.0, "rocket": 0.75, "camera": 1.0}
MODEL = "demo-imported"


@pytest.fixture
def study_and_server(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-judgemetrics0123456789")
    monkeypatch.setenv("GEMINI_API_KEY", "AIzaTESTjudgemetrics0123456789ab")
    path = materialize(tmp_path / "inputs")
    for table in ("images.csv", "descriptions.csv", "ratings.csv", "imported_captions.csv"):
        keep_images(path.parent / table, IMAGES)
    with (path.parent / "imported_captions.csv").open(newline="") as f:
        caption_of = {r["text"]: r["image_id"] for r in csv.DictReader(f) if r.get("variant", "full") == "full"}
    seen: list[tuple[str, int]] = []  # (kind, images sent) per request
    unexpected: list[str] = []

    def answer(prompt: str, images: list[bytes]) -> str:
        if prompt.startswith("You are trying to tell"):
            seen.append(("rating", len(images)))
            candidate = re.search(r"Candidate set:\n- (.*)\n\nReference set:", prompt, re.DOTALL).group(1)
            return (
                CLAIR_ANSWERS[caption_of[candidate]]
                if candidate in caption_of
                else '{"score": 50, "reason": "a person"}'
            )
        if prompt.startswith("You are a highly capable multimodal AI assistant"):
            seen.append(("preference", len(images)))
            first, second = re.search(r"Caption 1:\n(.*)\nCaption 2:\n(.*)\nDetermine", prompt, re.DOTALL).groups()
            if first in caption_of:
                return f"Reason: compared.\nJudgment: {VERDICTS[caption_of[first]][0]}"
            if second in caption_of:
                return f"Reason: compared.\nJudgment: {VERDICTS[caption_of[second]][1]}"
            return "Reason: both people.\nJudgment: Tie"
        unexpected.append(prompt[:80])
        return "unscripted"

    raw = yaml.safe_load(path.read_text())
    for key in ("votes", "hand_labels"):
        raw["data"].pop(key)
    for key in ("metrics", "taxonomy"):
        raw.pop(key)
    raw["stsb_check"] = False
    raw["models"] = [m | {"variants": "full"} for m in raw["models"] if m["name"] == MODEL]
    raw["judge_metrics"] = [
        {"name": "CLAIR", "kind": "rating", "backend": "openai", "model_id": "gpt-4o-mini"},
        {
            "name": "CapArena",
            "kind": "preference",
            "backend": "gemini",
            "model_id": "gemini-2.0-flash",
            "mode": "batch",
        },
    ]
    raw["statistics"] = {"n_resamples": 200, "seed": 5}
    with FakeAPIServer(answer=answer) as server:
        limits = {"rpm": 6000, "tpm": 10**8, "timeout_s": 5, "max_concurrency": 4, "budget_usd": 1.0}
        raw["providers"] = {
            "cache_dir": str(tmp_path / "cache"),
            "openai": {**limits, "base_url": server.openai_url},
            "gemini": {**limits, "base_url": server.gemini_url, "batch_poll_s": 0.2},
        }
        raw["output"] = str(tmp_path / "run")
        path.write_text(yaml.safe_dump(raw))
        yield path, server, seen, unexpected


def test_judge_metrics_score_validate_and_rerun_for_free(study_and_server, tmp_path):
    path, server, seen, unexpected = study_and_server
    study = load_study(path)
    lines = {line.what: line for line in estimate(study, check(study))[0]}
    run = run_study(study, Reporter(quiet=True))
    assert unexpected == []

    references = [r for r in run.read("references").to_pylist() if r["condition"] == "full"]
    members = sum(r["role"] in ("top", "bottom") for r in references)
    judged = run.read("judge_scores").to_pylist()
    # One rating per description, a preference in both orders; each distinct question sent once.
    assert sum(r["metric"] == "CLAIR" for r in judged) == len(IMAGES) + members
    assert sum(r["metric"] == "CapArena" for r in judged) == 2 * (len(IMAGES) + members)
    assert all(r["status"] == "ok" for r in judged)
    assert {k for k, _ in seen} == {"rating", "preference"}
    assert all(n == (1 if k == "preference" else 0) for k, n in seen)  # the image only with a preference
    # Each question asked once: CLAIR's one at a time, CapArena's in the provider's batches.
    assert server.counts()["openai.chat"] == len(IMAGES) + members
    assert len(server.batch_lines()) == 2 * (len(IMAGES) + members) and len(seen) == 3 * (len(IMAGES) + members)
    # The estimate bounds what each judge asked and what it cost.
    assert (lines["judge CLAIR"].requests, lines["judge CapArena"].requests) == (
        len(IMAGES) + members,
        2 * (len(IMAGES) + members),
    )
    assert server.counts()["openai.chat"] <= lines["judge CLAIR"].requests
    assert server.billed_usd(lambda model: (0.15, 0.60), provider="openai") <= lines["judge CLAIR"].usd

    camera = next(r for r in judged if r["metric"] == "CLAIR" and r["subject"] == MODEL and r["image_id"] == "camera")
    assert camera["answer"] == "No idea." and math.isnan(camera["value"])  # kept, unread, no crash
    coffee = next(r for r in judged if r["metric"] == "CLAIR" and r["subject"] == MODEL and r["image_id"] == "coffee")
    assert coffee["value"] == 65.0 and coffee["reason"] == "The cup, not the saucer."
    orders = {
        r["order"]: r["value"]
        for r in judged
        if r["metric"] == "CapArena" and r["subject"] == MODEL and r["image_id"] == "rocket"
    }
    assert orders == {"candidate-first": 0.5, "gold-first": 1.0}

    scores = {(r["metric"], r["subject"], r["image_id"]): r["value"] for r in run.read("scores").to_pylist()}
    for image in IMAGES:
        got = scores[("CLAIR", MODEL, image)]
        assert (math.isnan(got) and math.isnan(CLAIR[image])) or got == pytest.approx(CLAIR[image])
        assert scores[("CapArena", MODEL, image)] == ARENA[image]
        for group in ("human:top", "human:bottom"):
            assert scores[("CLAIR", group, image)] == pytest.approx(0.5) and scores[("CapArena", group, image)] == 0.5
    stats = {(r["subject"], r["metric"]) for r in run.read("stats").to_pylist()}
    assert {(MODEL, "CLAIR"), (MODEL, "CapArena"), ("human:top", "CapArena")} <= stats

    # The validation: each metric's mean correlation with the 8 raters over the 4 pairs every metric scored.
    with (path.parent / "ratings.csv").open(newline="") as f:
        ratings = list(csv.DictReader(f))
    kept = [i for i in IMAGES if i != "camera"]
    raters = sorted({r["rater_id"] for r in ratings})
    rating = {(r["rater_id"], r["image_id"]): float(r["rating"]) for r in ratings}
    validation = {
        (r["metric"], r["kind"]): r for r in run.read("metric_validation").to_pylist() if r["subject"] == "all"
    }
    for metric, values in (("CLAIR", CLAIR), ("CapArena", ARENA)):
        x = [values[i] for i in kept]
        for kind, corr in (("pearson", sps.pearsonr), ("spearman", sps.spearmanr)):
            expected = np.mean([corr(x, [rating[(rater, i)] for i in kept])[0] for rater in raters])
            row = validation[(metric, kind)]
            assert row["estimate"] == pytest.approx(expected, abs=1e-9)
            assert row["n_pairs"] == len(kept) and row["n_raters"] == len(raters)
            assert row["ci_low"] <= row["estimate"] <= row["ci_high"]
    assert {m for m, _ in validation} >= {"SBERT-SI", "CLAIR", "CapArena"}
    html = (run.root / "report.html").read_text()
    assert "No judge metric is shown" not in html and "agrees with the raters best" in html

    # Again: every stage is current and the server hears nothing.
    sent = len(server.received())
    run_study(load_study(path), Reporter(quiet=True))
    assert len(server.received()) == sent
    # A fresh run folder with the same cache asks the judges again: the cache answers, the same table.
    raw = yaml.safe_load(path.read_text())
    raw["output"] = str(tmp_path / "again")
    path.write_text(yaml.safe_dump(raw))
    again = run_study(load_study(path), Reporter(quiet=True))
    assert len(server.received()) == sent
    assert _without_nan(RunFolder(again.root).read("judge_scores").to_pylist()) == _without_nan(judged)


def _without_nan(rows: list[dict]) -> list[dict]:
    """The rows with NaN as None, so that equal tables compare equal."""
    return [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows]


def test_a_judge_on_a_named_endpoint_is_asked_there_for_free_and_cached_under_its_name(study_and_server):
    from vlm_decade.core.errors import InputError
    from vlm_decade.studies.estimate import render

    path, server, seen, unexpected = study_and_server
    with FakeAPIServer(answer=server.answer, models=("llama-judge",)) as engine:
        raw = yaml.safe_load(path.read_text())
        raw["judge_metrics"] = [
            {"name": "CLAIR", "kind": "rating", "backend": "openai", "model_id": "llama-judge", "endpoint": "engine"}
        ]
        raw["providers"]["endpoints"] = {"engine": {"base_url": engine.openai_url, "free": True, "max_concurrency": 4}}
        path.write_text(yaml.safe_dump(raw))
        study = load_study(path)
        lines, _ = estimate(study, check(study))  # check asks the endpoint what it serves
        assert engine.counts()["openai.models"] == 1
        line = next(ln for ln in lines if ln.what == "judge CLAIR")
        assert (line.provider, line.usd) == ("engine", 0.0)
        assert "engine (endpoint " in render(study, lines) and "free: every model it serves" in render(study, lines)
        run = run_study(study, Reporter(quiet=True))
        assert unexpected == []
        members = sum(
            r["role"] in ("top", "bottom") for r in run.read("references").to_pylist() if r["condition"] == "full"
        )
        judged = run.read("judge_scores").to_pylist()
        assert len(judged) == len(IMAGES) + members and all(r["status"] == "ok" for r in judged)
        assert all(r["cost_usd"] == 0.0 for r in judged)
        # Every question went to the endpoint, none to the cloud provider.
        assert engine.counts()["openai.chat"] == len(IMAGES) + members and server.counts()["openai.chat"] == 0
        scores = {(r["metric"], r["subject"], r["image_id"]): r["value"] for r in run.read("scores").to_pylist()}
        assert scores[("CLAIR", MODEL, "rocket")] == pytest.approx(0.95)
        assert run.manifest()["spend_usd"]["engine"] == 0.0
        # The same server under another name shares no cache entry: its judge is asked anew.
        raw["judge_metrics"][0]["endpoint"] = "engine-2"
        raw["providers"]["endpoints"] = {"engine-2": raw["providers"]["endpoints"]["engine"]}
        path.write_text(yaml.safe_dump(raw))
        run_study(load_study(path), Reporter(quiet=True))
        assert engine.counts()["openai.chat"] == 2 * (len(IMAGES) + members)
        # An endpoint that is not there is named, with the ones that are.
        raw["judge_metrics"][0]["endpoint"] = "engine-3"
        path.write_text(yaml.safe_dump(raw))
        with pytest.raises(InputError) as refused:
            check(load_study(path))
    assert "judge_metrics[0].endpoint" in str(refused.value) and "known: engine-2" in str(refused.value)
