"""Ingest benchmark: seconds and memory peak of reading and checking Study A's tables at N images, alone.

The shape is the scale study's at issue: each image with 9 human descriptions and 8 imported model
captions (two models, each with the full image and three masks), 16x16 random photos. What is
measured is the ingest the driver does before any stage: `load_study_data` (images, descriptions) and
each imported model's `check` and `missing_rows`. The image files are inspected once beforehand into
an `ImageCache`, so decoding (the `images` stage's work, measured by benchmarks/image_checks.py) is
not in the figure; their stat calls are. Each measurement is a fresh process: its peak RSS from
`getrusage` and the Python allocations' peak from tracemalloc (a second pass, as tracing slows it;
`--traced no` skips it).

    .venv/bin/python benchmarks/ingest.py [--images 100000] [--work DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WORDS = "man woman dog cat street beach park table cup tree sky boat red blue small old sits holds near under".split()
VARIANTS = ("full", "m1", "m2", "m3")

MEASURE = """
import json, pickle, resource, sys, time, tracemalloc
from pathlib import Path
from vlm_decade.core.config import ModelConfig
from vlm_decade.imaging.masks import MaskConfig, mask_ids
from vlm_decade.models.backends.imported import ImportedBackend, missing_rows
from vlm_decade.stages.images import ImageCache
from vlm_decade.studies.decade.config import DataConfig, RankingConfig
from vlm_decade.studies.decade.data import load_study_data

work, traced = Path(sys.argv[1]), sys.argv[2] == "traced"
known = pickle.loads((work / "cache.pickle").read_bytes())
data = DataConfig(images=work / "images.csv", image_dir=work / "images", descriptions=work / "descriptions.csv")
masks = MaskConfig(count=3)  # masks m1, m2, m3
models = [
    ModelConfig(name=f"model-{m}", backend="imported", model_id=m, era="mllm", variants="all",
                options={"file": str(work / f"model_{m}.csv")})
    for m in "ab"
]
if traced:
    tracemalloc.start()
start = time.monotonic()
study = load_study_data(data, RankingConfig(top_k=2, bottom_k=2), masks, ImageCache(known))
ids = set(study.images.column("image_id").to_pylist())
variants = ["full", *mask_ids(masks)]
problems = [p for m in models for p in ImportedBackend.check(m, ids, variants)]
lacking = missing_rows(models, ids, lambda m: variants)
seconds = time.monotonic() - start
assert not problems and not lacking, (problems[:3], lacking)
peak = tracemalloc.get_traced_memory()[1] if traced else None
print(json.dumps({"seconds": round(seconds, 2), "references": study.references.num_rows,
                  "tracemalloc_peak_mb": peak and round(peak / 2**20),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""


def sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(6, 12))))


def make_tables(folder: Path, n: int) -> None:
    """The study's tables and images (deterministic for n), and an image cache that knows them all."""
    from PIL import Image

    from vlm_decade.stages.images import ImageCache

    rng = np.random.default_rng(n)
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    with (
        open(folder / "images.csv", "w", newline="") as f_img,
        open(folder / "descriptions.csv", "w", newline="") as f_desc,
        open(folder / "model_a.csv", "w", newline="") as f_a,
        open(folder / "model_b.csv", "w", newline="") as f_b,
    ):
        w_img, w_desc, w_a, w_b = (csv.writer(f) for f in (f_img, f_desc, f_a, f_b))
        w_img.writerow(["image_id", "dataset", "file"])
        w_desc.writerow(["description_id", "image_id", "worker_id", "condition", "text"])
        w_a.writerow(["image_id", "variant", "text"])
        w_b.writerow(["image_id", "variant", "text"])
        for i in range(n):
            image_id = f"img{i:07d}"
            if not (images / f"{image_id}.png").exists():
                Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(images / f"{image_id}.png")
            w_img.writerow([image_id, "everyday" if i % 2 else "specialist", f"{image_id}.png"])
            for k in range(9):
                w_desc.writerow([f"{image_id}-d{k}", image_id, f"w{k}", "full", sentence(rng)])
            for variant in VARIANTS:
                w_a.writerow([image_id, variant, sentence(rng)])
                w_b.writerow([image_id, variant, sentence(rng)])
    cache = ImageCache()
    cache.inspect([str(images / f"img{i:07d}.png") for i in range(n)])
    (folder / "cache.pickle").write_bytes(pickle.dumps(cache.found))


def measure(folder: Path, traced: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(folder), "traced" if traced else "plain"],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-4000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--work", type=Path, help="where the tables go (default: a temporary folder)")
    parser.add_argument(
        "--traced", type=lambda v: v == "yes", help="yes: only the traced pass, no: only the plain one (default: both)"
    )
    args = parser.parse_args()
    folder = (args.work or Path(tempfile.mkdtemp(prefix="vlm-ingest-"))) / f"study-{args.images}"
    if not (folder / "cache.pickle").exists():
        made = time.monotonic()
        make_tables(folder, args.images)
        print(json.dumps({"made_s": round(time.monotonic() - made, 1)}), flush=True)
    for traced in (False, True) if args.traced is None else (args.traced,):
        print(json.dumps({"images": args.images, **measure(folder, traced)}), flush=True)


if __name__ == "__main__":
    main()
