"""Starting or joining Ray, with nothing sent off this machine.

A local Ray's dashboard process probes cloud metadata endpoints (169.254.169.254,
metadata.google.internal) unless `~/ray_bootstrap_config.yaml` names a provider, and `ray start`
posts usage statistics unless told not to (and, told not to, still posts that it was told). A scientific tool should not phone home, so a local
Ray here runs with usage stats off and a private HOME for the Ray processes that holds a
`provider: {type: local}` bootstrap file. Cache folders keep pointing at the user's real ones.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

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


def start_ray(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None):
    """Join the cluster at `address` (or RAY_ADDRESS), else start a local, offline Ray. Idempotent."""
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    os.environ.update({k: os.environ.get(k, v) for k, v in QUIET_RAY_ENV.items()})
    if address:
        ray.init(address=address, log_to_driver=True)
        return ray
    env = offline_env()
    with _environ(env):
        ray.init(
            # "local": a new Ray of our own, even when another one (`ray start`) runs on this machine;
            # without it, ray.init would quietly join that one.
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=True,
            logging_level="WARNING",
        )
    return ray


class LazyRay:
    """Starts (or joins) Ray the first time a stage needs it; shuts down only what it started.
    Call it for the `ray` module."""

    def __init__(self, runtime: RuntimeConfig):
        self.runtime = runtime
        self.ray = None
        self.started = False

    def __call__(self):
        if self.ray is None:
            import ray

            self.started = not ray.is_initialized()
            self.ray = start_ray(self.runtime.address, self.runtime.num_cpus)
        return self.ray

    def close(self) -> None:
        if self.ray is not None and self.started:
            self.ray.shutdown()
