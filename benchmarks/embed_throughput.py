"""Embedding throughput: texts per second through the embed stage (Ray encoder actors on every CPU,
parts, the sorted table written in batches) against a plain `SentenceTransformer.encode` over the
same texts with the same model in this process, in one run on the same machine.

The model is the packaged all-MiniLM-L6-v2 (SBERT-SI). Both paths start from "texts at hand, model on
disk, libraries not yet imported": the plain path runs in a fresh process with the texts in memory and
pays its imports (sentence-transformers takes seconds) and model load; the stage reads the texts from
the run's `references` table (written before its clock starts; reading and hashing them is its work)
and pays its actors' start-up (the same imports and load, in each actor). The figures are the best of
interleaved rounds (the machine may be shared). Prints one JSON object per measurement and a summary
with `ratio_vs_plain` (stage texts/s over plain texts/s). `--text-batches` runs the stage once per
round at each of several `embed.local.TEXT_BATCH` (texts per call to an actor; the first is the one the
ratios use), and `--encoder` takes another sentence-transformers folder (benchmarks/scale.py's small
encoder, whose calls cost more than its compute). Run from the repository root:
    .venv/bin/python benchmarks/embed_throughput.py [--texts 20000] [--rounds 2] [--text-batches 512 128]
        [--encoder FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.scale import sentence  # noqa: E402
from vlm_decade.core.config import EncoderConfig, RuntimeConfig, StudyBase  # noqa: E402
from vlm_decade.core.progress import Reporter  # noqa: E402
from vlm_decade.core.runfolder import RunFolder  # noqa: E402
from vlm_decade.core.runner import StudyRun  # noqa: E402
from vlm_decade.core.runtime import LazyRay, start_ray  # noqa: E402
from vlm_decade.models.encoders.sbert import resolve_weights  # noqa: E402
from vlm_decade.stages import embed  # noqa: E402


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


class EmbedStudy(StudyBase):
    """Just what the embed stage reads of a study."""

    encoders: tuple[EncoderConfig, ...]


def make_texts(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [sentence(rng) + f" {i}" for i in range(n)]


def plain_child(n: int, cfg: EncoderConfig) -> None:
    """The plain path, in this (fresh) process: prints its seconds from texts in memory to vectors."""
    texts = make_texts(n)
    start = time.perf_counter()
    from sentence_transformers import SentenceTransformer

    imported = time.perf_counter()
    model = SentenceTransformer(resolve_weights(cfg), device="cpu")
    vectors = model.encode(texts, batch_size=cfg.batch_size, convert_to_numpy=True, normalize_embeddings=True)
    end = time.perf_counter()
    assert vectors.shape[0] == n
    print(json.dumps({"seconds": end - start, "seconds_after_imports": end - imported}))


def plain(n: int, encoder: Path | None) -> dict:
    """The plain path's seconds: in all, and with the imports left out (as if already done)."""
    command = [sys.executable, __file__, "--plain-child", "--texts", str(n)]
    done = subprocess.run(
        command + (["--encoder", str(encoder)] if encoder else []), capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_inputs(folder: RunFolder, texts: list[str]) -> None:
    """The texts as the run's references, beside no responses: the tables the stage reads."""
    folder.write("references", pa.table({"text": pa.array(texts, pa.string())}))
    folder.write("responses", pa.table({"status": pa.array([], pa.string()), "text": pa.array([], pa.string())}))


def stage(study: EmbedStudy, texts: list[str], out: Path) -> float:
    """The stage's seconds from its input tables on disk to the embeddings table written."""
    folder = RunFolder(out)
    write_inputs(folder, texts)
    run = StudyRun(folder, Reporter(quiet=True), LazyRay(study.runtime))
    start = time.perf_counter()
    written = embed.run_embed(study, run)
    assert written.rows == len(texts)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--text-batches", type=int, nargs="+", default=[embed.local.TEXT_BATCH])
    parser.add_argument("--encoder", type=Path, help="a sentence-transformers folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cfg = EncoderConfig(name="SBERT-SI", path=args.encoder)
    if args.plain_child:
        return plain_child(args.texts, cfg)
    texts = make_texts(args.texts)
    cpus = os.cpu_count() or 2
    study = EmbedStudy(
        name="embed-throughput",
        models=({"name": "x", "backend": "imported", "model_id": "x"},),
        encoders=(cfg,),
        runtime=RuntimeConfig(num_cpus=cpus),
    )
    start_ray(num_cpus=cpus)
    best = {"plain": 0.0, "plain_imported": 0.0} | {batch: 0.0 for batch in args.text_batches}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            timed = plain(len(texts), args.encoder)
            best["plain"] = max(best["plain"], len(texts) / timed["seconds"])
            best["plain_imported"] = max(best["plain_imported"], len(texts) / timed["seconds_after_imports"])
            emit(
                round=r,
                path="plain",
                texts=len(texts),
                torch_threads=cpus,
                seconds=round(timed["seconds"], 2),
                seconds_after_imports=round(timed["seconds_after_imports"], 2),
                texts_per_s=round(len(texts) / timed["seconds"], 1),
            )
            for batch in args.text_batches:
                embed.local.TEXT_BATCH = batch
                seconds = stage(study, texts, Path(tmp) / f"run-{r}-{batch}")
                best[batch] = max(best[batch], len(texts) / seconds)
                emit(
                    round=r,
                    path="stage",
                    texts=len(texts),
                    text_batch=batch,
                    actors=cpus,
                    seconds=round(seconds, 2),
                    texts_per_s=round(len(texts) / seconds, 1),
                )
    first = args.text_batches[0]
    emit(
        summary=True,
        texts=len(texts),
        cpus=cpus,
        encoder=str(args.encoder or "all-MiniLM-L6-v2"),
        plain_texts_per_s=round(best["plain"], 1),
        stage_texts_per_s=round(best[first], 1),
        text_batch=first,
        ratio_vs_plain=round(best[first] / best["plain"], 3),
        plain_imports_done_texts_per_s=round(best["plain_imported"], 1),
        ratio_vs_plain_imports_done=round(best[first] / best["plain_imported"], 3),
        **{f"stage_texts_per_s_at_{b}": round(best[b], 1) for b in args.text_batches[1:]},
        **{f"speedup_over_{b}": round(best[first] / best[b], 3) for b in args.text_batches[1:]},
    )


if __name__ == "__main__":
    main()
