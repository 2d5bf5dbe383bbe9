"""Engine choice: the embed stage's work (encoding N distinct texts) through the project's own
dispatcher and through Ray Data, on one Ray, measured alike.

The paths, each a fresh driver process joined to the same local Ray (so each driver's memory is its
own, and a driver can be killed while the cluster stays):
- `dispatcher`: `stages.embed.run_embed`, the stage's real code (`core/dispatch.pool_map` over
  encoder actors, vectors saved as the run folder's parts, then the sorted table written).
- `raydata_parquet`: what a Ray user would write: `ray.data.from_arrow` (blocks of `BLOCK_ROWS`
  texts) -> `map_batches` over an actor pool (`ActorPoolStrategy`, one actor per CPU) ->
  `write_parquet` from the workers, streaming; a resume skips the texts whose vectors a readable
  file holds (a file cut short by the kill is discarded).
- `raydata_parts`: Ray Data's actor pool in place of `pool_map` inside the stage: the same
  streaming `map_batches`, its batches pulled by the driver (`iter_batches`) into the run folder's
  parts, then the stage's own table writer; resume as the stage's.
Both engines run the same encoder actor (`embed.local.EncodeActor`, the tiny two-layer encoder over
MiniLM's tokenizer that benchmarks/scale.py uses), the same batches (`embed.local.TEXT_BATCH` texts, sorted
by length) and the same rows (`embed.table.vector_rows`).

Measured per path: texts/s from "texts at hand, Ray up, no actor started" (in the driver for
`raydata_parquet`; for the two stage paths, the run's `references` table, written before the clock
starts, which the stage reads and hashes) to "every vector saved" (`encode_s`; for the two stage
paths also `stage_s`, with the sorted table written), and the driver's memory: its peak RSS and the
growth over its RSS before the work (sampled every 20 ms).
Resume: each path's driver is SIGKILLed once half the texts are saved, then run again on the same
folder; `kept` texts survived the kill, `redone` were encoded again (every text in flight or
waiting in a buffer when the kill came), and the rerun must leave each text exactly once. Node loss
is not measured here (one machine; tests/e2e/node_loss.py covers the dispatcher's actor pools).

Prints one JSON object per measurement, then a summary with the ratios (Ray Data over dispatcher).
Needs Ray Data (`pip install -e ".[bench]"`). Run from the repository root:
    .venv/bin/python benchmarks/engine_choice.py [--texts 40000] [--rounds 2] [--no-kill]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.scale import sentence  # noqa: E402
from vlm_decade.core.config import EncoderConfig, RuntimeConfig, StudyBase  # noqa: E402
from vlm_decade.core.progress import Reporter  # noqa: E402
from vlm_decade.core.runfolder import RunFolder  # noqa: E402
from vlm_decade.core.runner import StudyRun  # noqa: E402
from vlm_decade.core.runtime import LazyRay, start_ray  # noqa: E402
from vlm_decade.stages import embed  # noqa: E402

PATHS = ("dispatcher", "raydata_parquet", "raydata_parts")
BLOCK_ROWS = 8 * embed.local.TEXT_BATCH  # texts per Ray Data block: the unit an actor takes and a file holds
PARQUET_DIR = "raydata-parts"


class EmbedStudy(StudyBase):
    """Just what the embed stage reads of a study."""

    encoders: tuple[EncoderConfig, ...]


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def make_texts(n: int) -> pa.Table:
    """N distinct texts keyed as the stage keys them: (text_sha256, text), sorted by key."""
    rng = np.random.default_rng(0)
    texts = [sentence(rng) + f" {i}" for i in range(n)]
    return embed.plan._hashed(pa.array(texts, pa.string()))[0].sort_by("text_sha256")


def write_inputs(folder: RunFolder, texts: pa.Table) -> None:
    """The texts as the run's references, beside no responses: the tables the stage reads."""
    folder.write("references", texts.select(["text"]))
    folder.write("responses", pa.table({"status": pa.array([], pa.string()), "text": pa.array([], pa.string())}))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """The process's highest RSS while the block runs, sampled every 20 ms."""

    def __enter__(self):
        self.before = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


class Encode:
    """Ray Data's callable class: the stage's own encoder actor, rows as the stage makes them."""

    def __init__(self, cfg: EncoderConfig):
        self.cfg = cfg
        self.actor = embed.local.EncodeActor(cfg)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return embed.table.vector_rows(
            batch.column("text_sha256"), self.actor.encode(batch.column("text").to_pylist()), self.cfg
        )


def encoded_stream(ray, cfg: EncoderConfig, todo: pa.Table):
    """The texts through Ray Data's streaming `map_batches` over one encoder actor per CPU."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    todo = todo.take(pc.sort_indices(pc.utf8_length(todo.column("text"))))  # as the stage batches them
    blocks = [todo.slice(i, BLOCK_ROWS) for i in range(0, todo.num_rows, BLOCK_ROWS)]
    actors = max(1, int(ray.cluster_resources().get("CPU", 1)))
    return ray.data.from_arrow(blocks).map_batches(
        Encode,
        fn_constructor_args=(cfg,),
        batch_size=embed.local.TEXT_BATCH,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=min(actors, len(blocks))),
        num_cpus=1,
    )


def parquet_kept(folder: Path) -> tuple[pa.Array, int]:
    """The keys the readable Ray Data files hold, and how many files were cut short (removed)."""
    keys, damaged = [], 0
    for f in sorted(folder.glob("*.parquet")) if folder.exists() else ():
        try:
            keys.append(pq.read_table(f, columns=["text_sha256"]).column("text_sha256").combine_chunks())
        except (pa.ArrowInvalid, OSError):
            f.unlink()
            damaged += 1
    return (pa.concat_arrays(keys) if keys else pa.array([], pa.string())), damaged


def saved_rows(path: str, out: Path) -> int:
    """Rows saved so far (read by the parent while a driver runs)."""
    folder = out / PARQUET_DIR if path == "raydata_parquet" else out / ".parts" / "embeddings"
    rows = 0
    for f in folder.glob("*.parquet") if folder.exists() else ():
        try:
            rows += pq.read_metadata(f).num_rows
        except (pa.ArrowInvalid, OSError):
            pass  # being written
    return rows


def child(path: str, n: int, out: Path, encoder: Path, address: str) -> None:
    """One driver: the work of `path` on `out`; prints its figures as JSON."""
    texts = make_texts(n)
    cfg = EncoderConfig(name="SBERT-SI", path=encoder)
    study = EmbedStudy(
        name="engine-choice",
        models=({"name": "x", "backend": "imported", "model_id": "x"},),
        encoders=(cfg,),
        runtime=RuntimeConfig(address=address),
    )
    ray = start_ray(address)
    folder = RunFolder(out)
    if path != "raydata_parquet":
        write_inputs(folder, texts)
    run = StudyRun(folder, Reporter(quiet=True), LazyRay(study.runtime))
    figures: dict = {}
    with PeakRSS() as rss:
        start = time.perf_counter()
        if path == "raydata_parquet":
            kept, figures["damaged_files"] = parquet_kept(out / PARQUET_DIR)
            todo = texts.filter(pc.invert(pc.is_in(texts.column("text_sha256"), kept)))
            figures["kept"] = texts.num_rows - todo.num_rows
            if todo.num_rows:
                encoded_stream(ray, cfg, todo).write_parquet(str(out / PARQUET_DIR))
            figures["encode_s"] = time.perf_counter() - start
            keys, _ = parquet_kept(out / PARQUET_DIR)
            figures["rows_out"], figures["distinct_out"] = len(keys), len(pc.unique(keys))
        else:
            plan, write = embed.plan_texts, embed.write_selected
            plans: list[embed.plan.EmbedPlan] = []
            wrote_at: list[float] = []

            def kept_plan(*args):  # what the stage found already encoded: the texts it will not encode
                plans.append(plan(*args))
                return plans[0]

            def timed_write(*args):
                wrote_at.append(time.perf_counter())
                return write(*args)

            embed.plan_texts, embed.write_selected = kept_plan, timed_write
            if path == "raydata_parts":  # Ray Data's own actor pool: none of the stage's started ahead
                embed.start_actors = lambda *args: []
                embed.embed_local = lambda study, cfg, work, n, run, advance, actors: raydata_into_parts(run, cfg, work)
            written = embed.run_embed(study, run)
            figures["kept"] = plans[0].wanted - plans[0].todo[cfg.name]
            figures["stage_s"] = time.perf_counter() - start
            figures["encode_s"] = wrote_at[0] - start
            figures["rows_out"] = figures["distinct_out"] = written.rows
    figures.update(
        path=path,
        encoded=texts.num_rows - figures["kept"],
        rss_before_mb=round(rss.before / 2**20, 1),
        rss_peak_mb=round(rss.peak / 2**20, 1),
        rss_growth_mb=round((rss.peak - rss.before) / 2**20, 1),
        ru_maxrss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    )
    print("RESULT " + json.dumps(figures), flush=True)


def raydata_into_parts(run: StudyRun, cfg: EncoderConfig, work) -> None:
    """The stage's `embed_local` with Ray Data's actor pool in place of `pool_map`: the stage's
    batches of texts to encode (`work`) taken as one table, then batched as `encoded_stream` does."""
    stream = encoded_stream(run.ray(), cfg, pa.concat_tables(list(work)))
    with run.folder.parts("embeddings", embed.EMBEDDINGS_SCHEMA, embed.local.PART_ROWS, embed.local.PART_S) as parts:
        for batch in stream.iter_batches(batch_size=None, batch_format="pyarrow"):
            parts.add(batch)


def drive(path: str, n: int, out: Path, encoder: Path, address: str, kill_at: int | None = None) -> dict:
    """Run one driver; with `kill_at`, SIGKILL it once that many rows are saved. Its figures, or
    what was saved when it was killed."""
    cmd = [sys.executable, __file__, "--child", path, "--texts", str(n), "--out", str(out), "--encoder", str(encoder)]
    proc = subprocess.Popen([*cmd, "--address", address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_at is None:
        stdout, stderr = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"{path} driver failed:\n{stderr[-4000:]}")
        return json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:])
    while proc.poll() is None and saved_rows(path, out) < kill_at:
        time.sleep(0.05)
    if proc.poll() is not None:
        raise RuntimeError(f"{path} driver ended before {kill_at} rows were saved:\n{proc.stderr.read()[-4000:]}")
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return {"saved_at_kill": saved_rows(path, out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-kill", action="store_true", help="leave out the resume after SIGKILL")
    parser.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--encoder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.texts, args.out, args.encoder, args.address)
    from tests.hf_tiny import save_sentence_encoder

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["RAY_AUTH_MODE"] = "disabled"  # the drivers join this Ray as local processes, with no token to share
    cpus = os.cpu_count() or 2
    ray = start_ray(num_cpus=cpus)
    address = ray.get_runtime_context().gcs_address
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="vlm-engine-") as tmp:
        work = Path(tmp)
        encoder = save_sentence_encoder(work / "encoder")
        for r in range(args.rounds):
            order = PATHS if r % 2 == 0 else PATHS[::-1]  # neither path always runs first
            for path in order:
                got = drive(path, args.texts, work / f"{path}-{r}", encoder, address)
                assert got["kept"] == 0 and got["rows_out"] == got["distinct_out"] == args.texts, got
                got["texts_per_s"] = round(args.texts / got["encode_s"], 1)
                emit(round=r, **{k: round(v, 2) if isinstance(v, float) else v for k, v in got.items()})
                if path not in best or got["texts_per_s"] > best[path]["texts_per_s"]:
                    best[path] = got
        resume = {}
        if not args.no_kill:
            for path in PATHS:
                out = work / f"{path}-killed"
                killed = drive(path, args.texts, out, encoder, address, kill_at=args.texts // 2)
                again = drive(path, args.texts, out, encoder, address)
                assert again["rows_out"] == again["distinct_out"] == args.texts, again
                resume[path] = {
                    "saved_at_kill": killed["saved_at_kill"],
                    "kept": again["kept"],
                    "damaged_files": again.get("damaged_files", 0),
                    "encoded_on_rerun": again["encoded"],
                    "each_text_once_after_rerun": True,
                }
                emit(resume=path, **resume[path])
    base = best["dispatcher"]
    summary = {
        "summary": True,
        "texts": args.texts,
        "cpus": cpus,
        "loadavg_at_start": load,
        **{f"{p}_texts_per_s": best[p]["texts_per_s"] for p in PATHS},
        **{f"{p}_driver_rss_growth_mb": best[p]["rss_growth_mb"] for p in PATHS},
        **{f"{p}_driver_peak_rss_mb": best[p]["rss_peak_mb"] for p in PATHS},
        "dispatcher_stage_s": round(base["stage_s"], 2),
        "raydata_parts_stage_s": round(best["raydata_parts"]["stage_s"], 2),
        "ratio_raydata_parquet_vs_dispatcher": round(best["raydata_parquet"]["texts_per_s"] / base["texts_per_s"], 3),
        "ratio_raydata_parts_vs_dispatcher": round(best["raydata_parts"]["texts_per_s"] / base["texts_per_s"], 3),
        "resume_after_sigkill": resume,
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
