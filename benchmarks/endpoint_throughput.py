"""The endpoint path against the actor path: one tiny model, the same images, in one run.

The tiny random-weight LLaVA of tests/hf_tiny.py (CLIP vision tower + Llama, 32x32 images; no
download) is described two ways through the describe stage, each from a study file as a user
writes it:
- **endpoint**: `transformers serve` (the server that comes with transformers) started here on
  127.0.0.1 on a free port with `--continuous-batching`, serving the saved model; the study's model is
  `backend: openai, endpoint: tserve` with `providers.endpoints.tserve: {free: true, adaptive: true}`,
  so requests go through the gateway actor (cache, limits, adaptive concurrency) as they would to
  vLLM; the study is validated first (`validate` asks the server what it serves);
- **actor**: the same saved model as `backend: hf-vlm` in one Ray actor given every CPU, batch size 8.

Both answer the demo's 16 photos, each in `--copies` pixel-shifted copies (distinct bytes, so no
answer comes from the cache), in full and under the demo's 3 masks: 64 x copies stimuli, at most
`--max-tokens` answer tokens each (the random model never ends an answer itself, so through the
endpoint each is cut at the cap, which the gateway records as a failed row saying so: counted as
answered, in `cut_at_the_cap`). Images/s are stimuli answered per second: in steady state (after
each path's first batch of 8, from the stage's own progress counts) and from start to end with
start-up included (the actor path: actor start and model load; the endpoint path: the server's
start until it answers, plus the gateway's start). Each figure is the best of `--rounds`
interleaved rounds (the machine may be shared). Prints one JSON object; `ratio` is endpoint
images/s over actor images/s in steady state.

This measures the endpoint path's overhead on CPU with a model that does almost no work: base64
PNGs over HTTP to a server that runs one request at a time. transformers serve batches continuously
only text models; for a VLM it says so and falls back to one `generate` per request
(`server.continuous_batching_used` in the JSON). What the endpoint path is for is a real engine
(vLLM, SGLang) on GPUs, which batches many requests continuously and pages its attention cache:
docs/engines.md.

    .venv/bin/python benchmarks/endpoint_throughput.py   # --rounds 1 took 684 s on a loaded 2-core machine
    .venv/bin/python benchmarks/endpoint_throughput.py --smoke   # the 16 photos in full only, one round,
                                                                 # 4 answer tokens: that it runs
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import yaml  # noqa: E402
from PIL import Image  # noqa: E402

from tests import hf_tiny  # noqa: E402
from vlm_decade.core.progress import Reporter  # noqa: E402
from vlm_decade.core.runfolder import RunFolder  # noqa: E402
from vlm_decade.core.runner import StudyRun, given  # noqa: E402
from vlm_decade.core.runtime import LazyRay, start_ray  # noqa: E402
from vlm_decade.demo import materialize  # noqa: E402
from vlm_decade.stages import describe  # noqa: E402
from vlm_decade.studies import load_study, pipeline_of  # noqa: E402
from vlm_decade.studies.decade.data import load_study_data  # noqa: E402
from vlm_decade.studies.decade.pipeline import plan  # noqa: E402

CPUS = os.cpu_count() or 2
ENDPOINT = "tserve"
NO_BATCHING = "does not support continuous batching"  # what transformers serve logs when it falls back


class Clock(Reporter):
    """A silent reporter that keeps the time of each of the stage's progress counts."""

    def __init__(self):
        super().__init__(quiet=True)
        self.marks: list[tuple[float, int]] = []

    @contextlib.contextmanager
    def track(self, description: str, total: int, parts: dict[str, int] | None = None):
        yield lambda n=1, part=None: self.marks.append((time.perf_counter(), n))


def steady_rate(marks: list[tuple[float, int]]) -> float:
    """Stimuli/s after the first count (a batch): start-up, model load and warm-up left out."""
    if len(marks) < 2:
        return float("nan")
    return sum(n for _, n in marks[1:]) / (marks[-1][0] - marks[0][0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def transformers_serve(model: Path, log: Path, timeout_s: float = 300.0):
    """`transformers serve MODEL --continuous-batching` on 127.0.0.1, until it lists the model.
    Yields (base_url, the model id it serves, seconds it took to answer); stopped on exit."""
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "transformers"), "serve", str(model), "--continuous-batching"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            if time.perf_counter() - start > timeout_s:
                raise RuntimeError(f"transformers serve did not answer within {timeout_s:g} s")
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=2) as r:
                    served = [m["id"] for m in json.load(r)["data"]]
                break
            except OSError:
                time.sleep(0.25)
        yield base_url, served[0], time.perf_counter() - start
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def shifted_copies(images: pa.Table, copies: int, folder: Path) -> pa.Table:
    """Each image in `copies` versions rolled sideways by 0..copies-1 pixels: new bytes, the same
    photo, so each is a request of its own (the API cache keys on the bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for row in images.to_pylist():
        with Image.open(row["path"]) as im:
            rgb = np.asarray(im.convert("RGB"))
        for k in range(copies):
            path = folder / f"{row['image_id']}-{k}.png"
            Image.fromarray(np.roll(rgb, k, axis=1)).save(path)
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            rows.append(row | {"image_id": f"{row['image_id']}-{k}", "path": str(path), "sha256": sha, "mode": "RGB"})
    return pa.Table.from_pylist(rows, schema=images.schema)


def study_file(folder: Path, model: dict, providers: dict) -> Path:
    """The demo study with `model` as its only model (its ratings, hand labels, taxonomy and metric
    checks are about the demo's own models) and one Ray actor given every CPU."""
    path = materialize(folder)
    raw = yaml.safe_load(path.read_text())
    for key in ("ratings", "hand_labels"):
        raw["data"].pop(key)
    for key in ("taxonomy", "metrics"):
        raw.pop(key)
    raw |= {"models": [model], "encoders": [], "stsb_check": False, "providers": providers}
    raw["runtime"] = {"num_cpus": CPUS, "actors_per_model": 1, "cpus_per_actor": CPUS}
    path.write_text(yaml.safe_dump(raw))
    return path


def run_describe(path: Path, images: pa.Table, out: Path) -> dict:
    """The describe stage of the study at `path` over `images`, into a new run folder."""
    study = load_study(path)
    clock = Clock()
    run = StudyRun(RunFolder(out), clock, LazyRay(study.runtime))
    run.run_stage(given("images", images))
    start = time.perf_counter()
    describe.run_describe(study, plan(study), run)
    seconds = time.perf_counter() - start
    rows = run.folder.read("responses").select(["status", "error", "text"]).to_pylist()
    # The random model never ends an answer by itself: through the endpoint each is cut at the cap,
    # which the gateway records as an error row saying so (the answer was generated all the same).
    failed = [r for r in rows if r["status"] != "ok" and not r["error"].startswith("no complete answer")]
    assert not failed, failed[:3]
    texts = [r["text"] for r in rows if r["status"] == "ok"]
    return {
        "images": len(rows),
        "seconds": round(seconds, 2),
        "images_per_s": round(len(rows) / seconds, 3),
        "steady_images_per_s": round(steady_rate(clock.marks), 3),
        "cut_at_the_cap": len(rows) - len(texts),
        "words_per_answer": round(sum(len(t.split()) for t in texts) / len(texts), 2) if texts else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=2, help="pixel-shifted copies of each of the 16 photos")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; each figure is the best")
    ap.add_argument("--max-tokens", type=int, default=20, help="answer tokens at most, both paths")
    ap.add_argument("--ceiling", type=int, default=16, help="the endpoint's max_concurrency (adaptive below it)")
    ap.add_argument("--smoke", action="store_true", help="the photos in full only, one copy, one round, 4 tokens")
    args = ap.parse_args()
    if args.smoke:
        args.copies, args.rounds, args.max_tokens = 1, 1, 4
    with tempfile.TemporaryDirectory(prefix="vlm-endpoint-bench-") as tmp:
        print(json.dumps(measure(args, Path(tmp))))


def measure(args, tmp: Path) -> dict:
    """Both paths, `args.rounds` interleaved rounds, in folders under `tmp`: the JSON to print."""
    started = time.perf_counter()
    start_ray(num_cpus=CPUS)
    weights = hf_tiny.save_vlm(tmp / "tiny-llava")
    demo = load_study(materialize(tmp / "demo"))
    images = shifted_copies(load_study_data(demo.data, demo.ranking, demo.masks).images, args.copies, tmp / "images")
    local = study_file(
        tmp / "actor",
        {
            "name": "tiny-llava",
            "backend": "hf-vlm",
            "model_id": "tiny/llava",
            "path": str(weights),
            "era": "mllm",
            "variants": "full" if args.smoke else "all",
            "batch_size": 8,
            "options": {"max_new_tokens": args.max_tokens},
        },
        {"cache_dir": str(tmp / "cache-unused")},
    )
    with transformers_serve(weights, tmp / "serve.log") as (base_url, served_id, server_start_s):
        endpoint = {"base_url": base_url, "free": True, "adaptive": True, "max_concurrency": args.ceiling}
        remote = study_file(
            tmp / "endpoint",
            {
                "name": "tiny-llava",
                "backend": "openai",
                "model_id": served_id,
                "era": "mllm",
                "variants": "full" if args.smoke else "all",
                "endpoint": ENDPOINT,
                "options": {"max_output_tokens": args.max_tokens},
            },
            {"endpoints": {ENDPOINT: endpoint}},
        )
        check_start = time.perf_counter()
        study = load_study(remote)
        pipeline_of(study).check(study)  # what `validate` does: the endpoint answers and serves the model
        check_s = time.perf_counter() - check_start
        rounds = []
        for r in range(args.rounds):
            for name, path in (("endpoint", remote), ("actor", local)):
                raw = yaml.safe_load(path.read_text())
                raw["providers"]["cache_dir"] = str(tmp / f"cache-{name}-{r}")  # empty: every answer asked anew
                path.write_text(yaml.safe_dump(raw))
                rounds.append({"round": r, "path": name, **run_describe(path, images, tmp / f"run-{name}-{r}")})
        log = (tmp / "serve.log").read_text()
    best = {
        name: {key: max(x[key] for x in rounds if x["path"] == name) for key in ("images_per_s", "steady_images_per_s")}
        for name in ("endpoint", "actor")
    }
    n = rounds[0]["images"]
    fastest_endpoint = min(x["seconds"] for x in rounds if x["path"] == "endpoint")
    with_server_start = n / (server_start_s + fastest_endpoint)
    return {
        "model": "tests/hf_tiny.py save_vlm (LLaVA: CLIP 2x32 + Llama 2x32, 32x32 images, random weights)",
        "images": n,
        "max_tokens": args.max_tokens,
        "server": {
            "command": "transformers serve MODEL --continuous-batching --host 127.0.0.1 --device cpu",
            "start_s": round(server_start_s, 2),
            "continuous_batching_used": NO_BATCHING not in log,
            "said": next((line.strip() for line in log.splitlines() if NO_BATCHING in line), None),
            "validate_s": round(check_s, 2),
        },
        "endpoint": {"adaptive": True, "max_concurrency": args.ceiling, **best["endpoint"]},
        "endpoint_images_per_s_with_server_start": round(with_server_start, 3),
        "actor": {"actors": 1, "cpus_per_actor": CPUS, "batch_size": 8, **best["actor"]},
        "ratio": round(best["endpoint"]["steady_images_per_s"] / best["actor"]["steady_images_per_s"], 3),
        "ratio_with_startup": round(with_server_start / best["actor"]["images_per_s"], 3),
        "rounds": rounds,
        "note": "CPU, a tiny model: the endpoint path's overhead. Real engines (vLLM, SGLang) on GPUs, which "
        "batch continuously, are what the endpoint path is for (docs/engines.md).",
        "cpus": CPUS,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "total_s": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    main()
