"""Benchmark of local models on Ray: images per second through the describe stage (Ray actors)
against a plain single-process loop over the same model, batch size and images, in the same run.

Two models with random weights built from configs (no download): a tiny ViT-GPT2 (the fixed cost of
the Ray path) and a full-size one with the shapes of nlpconnect/vit-gpt2-image-captioning (ViT-base
encoder at 224 px, GPT-2 small decoder: the real model's FLOPs). The plain loop runs torch on all
cores; the Ray path runs 1 actor given every CPU, then 2 actors with one CPU each. Times are wall
clock from "model folder and image files on disk" to "texts": the plain loop pays its model load
and image decoding, the Ray path its actor start-up (a fresh worker process that imports torch),
model load, loader tasks and writing parts. Each figure is the best of interleaved rounds (two for
the full-size model), since the machine may be shared.

Prints one JSON object per line; the last is the summary with ratio_1_actor and ratio_2_actors:
Ray images/s over plain images/s for the full-size model in steady state (after each path's first
batch: the plain loop's batch end times, the Ray path's part-file times), plus the same ratios
from disk to texts with start-up included (`*_with_startup`). Run from the repo root:
    .venv/bin/python benchmarks/local_inference.py
    .venv/bin/python benchmarks/local_inference.py --smoke   # the tiny model in the full-size one's place,
                                                             # one round, full images only: that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from PIL import Image  # noqa: E402

from tests import hf_tiny  # noqa: E402
from vlm_decade.core.config import ModelConfig  # noqa: E402
from vlm_decade.core.progress import Reporter  # noqa: E402
from vlm_decade.core.runfolder import RunFolder  # noqa: E402
from vlm_decade.core.runner import StudyRun, given  # noqa: E402
from vlm_decade.core.runtime import (  # noqa: E402
    LazyRay,
    start_ray,
)
from vlm_decade.demo import materialize  # noqa: E402
from vlm_decade.imaging.masks import apply_mask  # noqa: E402
from vlm_decade.models.backends import Stimulus, backend_class  # noqa: E402
from vlm_decade.stages import describe  # noqa: E402
from vlm_decade.stages.describe import local as describe_local  # noqa: E402
from vlm_decade.stages.describe.plan import jobs_from, plan_jobs  # noqa: E402
from vlm_decade.studies import load_study  # noqa: E402
from vlm_decade.studies.decade.data import load_study_data  # noqa: E402
from vlm_decade.studies.decade.pipeline import plan  # noqa: E402

CPUS = os.cpu_count() or 2


def emit(**kw):
    print(json.dumps(kw), flush=True)


def save_full_size_vit_gpt2(folder: Path) -> Path:
    """nlpconnect/vit-gpt2-image-captioning's shapes (ViT-base/16 at 224 px + GPT-2 small, 239M
    parameters) with seeded random weights and a word-level tokenizer over GPT-2's vocabulary size."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import (
        GPT2Config,
        PreTrainedTokenizerFast,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    vocab = {f"w{i}": i for i in range(50256)} | {"<|endoftext|>": 50256}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>")),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(ViTConfig(), GPT2Config())
    config.decoder_start_token_id = config.eos_token_id = config.pad_token_id = 50256
    with torch.random.fork_rng():
        torch.manual_seed(0)
        VisionEncoderDecoderModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)
    return folder


def plain_loop(model: ModelConfig, jobs) -> tuple[float, float, list[str]]:
    """The same model, batches and images in this process, torch on its own threads. Returns the
    wall time, the steady-state images/s (after the first batch) and the texts."""
    start = time.perf_counter()
    backend = backend_class(model.backend)(model)
    texts = []
    batch_ends = []
    for i in range(0, len(jobs), model.batch_size):
        batch = []
        for job in jobs[i : i + model.batch_size]:
            with Image.open(job.path) as im:
                rgb = np.asarray(im.convert("RGB"))
            batch.append(
                Stimulus(job.image_id, job.variant, apply_mask(rgb, job.mask) if job.mask else rgb, job.prompt)
            )
        texts += [d.text for d in backend.describe(batch)]
        batch_ends.append(time.perf_counter())
    return time.perf_counter() - start, steady_rate(batch_ends, model.batch_size, len(jobs)), texts


def steady_rate(batch_ends: list[float], batch_size: int, n: int) -> float:
    """Images/s after the first batch: model load, worker start-up and warm-up left out."""
    if len(batch_ends) < 2:
        return float("nan")
    return (n - batch_size) / (batch_ends[-1] - batch_ends[0])


def ray_path(study, images, out: Path, actors: int) -> tuple[float, float, list[str]]:
    runtime = study.runtime.model_copy(update={"actors_per_model": actors, "cpus_per_actor": CPUS / actors})
    study = study.model_copy(update={"runtime": runtime})
    run = StudyRun(RunFolder(out), Reporter(quiet=True), LazyRay(study.runtime))
    run.run_stage(given("images", images))
    describe_local.PART_ROWS = 1  # a part per batch: its time stamps give the steady rate
    start = time.perf_counter()
    describe.run_describe(study, plan(study), run)
    seconds = time.perf_counter() - start
    table = run.folder.read("responses")
    assert set(table.column("status").to_pylist()) == {"ok"}, table.filter(
        pa.compute.equal(table.column("status"), "error")
    )
    # Each finished batch is saved as a part named by the time it was written.
    part_times = sorted(int(p.name.split("-")[1]) / 1e9 for p in (out / ".parts" / "responses").glob("part-*.parquet"))
    batch_size = study.models[0].batch_size
    return seconds, steady_rate(part_times, batch_size, table.num_rows), table.column("text").to_pylist()


def bench(name: str, model: ModelConfig, study, images, tmp: Path, rounds: int) -> dict:
    """Images/s of each path, best of `rounds` interleaved rounds (the machine may be shared: the
    best round is the one least disturbed, and interleaving spreads any disturbance over paths)."""
    study = study.model_copy(update={"models": (model,)})
    steps = plan(study)
    jobs = sorted(jobs_from(plan_jobs(study, steps, images), steps, images), key=lambda j: (j.image_id, j.variant))
    n = len(jobs)
    best = {"plain": 0.0, 1: 0.0, 2: 0.0}
    steady = {"plain": 0.0, 1: 0.0, 2: 0.0}
    for r in range(rounds):
        seconds, rate, plain_texts = plain_loop(model, jobs)
        best["plain"], steady["plain"] = max(best["plain"], n / seconds), max(steady["plain"], rate)
        emit(
            model=name,
            round=r,
            path="plain",
            torch_threads=CPUS,
            images=n,
            seconds=round(seconds, 2),
            images_per_s=round(n / seconds, 3),
            steady_images_per_s=round(rate, 3),
        )
        for actors in (1, 2):
            seconds, rate, texts = ray_path(study, images, tmp / f"{name}-{r}-{actors}", actors)
            assert texts == plain_texts, f"{name}: Ray and the plain loop disagree"
            best[actors], steady[actors] = max(best[actors], n / seconds), max(steady[actors], rate)
            emit(
                model=name,
                round=r,
                path="ray",
                actors=actors,
                cpus_per_actor=CPUS / actors,
                images=n,
                seconds=round(seconds, 2),
                images_per_s=round(n / seconds, 3),
                steady_images_per_s=round(rate, 3),
            )
    return best, steady


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny model only, one round, full images only")
    args = parser.parse_args()
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="vlm-bench-"))
    start_ray(num_cpus=CPUS)
    study = load_study(materialize(tmp / "study"))
    images = load_study_data(study.data, study.ranking, study.masks).images  # the demo's 16 photos
    tiny = ModelConfig(
        name="tiny",
        backend="hf-captioner",
        model_id="tiny/vit-gpt2",
        era="pre-mllm",
        batch_size=8,
        variants="full" if args.smoke else "all",
        path=hf_tiny.save_captioner(tmp / "tiny"),
    )
    small, small_steady = bench("tiny", tiny, study, images, tmp, rounds=1)
    if args.smoke:
        big, steady = small, small_steady
    else:
        full = ModelConfig(
            name="full",
            backend="hf-captioner",
            model_id="random/vit-gpt2-base",
            era="pre-mllm",
            batch_size=8,
            variants="all",
            path=save_full_size_vit_gpt2(tmp / "full"),
            options={"max_new_tokens": 20},
        )
        big, steady = bench("full", full, study, images, tmp, rounds=2)
    emit(
        # Throughput once models are loaded: what decides a long study's hours.
        ratio_1_actor=round(steady[1] / steady["plain"], 3),
        ratio_2_actors=round(steady[2] / steady["plain"], 3),
        # The same from files on disk to texts, start-up and model load included (64 stimuli).
        ratio_1_actor_with_startup=round(big[1] / big["plain"], 3),
        ratio_2_actors_with_startup=round(big[2] / big["plain"], 3),
        full_steady_images_per_s={
            "plain": round(steady["plain"], 3),
            "ray_1_actor": round(steady[1], 3),
            "ray_2_actors": round(steady[2], 3),
        },
        full_images_per_s={
            "plain": round(big["plain"], 3),
            "ray_1_actor": round(big[1], 3),
            "ray_2_actors": round(big[2], 3),
        },
        tiny_images_per_s={
            "plain": round(small["plain"], 3),
            "ray_1_actor": round(small[1], 3),
            "ray_2_actors": round(small[2], 3),
        },
        cpus=CPUS,
        total_seconds=round(time.perf_counter() - started, 1),
    )


if __name__ == "__main__":
    main()
