"""Node loss on a real multi-node Ray cluster started on this machine (`ray.cluster_utils.Cluster`):
run by tests/e2e/test_node_loss.py in its own process (one Ray per process).

A head with no CPU (the driver) and two one-CPU worker nodes. The demo's `ssd-template` model is
described, and the demo's texts embedded with the packaged MiniLM, first uninterrupted, then with the
worker node that holds the stage's actor removed (its raylet killed) once some but not all batches
are done. Writes both runs' tables under OUT and, as JSON, how many batches were done at each
kill and how many there were, to OUT/results.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from vlm_decade.core.runtime import offline_env

os.environ.update(offline_env())
os.environ["HF_HUB_OFFLINE"] = "1"

import pyarrow.parquet as pq

from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import StudyRun, given
from vlm_decade.core.runtime import LazyRay, start_ray
from vlm_decade.demo import decade_demo
from vlm_decade.stages import describe, embed
from vlm_decade.studies.decade.pipeline import check, plan


class Progress(Reporter):
    """Counts finished items; once `after` are done, wakes the killer and holds the stage's driver
    loop until the node is gone (`killed`), so the kill lands mid-stage however fast the machine."""

    def __init__(self, after: int):
        super().__init__(quiet=True)
        self.done, self.total, self.after = 0, 0, after
        self.reached, self.killed = threading.Event(), threading.Event()

    def track(self, description, total, parts=None):
        from contextlib import contextmanager

        @contextmanager
        def tracker():
            self.total = total

            def advance(n=1, part=None):
                self.done += n
                if self.done >= self.after and not self.killed.is_set():
                    self.reached.set()
                    self.killed.wait(timeout=600)

            yield advance

        return tracker()


def busy_worker(cluster, ray):
    """The worker node whose CPU is taken (the stage's actor is there); the cluster reports its
    resources with a lag, so look again for a while."""
    for _ in range(100):
        free = ray._private.state.state.available_resources_per_node()
        busy = [n for n in cluster.worker_nodes if n.node_id in free and free[n.node_id].get("CPU", 0) < 1]
        if busy:
            return busy[0]
        time.sleep(0.1)
    raise AssertionError("no worker node holds an actor")


def run_stage(study, out: Path, stage: str, cluster=None, kill_after: int = 0) -> dict:
    """One stage in a fresh run folder, removing the busy worker after `kill_after` items. The embed
    stage's folder begins as a copy of the uninterrupted describe run's: its responses are done there
    (and skipped here), so both embed runs encode the same texts without describing again."""
    data = check(study)
    if stage == "embed":
        shutil.copytree(out.parent / "describe-uninterrupted", out)
    run = StudyRun(RunFolder(out), Reporter(quiet=True), LazyRay(study.runtime))
    run.run_stage(given("images", data.images))
    run.run_stage(given("references", data.references))
    if stage == "embed":
        assert not run.run_stage(describe.stage(study, plan(study))), "describe ran again in the copy"
    reporter = run.reporter = Progress(kill_after or 10**9)  # counts the stage under test alone
    target = describe.stage(study, plan(study)) if stage == "describe" else embed.stage(study)
    failures: list[BaseException] = []

    def work() -> None:
        try:
            run.run_stage(target)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    at_kill = None
    if kill_after:
        reporter.reached.wait(timeout=600)
        node = busy_worker(cluster, run.ray())
        at_kill = reporter.done
        cluster.remove_node(node, allow_graceful=False)
        cluster.add_node(num_cpus=1)  # a replacement joins, as an autoscaler's would
        reporter.killed.set()
    worker.join(timeout=900)
    assert not worker.is_alive(), f"{stage} did not finish after the node loss"
    assert not failures, f"{stage} failed: {failures[0]!r}"
    table = "responses" if stage == "describe" else "embeddings"
    pq.write_table(RunFolder(out).read(table), out / f"{table}.result.parquet")
    return {"stage": stage, "at_kill": at_kill, "total": reporter.total}


def main(out: Path) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    start_ray(cluster.address)
    base = decade_demo(out / "demo")
    model = next(m for m in base.models if m.name == "ssd-template").model_copy(update={"batch_size": 2})
    runtime = base.runtime.model_copy(update={"address": cluster.address, "num_cpus": None, "stall_timeout_s": 300})
    data = base.data.model_copy(update={"ratings": None, "hand_labels": None})
    study = base.model_copy(update={"models": (model,), "taxonomy": None, "runtime": runtime, "data": data})
    embed.local.TEXT_BATCH = 16  # many small batches, so a kill lands mid-stage
    results = []
    for stage in ("describe", "embed"):
        results.append(run_stage(study, out / f"{stage}-uninterrupted", stage))
        results.append(
            run_stage(study, out / f"{stage}-killed", stage, cluster, kill_after=8 if stage == "describe" else 48)
        )
    (out / "results.json").write_text(json.dumps(results))  # not stdout: Ray may print there as it exits


if __name__ == "__main__":
    main(Path(sys.argv[1]))
