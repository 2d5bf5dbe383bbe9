"""Kept partial sums of the Poisson bootstrap's image shards (`ShardSums`).

A Poisson shard's partial sums are a function of the shard's scores alone and of its stream (the
seed, the dataset's name, the shard's place): shard k always draws from child k of the dataset's
stream, over whatever images fall in it (`_engine.poisson_partial_sums_many`). So a shard whose
scores are unchanged since an earlier run, byte for byte, has the very sums that run computed, and
the dataset's sums, added in shard order as ever, are the same to the bit. Each shard's sums are
kept under a key that hashes all of that (`_engine.shard_key`); a run that adds images at the end of
a dataset computes only the shards they fall in. This module is the record and its Arrow form; where
it is kept is the caller's business.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

SHARD_SUMS_SCHEMA = pa.schema(
    [
        ("key", pa.binary(32)),
        ("resamples", pa.int64()),
        ("series", pa.int64()),
        ("sums", pa.binary()),  # float64, (resamples, series), C order, little-endian
        ("totals", pa.binary()),
    ]
)


class ShardSums:
    """Shard key -> (sums, totals), each (resamples, series): those an earlier run `known`, and those
    this run has `used` (found or computed), which are all a later run can need of it."""

    def __init__(self, known: dict[bytes, tuple[np.ndarray, np.ndarray]] | None = None):
        self.known = known or {}
        self.used: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def get(self, key: bytes) -> tuple[np.ndarray, np.ndarray] | None:
        sums = self.known.get(key)
        if sums is not None:
            self.used[key] = sums
        return sums

    def put(self, key: bytes, sums: np.ndarray, totals: np.ndarray) -> None:
        self.used[key] = (sums, totals)

    def table(self) -> pa.Table:
        """The used sums, one row per shard (`SHARD_SUMS_SCHEMA`)."""
        keys = list(self.used)
        pairs = [self.used[k] for k in keys]
        return pa.table(
            [
                pa.array(keys, pa.binary(32)),
                pa.array([s.shape[0] for s, _ in pairs], pa.int64()),
                pa.array([s.shape[1] for s, _ in pairs], pa.int64()),
                pa.array([_bytes(s) for s, _ in pairs], pa.binary()),
                pa.array([_bytes(t) for _, t in pairs], pa.binary()),
            ],
            schema=SHARD_SUMS_SCHEMA,
        )

    @classmethod
    def from_table(cls, table: pa.Table) -> ShardSums:
        """The sums a `table` holds as known; a row whose arrays are not of its stated shape is left
        out (its shard is computed again)."""
        known = {}
        for row in table.cast(SHARD_SUMS_SCHEMA).to_pylist():
            shape = (row["resamples"], row["series"])
            sums, totals = (np.frombuffer(row[c], dtype="<f8") for c in ("sums", "totals"))
            if sums.size == totals.size == shape[0] * shape[1]:
                known[row["key"]] = (sums.reshape(shape), totals.reshape(shape))
        return cls(known)


def _bytes(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f8").tobytes()
