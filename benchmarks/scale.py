"""Scale benchmark: a synthetic Study A of N images through `vlm-decade run`, for N = 1,000, 10,000
and 100,000 (by default), measuring what grows with the images.

The study is built so that the framework is what is measured: 16x16 random photos, five human
descriptions per image (no votes: the consensus gold standard), two `imported` models (one with
every masked variant, one with the full image only), a two-layer sentence encoder built from a
config over MiniLM's tokenizer (SBERT-SI's interface at a fraction of its cost), 10,000 bootstrap
resamples. Each run is a fresh process (`python -m vlm_decade run`) whose own peak RSS is read from
`getrusage(RUSAGE_SELF)` (the driver only: Ray's workers are other processes).

Prints one JSON object per N, then a summary: per-stage seconds, driver peak RSS, run-folder and
report.html sizes, the log-log slope of total time against N, the driver's RSS growth per image,
and `driver_rss_gb_at_100k`. Run from the repository root:
    .venv/bin/python benchmarks/scale.py [--sizes 1000 10000 100000] [--work DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = (
    "man woman child dog cat horse bird car bus bicycle street beach park kitchen table chair cup bowl plate "
    "pizza cake tree sky water boat train plane field snow mountain city building window door lamp sofa bed "
    "book phone laptop screen red blue green yellow white black small large old young wooden glass metal "
    "sits stands walks runs rides holds eats drinks looks plays reads near under over beside behind front"
).split()

DRIVER = """
import resource, sys, time
from vlm_decade.cli import app
start = time.monotonic()
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "WALL_S", time.monotonic() - start, file=sys.stderr)
"""


def sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(6, 12))))


def make_study(folder: Path, n: int, encoder: Path) -> Path:
    """The synthetic study's files; deterministic for (n)."""
    from PIL import Image

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
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(images / f"{image_id}.png")
            w_img.writerow([image_id, "everyday" if i % 2 else "specialist", f"{image_id}.png"])
            for k in range(5):
                w_desc.writerow([f"{image_id}-d{k}", image_id, f"w{k}", "full", sentence(rng)])
            for variant in ("full", "m1", "m2", "m3"):
                w_a.writerow([image_id, variant, sentence(rng)])
            w_b.writerow([image_id, "full", sentence(rng)])
    study = {
        "name": f"scale-{n}",
        "data": {"images": "images.csv", "image_dir": "images", "descriptions": "descriptions.csv"},
        "ranking": {"top_k": 2, "bottom_k": 2},
        "models": [
            {
                "name": "model-a",
                "backend": "imported",
                "model_id": "synthetic-a",
                "era": "pre-mllm",
                "variants": "all",
                "batch_size": 512,
                "options": {"file": "model_a.csv"},
            },
            {
                "name": "model-b",
                "backend": "imported",
                "model_id": "synthetic-b",
                "era": "mllm",
                "batch_size": 512,
                "options": {"file": "model_b.csv"},
            },
        ],
        "encoders": [{"name": "SBERT-SI", "path": str(encoder), "batch_size": 256}],
        "statistics": {"n_resamples": 10_000},
    }
    path = folder / "study.json"  # YAML is a superset of JSON
    path.write_text(json.dumps(study, indent=1))
    return path


def run_once(study: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, "run", str(study), "--out", str(out)], env=env, capture_output=True, text=True
    )
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    peak_kb = int(done.stderr.split("PEAK_RSS_KB")[1].split()[0])
    manifest = json.loads((out / "manifest.json").read_text())
    stages = {name: rec.get("seconds") for name, rec in manifest["stages"].items()}
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return {
        "total_s": round(wall, 1),
        "stages_s": stages,
        "driver_peak_rss_gb": round(peak_kb / 2**20, 3),
        "run_folder_mb": round(size / 2**20, 1),
        "report_mb": round((out / "report.html").stat().st_size / 2**20, 2),
    }


def slope(xs, ys) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument(
        "--work", type=Path, help="where the synthetic studies and runs go (default: a temporary folder)"
    )
    args = parser.parse_args()
    from tests.hf_tiny import save_sentence_encoder

    work = args.work or Path(tempfile.mkdtemp(prefix="vlm-scale-"))
    encoder = work / "encoder"
    if not (encoder / "modules.json").exists():
        save_sentence_encoder(encoder)
    results = []
    for n in args.sizes:
        made = time.monotonic()
        study = make_study(work / f"study-{n}", n, encoder)
        row = {"images": n, "make_s": round(time.monotonic() - made, 1), **run_once(study, work / f"run-{n}")}
        results.append(row)
        print(json.dumps(row), flush=True)
    ns = [r["images"] for r in results]
    summary = {"sizes": ns}
    if len(ns) > 1:
        summary["total_time_loglog_slope"] = round(slope(ns, [r["total_s"] for r in results]), 3)
        rss = [r["driver_peak_rss_gb"] for r in results]
        summary["driver_rss_mb_per_image"] = round(float(np.polyfit(ns, rss, 1)[0]) * 1024, 4)
    at = {r["images"]: r["driver_peak_rss_gb"] for r in results}
    if 100_000 in at:
        summary["driver_rss_gb_at_100k"] = at[100_000]
    largest = results[-1]
    summary["seconds_per_million_images_extrapolated"] = round(
        largest["total_s"]
        * 1e6
        / largest["images"]
        * ((1e6 / largest["images"]) ** (summary.get("total_time_loglog_slope", 1.0) - 1)),
        0,
    )
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
