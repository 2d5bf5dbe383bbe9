"""Rows spread over numbered buckets on disk, so that a stage that must group or match rows of a
table too big to hold works one bucket at a time: by a sha256 key's first two hex digits
(`key_buckets`), or by any number (an image shard). In a run folder they go under `SPILL_FOLDER`,
scratch that each stage clears as it starts and ends, and the run removes when it ends (a killed
run's is removed by the next)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Rows read from run-folder files that take up to this much are spread over buckets in memory
# (`Spill(held=True)`), not on disk: once read they take about five times as much (texts and hex
# keys compress well); a run of 110,000 images' responses is 53 MB of files.
HOLD_FILES_BYTES = 96 * 2**20
SPILL_FOLDER = ".spill"  # the run folder's scratch for spills
DIGITS = pa.array([f"{d:02x}" for d in range(256)], pa.string())  # the buckets: a key's first two hex digits


def key_buckets(keys: pa.ChunkedArray) -> np.ndarray:
    """Each key's bucket: its first two hex digits as a number."""
    return pc.index_in(pc.utf8_slice_codeunits(keys, 0, 2), value_set=DIGITS).to_numpy(zero_copy_only=False)


class Spill:
    """Rows spread over numbered buckets, one Arrow stream file each under `root`, so that a bucket
    is read back whole while the others stay on disk; or, `held`, kept in memory bucket by bucket
    (for rows known to be few enough), with no file written or read."""

    def __init__(self, root: Path, schema: pa.Schema, held: bool = False):
        self.root, self.schema, self.held = root, schema, held
        self.writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        self.tables: dict[int, list[pa.Table]] = {}  # held: each bucket's rows as added
        if not held:
            root.mkdir(parents=True)

    def _path(self, bucket: int) -> str:
        return str(self.root / f"{bucket:06d}.arrow")

    def add(self, table: pa.Table, buckets: np.ndarray) -> None:
        """Each row into its bucket (`buckets`, one per row), in the order given."""
        if not table.num_rows:
            return
        order = np.argsort(buckets, kind="stable")
        table, buckets = table.take(pa.array(order)), buckets[order]
        found, starts = np.unique(buckets, return_index=True)
        for bucket, start, end in zip(found.tolist(), starts.tolist(), [*starts[1:].tolist(), len(buckets)]):
            if self.held:
                self.tables.setdefault(bucket, []).append(table.slice(start, end - start))
                continue
            if bucket not in self.writers:
                self.writers[bucket] = pa.ipc.new_stream(self._path(bucket), self.schema)
            self.writers[bucket].write_table(table.slice(start, end - start))

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()

    @property
    def buckets(self) -> list[int]:
        return sorted(self.tables if self.held else self.writers)

    def read(self, bucket: int) -> pa.Table:
        """A bucket's rows in the order added (after `close`)."""
        if self.held:
            return pa.concat_tables(self.tables[bucket]) if bucket in self.tables else self.schema.empty_table()
        if bucket not in self.writers:
            return self.schema.empty_table()
        with pa.ipc.open_stream(self._path(bucket)) as reader:
            return reader.read_all()

    def remove(self) -> None:
        self.tables = {}
        shutil.rmtree(self.root, ignore_errors=True)
