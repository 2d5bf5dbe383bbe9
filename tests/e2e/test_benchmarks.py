"""Every benchmark in benchmarks/ run at a tiny size, as its docstring says to run it: it exits 0 and
the last line it prints is the JSON summary it promises, with the checks it makes of itself (tables
equal, no request lost or answered twice) passed. The figures are not looked at: tiny sizes measure
nothing. What this keeps is that no benchmark stops running on the package as it is now.

The benchmarks that use Ray join one local head started here, as a cluster user's would, instead of
each starting its own (seconds each)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from vlm_decade.core.runtime import offline_env

from .conftest import BIN, cli_env

pytestmark = pytest.mark.e2e
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# benchmark -> its smallest arguments, and the keys its summary promises.
SMOKE = {
    "adaptive_concurrency": (
        ["--requests", "10", "--latency", "0.02", "--repeats", "1"],
        {"best_fixed", "default_fixed", "adaptive", "ratio_vs_best_fixed", "ratio_vs_default_fixed"},
    ),
    "api_batch": (
        ["--requests", "20", "--per-batch", "10", "--texts", "20"],
        {"duplicate_lines", "answers_identical_to_sync", "cost_ratio", "embeddings"},
    ),
    "api_throughput": (
        ["--requests", "30", "--rpm", "60000", "--latency", "0.01", "--sequential", "5", "--budget-requests", "10"]
        + ["--tpm", "2000", "--tpm-window", "1", "--tpm-windows", "2"],
        {"share_of_limit", "max_in_any_60s", "lost", "wait_over_retry_after", "budget_overshoot", "tpm_share_ratio"},
    ),
    "bootstrap": (
        ["--smoke"],
        {"speedup_vs_scipy", "speedup_vs_scipy_best", "ours_over_floor", "chunks_fresh_matrix_over_one"}
        | {"seconds_per_million_images", "loglog_slope_time_vs_images"},
    ),
    "column_hashing": (["--rows", "1000"], {"bytes_64", "bytes_540"}),
    "embed_throughput": (
        ["--texts", "200", "--rounds", "1"],
        {"plain_texts_per_s", "stage_texts_per_s", "ratio_vs_plain", "ratio_vs_plain_imports_done"},
    ),
    "embed_write": (
        ["--texts", "2000", "--passes", "2"],
        {"one_pass_s", "passes_every_part_s", "passes_footers_s", "every_part_over_footers"},
    ),
    "endpoint_throughput": (["--smoke"], {"server", "endpoint", "actor", "ratio", "ratio_with_startup"}),
    "engine_choice": (
        ["--texts", "300", "--rounds", "1", "--no-kill"],
        {"dispatcher_texts_per_s", "raydata_parquet_texts_per_s", "raydata_parts_texts_per_s"}
        | {"ratio_raydata_parquet_vs_dispatcher", "ratio_raydata_parts_vs_dispatcher"},
    ),
    "gpu_backends": (
        ["--quick", "--device", "cpu", "--repeats", "1", "--batch-sizes", "1", "--new-tokens", "2"],
        {"device_name", "best_per_s"},
    ),
    "image_checks": (
        ["--images", "20", "--rounds", "1", "--sizes", "32x32"],
        {"serial_s", "threads_s", "default_s", "processes_s", "default_speedup_vs_serial"},
    ),
    "imported_lookup": (
        ["--images", "1000", "--batches", "5", "--actor-batches", "5"],
        {"sorted_ms_per_batch", "scan_over_sorted", "driver_rows_per_s", "driver_over_actor_method"},
    ),
    "incremental": (
        ["--images", "20", "--humans", "2", "--model-texts", "2"],
        {"base_s", "incremental_s", "fresh_s", "incremental_over_fresh", "tables_equal", "tables"},
    ),
    "ingest": (["--images", "200", "--traced", "no"], {"images", "seconds", "references", "peak_rss_mb"}),
    "local_inference": (
        ["--smoke"],
        {"ratio_1_actor", "ratio_2_actors", "ratio_1_actor_with_startup", "ratio_2_actors_with_startup"},
    ),
    "openworld_scoring": (
        ["--predictions", "50"],
        {"seconds_distinct_once", "seconds_per_prediction_loop", "speedup", "max_abs_diff_ss", "max_abs_diff_cs"},
    ),
    "report_size": (["--sizes", "4"], {"decade", "openworld"}),
    "scale": (["--sizes", "20", "--humans", "2", "--model-texts", "2"], {"sizes", "humans", "model_texts"}),
    "shards": (
        ["--images", "300"],
        {"local_ratio_images_per_s_shards_over_loose", "local_ratio_peak_rss_shards_over_loose"}
        | {"s3_ratio_images_per_s_shards_over_loose", "s3_shards_serve_one_ms", "local_shards_serve_one_ms"},
    ),
    "vector_storage": (
        ["--rows", "2000", "--dim", "8", "--rounds", "1"],
        {"write_s", "read_s", "mb", "write_speedup", "read_speedup"},
    ),
    "whole_run_costs": (["--images", "500", "--vectors", "5000"], {"counts", "vectors_gathered", "ranking"}),
}

# What a benchmark checks of itself and says in its summary: a smoke run that breaks it fails.
SELF_CHECKS = {
    "api_batch": lambda s: s["duplicate_lines"] == 0 and s["answers_identical_to_sync"],
    "api_throughput": lambda s: s["lost"] == 0 and s["budget_overshoot"] <= 1.0,
    "incremental": lambda s: s["tables_equal"],
    "openworld_scoring": lambda s: max(s["max_abs_diff_ss"], s["max_abs_diff_cs"]) < 1e-5,
}


def test_every_benchmark_has_a_smoke_run():
    assert sorted(p.stem for p in BENCHMARKS.glob("*.py")) == sorted(SMOKE)


@pytest.fixture(scope="module")
def ray_head():
    """A local Ray head (`ray start --head`) for the module: the address its benchmarks join."""
    # Ray's socket paths must fit in 107 bytes, which pytest's tmp_path does not leave room for.
    ray_tmp = Path(tempfile.mkdtemp(prefix="vd-bench-", dir="/tmp"))
    env = cli_env() | offline_env(ray_tmp / "home")
    command = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--port=0"]
    command += [f"--num-cpus={os.cpu_count() or 2}", "--include-dashboard=false", "--disable-usage-stats"]
    log_path = ray_tmp / "head.log"
    log = open(log_path, "w")
    head = subprocess.Popen(
        [*command, f"--temp-dir={ray_tmp / 'ray'}"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while "Ray runtime started" not in log_path.read_text():
        assert head.poll() is None, "ray start --head exited: " + log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.5)
    yield (ray_tmp / "ray" / "ray_current_cluster").read_text().strip()
    # Nothing on this head is worth draining (SIGTERM waits 30 s for that): kill it outright.
    os.killpg(head.pid, signal.SIGKILL)
    head.wait(timeout=30)
    log.close()
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_benchmark_runs_at_a_tiny_size(name, ray_head):
    args, promised = SMOKE[name]
    env = cli_env() | {"RAY_ADDRESS": ray_head}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        cwd=BENCHMARKS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(summary, dict) and promised <= summary.keys(), sorted(summary)
    assert SELF_CHECKS.get(name, lambda s: True)(summary), summary
