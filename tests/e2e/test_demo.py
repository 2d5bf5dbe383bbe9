"""The demo end to end: report from the run's tables, no repeated work, resume after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pyarrow.parquet as pq
import pytest

from .conftest import BIN, cli_env, vlm_decade

pytestmark = pytest.mark.e2e

STAGES = ("images", "references", "responses", "embeddings", "scores", "stats", "metric_validation", "stsb", "report")
TABLES = ("images", "references", "responses", "embeddings", "scores", "stats", "comparisons", "metric_validation", "stsb")
# Wall-clock columns differ between runs by nature; everything else must be identical.
VOLATILE = {"responses": ["latency_s"]}


def _table(run, name):
    table = pq.read_table(run / f"{name}.parquet")
    drop = [c for c in VOLATILE.get(name, []) if c in table.column_names]
    table = table.drop_columns(drop)
    if name == "images":  # absolute paths differ between two run folders
        table = table.drop_columns(["path"])
    return table


def test_demo_writes_report_and_tables(demo_run):
    out, result = demo_run
    html = (out / "report.html").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert "Demo data" in html and "not findings" in html
    for name in TABLES:
        assert (out / f"{name}.parquet").exists(), name
    assert all(manifest["stages"][s]["state"] == "done" for s in STAGES)
    assert manifest["ranking_method"] == {"everyday": "votes", "specialist": "votes"}
    assert "api_key" not in json.dumps(manifest).lower()
    images = pq.read_table(out / "images.parquet")
    assert images.num_rows == 16 and all(len(h) == 64 for h in images.column("sha256").to_pylist())
    # The figure and the report's numbers come from this run's stats table.
    stats = pq.read_table(out / "stats.parquet").to_pylist()
    assert (out / "figures" / "similarity_SBERT-SI.png").stat().st_size > 10_000
    assert "figures/similarity_SBERT-SI.png" in html
    subjects = {r["subject"] for r in stats}
    assert {"ssd-template", "demo-imported", "human:top", "human:bottom"} <= subjects
    for r in stats:
        assert r["ci_low"] <= r["estimate"] <= r["ci_high"]
        assert f"{r['estimate']:.3f}" in html
    responses = pq.read_table(out / "responses.parquet")
    assert responses.num_rows == 2 * 16 * 4  # two models x 16 images x (full + 3 masks)
    assert {r["metric"] for r in stats} == {"SBERT-SI", "BERTScore"}
    # The metrics against (simulated) raters, and against STS-B's real human ratings.
    validation = pq.read_table(out / "metric_validation.parquet").to_pylist()
    assert {r["metric"] for r in validation if r["role"] == "metric"} == {"SBERT-SI", "BERTScore"}
    assert (out / "figures" / "metric_validation.png").exists() and "simulated for the demo" in html
    stsb = {(r["metric"], r["subset"]): r for r in pq.read_table(out / "stsb.parquet").to_pylist()}
    assert stsb[("SBERT-SI", "test")]["spearman"] == pytest.approx(0.8203, abs=0.01)
    assert stsb[("SBERT-SI", "test")]["n_pairs"] == 1379 and stsb[("BERTScore", "test_images")]["n_pairs"] == 250


def test_second_run_does_no_work_and_says_so(demo_run):
    out, _ = demo_run
    before = {n: (out / f"{n}.parquet").stat().st_mtime_ns for n in TABLES}
    again = vlm_decade("demo", "--out", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    for stage in STAGES:
        assert f"skip {stage}" in " ".join(again.stderr.split()), again.stderr
    assert "run " not in again.stderr
    assert before == {n: (out / f"{n}.parquet").stat().st_mtime_ns for n in TABLES}


def test_sigkill_midway_then_rerun_gives_the_same_tables(demo_run, tmp_path):
    reference, _ = demo_run
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [str(BIN / "vlm-decade"), "demo", "--out", str(out)],
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    parts = out / ".parts" / "responses"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(parts.glob("part-*.parquet")):
        assert proc.poll() is None, "the demo ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started
    proc.wait(timeout=30)
    assert not (out / "responses.parquet").exists(), "killed too late to test a resume"
    kept = len(list(parts.glob("part-*.parquet")))
    assert kept >= 1

    resumed = vlm_decade("demo", "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "already done, kept" in resumed.stderr
    for name in TABLES:
        assert _table(out, name).equals(_table(reference, name)), name
