"""Batch mode in the pipeline, the real clients against the fake server's batch protocols: the same
tables as sync mode (answers and vectors); a run killed while its chat batches are pending, and
again while its embedding batch is, started again, submits no line twice; a run that does not wait
submits every batch of a stage at once (every model's, then every encoder's), exits and leaves the
later stages for the run that collects; a finished study run again sends nothing."""

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

from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import run_failures
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.pipeline import run as run_decade
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig

from .test_api_describe import GEMINI_KEY, OPENAI_KEY, describe, study_file

pytestmark = pytest.mark.ray
VOLATILE = ("latency_s", "queued_s", "cost_usd", "paid_usd", "cached", "mode")
EMBEDDINGS = "/v1/embeddings"  # the endpoint of the fake server's embedding batches (both providers)


def set_mode(path: Path, mode: str = "batch") -> None:
    """Both providers of the study file in `mode`, polling batches every 0.2 s."""
    raw = yaml.safe_load(path.read_text())
    for provider in ("openai", "gemini"):
        raw["providers"][provider].update(mode=mode, batch_poll_s=0.2)
    path.write_text(yaml.safe_dump(raw))


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("GEMINI_API_KEY", GEMINI_KEY)


def batches_created(server: FakeAPIServer, provider: str, embeddings: bool = False) -> int:
    """Batches the server was given by `provider`: of chat requests, or of texts to embed."""
    return sum(
        b.provider == provider and (b.endpoint == EMBEDDINGS) == embeddings for b in server.batches.batches.values()
    )


def lines_of(server: FakeAPIServer, embeddings: bool, provider: str | None = None) -> list:
    """The lines worked through of chat batches, or of embedding batches (of `provider`'s only, if given)."""
    kinds = {b.id: b.endpoint == EMBEDDINGS for b in server.batches.batches.values() if provider in (None, b.provider)}
    return [r for r in server.batch_lines() if kinds.get(r.batch) == embeddings]


def waiting_lines(server: FakeAPIServer, provider: str, embeddings: bool) -> int:
    """The lines of `provider`'s batches, of chat requests or of texts to embed."""
    return sum(
        len(b.lines)
        for b in server.batches.batches.values()
        if b.provider == provider and (b.endpoint == EMBEDDINGS) == embeddings
    )


def all_due(server: FakeAPIServer) -> None:
    """Wait until every batch the server holds is past its `batch_delay_s`: the next look at it
    finds it worked through (a fixed pause would wait the whole delay however long ago it began)."""
    due = max(b.created for b in server.batches.batches.values()) + server.faults.batch_delay_s
    time.sleep(max(0.0, due - time.time()))


def environment() -> dict:
    """This process's environment (the `keys` fixture's keys), wide enough that no message wraps."""
    return {**os.environ, "COLUMNS": "400"}


def command(*args) -> list[str]:
    return [sys.executable, "-m", "vlm_decade", *map(str, args)]


def cli(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """A `vlm-decade` command run to its end, its output kept."""
    return subprocess.run(command(*args), env=environment(), capture_output=True, text=True, timeout=timeout)


def submitted_without_waiting(tmp_path: Path, server: FakeAPIServer) -> tuple[Path, Path]:
    """A study in batch mode run with `--no-wait`, which stops with gpt's and gem's batches pending:
    (study file, run folder)."""
    path = study_file(tmp_path, server)
    set_mode(path)
    out = tmp_path / "run"
    first = cli("run", path, "--out", out, "--no-wait")
    assert first.returncode == 0 and "requests wait in batches" in first.stderr, first.stderr
    # The detached gateway actors' notice from Ray goes to the run folder's log, not the terminal.
    assert "anonymous namespace" in (out / "logs" / "ray.log").read_text()
    assert "(raylet)" not in first.stdout + first.stderr and "anonymous namespace" not in first.stdout
    return path, out


def test_a_study_in_batch_mode_gives_the_tables_of_sync_mode(tmp_path, keys):
    """The whole study, answers and GPT-SI vectors bought in batches: every table as in sync mode
    but for the mode and cost columns."""
    with FakeAPIServer(FaultConfig(batch_delay_s=0.3)) as server:
        # The sync run to compare with, in this process on the session's Ray (a command would start its own)
        sync_path = study_file(tmp_path / "sync", server)
        sync_run = run_decade(load_study(sync_path, output=tmp_path / "sync" / "run"), Reporter(quiet=True))
        assert run_failures(sync_run.manifest()) == []  # what a command's exit status 0 says
        path = study_file(tmp_path / "batch", server)
        set_mode(path)
        batch_run = cli("run", path, "--out", tmp_path / "batch" / "run")
        assert batch_run.returncode == 0, batch_run.stderr
        created = {(p, e): batches_created(server, p, e) for p in ("openai", "gemini") for e in (False, True)}
        embedded = lines_of(server, embeddings=True)
    # one batch per model, and one of GPT-SI's texts to embed
    assert created == {("openai", False): 1, ("gemini", False): 1, ("openai", True): 1, ("gemini", True): 0}
    sync, batch = RunFolder(tmp_path / "sync" / "run"), RunFolder(tmp_path / "batch" / "run")
    responses = batch.read("responses")
    assert responses.drop_columns(list(VOLATILE)).equals(sync.read("responses").drop_columns(list(VOLATILE)))
    assert set(responses.column("mode").to_pylist()) == {"batch"}
    assert responses.column("cost_usd").to_pylist() == pytest.approx(
        [c / 2 for c in sync.read("responses").column("cost_usd").to_pylist()]
    )
    vectors = batch.read("embeddings")
    assert vectors.drop_columns(["mode"]).equals(sync.read("embeddings").drop_columns(["mode"]))
    assert set(vectors.column("mode").to_pylist()) == {"batch"} and set(
        sync.read("embeddings").column("mode").to_pylist()
    ) == {"sync"}
    for name in ("scores", "stats"):
        assert batch.read(name).equals(sync.read(name)), name
    assert len(embedded) == batch.read("embeddings").num_rows and max(Counter(r.key for r in embedded).values()) == 1
    spend = batch.manifest()["spend_by_mode_usd"]["openai"]
    assert spend == {"batch": pytest.approx(batch.manifest()["spend_usd"]["openai"], abs=1e-6)}
    assert spend["batch"] == pytest.approx(sync.manifest()["spend_usd"]["openai"] / 2, rel=1e-4)


def test_a_killed_run_collects_its_pending_batches_and_submits_no_line_twice(tmp_path, keys):
    def run_until(cmd, created) -> None:
        """Start the run and SIGKILL it as soon as `created()` holds (a batch submitted, not done)."""
        proc = subprocess.Popen(cmd, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not created() and proc.poll() is None:
            time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=30)

    with FakeAPIServer(FaultConfig(batch_delay_s=4.0)) as server:
        path = study_file(tmp_path, server)
        set_mode(path)
        out = tmp_path / "run"
        cmd = command("run", path, "--out", out)
        run_until(cmd, lambda: batches_created(server, "openai"))  # killed while gpt's batch is pending
        assert batches_created(server, "openai") == 1 and not server.batch_lines()

        server.faults = FaultConfig(batch_delay_s=1.0)
        run_until(cmd, lambda: batches_created(server, "openai", embeddings=True))  # ... and while GPT-SI's is
        assert batches_created(server, "openai", embeddings=True) == 1 and not lines_of(server, embeddings=True)

        done = cli("run", path, "--out", out)
        assert done.returncode == 0, done.stderr
        chats, texts = lines_of(server, embeddings=False), lines_of(server, embeddings=True)
        assert (batches_created(server, "openai"), batches_created(server, "openai", embeddings=True)) == (
            1,
            1,
        )  # picked up, not submitted again
        assert len(chats) == 80 and max(Counter(r.key for r in chats + texts).values()) == 1
        assert len(texts) == RunFolder(out).read("embeddings").num_rows
        responses = RunFolder(out).read("responses")
        assert set(responses.column("status").to_pylist()) == {"ok"}

        sent = len(server.received())
        again = cli("run", path, "--out", out)
        assert again.returncode == 0 and len(server.received()) == sent  # a finished study sends nothing


def test_a_run_that_does_not_wait_submits_every_batch_of_a_stage_at_once_and_a_later_run_collects(tmp_path, keys):
    """Two API models and two API encoders in batch mode, run with `--no-wait`: the first run submits
    both models' batches together, the next one (once they are done) collects them and submits both
    encoders' batches together, and the last waits and finishes the study: one batch turnaround per
    stage, not per model."""
    with FakeAPIServer(FaultConfig(batch_delay_s=3.0)) as server:
        path = study_file(tmp_path, server)
        raw = yaml.safe_load(path.read_text())
        gem_si = {"name": "GEM-SI", "backend": "gemini-embedding", "model_id": "gemini-embedding-001", "batch_size": 32}
        raw["encoders"].append(gem_si)
        path.write_text(yaml.safe_dump(raw))
        set_mode(path)
        out = tmp_path / "run"

        def created() -> dict:
            return {(p, e): batches_created(server, p, e) for p in ("openai", "gemini") for e in (False, True)}

        first = cli("run", path, "--out", out, "--no-wait")
        assert first.returncode == 0, first.stderr
        assert created() == {("openai", False): 1, ("gemini", False): 1, ("openai", True): 0, ("gemini", True): 0}
        assert "waiting for batches: responses of gpt: 64 requests wait in batches" in first.stderr
        assert "responses of gem: 16 requests wait in batches" in first.stderr
        stages = RunFolder(out).manifest()["stages"]
        assert (
            stages["responses"]["state"] == "running" and "embeddings" not in stages
        )  # the later stages did not start

        status = cli("status", out)
        assert status.returncode == 0, status.stderr
        for line in (
            "openai: batches 1 pending (chat, 64 requests waiting);",
            "responses gpt: 0 of 64 done (64 pending)",
            "gemini: batches 1 pending (chat, 16 requests waiting);",
            "responses gem: 0 of 16 done (16 pending)",
        ):
            assert line in status.stdout, line

        # The next run that does not wait collects both models' answers and submits both encoders' texts.
        all_due(server)
        second = cli("run", path, "--out", out, "--no-wait")
        assert second.returncode == 0 and "waiting for batches: encoder GPT-SI: " in second.stderr, second.stderr
        assert "encoder GEM-SI: " in second.stderr
        assert created() == {("openai", False): 1, ("gemini", False): 1, ("openai", True): 1, ("gemini", True): 1}
        texts = RunFolder(out).manifest()["stages"]
        assert (texts["responses"]["state"], texts["embeddings"]["state"]) == (
            "done",
            "running",
        ) and "scores" not in texts
        waiting = waiting_lines(server, "openai", embeddings=True)
        assert waiting == waiting_lines(server, "gemini", embeddings=True) > 0  # the same texts, once per encoder
        status = cli("status", out).stdout
        assert f"openai: batches 1 completed (chat), 1 pending (embeddings, {waiting} requests waiting)" in status
        assert f"gemini: batches 1 completed (chat), 1 pending (embeddings, {waiting} requests waiting)" in status

        all_due(server)
        last = cli("run", path, "--out", out)
        assert last.returncode == 0, last.stderr
        assert created() == {("openai", False): 1, ("gemini", False): 1, ("openai", True): 1, ("gemini", True): 1}
        lines = lines_of(server, embeddings=False)
        assert len(lines) == 80 and max(Counter(r.key for r in lines).values()) == 1
        vectors = RunFolder(out).read("embeddings")
        assert len(lines_of(server, embeddings=True)) == 2 * waiting == vectors.num_rows
        assert Counter(vectors.column("encoder").to_pylist()) == {"GPT-SI": waiting, "GEM-SI": waiting}
        assert RunFolder(out).manifest()["stages"]["report"]["state"] == "done"
        status = cli("status", out)
        assert (
            "openai: batches 1 completed (chat), 1 completed (embeddings);" in status.stdout
            and "responses gpt: 64 of 64 done (64 ok)" in status.stdout
        )
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
    next run collects the batches instead of sending their requests one by one."""
    with FakeAPIServer(FaultConfig(batch_delay_s=2.0)) as server:
        path, out = submitted_without_waiting(tmp_path, server)
        set_mode(path, "sync")
        chats = server.counts()["openai.chat"], server.counts()["gemini.generate"]
        second = cli("run", path, "--out", out)
        assert second.returncode == 0, second.stderr
        # gpt's and gem's requests, all in the batches the first run submitted, are collected from them.
        assert (server.counts()["openai.chat"], server.counts()["gemini.generate"]) == chats
        assert server.counts()["openai.batches.create"] == 1 and server.counts()["gemini.batches.create"] == 1
        lines = server.batch_lines()
        assert len(lines) == 80 and max(Counter(r.key for r in lines).values()) == 1
    responses = pq.read_table(out / "responses.parquet")
    assert set(responses.column("status").to_pylist()) == {"ok"}
    modes = {(r["subject"], r["mode"]) for r in responses.select(["subject", "mode"]).to_pylist()}
    assert modes == {("gpt", "batch"), ("gem", "batch")}


def test_cancel_keeps_what_a_pending_batch_answered_and_the_next_run_sends_the_rest(tmp_path, keys):
    """`vlm-decade cancel RUN_DIR` while gpt's and gem's batches are pending; the study then switches
    to sync mode: the next run takes what the batches answered from the cache and sends only the rest."""
    with FakeAPIServer(FaultConfig(batch_delay_s=60.0)) as server:
        path, out = submitted_without_waiting(tmp_path, server)
        cancelled = cli("cancel", out)
        assert cancelled.returncode == 0, cancelled.stderr
        answered = {p: len(lines_of(server, embeddings=False, provider=p)) for p in ("openai", "gemini")}
        for provider, n in (("openai", 64), ("gemini", 16)):
            assert answered[provider] < n
            said = f"{provider}: 1 batches cancelled; {answered[provider]} answers kept, {n - answered[provider]} requests left"
            assert f"{said} for the next run" in cancelled.stdout
        status = cli("status", out).stdout
        # nothing waits any more: what the batches answered is in the cache, the rest is for the next run to send
        assert "1 cancelled (chat)" in status and "requests waiting" not in status
        for model, n, provider in (("gpt", 64, "openai"), ("gem", 16, "gemini")):
            rows = ([f"{answered[provider]} answered in the cache"] if answered[provider] else []) + [
                f"{n - answered[provider]} to send"
            ]
            assert f"responses {model}: 0 of {n} done ({', '.join(rows)})" in status, status
        set_mode(path, "sync")
        second = cli("run", path, "--out", out)
        assert second.returncode == 0, second.stderr
        sent = server.counts()["openai.chat"], server.counts()["gemini.generate"]
        assert sent == (64 - answered["openai"], 16 - answered["gemini"])
        assert len(server.batch_lines()) == sum(answered.values())
        assert cli("cancel", out).stdout.splitlines() == ["openai: no batch pending", "gemini: no batch pending"]
    responses = RunFolder(out).read("responses")
    assert set(responses.column("status").to_pylist()) == {"ok"}
