"""Imported-model lookup benchmark, from a file of four variants per image, two comparisons side by
side in one run per file size:

- a batch of 8 questions (ModelConfig's default batch) answered by `FileAnswers` (the file's rows
  sorted by image once, each batch's rows found by binary search) against a scan of the whole file
  per batch (what the backend once did, which made describing quadratic in the images);
- every question of the file answered as the describe stage does it now, in the driver 65,536 at a
  time with each slice saved as a part (`local.look_up`), against the actor's own method over
  batches of 8 (`DescribeActor.describe`, called in this process: without the Ray call each batch
  cost in an actor, so a bound on what actors could do at best; `--actor-batches` of them, timed).

Prints one JSON object per number of images. Run from the repository root:
    .venv/bin/python benchmarks/imported_lookup.py [--images 100000 1000000] [--batches 200] [--actor-batches 2000]
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
from vlm_decade.core.runfolder import RunFolder  # noqa: E402
from vlm_decade.models.backends.imported import EVERY_PROMPT, ImportedBackend  # noqa: E402
from vlm_decade.stages.describe.local import DescribeActor, look_up  # noqa: E402
from vlm_decade.stages.describe.plan import Job  # noqa: E402

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


def measure(n: int, batches: int, actor_batches: int, folder: Path) -> dict:
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
    # Every question of the file, as the stage asks them (image by image, each variant).
    jobs = pa.table(
        {
            "subject": pa.repeat(pa.scalar("m"), n * len(VARIANTS)),
            "image_id": np.repeat(ids, len(VARIANTS)),
            "variant": np.tile(VARIANTS, n),
            "prompt_id": pa.repeat(pa.scalar("p"), n * len(VARIANTS)),
            "cache_key": pa.repeat(pa.scalar("k"), n * len(VARIANTS)),
        }
    )
    start = time.perf_counter()
    look_up(model, [jobs], type("Run", (), {"folder": RunFolder(folder / f"run-{n}")})(), lambda done: None)
    out["driver_rows_per_s"] = round(jobs.num_rows / (time.perf_counter() - start))
    actor = DescribeActor(model)
    rows = [
        Job("m", str(i), v, "p", "", "", None, "k")
        for i, v in zip(jobs.column("image_id")[: actor_batches * BATCH].to_pylist(), VARIANTS * actor_batches * 2)
    ]
    start = time.perf_counter()
    for at in range(0, len(rows), BATCH):
        actor.describe(rows[at : at + BATCH], None)
    out["actor_method_rows_per_s"] = round(len(rows) / (time.perf_counter() - start))
    out["driver_over_actor_method"] = round(out["driver_rows_per_s"] / out["actor_method_rows_per_s"], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--batches", type=int, default=200, help="batches of 8 questions asked per size")
    parser.add_argument("--actor-batches", type=int, default=2000, help="batches of 8 the actor's method answers")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for n in args.images:
            print(json.dumps(measure(n, args.batches, args.actor_batches, Path(folder))), flush=True)


if __name__ == "__main__":
    main()
