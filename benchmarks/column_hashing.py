"""Hashing a column of strings (sha256, hex): what `core.columns.sha256_hex` chooses between, side by
side with the obvious loop, on the same strings in one run.

- `python`: `[hashlib.sha256(s.encode()).hexdigest() for s in column.to_pylist()]`, then an array;
- `buffers`: hashlib over slices of the column's own bytes (no Python string per value);
- `duckdb`: DuckDB's `sha256` over the column (on every core).

Per string length (64 bytes: a description; 540: a cache key's payload), wall and CPU seconds of
each, best of three, and the ratios to `python`. Run from the repository root:
    .venv/bin/python benchmarks/column_hashing.py [--rows 300000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import time

import numpy as np
import pyarrow as pa

from vlm_decade.core import columns


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def python_loop(values: pa.Array) -> pa.Array:
    return pa.array([hashlib.sha256(s.encode()).hexdigest() for s in values.to_pylist()], pa.string())


def buffers(values: pa.Array) -> pa.Array:
    _, offsets, data = values.buffers()
    bounds = np.frombuffer(offsets, np.int32)[values.offset : values.offset + len(values) + 1].tolist()
    data = memoryview(data)
    return pa.array([hashlib.sha256(data[a:b]).hexdigest() for a, b in zip(bounds, bounds[1:])], pa.string())


def best(way, values: pa.Array) -> dict:
    runs = []
    for _ in range(3):
        wall, used = time.perf_counter(), cpu()
        out = way(values)
        runs.append((time.perf_counter() - wall, cpu() - used))
    wall, used = min(runs)
    return {"wall_s": wall, "cpu_s": used, "out": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    args = parser.parse_args()
    result = {"rows": args.rows, "cores": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)}
    for length in (64, 540):
        values = pa.array([f"text {i} ".ljust(length, "x") for i in range(args.rows)], pa.string())
        ways = {"python": python_loop, "buffers": buffers, "duckdb": columns._duckdb_sha256}
        timed = {name: best(way, values) for name, way in ways.items()}
        want = timed["python"].pop("out")
        for name in ("buffers", "duckdb"):
            assert timed[name].pop("out").equals(want), name  # the same keys, or the figure means nothing
        base = timed["python"]["wall_s"]  # the ratios of the seconds as measured: a few rows' round to 0.0
        result[f"bytes_{length}"] = {name: {k: round(v, 3) for k, v in t.items()} for name, t in timed.items()} | {
            f"{name}_speedup": round(base / timed[name]["wall_s"], 2) for name in ("buffers", "duckdb")
        }
        result[f"bytes_{length}"]["chosen"] = "duckdb" if length <= columns.DUCKDB_MAX_MEAN_BYTES else "buffers"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
