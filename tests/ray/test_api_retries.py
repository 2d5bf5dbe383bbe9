"""A stage with rows the API could not finish is not finished: a plain rerun sends exactly those rows
again, and nothing that was answered. Against the fake server, failing half the requests with
`max_attempts: 1`, then healthy: responses and embeddings (through the command line, whose last
lines name what is still not done) and Study B's judgements."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.demo.openworld import materialize as materialize_openworld
from vlm_decade.studies import load_study
from vlm_decade.studies.openworld.pipeline import run as run_openworld
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig

from .test_api_describe import GEMINI_KEY, OPENAI_KEY, study_file

pytestmark = pytest.mark.ray


def answered(log) -> set[str]:
    return {r.payload_sha256 for r in log if r.outcome == "ok"}


def one_attempt(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    for provider in ("openai", "gemini"):
        raw["providers"][provider]["max_attempts"] = 1
    path.write_text(yaml.safe_dump(raw))


def test_a_rerun_sends_exactly_the_rows_that_failed_and_the_last_lines_say_what_is_left(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("GEMINI_API_KEY", GEMINI_KEY)
    with FakeAPIServer(FaultConfig(rate_500=0.5, seed=4)) as server:
        path = study_file(tmp_path, server)
        one_attempt(path)
        out = tmp_path / "run"
        cmd = [sys.executable, "-m", "vlm_decade", "run", str(path), "--out", str(out)]
        env = {**os.environ, "COLUMNS": "400"}  # one message a line
        first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        log_1 = server.received()
        responses = pq.read_table(out / "responses.parquet").to_pylist()
        failed = [r for r in responses if r["status"] != "ok"]
        assert failed and len(failed) < len(responses)
        # Half the embedding batches failed too: the stage saved the rest and stopped, saying so.
        assert first.returncode == 1, first.stderr
        assert (
            "encoder GPT-SI:" in first.stderr and "texts not encoded (most common: InternalServerError" in first.stderr
        )
        tail = first.stderr.rsplit("rows not finished", 1)[1]
        for subject in ("gpt", "gem"):
            errors = Counter(r["error"] for r in failed if r["subject"] == subject)
            assert (
                f"responses {subject}: {sum(errors.values())} error; most common: {errors.most_common(1)[0][0]}" in tail
            )

        server.faults = FaultConfig()
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        assert "rows not finished" not in second.stderr
        log_2 = server.received()[len(log_1) :]

    chats_2 = Counter(r.payload_sha256 for r in log_2 if r.endpoint in ("openai.chat", "gemini.generate"))
    chats_1 = [r for r in log_1 if r.endpoint in ("openai.chat", "gemini.generate")]
    assert max(chats_2.values()) == 1 and set(chats_2) == {r.payload_sha256 for r in chats_1} - answered(chats_1)
    assert len(chats_2) == len(failed)
    final = pq.read_table(out / "responses.parquet")
    assert set(final.column("status").to_pylist()) == {"ok"} and final.num_rows == len(responses)
    # Every text was paid for once: the vectors bought in the first run were not bought again.
    embedded = sum(r.inputs for r in log_1 + log_2 if r.endpoint == "openai.embeddings" and r.outcome == "ok")
    assert embedded == RunFolder(out).num_rows("embeddings")


JUDGE_MARK = "This is the target value: "


def model_and_judge(prompt: str, images: list[bytes]) -> str:
    if JUDGE_MARK in prompt:
        return "1" if prompt.split(JUDGE_MARK, 1)[1].startswith("cat") else "0"
    return f"a photo of thing {len(images[0]) % 7}"  # a few distinct predictions per label


def test_a_rerun_asks_the_judge_again_only_what_it_failed_to_answer(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    data = materialize_openworld(tmp_path / "data")
    with (data / "labels.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))[:12]
    with (data / "labels.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with FakeAPIServer(FaultConfig(rate_500=0.5, only_if=JUDGE_MARK, seed=2), answer=model_and_judge) as server:
        limits = {
            "rpm": 6000,
            "tpm": 10**8,
            "timeout_s": 5,
            "max_concurrency": 4,
            "max_attempts": 1,
            "base_url": server.openai_url,
        }
        study = {
            "name": "judge-retries",
            "study": "openworld",
            "data": {"labels": "labels.csv", "image_dir": "images", "classnames": "classnames.csv"},
            "prompts": [{"id": "default", "text": "What type of object is in this image?"}],
            "models": [{"name": "gpt", "backend": "openai", "model_id": "gpt-4o-mini"}],
            "judge": {"backend": "openai", "model_id": "gpt-4o-mini"},
            "statistics": {"n_resamples": 200, "seed": 1},
            "providers": {"cache_dir": str(tmp_path / "cache"), "openai": limits},
            "output": str(tmp_path / "run"),
        }
        (data / "study.yaml").write_text(yaml.safe_dump(study))
        folder = run_openworld(load_study(data / "study.yaml"), Reporter(quiet=True))
        first = pq.read_table(folder.root / "judgements.parquet").to_pylist()
        log_1 = server.received()
        assert {j["status"] for j in first} == {"ok", "error"}
        assert folder.manifest()["stages"]["judgements"]["state"] == "incomplete"

        server.faults = FaultConfig()
        run_openworld(load_study(data / "study.yaml"), Reporter(quiet=True))
        log_2 = server.received()[len(log_1) :]
    again = pq.read_table(folder.root / "judgements.parquet").to_pylist()
    judge_1 = [r for r in log_1 if r.outcome != "ok"]
    assert {r.payload_sha256 for r in judge_1}.isdisjoint(answered(log_1))  # each failed once, never answered
    assert Counter(r.payload_sha256 for r in log_2) == Counter(r.payload_sha256 for r in judge_1)
    assert len(log_2) == sum(j["status"] == "error" for j in first)
    assert {j["status"] for j in again} == {"ok"}
    kept = {(j["label"], j["prediction"]): j["answer"] for j in first if j["status"] == "ok"}
    assert {(j["label"], j["prediction"]): j["answer"] for j in again if (j["label"], j["prediction"]) in kept} == kept
