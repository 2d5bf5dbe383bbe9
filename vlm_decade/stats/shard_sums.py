"""Where a statistics stage keeps its Poisson shards' partial sums between runs:
`.cache/<stage>-shards.parquet` in the run folder (`stats.ShardSums` says why they may be kept).

What a run used is all that is written, so the file holds one study's shards, not every shard any
run computed. A file that cannot be read, or a page of it that fails its checksum, costs computing
every shard again, and nothing else.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from vlm_decade.core.files import atomic_write_bytes
from vlm_decade.core.parquet import table_bytes
from vlm_decade.stats import ShardSums


def shard_sums_file(run_folder: str | Path, stage: str) -> Path:
    return Path(run_folder) / ".cache" / f"{stage}-shards.parquet"


def kept_shard_sums(run_folder: str | Path, stage: str) -> ShardSums:
    """The sums the stage's last run kept (none: an empty record)."""
    path = shard_sums_file(run_folder, stage)
    if not path.is_file():
        return ShardSums()
    try:
        return ShardSums.from_table(pq.read_table(path, page_checksum_verification=True))
    except Exception:  # noqa: BLE001 - a damaged record only costs the bootstrap's time
        return ShardSums()


def keep_shard_sums(run_folder: str | Path, stage: str, sums: ShardSums) -> None:
    """Write what this run used in place of the last record; with none used (an ordinary
    bootstrap), no record is left."""
    path = shard_sums_file(run_folder, stage)
    if not sums.used:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # With page checksums: a damaged page is refused, not summed.
    atomic_write_bytes(path, table_bytes(sums.table(), write_page_checksum=True))
