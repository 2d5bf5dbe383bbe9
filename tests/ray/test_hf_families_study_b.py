"""Two `hf-vlm` families whose processors load without torchvision (Qwen2-VL, SmolVLM) answer a
real Study B run on the session Ray, through the describe stage's actors, one row per image."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.hf_families import save_qwen2_vl, save_smolvlm
from vlm_decade.core.progress import Reporter
from vlm_decade.demo.openworld import materialize
from vlm_decade.studies import load_study
from vlm_decade.studies.openworld.pipeline import run as run_openworld
from vlm_decade.testing.fake_api import FakeAPIServer

pytestmark = pytest.mark.ray

IMAGES = ("cifar10_00", "imagenet_00", "imagenet_16")


def test_qwen2_vl_and_smolvlm_answer_a_study_b_run(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openworld0123456789")
    data = materialize(tmp_path / "data")
    with (data / "labels.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["image_id"] in IMAGES]
    with (data / "labels.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    qwen, smol = save_qwen2_vl(tmp_path / "qwen"), save_smolvlm(tmp_path / "smol")
    with FakeAPIServer(answer=lambda prompt, images: "1") as server:
        limits = f"{{rpm: 6000, tpm: 100000000, timeout_s: 5, max_concurrency: 4, budget_usd: 1.0, base_url: '{server.openai_url}'}}"
        (data / "study.yaml").write_text(
            f"""
name: families
study: openworld
data: {{labels: labels.csv, image_dir: images, classnames: classnames.csv}}
prompts:
  - {{id: default, text: "What type of object is in this image?"}}
models:
  - {{name: tiny-qwen2-vl, backend: hf-vlm, model_id: tiny-qwen2-vl, path: {qwen}, batch_size: 2, options: {{max_new_tokens: 6}}}}
  - {{name: tiny-smolvlm, backend: hf-vlm, model_id: tiny-smolvlm, path: {smol}, batch_size: 2, options: {{max_new_tokens: 6}}}}
judge: {{backend: openai, model_id: gpt-4o-mini}}
statistics: {{n_resamples: 100, seed: 7}}
providers: {{cache_dir: {tmp_path / "cache"}, openai: {limits}}}
output: {tmp_path / "run"}
"""
        )
        run = run_openworld(load_study(data / "study.yaml"), Reporter(quiet=True))
    responses = pq.read_table(run.root / "responses.parquet").to_pylist()
    assert sorted((r["subject"], r["image_id"]) for r in responses) == sorted(
        (m, i) for m in ("tiny-qwen2-vl", "tiny-smolvlm") for i in IMAGES
    )
    assert all(r["status"] == "ok" and r["error"] in (None, "") for r in responses), responses
