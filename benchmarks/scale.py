"""Scale benchmark: a synthetic Study A of N images through `vlm-decade run`, for N = 100,000 and
1,000,000 (by default), measuring what grows with the images.

The study is built so that the framework is what is measured: 16x16 random photos, nine human
descriptions per image (`--humans`; no votes: the consensus gold standard), eight model texts per
image (`--model-texts`: `imported` models of all four variants, full, m1, m2, m3, and one of the full
image only for a remainder), a two-layer sentence encoder built from a config over MiniLM's
tokenizer (SBERT-SI's interface at a fraction of its cost), 10,000 bootstrap resamples, the
framework's default batch sizes. Each run is a fresh process (`python -m vlm_decade run`) whose own
peak RSS is read from `getrusage(RUSAGE_SELF)` (the driver only: Ray's workers are other processes).
A study's files are kept in `--work` and reused by a later run of the same shape and size.

Prints one JSON object per N (per-stage seconds, and the driver's peak RSS over the run, before the
first stage (`input`: reading and checking the study's files) and within each stage), then a summary: the log-log slope of total time against N over the two
largest sizes (`loglog_slope`), the marginal milliseconds per image between them
(`ms_per_image_marginal`), the driver's RSS growth per image, and `driver_rss_gb_at_1m`: measured
when a million ran, otherwise extrapolated linearly from the two largest sizes
(`driver_rss_gb_at_1m_extrapolated: true`). Run from the repository root:
    .venv/bin/python benchmarks/scale.py [--sizes 100000 1000000] [--humans 9] [--model-texts 8] [--work DIR]
        [--again STAGE]
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

# The driver's peak RSS over the whole run, and over each stage: the kernel's high-water mark
# (VmHWM) is reset as a stage begins (Linux's clear_refs) and read as it ends.
DRIVER = """
import resource, sys, time
from vlm_decade.cli import app
from vlm_decade.core import runner

def hwm_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))

run_stage = runner.StudyRun.run_stage
def measured(self, stage):
    print("STAGE_RSS_KB before-" + stage.name, hwm_kb(), file=sys.stderr)  # the peak since the last reset
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    try:
        return run_stage(self, stage)
    finally:
        print("STAGE_RSS_KB", stage.name, hwm_kb(), file=sys.stderr)
if sys.platform == "linux":
    runner.StudyRun.run_stage = measured
start = time.monotonic()
try:
    code = app(sys.argv[1:], standalone_mode=False)  # a run that stops (Ray did not start, say) returns its status
finally:
    print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "WALL_S", time.monotonic() - start, file=sys.stderr)
sys.exit(code if isinstance(code, int) else 0)
"""


def sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(6, 12))))


ALL_VARIANTS = ("full", "m1", "m2", "m3")


def model_variants(model_texts: int) -> list[tuple[str, ...]]:
    """Each imported model's variants: as many models of all four variants as fit, then one of the
    full image only per remaining text (8 -> two of four; 5 -> one of four and one of the full)."""
    return [ALL_VARIANTS] * (model_texts // 4) + [("full",)] * (model_texts % 4)


def make_study(folder: Path, n: int, encoder: Path, humans: int, model_texts: int) -> Path:
    """The synthetic study's files; deterministic for (n, humans, model_texts), and reused when there
    with that shape (a folder of another shape is refused: its figures would be another study's)."""
    path = folder / "study.json"  # YAML is a superset of JSON
    shape = {"images": n, "humans": humans, "model_texts": model_texts}
    if path.exists():
        made = folder / "shape.json"
        if made.exists():
            found = json.loads(made.read_text())
        else:  # made before its shape was written down: its name gives the images, its models the texts
            # (the human descriptions per image, not written there, are taken as asked)
            study = json.loads(path.read_text())
            found = {"images": int(study["name"].removeprefix("scale-")), "humans": humans, "model_texts": model_texts}
            if [m.get("variants") == "all" for m in study["models"]] != [
                len(v) > 1 for v in model_variants(model_texts)
            ]:
                found["model_texts"] = None
        if found != shape:
            raise SystemExit(f"{folder} holds a study of another shape ({found}, not {shape}): give another folder")
        return path
    from PIL import Image

    rng = np.random.default_rng(n)
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    shapes = model_variants(model_texts)
    models = [f"model_{j}.csv" for j in range(len(shapes))]
    with (
        open(folder / "images.csv", "w", newline="") as f_img,
        open(folder / "descriptions.csv", "w", newline="") as f_desc,
    ):
        model_files = [open(folder / name, "w", newline="") for name in models]
        w_img, w_desc = csv.writer(f_img), csv.writer(f_desc)
        w_models = [csv.writer(f) for f in model_files]
        w_img.writerow(["image_id", "dataset", "file"])
        w_desc.writerow(["description_id", "image_id", "worker_id", "condition", "text"])
        for w in w_models:
            w.writerow(["image_id", "variant", "text"])
        for i in range(n):
            image_id = f"img{i:07d}"
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(images / f"{image_id}.png")
            w_img.writerow([image_id, "everyday" if i % 2 else "specialist", f"{image_id}.png"])
            for k in range(humans):
                w_desc.writerow([f"{image_id}-d{k}", image_id, f"w{k}", "full", sentence(rng)])
            for w, variants in zip(w_models, shapes):
                for variant in variants:
                    w.writerow([image_id, variant, sentence(rng)])
        for f in model_files:
            f.close()
    study = {
        "name": f"scale-{n}",
        "data": {"images": "images.csv", "image_dir": "images", "descriptions": "descriptions.csv"},
        "ranking": {"top_k": 2, "bottom_k": 2},
        "models": [
            {
                "name": f"model-{j}",
                "backend": "imported",
                "model_id": f"synthetic-{j}",
                "era": "pre-mllm" if j % 2 == 0 else "mllm",
                **({"variants": "all"} if len(variants) > 1 else {}),
                "options": {"file": name},
            }
            for j, (name, variants) in enumerate(zip(models, shapes))
        ],
        "encoders": [{"name": "SBERT-SI", "path": str(encoder)}],
        "statistics": {"n_resamples": 10_000},
    }
    path.write_text(json.dumps(study, indent=1))
    (folder / "shape.json").write_text(json.dumps(shape))
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
    stage_kb = {}
    for line in done.stderr.splitlines():
        if line.startswith("STAGE_RSS_KB"):
            _, name, kb = line.split()
            if not stage_kb:  # the peak before the first stage: reading and checking the study's inputs
                name = "input"
            stage_kb[name] = max(stage_kb.get(name, 0), int(kb))
    # Resetting the high-water mark resets getrusage's too: the run's peak is the highest of them all.
    peak_kb = max([peak_kb, *stage_kb.values()])
    stage_kb = {name: kb for name, kb in stage_kb.items() if not name.startswith("before-")}
    manifest = json.loads((out / "manifest.json").read_text())
    stages = {name: rec.get("seconds") for name, rec in manifest["stages"].items()}
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return {
        "total_s": round(wall, 1),
        "stages_s": stages,
        "driver_peak_rss_gb": round(peak_kb / 2**20, 3),
        "stage_peak_rss_gb": {name: round(kb / 2**20, 3) for name, kb in stage_kb.items()},
        "run_folder_mb": round(size / 2**20, 1),
        "report_mb": round((out / "report.html").stat().st_size / 2**20, 2),
    }


def mark_stale(out: Path, stage: str) -> None:
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["stages"][stage]["fingerprint"] = "stale"
    manifest_path.write_text(json.dumps(manifest, indent=2))


def slope(xs, ys) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--humans", type=int, default=9, help="human descriptions per image")
    parser.add_argument("--model-texts", type=int, default=8, help="model texts per image (imported models' rows)")
    parser.add_argument(
        "--work", type=Path, help="where the synthetic studies and runs go (default: a temporary folder)"
    )
    parser.add_argument(
        "--again",
        metavar="STAGE",
        help="in a run folder already finished, run this stage again (its record marked stale): the input "
        "checks and that stage measured without the hours of encoding before it",
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
        shape = f"h{args.humans}-m{args.model_texts}"
        study = make_study(work / f"study-{n}-{shape}", n, encoder, args.humans, args.model_texts)
        if args.again:
            mark_stale(work / f"run-{n}-{shape}", args.again)
        row = {
            "images": n,
            "humans": args.humans,
            "model_texts": args.model_texts,
            "make_s": round(time.monotonic() - made, 1),
            **run_once(study, work / f"run-{n}-{shape}"),
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps(summarise(results)), flush=True)


def summarise(results: list[dict]) -> dict:
    """The summary over the runs: slope, marginal cost and RSS growth between the two largest sizes
    (where fixed costs weigh least), the driver's RSS at a million (measured or extrapolated)."""
    results = sorted(results, key=lambda r: r["images"])
    summary = {"sizes": [r["images"] for r in results], "humans": results[0]["humans"]}
    summary["model_texts"] = results[0]["model_texts"]
    at = {r["images"]: r["driver_peak_rss_gb"] for r in results}
    if len(results) > 1:
        small, large = results[-2], results[-1]
        dn = large["images"] - small["images"]
        summary["loglog_slope"] = round(
            slope([small["images"], large["images"]], [small["total_s"], large["total_s"]]), 3
        )
        summary["ms_per_image_marginal"] = round((large["total_s"] - small["total_s"]) * 1000 / dn, 3)
        per_image_gb = (large["driver_peak_rss_gb"] - small["driver_peak_rss_gb"]) / dn
        summary["driver_rss_kb_per_image"] = round(per_image_gb * 2**20, 3)
        if 1_000_000 not in at:
            at_1m = large["driver_peak_rss_gb"] + per_image_gb * (1_000_000 - large["images"])
            summary["driver_rss_gb_at_1m"] = round(at_1m, 3)
            summary["driver_rss_gb_at_1m_extrapolated"] = True
    if 1_000_000 in at:
        summary["driver_rss_gb_at_1m"] = at[1_000_000]
        summary["driver_rss_gb_at_1m_extrapolated"] = False
    return summary


if __name__ == "__main__":
    main()
