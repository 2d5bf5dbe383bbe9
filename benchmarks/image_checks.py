"""Image checks: seconds to read, decode and hash N generated PNGs with `stages.images.check_images`
(no cache) in one thread (`workers=1`), on a pool of threads of Python's default size (`threads`),
as a run calls it (`default`: images whose check is quick in one thread, or on a pool of processes
from a forkserver when there are many; slower ones on the threads), against the same inspection on
a pool of spawned processes, one per core, its start included (`processes`: the alternative the
checks do not take, `stages/images.py` says why). Each of `--sizes` (width x
height); interleaved rounds, best of each (the machine may be shared). Prints one JSON object per
measurement and one summary per size. Run from the repository root:
    .venv/bin/python benchmarks/image_checks.py [--images 2000] [--rounds 2] [--sizes 160x120,32x32]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vlm_decade.core.errors import Problems  # noqa: E402
from vlm_decade.core.tables import cell_text, read_table  # noqa: E402
from vlm_decade.stages import images as stage  # noqa: E402


def make_images(folder: Path, count: int, width: int, height: int) -> Path:
    """`count` RGB PNGs: a smooth gradient with noise (160x120: about 30 KB each), and their table."""
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 200, width, dtype=np.float32)[None, :, None]
    for i in range(count):
        noise = rng.normal(0, 12, (height, width, 3)).astype(np.float32)
        pixels = np.clip(ramp + noise + (i % 50), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        (folder / f"im{i:05d}.png").write_bytes(buf.getvalue())
    with open(folder / "images.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(
            [list(stage.IMAGE_COLUMNS), *[[f"im{i:05d}", "d", f"im{i:05d}.png"] for i in range(count)]]
        )
    return folder / "images.csv"


def check(table_path: Path, folder: Path, how: str) -> float:
    problems = Problems()
    table = read_table(table_path, stage.IMAGE_COLUMNS, problems)
    start = time.perf_counter()
    if how == "processes":
        paths = [stage.storage.join(folder, cell_text(r, "file")) for r in table.rows]
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(len(os.sched_getaffinity(0)), mp_context=context) as pool:
            found = list(pool.map(stage._inspect_image, paths, chunksize=32))
        assert not [f for f in found if isinstance(f, str)]
    else:
        workers = {"serial": 1, "threads": min(32, (os.cpu_count() or 1) + 4), "default": None}[how]
        images = stage.check_images(table, folder, problems, workers=workers)
        assert len(images) == len(table.rows)
    assert not problems.items, problems.items[:3]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", default="160x120,32x32")
    args = parser.parse_args()
    for size in args.sizes.split(","):
        width, height = map(int, size.split("x"))
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            table = make_images(folder, args.images, width, height)
            best: dict[str, float] = {}
            for _ in range(args.rounds):
                for how in ("serial", "threads", "default", "processes"):
                    seconds = check(table, folder, how)
                    print(json.dumps({"how": how, "size": size, "images": args.images, "seconds": round(seconds, 2)}))
                    best[how] = min(best.get(how, seconds), seconds)
        summary = {"images": args.images, "size": size, "cores": len(os.sched_getaffinity(0))}
        summary |= {f"{how}_s": round(s, 2) for how, s in best.items()}
        summary["default_speedup_vs_serial"] = round(best["serial"] / best["default"], 2)
        summary["default_speedup_vs_threads"] = round(best["threads"] / best["default"], 2)
        print(json.dumps(summary | {"load_1min": round(os.getloadavg()[0], 1)}), flush=True)


if __name__ == "__main__":
    main()
