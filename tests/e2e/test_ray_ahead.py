"""Ray started ahead (`LazyRay.start_soon`, the embed stage's actors started while earlier stages
run): a local Ray started on a thread keeps working after that start is over, until the run ends;
and shut down beside the last stages (`LazyRay.close_soon`, from then on refused), with `close`
waiting for that."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

DRIVER = """
import json, os, sys, threading, time
from pathlib import Path
from vlm_decade.core.config import RuntimeConfig
from vlm_decade.core.runtime import LazyRay

def where():
    return os.getpid()

lazy = LazyRay(RuntimeConfig(num_cpus=1), Path(sys.argv[1]))
# `then` runs on the starting thread: it submits a task, as the embed stage starts its actors there
future = lazy.start_soon(lambda ray: ray.remote(where).remote())
first = lazy().get(future.result(timeout=300))
time.sleep(3)  # a local Ray's processes die with the thread that started them: it must still be alive
later = lazy().get(lazy().remote(where).remote(), timeout=120)
started = lazy()._private.worker._global_node.all_processes
processes = [(kind, info.process) for kind, infos in started.items() for info in infos]
raylet = started["raylet"][0].process
lazy.close_soon()
try:
    lazy()
    refused = False
except RuntimeError:
    refused = True
lazy.close()
closed_when_close_returned = raylet.poll() is not None
left = sorted(kind for kind, process in processes if process.poll() is None)
print(json.dumps({
    "driver": os.getpid(), "first": first, "later": later, "raylet_exit": raylet.returncode,
    "refused": refused, "closed_when_close_returned": closed_when_close_returned, "left": left,
    "kinds": sorted(kind for kind, _ in processes),
    "threads_alive": [t.name for t in threading.enumerate() if t.name in ("ray-start", "ray-close") and t.is_alive()],
}))
"""


def test_ray_started_on_a_thread_works_after_the_start_and_ends_with_close_soon_then_close(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path / "logs")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["first"] != out["driver"] and out["later"] != out["driver"]  # both ran in Ray's workers
    assert out["refused"]  # Ray is not called for once it is being shut down
    assert out["closed_when_close_returned"]  # `close` waited for `close_soon`'s shutdown
    # Nothing it started is left, the autoscaler's monitor (killed ahead of the shutdown) included.
    assert "monitor" in out["kinds"] and out["left"] == []
    assert out["threads_alive"] == []
