"""Where every random number comes from: one SeedSequence per (seed, stream name, kind, chunk).

Resamples are drawn in chunks of a fixed size (CHUNK resamples); chunk c of a dataset always uses
the c-th child spawned from the dataset's root sequence, whatever the number of Ray tasks, blocks
or workers that compute it, so a fixed seed gives bit-identical results on any cluster. The root
depends only on the seed and the dataset's *name* (a stable hash, not Python's salted hash()), so
adding or removing another dataset never changes this one's resamples.
"""

from __future__ import annotations

import hashlib

import numpy as np

CHUNK = 500  # resamples per stream; part of the results' definition, do not change lightly

# A second spawn-key word keeps the streams of the different uses apart for the same name.
KIND_MULTINOMIAL = 0
KIND_POISSON = 1
KIND_CORRELATION = 2


def name_key(name: str) -> int:
    """A stable 64-bit integer for a stream name (dataset name, correlation id)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def root_sequence(seed: int, name: str, kind: int) -> np.random.SeedSequence:
    """The root sequence of one named stream; its spawned children are the chunk streams."""
    return np.random.SeedSequence(seed, spawn_key=(name_key(name), kind))


def n_chunks(n_resamples: int) -> int:
    return -(-n_resamples // CHUNK)


def chunk_sizes(n_resamples: int) -> list[int]:
    """CHUNK, CHUNK, ..., remainder: the last chunk is shorter when B is not a multiple."""
    return [min(CHUNK, n_resamples - c * CHUNK) for c in range(n_chunks(n_resamples))]


def chunk_streams(seed: int, name: str, kind: int, count: int) -> list[np.random.SeedSequence]:
    """The first `count` child streams (child c is the same for any count > c)."""
    return root_sequence(seed, name, kind).spawn(count)


def split_chunks(n: int, n_tasks: int) -> list[range]:
    """Contiguous ranges of whole chunks, one per task (fewer tasks if there are fewer chunks)."""
    n_tasks = max(1, min(n_tasks, n))
    bounds = np.linspace(0, n, n_tasks + 1).round().astype(int)
    return [range(bounds[i], bounds[i + 1]) for i in range(n_tasks) if bounds[i + 1] > bounds[i]]
