"""Three costs every run pays over all images, each side by side with the obvious way in one run, on
the same data:

- `counts`: a bootstrap chunk's resample counts (500 resamples of `--images` images),
  `stats._core.multinomial_counts` (indices drawn 16 rows at a time) against one draw of all the
  chunk's indices, counted row by row as before; the counts must be equal.
- `vectors`: the rows of a new embeddings segment (`--vectors` vectors of 384 floats in parts of
  4,096, taken in key order), `embed.write._vector_blocks` (4,096 rows at a time from each part's float
  matrix) against Arrow's take of the same blocks; the vectors must be equal.
- `ranking`: the consensus ranking of `--images` images of nine descriptions
  (`data._references_table`), slabs on every core against one slab after another; the tables must
  be equal.

Prints one JSON object: seconds of each way, best of three, and the ratio of the obvious way to the
project's. Run from the repository root:
    .venv/bin/python benchmarks/whole_run_costs.py [--images 110000] [--vectors 170000]
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent import futures

import numpy as np
import pyarrow as pa

from vlm_decade.stages import embed
from vlm_decade.stats import _core
from vlm_decade.studies.decade import data
from vlm_decade.studies.decade.config import RankingConfig

WORDS = "man woman dog cat horse street beach park table cup tree sky water boat red blue small old".split()


def best(run, repeat: int = 3) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return min(times), out


def one_draw_counts(rng: np.random.Generator, n_resamples: int, n: int) -> np.ndarray:
    idx = rng.integers(0, n, size=(n_resamples, n))
    counts = np.empty((n_resamples, n))
    for row, drawn in zip(counts, idx):
        row[:] = np.bincount(drawn, minlength=n)
    return counts


def counts(images: int) -> dict:
    mine, a = best(lambda: _core.multinomial_counts(np.random.default_rng(1), 500, images))
    theirs, b = best(lambda: one_draw_counts(np.random.default_rng(1), 500, images))
    assert np.array_equal(a, b)
    return {"blocks_s": round(mine, 3), "one_draw_s": round(theirs, 3), "ratio": round(theirs / mine, 2)}


def vectors(n: int) -> dict:
    rng = np.random.default_rng(2)
    parts = [
        pa.FixedSizeListArray.from_arrays(pa.array(rng.random(min(4096, n - lo) * 384, np.float32)), 384).cast(
            pa.list_(pa.float32())
        )
        for lo in range(0, n, 4096)
    ]
    column, at = pa.chunked_array(parts), rng.permutation(n)

    def blocks():
        return sum(len(b) for b in embed.write._vector_blocks(column, at, embed.table.VECTOR_BATCH))

    def arrow():
        return sum(
            len(column.take(at[lo : lo + embed.table.VECTOR_BATCH])) for lo in range(0, n, embed.table.VECTOR_BATCH)
        )

    mine, _ = best(blocks)
    theirs, _ = best(arrow)
    first = next(embed.write._vector_blocks(column, at, embed.table.VECTOR_BATCH))
    assert first.equals(column.take(at[: embed.table.VECTOR_BATCH]).combine_chunks())
    return {"blocks_s": round(mine, 3), "arrow_take_s": round(theirs, 3), "ratio": round(theirs / mine, 2)}


class _OneThread(futures.ThreadPoolExecutor):
    def __init__(self, workers=None):
        super().__init__(1)


def ranking(images: int) -> dict:
    rng = np.random.default_rng(3)
    n = images * 9
    ids = pa.array([f"i{k:07d}" for k in range(images)])
    descriptions = pa.table(
        {
            "description_id": pa.array([f"d{k:08d}" for k in range(n)]),
            "image_id": pa.array(np.repeat(ids.to_numpy(zero_copy_only=False), 9)),
            "worker_id": pa.array(["w"] * n),
            "condition": pa.array(["full"] * n),
            "text": pa.array([" ".join(rng.choice(WORDS, size=int(rng.integers(6, 12)))) for _ in range(n)]),
        }
    )
    images_t = pa.table({"image_id": ids, "dataset": pa.array(["coco"] * images)})
    cfg = RankingConfig(top_k=2, bottom_k=2)

    def run():
        return data._references_table(images_t, descriptions, data._Tally(), {"coco": data.CONSENSUS}, cfg)

    mine, a = best(run)
    threads = data.ThreadPoolExecutor
    data.ThreadPoolExecutor = _OneThread
    try:
        theirs, b = best(run)
    finally:
        data.ThreadPoolExecutor = threads
    assert a.equals(b)
    return {"threads_s": round(mine, 3), "one_thread_s": round(theirs, 3), "ratio": round(theirs / mine, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=110_000)
    parser.add_argument("--vectors", type=int, default=170_000)
    args = parser.parse_args()
    out = {
        "images": args.images,
        "vectors": args.vectors,
        "counts": counts(args.images),
        "vectors_gathered": vectors(args.vectors),
        "ranking": ranking(args.images),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
