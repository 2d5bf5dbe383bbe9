"""Vector storage benchmark: an embeddings table of unit float32 vectors written and read back as the
run folder stores it now (`parquet.writer_options`: the vector column plain, with neither
dictionary nor compression, the other columns zstd) against zstd with dictionary encoding on every
column (how every table was written before), both in row groups of 4,096 rows as the embed stage
writes them, the same rows each side, best of `--rounds`.

Prints one JSON object. Run from the repository root:
    .venv/bin/python benchmarks/vector_storage.py [--rows 100000] [--dim 384] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vlm_decade.core.fingerprints import table_fingerprint  # noqa: E402
from vlm_decade.core.runfolder import RunFolder  # noqa: E402
from vlm_decade.stages.embed.table import EMBEDDINGS_SCHEMA, VECTOR_BATCH  # noqa: E402


def table_of(rows: int, dim: int) -> pa.Table:
    vectors = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    keys = sorted(hashlib.sha256(str(i).encode()).hexdigest() for i in range(rows))
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim).cast(pa.list_(pa.float32()))
    return pa.table(
        {
            "text_sha256": keys,
            "encoder": ["SBERT-SI"] * rows,
            "encoder_key": ["k" * 64] * rows,
            "dim": pa.array([dim] * rows, pa.int32()),
            "vector": column,
            "mode": pa.nulls(rows, pa.string()),
        },
        schema=EMBEDDINGS_SCHEMA,
    )


def write_all_zstd(path: Path, table: pa.Table) -> None:
    """What every table was written with before: zstd and dictionary encoding on every column."""
    with pq.ParquetWriter(path, table.schema, compression="zstd", use_compliant_nested_type=False) as writer:
        for batch in table.to_batches(max_chunksize=VECTOR_BATCH):
            writer.write_batch(batch, row_group_size=VECTOR_BATCH)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    table = table_of(args.rows, args.dim).combine_chunks()
    with tempfile.TemporaryDirectory() as tmp:
        folder = RunFolder(Path(tmp) / "run")
        before = Path(tmp) / "all-zstd.parquet"
        now_path = folder.segment_folder("embeddings") / "segment-000001.parquet"
        write = {"plain_vectors": [], "all_zstd": []}
        read = {"plain_vectors": [], "all_zstd": []}
        for _ in range(args.rounds):  # interleaved, so a change in the machine's load touches both
            write["plain_vectors"].append(
                timed(lambda: folder.write_segment("embeddings", 1, table.schema, table.to_batches(), VECTOR_BATCH))
            )
            write["all_zstd"].append(timed(lambda: write_all_zstd(before, table)))
            read["plain_vectors"].append(timed(lambda: pq.read_table(now_path)))
            read["all_zstd"].append(timed(lambda: pq.read_table(before)))
        assert table_fingerprint(pq.read_table(now_path)) == table_fingerprint(pq.read_table(before))
        sizes = {"plain_vectors": now_path.stat().st_size, "all_zstd": before.stat().st_size}
    best = {kind: {k: round(min(v), 3) for k, v in times.items()} for kind, times in (("write", write), ("read", read))}
    print(
        json.dumps(
            {
                "rows": args.rows,
                "dim": args.dim,
                "write_s": best["write"],
                "read_s": best["read"],
                "mb": {k: round(v / 2**20, 1) for k, v in sizes.items()},
                "write_speedup": round(best["write"]["all_zstd"] / best["write"]["plain_vectors"], 2),
                "read_speedup": round(best["read"]["all_zstd"] / best["read"]["plain_vectors"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
