"""Imported-model lookup benchmark: an actor of the `imported` backend answers a few questions at a
time (its default batch of 8 stimuli) from a file of four variants per image. Measured side by side
in one run, per file size: `FileAnswers` (the file's rows sorted by image once, each batch's rows
found by binary search) against a scan of the whole file per batch (filtering its rows by the
batch's images, what the backend did before), which makes describing quadratic in the images.

Prints one JSON object per number of images: the seconds to load the file, milliseconds per batch
of each way, and their ratio. Run from the repository root:
    .venv/bin/python benchmarks/imported_lookup.py [--images 100000 1000000] [--batches 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vlm_decade.core.config import ModelConfig  # noqa: E402
from vlm_decade.models.backends.imported import EVERY_PROMPT, ImportedBackend  # noqa: E402

VARIANTS = ("full", "m1", "m2", "m3")
BATCH = 8  # ModelConfig's default batch_size


def scanned(answers, image_ids: pa.Array, variants: pa.Array, prompt_id: str) -> pa.Array:
    """The alternative: the batch's rows found by filtering every row of the file."""
    rows = answers.rows.filter(pc.is_in(answers.rows.column("image_id"), value_set=pc.unique(image_ids)))
    have = pc.binary_join_element_wise(*(rows.column(c) for c in ("image_id", "variant", "prompt")), "\x1f")
    have = have.combine_chunks() if isinstance(have, pa.ChunkedArray) else have
    asked = lambda prompt: pc.binary_join_element_wise(image_ids, variants, prompt, "\x1f")  # noqa: E731
    at = pc.coalesce(pc.index_in(asked(prompt_id), have), pc.index_in(asked(EVERY_PROMPT), have))
    return rows.column("text").take(at).combine_chunks().cast(pa.string())


def measure(n: int, batches: int, folder: Path) -> dict:
    ids = np.char.add("img", np.char.zfill(np.arange(n).astype(str), 7))
    path = folder / f"answers-{n}.parquet"
    pq.write_table(
        pa.table(
            {
                "image_id": np.repeat(ids, len(VARIANTS)),
                "variant": np.tile(VARIANTS, n),
                "text": pa.array(np.char.add("a photo of thing ", np.arange(n * len(VARIANTS)).astype(str))),
            }
        ),
        path,
    )
    model = ModelConfig(name="m", backend="imported", model_id="m", era="mllm", options={"file": str(path)})
    start = time.perf_counter()
    backend = ImportedBackend(model)
    load_s = time.perf_counter() - start
    rng = np.random.default_rng(n)
    asked = []
    for _ in range(batches):  # a batch: two images, all four variants, as the plan orders jobs
        first = int(rng.integers(0, n - 1))
        asked.append((pa.array(np.repeat(ids[first : first + 2], 4)), pa.array(VARIANTS * 2)))
    out = {"images": n, "file_rows": n * len(VARIANTS), "load_s": round(load_s, 2)}
    for name, lookup in (("sorted", backend.answers.texts), ("scan", lambda *a: scanned(backend.answers, *a))):
        start = time.perf_counter()
        got = [lookup(image_ids, variants, EVERY_PROMPT) for image_ids, variants in asked]
        out[f"{name}_ms_per_batch"] = round((time.perf_counter() - start) * 1000 / batches, 3)
        out.setdefault("answers", got)
    assert all(
        a.equals(b) for a, b in zip(out.pop("answers"), [scanned(backend.answers, *q, EVERY_PROMPT) for q in asked])
    )
    out["scan_over_sorted"] = round(out["scan_ms_per_batch"] / out["sorted_ms_per_batch"], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--batches", type=int, default=200, help="batches of 8 questions asked per size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for n in args.images:
            print(json.dumps(measure(n, args.batches, Path(folder))), flush=True)


if __name__ == "__main__":
    main()
