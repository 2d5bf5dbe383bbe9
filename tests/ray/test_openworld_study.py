"""Study B end to end on the session Ray: a tiny VLM built from config answers two prompts, a tiny
CLIP chooses from the class list, and an API judge on the fake server gives LI. The judge's
answers are scripted per label, so every LI value, the raw answers kept as evidence and the
outcomes can be checked; a second run does no work and sends no request."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.hf_tiny import save_clip, save_vlm
from vlm_decade.core.progress import Reporter
from vlm_decade.demo.openworld import materialize
from vlm_decade.studies import load_study
from vlm_decade.studies.openworld.metrics import text_inclusion
from vlm_decade.studies.openworld.pipeline import run as run_openworld
from vlm_decade.testing.fake_api import FakeAPIServer

pytestmark = pytest.mark.ray

IMAGES = ("cifar10_00", "cifar10_01", "cifar10_03", "imagenet_00", "imagenet_16", "imagenet_05")
# The judge's verdict by label: "maybe" is no valid answer, so it counts as 0 and is kept.
VERDICTS = {"cat": "1", "ship": "0", "airplane": "maybe"}


def judge_answer(prompt: str, images: list[bytes]) -> str:
    assert not images, "the judge is sent text only"
    label = prompt.split("This is the target value: ", 1)[1].split("\n", 1)[0]
    return VERDICTS.get(label, "1")


@pytest.fixture
def study_file(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openworld0123456789")
    data = materialize(tmp_path / "data")
    with (data / "labels.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["image_id"] in IMAGES]
    assert len(rows) == len(IMAGES)
    with (data / "labels.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    vlm, clip = save_vlm(tmp_path / "vlm"), save_clip(tmp_path / "clip")
    with FakeAPIServer(answer=judge_answer) as server:
        limits = f"{{rpm: 6000, tpm: 100000000, timeout_s: 5, max_concurrency: 4, budget_usd: 1.0, base_url: '{server.openai_url}'}}"
        (data / "study.yaml").write_text(
            f"""
name: openworld-test
study: openworld
data: {{labels: labels.csv, image_dir: images, classnames: classnames.csv}}
prompts:
  - {{id: default, text: "What type of object is in this image?"}}
  - {{id: specific, text: "What type of object is in this image? Be specific."}}
models:
  - {{name: tiny-vlm, backend: hf-vlm, model_id: tiny-llava, path: {vlm}, batch_size: 4, options: {{max_new_tokens: 6}}}}
  - {{name: tiny-clip, backend: hf-zero-shot, model_id: tiny-clip, path: {clip}, batch_size: 4}}
judge: {{backend: openai, model_id: gpt-4o-mini}}
statistics: {{n_resamples: 500, seed: 7}}
providers: {{cache_dir: {tmp_path / "cache"}, openai: {limits}}}
output: {tmp_path / "run"}
"""
        )
        yield data / "study.yaml", server


def test_study_b_runs_with_a_tiny_vlm_a_closed_world_baseline_and_an_api_judge(study_file):
    path, server = study_file
    study = load_study(path)
    run = run_openworld(study, Reporter(quiet=True))
    root = run.root
    labels = {r["image_id"]: r for r in pq.read_table(root / "labels.parquet").to_pylist()}
    responses = pq.read_table(root / "responses.parquet").to_pylist()

    # Every prompt for the open-world model; the closed-world baseline once, with a class name.
    assert sorted((r["subject"], r["prompt_id"]) for r in responses) == sorted(
        [("tiny-vlm", p) for p in ("default", "specific") for _ in IMAGES] + [("tiny-clip", "default")] * len(IMAGES)
    )
    assert all(r["status"] == "ok" for r in responses)
    classes = {}
    for r in csv.DictReader((path.parent / "classnames.csv").open()):
        classes.setdefault(r["dataset"], set()).add(r["class_name"])
    assert all(r["text"] in classes[labels[r["image_id"]]["dataset"]] for r in responses if r["subject"] == "tiny-clip")

    # The judge saw each distinct (label, prediction) once; LI follows the scripted verdicts.
    judgements = pq.read_table(root / "judgements.parquet").to_pylist()
    pairs = {(labels[r["image_id"]]["label"], r["text"].strip()) for r in responses}
    assert sorted((j["label"], j["prediction"]) for j in judgements) == sorted(pairs)
    assert all(j["answer"] == VERDICTS.get(j["label"], "1") for j in judgements)
    assert all(j["valid"] == (j["label"] != "airplane") for j in judgements)
    requests = len(server.received())
    assert requests == len(pairs)

    predictions = pq.read_table(root / "predictions.parquet").to_pylist()
    assert len(predictions) == len(responses)
    for p in predictions:
        assert p["LI"] == (1.0 if VERDICTS.get(p["label"], "1") == "1" else 0.0)
        assert p["judge_answer"] == VERDICTS.get(p["label"], "1")
        assert p["TI"] == text_inclusion(p["label"], p["prediction"])
        high_cs, high_li = p["CS"] >= study.scoring.cs_high, p["LI"] >= study.scoring.li_high
        expected = {
            (True, True): "correct",
            (True, False): "granularity",
            (False, True): "ambiguity",
            (False, False): "confusion",
        }
        assert p["outcome"] == expected[(high_cs, high_li)]

    # Stats per dataset, per granularity group and over all datasets, per prompt: as the paper's
    # table, "all" (and each group) is the mean of the datasets' means.
    stats = pq.read_table(root / "stats.parquet").to_pylist()
    li_all = next(
        s
        for s in stats
        if (s["subject"], s["dataset"], s["metric"], s["prompt_id"]) == ("tiny-vlm", "all", "LI", "specific")
    )
    mine = [p for p in predictions if p["subject"] == "tiny-vlm" and p["prompt_id"] == "specific"]
    by_dataset = {d: [p["LI"] for p in mine if p["dataset"] == d] for d in {p["dataset"] for p in mine}}
    assert li_all["estimate"] == pytest.approx(sum(sum(v) / len(v) for v in by_dataset.values()) / len(by_dataset))
    assert {s["dataset"] for s in stats} == {"prototypical", "fine-grained", "all"} | set(by_dataset)
    assert {"ss@0.5", "ss@avg"} <= {s["metric"] for s in stats}
    comparisons = pq.read_table(root / "comparisons.parquet").to_pylist()
    assert {c["family"] for c in comparisons} == {"open-vs-closed", "model-vs-model", "prompt-ablation"}
    html = (root / "report.html").read_text()
    for section in (
        "Main table",
        "Per dataset",
        "SS at thresholds",
        "Model against model",
        "Prompt ablation: differences",
        "Error types",
    ):
        assert section in html

    # Again: every stage skipped, no request sent.
    run_openworld(load_study(path), Reporter(quiet=True))
    assert len(server.received()) == requests

    # A third prompt: only the pairs the judge has not seen are judged (one request each), and the
    # predictions of the first two prompts are kept as they were.
    scored = pq.read_table(root / "predictions.parquet").to_pylist()
    text = path.read_text()
    specific = '  - {id: specific, text: "What type of object is in this image? Be specific."}\n'
    path.write_text(
        text.replace(
            specific, specific + '  - {id: generic, text: "Name the object in this image with one general word."}\n', 1
        )
    )
    run_openworld(load_study(path), Reporter(quiet=True))
    labels_of = {i: r["label"] for i, r in labels.items()}
    responses = pq.read_table(root / "responses.parquet").to_pylist()
    new_pairs = {(labels_of[r["image_id"]], r["text"].strip()) for r in responses} - pairs
    assert new_pairs and {r["prompt_id"] for r in responses} == {"default", "specific", "generic"}
    assert len(server.received()) == requests + len(new_pairs)
    assert len(pq.read_table(root / "judgements.parquet").to_pylist()) == len(pairs | new_pairs)
    rescored = pq.read_table(root / "predictions.parquet").to_pylist()
    assert [p for p in rescored if p["prompt_id"] != "generic"] == scored
    assert len(rescored) == len(responses)


def test_estimate_counts_one_judge_request_per_prediction_and_spends_nothing(study_file):
    import subprocess
    import sys

    path, server = study_file
    done = subprocess.run(
        [sys.executable, "-m", "vlm_decade", "estimate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    judge = next(line.split() for line in done.stdout.splitlines() if line.startswith("openai   judge gpt-4o-mini"))
    # tiny-vlm answers 2 prompts, tiny-clip 1, on 6 images: 18 predictions, 16 output tokens each at most
    assert judge[3:5] == ["18", "0"] and judge[6] == str(18 * 16) and float(judge[-1]) > 0
    assert server.received() == []  # estimating spends nothing
