"""Starting Ray: a start that times out is tried once more, then said as an environment error; Ray's
own lines, and the notices published to its driver, are kept, colour codes out, in the run
folder's log."""

import logging

import pytest

from vlm_decade.core.runtime import (
    RAY_LOG,
    PendingLog,
    RayStartFailed,
    keep_worker_logs,
    published_lines_into_log,
    ray_log_handler,
    ray_logging_into,
    start_with_retry,
)

TIMED_OUT = Exception("The current node timed out during startup. This could happen because ...")


def starter(*outcomes):
    """A start function that meets `outcomes` in turn (an exception is raised), recording attempts."""
    attempts = []

    def start(attempt):
        attempts.append(attempt)
        outcome = outcomes[len(attempts) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return start, attempts


def test_a_timed_out_start_is_tried_once_more_after_a_pause():
    start, attempts = starter(TIMED_OUT, "ray")
    pauses = []
    assert start_with_retry(start, pause_s=7, sleep=pauses.append) == "ray"
    assert attempts == [0, 1] and pauses == [7]


def test_two_time_outs_are_an_environment_error_that_says_what_to_try():
    start, attempts = starter(TIMED_OUT, TIMED_OUT)
    with pytest.raises(RayStartFailed) as caught:
        start_with_retry(start, sleep=lambda s: None)
    assert attempts == [0, 1]
    said = str(caught.value)
    assert "timed out during startup" in said and "runtime.num_cpus" in said and "--address" in said


def test_another_error_is_not_retried():
    start, attempts = starter(ValueError("bad resources"))
    with pytest.raises(ValueError, match="bad resources"):
        start_with_retry(start, sleep=lambda s: None)
    assert attempts == [0]


def test_workers_output_lands_in_the_run_folder_log_without_colour_codes(tmp_path):
    session = tmp_path / "session"
    session.mkdir()
    (session / "worker-ab-1.out").write_text("\x1b[36m(DescribeActor pid=1)\x1b[0m loaded\n")
    (session / "worker-ab-1.err").write_text("INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
    (session / "worker-cd-2.out").write_text("")  # nothing printed: no header
    (session / "raylet.out").write_text("not a worker's\n")
    keep_worker_logs(session, tmp_path / "logs")
    assert (tmp_path / "logs" / RAY_LOG).read_text() == (
        "--- worker-ab-1.err\nINFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n"
        "--- worker-ab-1.out\n(DescribeActor pid=1) loaded\n"
    )


def test_ray_warnings_go_to_the_log_not_the_terminal(tmp_path, capsys):
    logger = logging.getLogger("ray")
    saved = logger.handlers[:], logger.propagate, logger.level
    try:
        with ray_logging_into(ray_log_handler(tmp_path)):
            logger.handlers.clear()  # as ray.init(configure_logging=False) does
            logging.getLogger("ray._private.authentication").warning("Token authentication is enabled")
        logging.getLogger("ray.actor").warning("an actor's warning")
        assert capsys.readouterr().err == ""
        logged = (tmp_path / RAY_LOG).read_text()
        assert "WARNING ray._private.authentication: Token authentication is enabled" in logged
        assert "WARNING ray.actor: an actor's warning" in logged
    finally:
        for handler in logger.handlers[:]:
            logger.removeHandler(handler)
            handler.close()
        logger.handlers[:], logger.propagate, logger.level = saved[0], saved[1], saved[2]


def test_notices_published_to_the_driver_go_to_the_log_not_stdout(tmp_path, capsys):
    """The driver's thread that prints what raylets and GCS publish (a detached actor in an
    anonymous namespace, too many workers started) prints into the log instead, from `ray.init` on."""
    from types import SimpleNamespace

    logger = logging.getLogger("ray")
    saved = logger.handlers[:], logger.propagate, logger.level
    worker = SimpleNamespace(print_to_stdstream=None)  # stands for ray._private.worker
    published_lines_into_log(worker)
    notice = "It looks like you're creating a detached actor in an anonymous namespace."
    try:
        with ray_logging_into(ray_log_handler(tmp_path)):
            logger.handlers.clear()  # as ray.init(configure_logging=False) does
            worker.print_to_stdstream({"lines": [f"\x1b[33m{notice}\x1b[0m"], "pid": "raylet", "is_err": False}, False)
        workers = "WARNING: 12 PYTHON worker processes have been started on node: abc"
        worker.print_to_stdstream({"lines": [workers], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        assert capsys.readouterr() == ("", "")
        logged = (tmp_path / RAY_LOG).read_text()
        assert f"WARNING ray._private.worker: (raylet) {notice}\n" in logged and f"(raylet) {workers}" in logged
    finally:
        for handler in logger.handlers[:]:
            logger.removeHandler(handler)
            handler.close()
        logger.handlers[:], logger.propagate, logger.level = saved[0], saved[1], saved[2]


def test_lines_of_a_start_begun_before_the_run_folder_opened_are_written_there_first(tmp_path, capsys):
    """A Ray started ahead of the run folder (images added to a finished run): its lines are held,
    then written to the folder's log in order, before the lines after it is named; none on the terminal."""
    logger = logging.getLogger("ray")
    saved = logger.handlers[:], logger.propagate, logger.level
    pending = PendingLog()
    try:
        with ray_logging_into(pending):
            logger.handlers.clear()  # as ray.init(configure_logging=False) does
            logging.getLogger("ray._private.worker").warning("SIGTERM handler is not set")
            logging.getLogger("ray._private.worker").warning("Ray started on a thread")
        assert not (tmp_path / RAY_LOG).exists()  # the folder is not named yet: nothing written
        pending.keep_in(tmp_path)
        logging.getLogger("ray.actor").warning("an actor's warning")
        assert capsys.readouterr().err == ""
        lines = (tmp_path / RAY_LOG).read_text().splitlines()
        assert [line.split(" ", 2)[2] for line in lines] == [
            "WARNING ray._private.worker: SIGTERM handler is not set",
            "WARNING ray._private.worker: Ray started on a thread",
            "WARNING ray.actor: an actor's warning",
        ]
    finally:
        for handler in logger.handlers[:]:
            logger.removeHandler(handler)
            handler.close()
        logger.handlers[:], logger.propagate, logger.level = saved[0], saved[1], saved[2]


def test_verbose_on_the_command_line_lets_ray_speak(monkeypatch):
    from typer.testing import CliRunner

    from vlm_decade import cli
    from vlm_decade.core.runtime import VERBOSE_ENV, verbose

    monkeypatch.setenv(VERBOSE_ENV, "0")  # restored after the test
    assert not verbose()
    assert CliRunner().invoke(cli.app, ["schema", "decade"]).exit_code == 0
    assert not verbose()
    assert CliRunner().invoke(cli.app, ["--verbose", "schema", "decade"]).exit_code == 0
    assert verbose()


def test_the_gpus_a_local_ray_would_have_are_the_machines_cuda_devices(monkeypatch):
    """Before Ray starts, validate counts GPUs as Ray will: a local Ray finds this machine's CUDA
    devices; a cluster is not counted (it may autoscale)."""
    import sys

    import torch

    from vlm_decade.core.config import RuntimeConfig
    from vlm_decade.core.runtime import gpus_available

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # not imported: not started
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert gpus_available(RuntimeConfig()) == (3.0, "this machine's torch.cuda.device_count() is")
    assert gpus_available(RuntimeConfig(address="ray://head:10001")) is None
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    assert gpus_available(RuntimeConfig()) is None


def test_validate_refuses_more_gpus_than_this_machine_has(monkeypatch, tmp_path):
    import sys

    import torch
    import yaml
    from typer.testing import CliRunner

    from vlm_decade.cli import app
    from vlm_decade.demo import materialize

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    raw = yaml.safe_load(materialize(tmp_path).read_text())
    for actors, code in ((1, 0), (2, 2)):
        raw["runtime"] = {**raw.get("runtime", {}), "gpus_per_actor": 1, "actors_per_model": actors}
        (tmp_path / "gpus.yaml").write_text(yaml.safe_dump(raw))
        done = CliRunner().invoke(app, ["validate", str(tmp_path / "gpus.yaml")])
        said = " ".join(done.output.split())
        assert done.exit_code == code, said
    assert "Traceback" not in said and said.startswith("1 problem") and "runtime.gpus_per_actor" in said
    assert "2 actors x 1 GPU = 2 GPU, but this machine's torch.cuda.device_count() is 1" in said
