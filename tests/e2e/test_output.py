"""What the command line prints into a log or a pipe, as a user's shell sees it: whole lines (a long
path never broken), a problem on many rows collapsed (`validate --all` lists them all), Ray's own lines
kept off it (they go to the run folder's logs/ray.log), and a smoke run (`--limit`) stopped with
Ctrl-C: exit 130, what was kept and the command that goes on; `status` says it is a smoke run, and a
full run refuses its folder."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pyarrow.parquet as pq
import pytest

from vlm_decade.demo import materialize

from .conftest import BIN, cli_env

pytestmark = pytest.mark.e2e

LONG = [f"a-rather-long-folder-name-{i}" for i in range(1, 5)]  # the path runs well past 80 columns


def pipe_env(**extra: str) -> dict[str, str]:
    env = cli_env() | extra
    env.pop("COLUMNS")  # as in a log or a pipe: no width given
    return env


def test_off_a_terminal_lines_stay_whole_and_a_problem_on_many_rows_is_collapsed(tmp_path):
    inputs = tmp_path.joinpath(*LONG)
    study = materialize(inputs)
    descriptions = inputs / "descriptions.csv"
    descriptions.write_text(descriptions.read_text().replace(",full,", ",default,"))
    rows = descriptions.read_text().count(",default,")
    files = sorted(tmp_path.rglob("*"))

    def validate(*args: str) -> list[str]:
        result = subprocess.run(
            [str(BIN / "vlm-decade"), "validate", str(study), *args],
            capture_output=True,
            text=True,
            env=pipe_env(),
            timeout=300,
        )
        assert result.returncode == 2, result.stderr
        return result.stderr.splitlines()

    lines = validate()
    unknown = [line for line in lines if "unknown condition 'default'" in line]
    assert len(unknown) == 3 and all(line.startswith(f"  - {descriptions}, row ") for line in unknown)
    assert f"    ... and {rows - 3} more rows like it" in lines
    assert lines[-1] == f"every one of them: vlm-decade validate {study} --all"
    every = validate("--all")
    assert sum(line.startswith(f"  - {descriptions}, row ") for line in every) == rows
    assert not any("more rows like it" in line for line in every)
    assert sorted(tmp_path.rglob("*")) == files  # a refused command writes nothing


def _output_once_stopped(proc: subprocess.Popen) -> tuple[str, str]:
    """The stopped driver's stdout and stderr; a driver still there two minutes after Ctrl-C fails the
    test with its threads' stacks (PYTHONFAULTHANDLER dumps them on SIGABRT) and its session's
    processes, so a rare hang says where it hung."""
    try:
        return proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        processes = subprocess.run(
            ["ps", "-s", str(proc.pid), "-o", "pid,stat,etime,args"], capture_output=True, text=True
        )
        proc.send_signal(signal.SIGABRT)
        stderr = proc.communicate(timeout=60)[1]
        # Every thread's stack, each innermost frame first (the main thread's last): the whole dump.
        dump = stderr[max(stderr.find("Fatal Python error"), 0) :]
        raise AssertionError(f"still running 120 s after Ctrl-C:\n{processes.stdout}\n{dump[:40_000]}") from None


def test_a_smoke_run_stopped_with_ctrl_c_says_what_it_kept_and_how_to_go_on(tmp_path):
    study = materialize(tmp_path / "inputs")
    paused = tmp_path / "paused"
    command = [str(BIN / "vlm-decade"), "run", str(study), "--limit", "2"]
    # The driver starts as a command typed at a terminal does, whatever started this suite: a
    # suite run in the background of a script (nohup, `&`) ignores SIGINT, and a child inherits an
    # ignored signal, so Ctrl-C would never reach it.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            command,
            cwd=tmp_path,  # the demo study's run folder is runs/study, under the current folder
            env=pipe_env(VLM_DECADE_PAUSE_AFTER_PART=f"responses:{paused}", PYTHONFAULTHANDLER="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    finally:
        signal.signal(signal.SIGINT, inherited)
    deadline = time.monotonic() + 600
    while not paused.exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no part of the responses within 10 minutes"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # to the driver, as Ctrl-C would
    stdout, stderr = _output_once_stopped(proc)
    assert proc.returncode == 130, stderr[-3000:]

    run = tmp_path / "runs" / "study-smoke2"  # never runs/study: a smoke run has its own folder
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["limit"] == 2 and manifest["config"]["limit"] == 2
    assert pq.read_table(run / "images.parquet").num_rows == 4  # the first 2 of each of the 2 datasets
    saved = sum(pq.read_metadata(p).num_rows for p in (run / ".parts" / "responses").glob("part-*.parquet"))
    lines = stderr.splitlines()
    assert "kept: the stages finished (images, references, metadata)" in lines
    assert f"kept: {saved} rows of responses, saved before the stop (not done again)" in lines
    assert f"to go on from there: vlm-decade run {study} --limit 2" in lines
    # Ray's own lines went to the run folder's log, not to the user: neither its logging nor what
    # its raylets publish to the driver (printed to stdout by a thread of Ray's)
    terminal = stdout + stderr
    assert "\x1b[" not in terminal and "Token authentication" not in terminal
    assert not any(mark in terminal for mark in ("(raylet)", "(pid=", "worker processes have been started"))
    assert "Token authentication is enabled" in (run / "logs" / "ray.log").read_text()

    status = subprocess.run(
        [str(BIN / "vlm-decade"), "status", str(run)], capture_output=True, text=True, env=pipe_env(), timeout=300
    )
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0] == (
        "smoke run: only the first 2 images of each dataset (run --limit 2); not the full study"
    )
    full = subprocess.run(
        [str(BIN / "vlm-decade"), "run", str(study), "--out", str(run)],
        capture_output=True,
        text=True,
        env=pipe_env(),
        timeout=300,
    )
    assert full.returncode == 2, full.stderr
    assert f"{run} holds a smoke run of the first 2 images of each dataset" in " ".join(full.stderr.split())
    assert json.loads((run / "manifest.json").read_text())["limit"] == 2  # left as it was
