"""Losing a node mid-stage on a real multi-node Ray cluster: the stage goes on with a new actor
(or the others) and ends with the same table as an uninterrupted run. The loader tasks on the lost
node are lost too and redone. The scenario runs in its own process (tests/e2e/node_loss.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from .conftest import cli_env

SCRIPT = Path(__file__).with_name("node_loss.py")


def test_a_lost_node_mid_stage_changes_no_table(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1500,
        env=cli_env(),
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-5000:]
    results = json.loads((tmp_path / "results.json").read_text())
    killed = [r for r in results if r["at_kill"] is not None]
    assert [r["stage"] for r in killed] == ["describe", "embed"]
    for r in killed:
        assert 0 < r["at_kill"] < r["total"], r  # the node went with some, not all, of the work done
    for stage, table, drop in (("describe", "responses", ["latency_s"]), ("embed", "embeddings", [])):
        base = pq.read_table(tmp_path / f"{stage}-uninterrupted" / f"{table}.result.parquet").drop_columns(drop)
        after = pq.read_table(tmp_path / f"{stage}-killed" / f"{table}.result.parquet").drop_columns(drop)
        assert after.num_rows == base.num_rows > 0 and after.equals(base), stage
        if table == "responses":
            assert set(after.column("status").to_pylist()) == {"ok"}
