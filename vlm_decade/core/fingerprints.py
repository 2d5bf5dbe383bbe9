"""A table's content fingerprint: a hash of its schema and rows, the same however the table is
chunked and whatever Parquet writer wrote it, and blind to the columns that measure the wall clock,
so an identical rerun gives identical fingerprints. The run folder records one per table, and a
stage's own fingerprint is made of its inputs' (`core.runner`).
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

# A table's fingerprint hashes its Arrow IPC stream in record batches of exactly this many rows (the
# last one shorter), so it does not depend on how the table happens to be chunked, and a table that
# is written in pieces (`write_batches`) gets the fingerprint it would get written whole.
FINGERPRINT_ROWS = 8192
# Columns that measure the wall clock (how long an answer took, how long it waited): two runs that
# give the same answers differ in them, so a table's fingerprint leaves them out, and an identical
# rerun gives identical fingerprints (and the stages after it are not run again for them).
WALL_CLOCK_COLUMNS = frozenset({"latency_s", "queued_s"})


class _HashSink:
    """A write-only file that hashes what is written to it."""

    def __init__(self):
        self.digest = hashlib.sha256()
        self.closed = False

    def write(self, data) -> int:
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class Fingerprinter:
    """A table's content fingerprint, fed batch by batch in any chunking (`table_fingerprint`); the
    `WALL_CLOCK_COLUMNS` are left out."""

    def __init__(self, schema: pa.Schema):
        self.columns = [name for name in schema.names if name not in WALL_CLOCK_COLUMNS]
        self.sink = _HashSink()
        hashed = pa.schema([schema.field(c) for c in self.columns])
        self.writer = pa.ipc.new_stream(pa.PythonFile(self.sink, mode="w"), hashed)
        self.pending: list[pa.RecordBatch] = []
        self.count = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch.select(self.columns))
        self.count += batch.num_rows
        while self.count >= FINGERPRINT_ROWS:
            self._emit(FINGERPRINT_ROWS)

    def _emit(self, rows: int) -> None:
        table = pa.Table.from_batches(self.pending).combine_chunks()
        # Lengths given: a table of no columns is sliced to the length asked, not to its rows.
        head, rest = table.slice(0, min(rows, table.num_rows)), table.slice(rows, max(table.num_rows - rows, 0))
        for batch in head.to_batches(max_chunksize=rows):
            self.writer.write_batch(batch)
        self.pending = rest.to_batches() if rest.num_rows else []
        self.count = rest.num_rows

    def hexdigest(self) -> str:
        if self.count:
            self._emit(self.count)
        self.writer.close()
        return self.sink.digest.hexdigest()


def batches_of(table: pa.Table, rows: int):
    """`table` as record batches of `rows` rows (the last fewer), whatever its chunks, each joined
    on its own: joining the whole table first would be a copy of it."""
    for start in range(0, table.num_rows, rows):
        yield from table.slice(start, min(rows, table.num_rows - start)).combine_chunks().to_batches()


def table_fingerprint(table: pa.Table) -> str:
    """A content hash of a table's schema and rows but its wall-clock columns (independent of
    Parquet writer details and of the table's chunking)."""
    fingerprint = Fingerprinter(table.schema)
    for batch in batches_of(table, FINGERPRINT_ROWS):
        fingerprint.add(batch)
    return fingerprint.hexdigest()
