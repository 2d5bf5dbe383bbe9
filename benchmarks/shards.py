"""Shards against loose files: N generated PNGs kept once as loose files (an images table beside a
folder) and once in N/100 WebDataset tar shards (`data.shards`), each checked by the images stage
as a run checks it (`stages.images.check_images` for the files, `stages.shard_images.
check_shard_images` for the shards: both decode, hash and measure every image), locally and in a
moto S3 bucket on 127.0.0.1. Each form is checked in a subprocess of its own, so its peak RSS
(`ru_maxrss`) is that check's alone; the subprocess then times the viewer's read of one image
(`view.verify.image_bytes`: read and verified by its sha256) from its recorded path, a loose file
or a shard member. Locally the two forms are checked `--rounds` times, alternately (loose, shards,
loose, ...), so that a shared machine's changing load falls on both: the summary's rates and peaks
are the medians of the rounds, its ratios those of the medians, and `local_ratios_by_round` each
round's images/s ratio. Prints one JSON object per check and a summary with the ratios (shards /
loose: images/s, higher is better; peak RSS, lower is better). Run from the repository root:
    .venv/bin/python benchmarks/shards.py [--images 100000] [--per-shard 100] [--rounds 1] [--bucket yes]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUCKET = "bench-shards"
SERVES = 20  # reads of one image by the viewer, the median reported
_MEDIANS = ("images_per_s", "peak_rss_mb", "serve_one_ms")  # of each form's rounds


def make_inputs(folder: Path, count: int, per_shard: int, loose: bool = True) -> None:
    """`count` 32x32 RGB PNGs (seeded noise over a ramp, each distinct) as loose files with their
    table (unless not `loose`), and the same bytes in tar shards of `per_shard` images (`im<i>.png`:
    key `im<i>`)."""
    rng = np.random.default_rng(np.random.SeedSequence([65, count]))
    ramp = np.linspace(0, 200, 32, dtype=np.int16)[None, :, None]
    (folder / "loose").mkdir()
    (folder / "shards").mkdir()
    rows = [["image_id", "dataset", "file"]]
    tar = None
    for i in range(count):
        if i % per_shard == 0:
            if tar is not None:
                tar.close()
            tar = tarfile.open(folder / "shards" / f"part-{i // per_shard:06d}.tar", "w")
        pixels = np.clip(ramp + rng.integers(-20, 20, (32, 32, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        data, name = buf.getvalue(), f"im{i:07d}.png"
        if loose:
            (folder / "loose" / name).write_bytes(data)
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        rows.append([f"im{i:07d}", "d", name])
    tar.close()
    with open(folder / "images.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(rows)


def pattern(count: int, per_shard: int) -> str:
    return f"part-{{000000..{(count + per_shard - 1) // per_shard - 1:06d}}}.tar"


def child(form: str, base: str, table: str, shards: str) -> None:
    """Check the images in one form (in this process, so its peak RSS is the check's), then time the
    viewer's read of the first image; print one JSON object."""
    from vlm_decade.core.errors import Problems
    from vlm_decade.core.tables import read_table
    from vlm_decade.stages import images as stage
    from vlm_decade.stages.shard_images import check_shard_images
    from vlm_decade.view.verify import image_bytes

    problems = Problems()
    start = time.perf_counter()
    if form == "loose":
        checked = stage.check_images(read_table(Path(table), stage.IMAGE_COLUMNS, problems), f"{base}/loose", problems)
    else:
        _, checked = check_shard_images(f"{base}/shards/{shards}", None, "d", problems)
    seconds = time.perf_counter() - start
    assert not problems.items, problems.items[:3]
    first = checked.slice(0, 1).to_pylist()[0]
    serve = []
    for _ in range(SERVES):
        began = time.perf_counter()
        image_bytes(first)
        serve.append(time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(
        json.dumps(
            {
                "images": checked.num_rows,
                "seconds": round(seconds, 3),
                "images_per_s": round(checked.num_rows / seconds, 1),
                "peak_rss_mb": round(peak, 1),
                "serve_one_ms": round(1000 * statistics.median(serve), 3),
                "served_from": first["path"],
            }
        )
    )


def measure(form: str, base: str, folder: Path, shards: str, env: dict) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", form, "--base", base, "--table", str(folder / "images.csv")]
        + ["--shards", shards],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def upload(folder: Path, endpoint: str) -> None:
    """The loose files and the shards into the bucket, under the same names."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    for sub in (s for s in ("loose", "shards") if (folder / s).is_dir()):
        for path in sorted((folder / sub).iterdir()):
            client.put_object(Bucket=BUCKET, Key=f"{sub}/{path.name}", Body=path.read_bytes())


def compare(
    where: str, base: str, folder: Path, shards: str, env: dict, rounds: int = 1, shards_only: bool = False
) -> dict:
    runs: dict[str, list[dict]] = {"loose": [], "shards": []}
    if shards_only:
        found = measure("shards", base, folder, shards, env)
        print(json.dumps({"where": where, "form": "shards"} | found), flush=True)
        return {f"{where}_shards_{k}": found[k] for k in ("images_per_s", "peak_rss_mb", "serve_one_ms")}
    for round_ in range(rounds):
        for form in ("loose", "shards"):
            runs[form].append(measure(form, base, folder, shards, env))
            print(json.dumps({"where": where, "form": form, "round": round_ + 1} | runs[form][-1]), flush=True)
    loose, shard = ({k: statistics.median(r[k] for r in runs[form]) for k in _MEDIANS} for form in runs)
    by_round = [round(s["images_per_s"] / lo["images_per_s"], 2) for lo, s in zip(runs["loose"], runs["shards"])]
    return {f"{where}_ratios_by_round": by_round} | {
        f"{where}_loose_images_per_s": loose["images_per_s"],
        f"{where}_shards_images_per_s": shard["images_per_s"],
        f"{where}_ratio_images_per_s_shards_over_loose": round(shard["images_per_s"] / loose["images_per_s"], 2),
        f"{where}_loose_peak_rss_mb": loose["peak_rss_mb"],
        f"{where}_shards_peak_rss_mb": shard["peak_rss_mb"],
        f"{where}_ratio_peak_rss_shards_over_loose": round(shard["peak_rss_mb"] / loose["peak_rss_mb"], 2),
        f"{where}_loose_serve_one_ms": loose["serve_one_ms"],
        f"{where}_shards_serve_one_ms": shard["serve_one_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--per-shard", type=int, default=100)
    parser.add_argument("--bucket", choices=("yes", "no"), default="yes")
    parser.add_argument("--rounds", type=int, default=1, help="local checks of each form, alternately")
    parser.add_argument(
        "--shards-only", action="store_true", help="check the shards alone (a size whose loose files would not fit)"
    )
    parser.add_argument("--child", choices=("loose", "shards"))
    parser.add_argument("--base")
    parser.add_argument("--table")
    parser.add_argument("--shards")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.base, args.table, args.shards)
        return
    env = dict(os.environ)
    summary = {
        "images": args.images,
        "shards": -(-args.images // args.per_shard),
        "cores": len(os.sched_getaffinity(0)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        began = time.perf_counter()
        make_inputs(folder, args.images, args.per_shard, loose=not args.shards_only)
        summary["make_s"] = round(time.perf_counter() - began, 1)
        shards = pattern(args.images, args.per_shard)
        summary |= compare("local", str(folder), folder, shards, env, args.rounds, args.shards_only)
        if args.bucket == "yes":
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            s3_env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
            s3_env |= {"AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
            env |= s3_env | {"AWS_ENDPOINT_URL": endpoint}
            os.environ.update(s3_env)
            try:
                upload(folder, endpoint)
                summary |= compare("s3", f"s3://{BUCKET}", folder, shards, env, shards_only=args.shards_only)
            finally:
                server.stop()
    print(json.dumps(summary | {"load_1min": round(os.getloadavg()[0], 1)}), flush=True)


if __name__ == "__main__":
    main()
