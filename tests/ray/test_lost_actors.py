"""An actor lost mid-stage (its process gone, as with its node): the stage still finishes with
every row, the run says the loss in one line and the manifest records it."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pyarrow as pa
import pytest

pytestmark = pytest.mark.ray


class DiesOnce:
    """Doubles numbers; the first actor to reach item 3 exits, as a lost node's actor does."""

    def __init__(self, marker: str):
        self.marker = Path(marker)

    def double(self, items: list[int]) -> list[int]:
        if 3 in items and not self.marker.exists():
            self.marker.touch()
            os._exit(1)
        return [2 * i for i in items]


def test_a_lost_actor_is_said_and_recorded_and_its_batch_redone(ray_session, tmp_path):
    from rich.console import Console

    from vlm_decade.core.dispatch import batches, pool_map
    from vlm_decade.core.progress import Reporter
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.core.runner import Stage, StudyRun
    from vlm_decade.core.runtime import LazyRay

    said = io.StringIO()
    run = StudyRun(RunFolder(tmp_path / "run"), Reporter(Console(file=said, width=300)), LazyRay(None))
    actor = ray_session.remote(DiesOnce).options(num_cpus=0)

    def compute(run):
        done = pool_map(
            ray_session,
            lambda: actor.remote(str(tmp_path / "died")),
            1,
            batches(list(range(8)), 2),
            lambda a, batch: a.double.remote(batch),
            in_flight_per_actor=1,
            what="double (m)",
            on_lost=run.actor_lost,
        )
        return {"doubled": pa.table({"n": sorted(n for d in done for n in d.value)})}

    run.run_stage(Stage("doubled", (), {}, compute))
    assert run.table("doubled").column("n").to_pylist() == [2 * i for i in range(8)]
    (line,) = [ln for ln in said.getvalue().splitlines() if "lost" in ln]
    assert "doubled: an actor of double (m) was lost" in line and "1 of its batches done again" in line
    (record,) = run.folder.manifest()["stages"]["doubled"]["lost_actors"]
    assert record["actor"] == "double (m)" and record["batches_redone"] == 1 and record["at"]
    assert record["node"] in (None, ray_session.util.get_node_ip_address())
