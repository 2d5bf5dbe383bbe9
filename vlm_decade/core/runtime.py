"""Starting or joining Ray, with nothing sent off this machine.

A local Ray's dashboard process probes cloud metadata endpoints (169.254.169.254,
metadata.google.internal) unless `~/ray_bootstrap_config.yaml` names a provider, and `ray start`
posts usage statistics unless told not to (and, told not to, still posts that it was told). A scientific tool should not phone home, so a local
Ray here runs with usage stats off and a private HOME for the Ray processes that holds a
`provider: {type: local}` bootstrap file. Cache folders keep pointing at the user's real ones.

Ray's own lines (its warnings, workers' output with colour codes, native libraries' notices printed in
actors, the notices its raylets and GCS publish to the driver) stay off the user's terminal unless
`VERBOSE_ENV` is set (`vlm-decade --verbose`): they go to `logs/ray.log` in the run folder. A local Ray that times out while starting (it happens on a
loaded machine) is tried once more after a pause, then reported as `RayStartFailed`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any

from vlm_decade.core.config import RuntimeConfig
from vlm_decade.core.files import atomic_write_bytes

QUIET_RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # With stats disabled, a head started by `ray start` still posts a "disabled" notice to this
    # URL (a DNS lookup and an HTTPS request); point it at a closed local port instead.
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    # Our own progress bars speak for each stage; transformers' weight-loading bars only add noise.
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


# Set (to "1") by `vlm-decade --verbose`: Ray's own lines reach the terminal as Ray prints them.
VERBOSE_ENV = "VLM_DECADE_VERBOSE"
RAY_LOG = "ray.log"  # in the run folder's logs/
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Ray waits a fixed 30 s for its raylet to register; on a loaded machine that is sometimes too short.
STARTUP_TIMEOUT = "timed out during startup"


class RayStartFailed(Exception):
    """A local Ray did not start, twice: an error of the environment, with what to try."""


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


def start_with_retry(start: Callable[[int], object], pause_s: float = 10.0, sleep=time.sleep):
    """`start(attempt)` (attempt 0, then 1), tried once more, after `pause_s`, when the first attempt
    timed out during startup; a second time-out (or one on the retry) becomes `RayStartFailed`. Any
    other error passes through: it is no matter of load."""
    for attempt in (0, 1):
        try:
            return start(attempt)
        except Exception as exc:  # Ray raises a bare Exception for the time-out
            if STARTUP_TIMEOUT not in str(exc):
                raise
            if attempt == 1:
                raise RayStartFailed(
                    f"a local Ray did not start ({exc}), twice. The machine is probably too loaded: run again when "
                    "it is less busy, give the run fewer CPUs (runtime.num_cpus in the study file), or start Ray "
                    "yourself (`ray start --head`) and pass its address with --address"
                ) from None
            sleep(pause_s)


def without_ansi(text: str) -> str:
    """`text` with terminal colour codes taken out (Ray colours its workers' lines)."""
    return _ANSI.sub("", text)


def ray_log_handler(log_dir: Path | None) -> logging.Handler:
    """Where Ray's own Python logging goes instead of the terminal: `log_dir/ray.log` (nowhere when
    there is no run folder to hold it)."""
    if log_dir is None:
        return logging.NullHandler()
    log_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_dir / RAY_LOG, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


class PendingLog(logging.Handler):
    """Ray's lines from a start begun before the run folder was opened (`LazyRay.keep_logs_in`): held
    until the folder's logs/ is named, then written there, as are the lines after."""

    def __init__(self):
        super().__init__()
        self.held: list[logging.LogRecord] = []
        self.target: logging.Handler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.target is None:
            self.held.append(record)
        else:
            self.target.handle(record)

    def keep_in(self, log_dir: Path) -> None:
        target = ray_log_handler(log_dir)
        with self.lock:  # `handle` holds it around `emit`: no line is written out of order or lost
            self.target = target
            for record in self.held:
                target.handle(record)
            self.held = []

    def close(self) -> None:
        if self.target is not None:
            self.target.close()
        super().close()


@contextmanager
def ray_logging_into(handler: logging.Handler):
    """Ray's logging (its warnings, "Token authentication is enabled ...") into `handler` alone, from
    the start of `ray.init` on. `ray.init(configure_logging=False)` clears the "ray" logger's
    handlers, so while it runs the handler sits on "ray._private", where its start-up lines come from."""
    ray_logger, private = logging.getLogger("ray"), logging.getLogger("ray._private")
    for logger in (ray_logger, private):
        for old in [h for h in logger.handlers if getattr(h, "vlm_decade", False)]:
            logger.removeHandler(old)
            old.close()
    handler.vlm_decade = True
    private.addHandler(handler)
    try:
        yield
    finally:
        private.removeHandler(handler)
        ray_logger.handlers[:] = [handler]
        ray_logger.setLevel(logging.INFO)
        ray_logger.propagate = False


def published_lines_into_log(worker_module) -> None:
    """The notices Ray's raylets and GCS publish to the driver ("It looks like you're creating a
    detached actor in an anonymous namespace", "N PYTHON worker processes have been started") into
    Ray's logging, so into `ray.log`: the driver prints them to stdout from a thread of its own
    (`listen_error_messages` through `print_to_stdstream`), whatever `log_to_driver` says, from
    `ray.init` to the end of the run. `worker_module` is `ray._private.worker`."""
    log = logging.getLogger("ray._private.worker")  # "ray._private" holds the handler during `ray.init`

    def into_log(data: dict, ignore_prefix: bool = False) -> None:
        for line in data.get("lines", []):
            log.warning("(%s) %s", data.get("pid", "ray"), without_ansi(line))

    worker_module.print_to_stdstream = into_log


def keep_worker_logs(logs_dir: Path, log_dir: Path) -> None:
    """Append what Ray's workers printed (their .out and .err files in Ray's session folder) to
    `log_dir/ray.log`, colour codes taken out, each file under its name."""
    files = sorted(p for p in logs_dir.glob("worker-*") if p.suffix in (".out", ".err") and p.stat().st_size)
    if not files:
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / RAY_LOG, "a", encoding="utf-8") as log:
        for path in files:
            log.write(f"--- {path.name}\n{without_ansi(path.read_text(errors='replace'))}")


def private_ray_home(root: Path | None = None) -> Path:
    """A folder to use as HOME for Ray's own processes, holding the local-provider bootstrap file."""
    base = root or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vlm_decade" / "ray_home"
    base.mkdir(parents=True, exist_ok=True)
    bootstrap = base / "ray_bootstrap_config.yaml"
    if not bootstrap.exists():
        atomic_write_bytes(bootstrap, b"provider: {type: local}\n")
    return base


def offline_env(home: Path | None = None) -> dict[str, str]:
    """Environment for Ray processes (also `ray start` in tests and scripts): quiet and local."""
    real_home = Path.home()
    return {
        **QUIET_RAY_ENV,
        "HOME": str(private_ray_home(home)),
        # Ray's processes get the private HOME; caches stay where the user keeps them.
        "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(real_home / ".cache")),
        "HF_HOME": os.environ.get("HF_HOME", str(real_home / ".cache" / "huggingface")),
    }


@contextmanager
def _environ(overrides: dict[str, str]):
    saved = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def start_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    log_dir: Path | None = None,
    handler: logging.Handler | None = None,
):
    """Join the cluster at `address` (or RAY_ADDRESS), else start a local, offline Ray. Idempotent.
    Unless `verbose()`, Ray's own lines go to `handler`, by default `log_dir/ray.log`, instead of the terminal."""
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    os.environ.update({k: os.environ.get(k, v) for k, v in QUIET_RAY_ENV.items()})
    loud = verbose()
    quiet = {"log_to_driver": loud, "configure_logging": loud, **({"logging_level": "WARNING"} if loud else {})}
    logging_into = nullcontext() if loud else ray_logging_into(handler or ray_log_handler(log_dir))
    if not loud:
        published_lines_into_log(ray._private.worker)
    if address:
        with logging_into:
            ray.init(address=address, **quiet)
        return ray

    def start(attempt: int):
        if attempt:
            ray.shutdown()  # what the timed-out start left
        with _environ(offline_env()):
            ray.init(
                # "local": a new Ray of our own, even when another one (`ray start`) runs on this machine;
                # without it, ray.init would quietly join that one.
                address="local",
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                include_dashboard=False,
                **quiet,
            )

    with logging_into:
        start_with_retry(start)
    return ray


def gpus_available(runtime: RuntimeConfig) -> tuple[float, str] | None:
    """The GPUs a study's actors can have on a local Ray, known before any of them starts, and where
    the figure comes from: those the Ray already started declares (its `num_gpus`, whether or not
    the cards are there), else this machine's CUDA devices (what Ray will find). None for a cluster
    (an address): it may autoscale to fit, as the describe stage's own check of its actors allows."""
    if runtime.address or os.environ.get("RAY_ADDRESS"):
        return None
    ray = sys.modules.get("ray")  # not imported: not started either
    if ray is not None and ray.is_initialized():
        return float(ray.cluster_resources().get("GPU", 0.0)), "this Ray has"
    try:
        import torch
    except ImportError:
        return 0.0, "this machine (no torch) has"
    return float(torch.cuda.device_count()), "this machine's torch.cuda.device_count() is"


def ray_logs_dir(ray) -> Path | None:
    """The session folder where a local Ray keeps its processes' logs (None when not known)."""
    node = getattr(ray._private.worker, "_global_node", None)
    return Path(node.get_logs_dir_path()) if node is not None else None


def kill_autoscaler_monitor(ray) -> None:
    """Kill a local Ray's autoscaler monitor ahead of `ray.shutdown`, which stops GCS before it: the
    monitor's SIGTERM handler then reports its end to GCS, which is gone, until the shutdown's second
    of grace runs out and kills it anyway (a second at the end of every run). A local Ray's monitor
    has nothing to keep: it scales no cluster."""
    node = getattr(ray._private.worker, "_global_node", None)
    for info in getattr(node, "all_processes", {}).get("monitor", []):
        if info.process.poll() is None:
            info.process.kill()
            with suppress(subprocess.TimeoutExpired):  # then the shutdown sees to it, as before
                info.process.wait(timeout=5)


class LazyRay:
    """Starts (or joins) Ray the first time a stage needs it, or ahead of that on a thread
    (`start_soon`); shuts down only what it started. Call it for the `ray` module."""

    def __init__(self, runtime: RuntimeConfig, log_dir: Path | None = None):
        self.runtime = runtime
        self.log_dir = log_dir  # where Ray's own lines go (the run folder's logs/)
        self._log: logging.Handler | None = None  # what takes them, once Ray is started
        self._log_lock = threading.Lock()  # the handler chosen, and `keep_logs_in`, one at a time
        self.ray = None
        self.started = self.local = False
        self.closed = False
        self._lock = threading.Lock()  # one start, and no start after `close`
        self._keeper: threading.Thread | None = None
        self._ahead: Future | None = None  # what the keeper's `then` returns
        self._closer: threading.Thread | None = None  # `close_soon`'s
        self._closing = threading.Event()
        # Set as the run ends: a `then` that waits (for an actor to load) stops, so that nothing
        # touches Ray once it is shut down (Ray ends the process when its worker is used after).
        self.stopping = threading.Event()

    def __call__(self):
        with self._lock:
            if self.closed or self._closer is not None:
                raise RuntimeError("the run has ended: Ray is not started again")
            if self.ray is None:
                import ray

                self.started = not ray.is_initialized()
                # Only a local Ray's session folder holds this run's workers alone (a cluster's, other jobs' too).
                self.local = self.started and not (self.runtime.address or os.environ.get("RAY_ADDRESS"))
                with self._log_lock:
                    self._log = ray_log_handler(self.log_dir) if self.log_dir is not None else PendingLog()
                self.ray = start_ray(self.runtime.address, self.runtime.num_cpus, handler=self._log)
            return self.ray

    def keep_logs_in(self, log_dir: Path) -> None:
        """Ray's own lines, and its workers' at `close`, go to `log_dir/ray.log` from now on; those of
        a start begun before (`start_soon` ahead of the run folder) are written there first. Never
        waits for a start under way."""
        with self._log_lock:
            self.log_dir = log_dir
            if isinstance(self._log, PendingLog):
                self._log.keep_in(log_dir)

    def start_soon(self, then: Callable[[Any], Any]) -> Future:
        """Start (or join) Ray on a thread while the caller goes on, then call `then(ray)` there (start
        actors, say; whoever takes the future waits for it); the future holds what it returned, or why it failed (a
        stage that calls for Ray afterwards tries the start again and says why). The thread lives
        until `close`: a local Ray's own processes are bound to the thread that started them and
        are killed when it ends. While a local Ray starts, HOME is its private one in `os.environ`
        (`offline_env`); the caches the driver may open meanwhile are named by XDG_CACHE_HOME and
        HF_HOME, which stay the user's."""
        future: Future = Future()
        if self._keeper is not None or self.ray is not None:
            try:
                future.set_result(then(self()))
            except Exception as exc:  # noqa: BLE001 - kept in the future, for its taker
                future.set_exception(exc)
            return future
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            # What ray.init does on the main thread only: SIGTERM ends the driver through its
            # `finally` blocks, so Ray is shut down and the run folder left as after an error.
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))

        def keep() -> None:
            try:
                future.set_result(then(self()))
            except BaseException as exc:  # noqa: BLE001 - kept in the future, for its taker
                future.set_exception(exc)
            self._closing.wait()

        self._keeper, self._ahead = threading.Thread(target=keep, name="ray-start", daemon=True), future
        self._keeper.start()
        return future

    def close_soon(self) -> None:
        """`close` on a thread while the caller goes on (to stages that need no Ray, or to say why
        a run was refused): the shutdown waits about a second for Ray's processes to end (and for a
        start under way). `close` waits for it, and so does the process's end."""
        with self._lock:
            if self.closed or self._closer is not None:
                return
            self._closer = threading.Thread(target=self._close, name="ray-close")
            self._closer.start()

    def close(self) -> None:
        """Shut down what this started (once: closing again does nothing), once what was started
        ahead is done: a `then` still waiting stops (`stopping`)."""
        closer = self._closer
        if closer is not None and closer is not threading.current_thread():
            closer.join()
            return
        self._close()

    def _close(self) -> None:
        self.stopping.set()
        if self._ahead is not None and self._keeper is not threading.current_thread():
            wait([self._ahead])
        with self._lock:  # a start under way finishes first, so what it starts is shut down here
            if self.closed:
                return
            self.closed = True
            if self.ray is not None and self.started:
                logs = ray_logs_dir(self.ray)
                if self.local:
                    kill_autoscaler_monitor(self.ray)
                self.ray.shutdown()
                if self.local and logs is not None and self.log_dir is not None and not verbose():
                    keep_worker_logs(logs, self.log_dir)
        self._closing.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join()
