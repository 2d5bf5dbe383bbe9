"""Helpers for end-to-end tests: run the command line in a subprocess, as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200"})
    env.pop("RAY_ADDRESS", None)
    # ray.init sets it in the process that calls it: a test that ran a study in this process would
    # hand it on, and a user's shell has none.
    env.pop("RAY_AUTH_MODE", None)
    return env


def vlm_decade(*args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "vlm-decade"), *args], capture_output=True, text=True, timeout=timeout, env=cli_env(), **kwargs
    )


# What test_offline looks for in a trace: every connection, and every datagram sent.
TRACED = "trace=connect,sendto,sendmsg,sendmmsg,close"


def strace_filtered(strace: str) -> list[str]:
    """`--seccomp-bpf` where this strace and kernel take it, else nothing: with it only the traced
    calls stop a process for strace, instead of every system call of every thread (what made the
    traced demo run minutes longer than an untraced one)."""
    probe = [strace, "--seccomp-bpf", "-f", "-qq", "-e", TRACED, "-o", os.devnull, "true"]
    return ["--seccomp-bpf"] if subprocess.run(probe, capture_output=True).returncode == 0 else []


def demo_trace(run: Path) -> Path:
    """Where the shared demo run's trace lies (beside its run folder)."""
    return run.parent / "strace.log"


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One uninterrupted demo run shared by the e2e tests (it takes minutes). Where strace can trace,
    the run goes under it, its connections logged to `demo_trace(run)` for test_offline: one traced
    run serves both, where a second demo run would cost as much again."""
    out = tmp_path_factory.mktemp("demo") / "run"
    strace = shutil.which("strace")
    if strace and subprocess.run([strace, "-qq", "-o", os.devnull, "true"], capture_output=True).returncode == 0:
        trace = [strace, *strace_filtered(strace), "-f", "-qq", "-e", TRACED, "-o", str(demo_trace(out))]
    else:
        trace = []  # test_offline then fails (or skips, when strace is left out) on its own
    result = subprocess.run(
        [*trace, str(BIN / "vlm-decade"), "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=cli_env(),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return out, result


@pytest.fixture
def demo_run_in_place(demo_run, tmp_path) -> Path:
    """The shared demo run's folder itself, for a test that damages it and reruns the demo there
    (every stage depends on where the run's inputs lie, so in a copy elsewhere every stage would run
    again); the folder is put back as it was afterwards, whatever the test did."""
    root = demo_run[0]
    kept = tmp_path / "kept"
    shutil.copytree(root, kept, symlinks=True)
    yield root
    shutil.rmtree(root)
    shutil.copytree(kept, root, symlinks=True)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """Study A's demo inputs, with Study B's in `openworld/` (its study file there), for the tests
    that damage a copy of them."""
    from vlm_decade.demo import OPENWORLD_STUDY_FILE, materialize
    from vlm_decade.demo.openworld import materialize as materialize_openworld

    folder = tmp_path_factory.mktemp("inputs")
    materialize(folder)
    openworld = materialize_openworld(folder / "openworld")
    (openworld / "study.yaml").write_bytes(OPENWORLD_STUDY_FILE.read_bytes())
    return folder
