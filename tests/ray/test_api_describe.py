"""API models and encoders in the pipeline, through the gateway actor, against the fake server:
rows carry what the provider answered; a killed run resumed sends nothing twice; a budget stops
spending and a later run with more takes up the rest; keys are never written anywhere."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from vlm_decade.core.config import ProviderConfig
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runtime import offline_env
from vlm_decade.demo import materialize
from vlm_decade.models.api.spend import read_spend, spend_log_path
from vlm_decade.stages.describe.plan import jobs_from, load_png, plan_jobs
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.data import load_study_data
from vlm_decade.studies.decade.pipeline import estimate, plan
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig, chat_text

from .conftest import describe_stage

pytestmark = pytest.mark.ray
OPENAI_KEY = "sk-test-NEVERWRITE0123456789abc"
GEMINI_KEY = "AIzaTESTNEVERWRITE0123456789abcdef"


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("GEMINI_API_KEY", GEMINI_KEY)
    with FakeAPIServer(FaultConfig(latency_s=0.05)) as s:
        yield s


def study_file(tmp_path: Path, server: FakeAPIServer, budget: float | None = 10.0, concurrency: int = 8) -> Path:
    path = materialize(tmp_path / "inputs")
    raw = yaml.safe_load(path.read_text())
    raw["models"] = [
        {"name": "gpt", "backend": "openai", "model_id": "gpt-4o-mini", "era": "mllm", "variants": "all"},
        {"name": "gem", "backend": "gemini", "model_id": "gemini-2.5-flash", "era": "mllm"},
    ]
    raw["encoders"] = [
        {"name": "GPT-SI", "backend": "openai-embedding", "model_id": "text-embedding-3-large", "batch_size": 32}
    ]
    raw["statistics"] = {"n_resamples": 200, "seed": 1}
    # The demo's ratings and hand labels are about its own models, and neither the metric checks nor
    # the error taxonomy are what this test is about.
    raw["data"].pop("ratings")
    raw["data"].pop("hand_labels")
    raw.pop("taxonomy")
    raw.pop("metrics")
    raw["stsb_check"] = False
    common = {"rpm": 6000, "tpm": 10**8, "timeout_s": 5, "max_concurrency": concurrency, "budget_usd": budget}
    raw["providers"] = {
        "cache_dir": str(tmp_path / "cache"),
        "openai": {**common, "base_url": server.openai_url},
        "gemini": {**common, "base_url": server.gemini_url},
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def describe(path: Path, out: Path, **update):

    study = load_study(path)
    study = study.model_copy(update=update)
    images = load_study_data(study.data, study.ranking, study.masks).images
    return study, images, describe_stage(study, images, out)


def test_rows_hold_what_the_provider_answered_for_the_exact_png(server, tmp_path):
    study, images, table = describe(study_file(tmp_path, server), tmp_path / "run")
    assert table.num_rows == 16 * 4 + 16 and set(table.column("status").to_pylist()) == {"ok"}
    jobs = {
        (j.subject, j.image_id, j.variant): j
        for j in jobs_from(plan_jobs(study, plan(study), images), plan(study), images)
    }
    rows = table.to_pylist()
    sample = [r for r in rows if r["variant"] in ("full", "m2")][:12]
    pngs = load_png([jobs[(r["subject"], r["image_id"], r["variant"])] for r in sample])
    for row, png in zip(sample, pngs):
        assert row["text"] == chat_text(study.prompt, [png]), row  # masked bytes, not the original's
    assert {r["model_version"] for r in rows} == {"gpt-4o-mini-2025-01-01+fp_fake", "gemini-2.5-flash-001"}
    assert all(r["input_tokens"] > 0 and r["output_tokens"] > 0 and r["cost_usd"] > 0 for r in rows)
    spend = RunFolder(tmp_path / "run").manifest()["spend_usd"]
    assert spend["openai"] == pytest.approx(sum(r["cost_usd"] for r in rows if r["subject"] == "gpt"), abs=1e-5)
    assert server.counts() == Counter({"openai.chat": 64, "gemini.generate": 16})


def test_a_budget_stops_spending_and_a_higher_one_goes_on(server, tmp_path):
    path = study_file(tmp_path, server, budget=0.004)
    study, images, table = describe(path, tmp_path / "run")
    status = Counter(table.column("status").to_pylist())
    assert status["ok"] > 0 and status["skipped"] > 0 and status["error"] == 0
    skipped = table.filter(pa.compute.equal(table.column("status"), "skipped")).to_pylist()
    assert "budget $0.004 for" in skipped[0]["error"]
    spend = RunFolder(tmp_path / "run").manifest()["spend_usd"]
    assert all(v <= 0.004 for v in spend.values())
    RunFolder(tmp_path / "run").write("responses", table)

    more = study.providers.model_copy(
        update={p: getattr(study.providers, p).model_copy(update={"budget_usd": 1.0}) for p in ("openai", "gemini")}
    )
    _, _, again = describe(path, tmp_path / "run", providers=more)
    assert set(again.column("status").to_pylist()) == {"ok"}
    sent = Counter(r.payload_sha256 for r in server.received())
    assert max(sent.values()) == 1 and sum(sent.values()) == 80  # each request paid for once


def test_one_budget_holds_for_every_model_of_a_provider(server, tmp_path):
    # Two OpenAI models, each alone well within the budget and together not: one budget for both.
    # A request may cost up to $0.00023-0.00025 and costs about $0.00003; each model's 64 cost ~$0.002.
    path = study_file(tmp_path, server, budget=0.003)
    raw = yaml.safe_load(path.read_text())
    raw["models"] = [
        {
            "name": name,
            "backend": "openai",
            "model_id": "gpt-4o-mini",
            "era": "mllm",
            "variants": "all",
            "prompt": f"{name}: what happens here?",
        }
        for name in ("gpt-a", "gpt-b")
    ]
    path.write_text(yaml.safe_dump(raw))
    study, images, table = describe(path, tmp_path / "run")
    status = Counter((r["subject"], r["status"]) for r in table.to_pylist())
    assert status[("gpt-a", "ok")] == 64 and status[("gpt-b", "skipped")] > 0
    billed = server.billed_usd(price_table("openai"))
    spend = RunFolder(tmp_path / "run").manifest()["spend_usd"]["openai"]
    assert spend == pytest.approx(billed, abs=1e-6) and billed == pytest.approx(
        sum(r["paid_usd"] for r in table.to_pylist()), abs=1e-12
    )
    assert 0.003 - 0.00025 < spend <= 0.003  # up to the last request that fits, never past it


def price_table(provider: str):
    """model -> (US$ per M input tokens, per M output tokens), as the study prices them."""

    def price(model: str) -> tuple[float, float]:
        p = ProviderConfig(rpm=1, tpm=1).price(provider, model)
        return p.input_per_mtok, p.output_per_mtok

    return price


def _written_files(*roots: Path):
    for root in roots:
        for f in root.rglob("*"):
            if f.is_file():
                yield f


def test_a_killed_run_resumed_sends_nothing_twice_and_writes_no_key(server, tmp_path):
    server.faults.latency_s = 0.3
    path = study_file(tmp_path, server, concurrency=2)
    out = tmp_path / "run"
    env = {**os.environ, "OPENAI_API_KEY": OPENAI_KEY, "GEMINI_API_KEY": GEMINI_KEY}
    cmd = [sys.executable, "-m", "vlm_decade", "run", str(path), "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    parts = out / ".parts" / "responses"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(parts.glob("part-*.parquet"))) < 2:
        time.sleep(0.1)
    while time.monotonic() < deadline and not any(r.answered is None for r in server.received()):
        time.sleep(0.01)  # kill while the server is working on requests
    killed_at = time.time()
    proc.kill()  # SIGKILL: no cleanup in the driver
    proc.wait(timeout=30)
    dead_at = time.time()
    time.sleep(2.0)  # answers on their way, and anything a surviving gateway would still send
    before = server.received()
    assert 0 < len(before) < 80 + 1, "the kill should land midway through describe"
    # Nothing new leaves once the driver is gone. The gateway logs `sent` as an attempt leaves: the
    # server's own clock would count a request sent before the exit but read late by a busy machine.
    sent = [t for p in ("openai", "gemini") for t, _ in read_spend(spend_log_path(out, p)).sent]
    assert len(sent) >= len(before) and max(sent) <= dead_at + 0.05, [
        round(t - dead_at, 3) for t in sent if t > dead_at
    ]
    in_flight = [r for r in before if r.time < killed_at < r.answered]
    assert in_flight, "the kill should land while requests are in flight"

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    responses = RunFolder(out).read("responses")
    assert responses.num_rows == 80 and set(responses.column("status").to_pylist()) == {"ok"}
    answered = [r for r in server.received() if r.endpoint.endswith(("chat", "generate"))]
    sent = Counter(r.payload_sha256 for r in answered)
    assert len(sent) == 80
    # Every answer that reached the gateway before the kill is kept and never bought again; only a
    # request still in flight at the kill (its answer died with the process) may be sent twice.
    first_sent = {}
    for r in answered:
        first_sent.setdefault(r.payload_sha256, r.time)
    again = [h for h, n in sent.items() if n > 1]
    late = {h: round(killed_at - first_sent[h], 3) for h in again}
    assert max(sent.values()) <= 2 and len(again) <= 2 * 2, late  # two providers, concurrency 2
    assert all(age <= server.faults.latency_s + 0.5 for age in late.values()), late
    embeddings = RunFolder(out).read("embeddings")
    assert set(embeddings.column("dim").to_pylist()) == {3072} and server.counts()["openai.embeddings"] >= 1
    manifest = RunFolder(out).manifest()
    # The spend is what was paid for the answers that reached the gateway, those that arrived after
    # the driver died included; answers that reached no one are the unresolved attempts' at most.
    for provider in ("openai", "gemini"):
        price = price_table(provider)
        delivered = server.billed_usd(price, delivered_only=True, provider=provider)
        unresolved = manifest.get("spend_unresolved_usd", {}).get(provider, 0.0)
        # An answer the server delivered at the very moment the gateway died may not have been
        # logged as paid: then its attempt is among the unresolved ones, whose worst case covers it.
        assert (
            delivered - unresolved - 1e-6 <= manifest["spend_usd"][provider] <= delivered + 1e-6
        )  # the manifest keeps 6 decimals
        assert server.billed_usd(price, provider=provider) <= manifest["spend_usd"][provider] + unresolved + 1e-6

    key_bytes = [k.encode() for k in (OPENAI_KEY, GEMINI_KEY)]
    for f in _written_files(out, tmp_path / "cache"):
        data = f.read_bytes()
        assert not any(k in data for k in key_bytes), f
    assert not any(k in (done.stdout + done.stderr).encode() for k in key_bytes)
    assert hashlib.sha256(OPENAI_KEY.encode()).hexdigest() not in (out / "manifest.json").read_text()


def test_estimate_counts_what_the_cache_already_holds(server, tmp_path):
    path = study_file(tmp_path, server)
    env = {**os.environ, "OPENAI_API_KEY": OPENAI_KEY, "GEMINI_API_KEY": GEMINI_KEY}
    cmd = [sys.executable, "-m", "vlm_decade", "estimate", str(path)]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert sum(server.counts().values()) == 0  # estimating spends nothing
    gpt = next(line.split() for line in first.stdout.splitlines() if line.startswith("openai   gpt "))
    assert gpt[2:4] == ["64", "0"] and float(gpt[-1]) > 0
    study, images, _ = describe(path, tmp_path / "run")
    lines = {line.what: line for line in estimate(study, load_study_data(study.data, study.ranking, study.masks))[0]}
    assert (lines["gpt"].requests, lines["gpt"].cached, lines["gpt"].usd) == (64, 64, 0.0)


def test_a_missing_key_fails_validate_before_any_work(server, tmp_path, monkeypatch):
    path = study_file(tmp_path, server)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")}
    env["GEMINI_API_KEY"] = GEMINI_KEY
    done = subprocess.run(
        [sys.executable, "-m", "vlm_decade", "validate", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "OPENAI_API_KEY" in done.stderr and "gpt" in done.stderr
    assert GEMINI_KEY not in done.stderr and sum(server.counts().values()) == 0


@contextmanager
def ray_head(tmp_path: Path):
    """A Ray head of its own on 127.0.0.1, started apart from any driver (as a cluster is): the
    address to join, and the environment that joins it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Ray's socket paths must fit in 107 bytes, which pytest's tmp_path does not leave room for.
    ray_tmp = tempfile.mkdtemp(prefix="vd-ray-", dir="/tmp")
    env = {
        **os.environ,
        **offline_env(tmp_path / "ray_home"),
        "OPENAI_API_KEY": OPENAI_KEY,
        "GEMINI_API_KEY": GEMINI_KEY,
        # A driver here takes its node's address for 127.0.0.1 unless told this is no cluster address.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        "RAY_ADDRESS": f"127.0.0.1:{port}",
    }
    cmd = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={ray_tmp}",
    ]
    log = tmp_path / "head.log"
    head = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield env
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=30)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def named_actors(env: dict) -> list[str]:
    """The named actors alive in the cluster that `env` joins."""
    probe = (
        "import json, ray; ray.init(logging_level='ERROR'); "
        "print(json.dumps([a['name'] for a in ray.util.list_named_actors(all_namespaces=True)]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_on_a_cluster_the_gateway_keeps_every_answer_in_flight_when_the_driver_is_killed(server, tmp_path):
    """A driver killed with many requests in flight against a slow provider: its gateways send
    nothing new, record every answer still on its way (cache entry and spend line), then end
    themselves; the rerun buys none of those answers again, and the spend is what was billed."""
    server.faults.latency_s = 2.0
    path = study_file(tmp_path, server, concurrency=32)
    out = tmp_path / "run"
    with ray_head(tmp_path) as env:
        cmd = [sys.executable, "-m", "vlm_decade", "run", str(path), "--out", str(out)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and sum(r.answered is None for r in server.received()) < 24:
            time.sleep(0.02)
        killed_at = time.time()
        proc.kill()  # SIGKILL: no cleanup in the driver
        proc.wait(timeout=30)
        dead_at = time.time()
        in_flight = [r for r in server.received() if r.answered is None]
        assert len(in_flight) >= 24, "the kill should land with many requests in flight"
        while time.monotonic() < deadline and any(r.answered is None for r in server.received()):
            time.sleep(0.1)
        logs = {p: spend_log_path(out, p) for p in ("openai", "gemini")}
        while time.monotonic() < deadline and any(read_spend(log).unresolved for log in logs.values()):
            time.sleep(0.1)  # the answers that arrived are being recorded
        before = server.received()
        assert {r.endpoint for r in before} <= {"openai.chat", "gemini.generate"}  # describe was under way
        # Nothing new left once the driver was gone (the gateway logs `sent` as an attempt leaves).
        assert max(t for log in logs.values() for t, _ in read_spend(log).sent) <= dead_at + 0.05
        assert all(r.outcome == "ok" and r.delivered for r in before) and all(r.answered > killed_at for r in in_flight)
        # Every answer the provider gave is recorded: its spend line first, then its cache entry
        # (`gateway._attempt`), which may still be on its way when the last spend line is read.
        cached = lambda: {f.stem for f in (tmp_path / "cache" / "chat").rglob("*.json")}  # noqa: E731
        while time.monotonic() < deadline and len(cached()) < len(before):
            time.sleep(0.1)
        assert len(cached()) == len(before)
        for provider, log in logs.items():
            spend = read_spend(log)
            billed = server.billed_usd(price_table(provider), provider=provider)
            assert spend.unresolved == 0 and spend.paid == pytest.approx(billed, abs=1e-12)
        deadline = time.monotonic() + 60
        while gateways := [n for n in named_actors(env) if n.startswith("vlm_decade-api-")]:
            assert time.monotonic() < deadline, gateways  # each gateway ends itself once its answers are in
            time.sleep(1)

        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    responses = RunFolder(out).read("responses")
    assert responses.num_rows == 80 and set(responses.column("status").to_pylist()) == {"ok"}
    sent = Counter(r.payload_sha256 for r in server.received() if r.endpoint.endswith(("chat", "generate")))
    assert len(sent) == 80 and max(sent.values()) == 1  # none of the answers in flight at the kill bought again
    manifest = RunFolder(out).manifest()
    for provider in ("openai", "gemini"):
        billed = server.billed_usd(price_table(provider), provider=provider)
        assert manifest["spend_usd"][provider] == pytest.approx(billed, abs=1e-6)  # the manifest keeps 6 decimals
        assert provider not in manifest.get("spend_unresolved_usd", {})


def test_a_cloud_model_and_an_endpoint_model_run_side_by_side_and_validate_asks_the_endpoint(server, tmp_path):
    from vlm_decade.core.errors import InputError
    from vlm_decade.studies import pipeline_of

    with FakeAPIServer(FaultConfig(latency_s=0.05), models=("Qwen2-VL-2B",)) as engine:
        path = study_file(tmp_path, server)
        raw = yaml.safe_load(path.read_text())
        raw["models"] = [
            raw["models"][0],
            {"name": "qwen", "backend": "openai", "model_id": "Qwen2-VL-2B", "era": "mllm", "endpoint": "engine"},
        ]
        raw["encoders"] = []
        raw["providers"]["endpoints"] = {"engine": {"base_url": engine.openai_url, "free": True, "adaptive": True}}
        path.write_text(yaml.safe_dump(raw))
        pipeline_of(load_study(path)).check(load_study(path))  # the endpoint answers and serves the model
        study, _, table = describe(path, tmp_path / "run")
        by_subject = Counter((r["subject"], r["status"]) for r in table.to_pylist())
        assert by_subject == Counter({("gpt", "ok"): 64, ("qwen", "ok"): 16})
        qwen = [r for r in table.to_pylist() if r["subject"] == "qwen"]
        assert {r["model_version"] for r in qwen} == {"Qwen2-VL-2B-2025-01-01+fp_fake"}
        assert all(r["cost_usd"] == 0.0 for r in qwen)
        # Each server got only its own model's requests.
        assert engine.counts() == Counter({"openai.chat": 16, "openai.models": 1})
        assert server.counts() == Counter({"openai.chat": 64})
        assert RunFolder(tmp_path / "run").manifest()["spend_usd"]["engine"] == 0.0
        raw["models"][1]["model_id"] = "Qwen2-VL-7B"
        path.write_text(yaml.safe_dump(raw))
        with pytest.raises(InputError) as refused:
            pipeline_of(load_study(path)).check(load_study(path))
    assert f"endpoint 'engine' at {engine.openai_url} does not serve 'Qwen2-VL-7B'" in str(refused.value)
    assert "models[1].model_id" in str(refused.value)
