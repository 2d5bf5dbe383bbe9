"""`ray job submit` of the demo study to a local head on 127.0.0.1, as a cluster user would."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests import required
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runtime import offline_env

from .conftest import BIN, TRACED, cli_env, strace_filtered
from .netcheck import outside_traffic

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    env = cli_env() | offline_env(tmp_path / "ray_home")
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"  # the job's `python` is this environment's
    port, dashboard = _free_port(), _free_port()
    # Ray's socket paths must fit in 107 bytes, which pytest's tmp_path does not leave room for.
    ray_tmp = tempfile.mkdtemp(prefix="vd-ray-", dir="/tmp")
    cmd = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        # The job agent's own port is fixed by default (52365): a Ray already running on the
        # machine would hold it, and this head's agent would never take jobs.
        f"--dashboard-agent-listen-port={_free_port()}",
        "--num-cpus=2",
        "--disable-usage-stats",
        f"--temp-dir={ray_tmp}",
    ]
    log = tmp_path / "head.strace"
    strace = required.tool("strace")
    cmd = [
        strace,
        *strace_filtered(strace),
        "-f",
        "-qq",
        "-e",
        TRACED,
        "-o",
        str(log),
        *cmd,
    ]
    head_log = open(tmp_path / "head.log", "w")
    head = subprocess.Popen(cmd, env=env, stdout=head_log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    deadline = time.monotonic() + 120
    while True:
        probe = subprocess.run(
            [str(BIN / "ray"), "job", "list", "--address", address], env=env, capture_output=True, text=True
        )
        if probe.returncode == 0:
            break
        assert head.poll() is None, "ray start --head exited: " + (tmp_path / "head.log").read_text()[-3000:]
        assert time.monotonic() < deadline, probe.stderr[-2000:]
        time.sleep(1)
    yield address, env, log
    # A test head holds nothing worth draining (SIGTERM waits 30 s for that): kill it outright.
    os.killpg(head.pid, signal.SIGKILL)
    head.wait(timeout=30)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_ray_job_submit_finishes_the_demo_a_workstation_began(ray_head, demo_run_in_place):
    """The shared demo run with its statistics gone, finished by a job on the head (as a user who
    began on a workstation would finish on the cluster): the job redoes the statistics in Ray tasks
    on the head, keeps every other stage, and ends with the tables of the uninterrupted run. The
    whole demo under a job would cost minutes more and test nothing the shared run does not."""
    address, env, strace_log = ray_head
    out = demo_run_in_place / "decade"
    before = RunFolder(out).read("stats")
    (out / "stats.parquet").unlink()
    runtime_env = {"excludes": [".venv", ".git", "runs", "**/__pycache__"]}
    submit = subprocess.run(
        [
            str(BIN / "ray"),
            "job",
            "submit",
            "--address",
            address,
            "--submission-id",
            "vlm-decade-e2e",
            "--working-dir",
            str(REPO),
            "--runtime-env-json",
            json.dumps(runtime_env),
            "--",
            "python",
            "jobs/decade_study.py",
            "--demo",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    from ray.job_submission import JobStatus, JobSubmissionClient

    said = submit.stdout[-4000:] + submit.stderr[-2000:]
    assert submit.returncode == 0, said
    assert JobSubmissionClient(address).get_job_status("vlm-decade-e2e") == JobStatus.SUCCEEDED, said
    assert f"run folder: {out.resolve()}" in submit.stdout  # the job says where its results are
    manifest = json.loads((out / "manifest.json").read_text())
    assert all(s["state"] == "done" for s in manifest["stages"].values())
    assert "stats: stats.parquet is missing; done again" in submit.stdout, said
    assert set(re.findall(r"skip (\w+) ", submit.stdout)) == set(manifest["stages"]) - {"stats"}, said
    assert RunFolder(out).read("stats").equals(before)
    assert outside_traffic(strace_log.read_text()) == []
