"""Batch mode in the pipeline, the real clients against the fake server's batch protocols: the same
tables as sync mode; a run killed while its batches are pending, started again, submits no line
twice; a run that does not wait submits, exits and leaves the later stages for the run that
collects; a finished study run again sends nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from vlm_decade.core.runfolder import RunFolder
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig

from .test_api_describe import GEMINI_KEY, OPENAI_KEY, describe, study_file

pytestmark = pytest.mark.ray
VOLATILE = ("latency_s", "queued_s", "cost_usd", "paid_usd", "cached", "mode")


def batch_mode(path: Path, poll_s: float = 0.2) -> None:
    raw = yaml.safe_load(path.read_text())
    for provider in ("openai", "gemini"):
        raw["providers"][provider].update(mode="batch", batch_poll_s=poll_s)
    path.write_text(yaml.safe_dump(raw))


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("GEMINI_API_KEY", GEMINI_KEY)


def test_batch_mode_gives_the_tables_of_sync_mode(tmp_path, keys):
    with FakeAPIServer(FaultConfig(batch_delay_s=0.3)) as server:
        _, _, sync = describe(study_file(tmp_path / "sync", server), tmp_path / "sync" / "run")
        path = study_file(tmp_path / "batch", server)
        batch_mode(path)
        _, _, batch = describe(path, tmp_path / "batch" / "run")
        counts = server.counts()
    assert counts["openai.batches.create"] == 1 and counts["gemini.batches.create"] == 1  # one model each: one batch each
    assert batch.drop_columns(list(VOLATILE)).equals(sync.drop_columns(list(VOLATILE)))
    assert set(batch.column("mode").to_pylist()) == {"batch"} and set(sync.column("mode").to_pylist()) == {"sync"}
    assert batch.column("cost_usd").to_pylist() == pytest.approx([c / 2 for c in sync.column("cost_usd").to_pylist()])
    manifest = RunFolder(tmp_path / "batch" / "run").manifest()
    assert manifest["spend_by_mode_usd"]["openai"] == {"batch": pytest.approx(manifest["spend_usd"]["openai"], abs=1e-6)}


def test_a_killed_run_collects_its_pending_batches_and_submits_no_line_twice(tmp_path, keys):
    env = {**os.environ, "COLUMNS": "400"}
    with FakeAPIServer(FaultConfig(batch_delay_s=4.0)) as server:
        path = study_file(tmp_path, server)
        batch_mode(path)
        out = tmp_path / "run"
        cmd = [sys.executable, "-m", "vlm_decade", "run", str(path), "--out", str(out)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not server.counts()["openai.batches.create"]:
            time.sleep(0.05)
        proc.kill()  # SIGKILL while the first batch is pending
        proc.wait(timeout=30)
        created = server.counts()["openai.batches.create"]
        assert created == 1 and not server.batch_lines()

        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        lines = server.batch_lines()
        assert server.counts()["openai.batches.create"] == 1  # picked up, not submitted again
        assert max(Counter(r.key for r in lines).values()) == 1 and len(lines) == 80
        responses = RunFolder(out).read("responses")
        assert set(responses.column("status").to_pylist()) == {"ok"}

        sent = len(server.received())
        again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and len(server.received()) == sent  # a finished study sends nothing


def test_a_run_that_does_not_wait_submits_exits_and_a_later_run_collects(tmp_path, keys):
    env = {**os.environ, "COLUMNS": "400"}
    with FakeAPIServer(FaultConfig(batch_delay_s=3.0)) as server:
        path = study_file(tmp_path, server)
        batch_mode(path)
        out = tmp_path / "run"
        cmd = [sys.executable, "-m", "vlm_decade", "run", str(path), "--out", str(out)]
        first = subprocess.run(cmd + ["--no-wait"], env=env, capture_output=True, text=True, timeout=300)
        assert first.returncode == 0, first.stderr
        assert "waiting for batches: responses of gpt: 64 requests wait in batches" in first.stderr
        stages = RunFolder(out).manifest()["stages"]
        assert stages["responses"]["state"] == "running" and "embeddings" not in stages  # the later stages did not start

        status = subprocess.run([sys.executable, "-m", "vlm_decade", "status", str(out)], env=env, capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr
        assert "openai: batches 1 pending" in status.stdout and "responses gpt: 0 of 64 done (64 pending)" in status.stdout

        time.sleep(3.0)
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        assert server.counts()["openai.batches.create"] == 1 and server.counts()["gemini.batches.create"] == 1
        lines = server.batch_lines()
        assert len(lines) == 80 and max(Counter(r.key for r in lines).values()) == 1
        assert RunFolder(out).manifest()["stages"]["report"]["state"] == "done"
        status = subprocess.run([sys.executable, "-m", "vlm_decade", "status", str(out)], env=env, capture_output=True, text=True, timeout=120)
        assert "openai: batches 1 completed" in status.stdout and "responses gpt: 64 of 64 done (64 ok)" in status.stdout
    table = pq.read_table(out / "responses.parquet")
    assert set(table.column("mode").to_pylist()) == {"batch"}


def test_a_model_may_choose_its_own_mode(tmp_path, keys):
    """OpenAI in sync mode with gpt alone in batch mode, Gemini in batch mode with gem alone in sync:
    each model's answers are bought as it chose, and the tables are those of an all-sync run."""
    with FakeAPIServer(FaultConfig(batch_delay_s=0.3)) as server:
        _, _, sync = describe(study_file(tmp_path / "sync", server), tmp_path / "sync" / "run")
        path = study_file(tmp_path / "mixed", server)
        raw = yaml.safe_load(path.read_text())
        raw["providers"]["openai"].update(batch_poll_s=0.2)
        raw["providers"]["gemini"].update(mode="batch", batch_poll_s=0.2)
        modes = {"gpt": "batch", "gem": "sync"}
        for model in raw["models"]:
            model["mode"] = modes[model["name"]]
        path.write_text(yaml.safe_dump(raw))
        chats_before = server.counts()["openai.chat"]
        _, _, mixed = describe(path, tmp_path / "mixed" / "run")
        counts = server.counts()
    assert counts["openai.batches.create"] == 1 and counts["gemini.batches.create"] == 0
    assert counts["openai.chat"] == chats_before  # gpt: no request one by one
    assert len(server.batch_lines()) == 64  # gpt's 16 images x 4 variants, each once
    by_subject = {s: set() for s in modes}
    for row in mixed.select(["subject", "mode"]).to_pylist():
        by_subject[row["subject"]].add(row["mode"])
    assert by_subject == {"gpt": {"batch"}, "gem": {"sync"}}
    assert mixed.drop_columns(list(VOLATILE)).equals(sync.drop_columns(list(VOLATILE)))


def test_requests_left_in_a_pending_batch_are_collected_in_sync_mode_not_bought_again(tmp_path, keys):
    """Submitted in batch mode by a run that did not wait; the study then switched to sync mode: the
    next run collects the batch instead of sending its requests one by one."""
    env = {**os.environ, "COLUMNS": "400"}
    with FakeAPIServer(FaultConfig(batch_delay_s=2.0)) as server:
        path = study_file(tmp_path, server)
        batch_mode(path)
        out = tmp_path / "run"
        cmd = [sys.executable, "-m", "vlm_decade", "run", str(path), "--out", str(out)]
        first = subprocess.run(cmd + ["--no-wait"], env=env, capture_output=True, text=True, timeout=300)
        assert first.returncode == 0 and "requests wait in batches" in first.stderr, first.stderr
        raw = yaml.safe_load(path.read_text())
        for provider in ("openai", "gemini"):
            raw["providers"][provider]["mode"] = "sync"
        path.write_text(yaml.safe_dump(raw))
        chats = server.counts()["openai.chat"], server.counts()["gemini.generate"]
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        # gpt's requests, all in the pending batch, are collected from it; gem never reached a batch
        # (the first run stopped at gpt's), so its 16 requests go one by one, as the study now says.
        assert (server.counts()["openai.chat"], server.counts()["gemini.generate"]) == (chats[0], chats[1] + 16)
        assert server.counts()["openai.batches.create"] == 1 and server.counts()["gemini.batches.create"] == 0
        lines = server.batch_lines()
        assert len(lines) == 64 and max(Counter(r.key for r in lines).values()) == 1
    responses = pq.read_table(out / "responses.parquet")
    assert set(responses.column("status").to_pylist()) == {"ok"}
    modes = {(r["subject"], r["mode"]) for r in responses.select(["subject", "mode"]).to_pylist()}
    assert modes == {("gpt", "batch"), ("gem", "sync")}
