"""Helpers for end-to-end tests: run the command line in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200"})
    env.pop("RAY_ADDRESS", None)
    return env


def vlm_decade(*args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "vlm-decade"), *args], capture_output=True, text=True, timeout=timeout, env=cli_env(), **kwargs
    )


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One uninterrupted demo run shared by the e2e tests (it takes a minute)."""
    out = tmp_path_factory.mktemp("demo") / "run"
    result = vlm_decade("demo", "--out", str(out))
    assert result.returncode == 0, result.stderr[-4000:]
    return out, result
