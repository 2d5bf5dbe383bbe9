"""Incremental-run benchmark: a finished synthetic Study A (benchmarks/scale.py's shape: nine human
descriptions and eight texts of `imported` models per image, the tiny sentence encoder), then 10% more
images added to its files and the run done again into the same run folder, timed against a fresh
run of all the images; and the two run folders' tables compared (floats within 1e-6; and how many
rows are not equal to the bit).

A 2-core machine's speed drifts by tens of percent within minutes, which moves a single pair of
runs' ratio as much as a stage's work does: with `--pairs N`, the incremental and the fresh run are
each done N times, in turns (an incremental run from a copy of the finished run, then a fresh one;
the next pair the other way round), and `incremental_over_fresh` is the median of the pairs' ratios.

Prints one JSON object: the base, incremental and fresh runs' seconds and per-stage seconds (of
the last pair), each pair's seconds and ratio (`pairs`), `incremental_over_fresh`, and
`tables_equal` with the largest float difference per table (the last pair's run folders). Run from
the repository root:
    .venv/bin/python benchmarks/incremental.py [--images 1000] [--added 0.1] [--humans 9] [--model-texts 8] [--pairs 1] [--work DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scale import make_study, run_once

from vlm_decade.core.runfolder import RunFolder

# What a run measures of itself (times, its own version), not what it found.
VOLATILE = {"latency_s"}


def subset(full: Path, base: Path, keep: set[str]) -> Path:
    """`full`'s study with only the images in `keep` (its files filtered, its images shared)."""
    base.mkdir(parents=True, exist_ok=True)
    study = json.loads((full / "study.json").read_text())
    models = [m["options"]["file"] for m in study["models"]]
    for name in ("images.csv", "descriptions.csv", *models):
        with open(full / name, newline="") as f_in, open(base / name, "w", newline="") as f_out:
            rows = csv.DictReader(f_in)
            writer = csv.DictWriter(f_out, rows.fieldnames)
            writer.writeheader()
            writer.writerows(r for r in rows if r["image_id"] in keep)
    study["data"]["image_dir"] = str(full / "images")
    (base / "study.json").write_text(json.dumps(study, indent=1))
    return base / "study.json"


SLICE_ROWS = 65_536  # rows compared at a time: a million images' vectors do not fit in memory as floats twice
PASS_ROWS = 1_048_576  # rows of a column put in order per pass over its files (a vector column: 1.6 GB)


def _in_order(sides, name: str, column: str, rows: int):
    """(first row, slice of side a, slice of side b) of table `name`'s `column` in each side's
    order (`sides`: (run folder, the sort indices of its rows)), `SLICE_ROWS` rows a slice. Each
    side's column is read a row group at a time, once per `PASS_ROWS` rows of the order, keeping
    the rows that pass wants: two whole vector columns do not fit in memory (330,000 images: 5.6
    million vectors, 8.6 GB each, against 24 GB)."""
    ranks = []
    for _, order in sides:
        rank = np.empty(rows, np.int64)
        rank[order.to_numpy()] = np.arange(rows)
        ranks.append(rank)
    for first in range(0, rows, PASS_ROWS):
        end = min(rows, first + PASS_ROWS)
        ordered = []
        for (folder, _), rank in zip(sides, ranks):
            pieces, at, start = [], [], 0
            for batch in folder.batches(name, columns=[column]):
                window = rank[start : start + batch.num_rows]
                mine = np.flatnonzero((window >= first) & (window < end))
                pieces.append(batch.column(0).take(pa.array(mine)))
                at.append(window[mine] - first)
                start += batch.num_rows
            values = pa.chunked_array(pieces)  # a pass is made only of a table with rows
            ordered.append(values.take(pa.array(np.argsort(np.concatenate(at), kind="stable"))))
        for lo in range(0, end - first, SLICE_ROWS):
            yield first + lo, *(side.slice(lo, SLICE_ROWS).combine_chunks() for side in ordered)


def compare(a: Path, b: Path) -> dict:
    """Per table of run folder `a`: None where `b`'s equals it (floats within 1e-6), else why not;
    and the largest float difference seen."""
    out = {}
    # Every table: one file, or a folder of segments (the embeddings); a column at a time, both
    # tables in the order of their other columns.
    folder_a, folder_b = RunFolder(a), RunFolder(b)
    names = {p.stem for p in a.glob("*.parquet")} | {
        p.name for p in a.iterdir() if p.is_dir() and folder_a.segments(p.name)
    }
    for name in sorted(names):
        schema_a, schema_b = folder_a.schema(name), folder_b.schema(name)
        rows_a, rows_b = folder_a.num_rows(name), folder_b.num_rows(name)
        keep = [c for c in schema_a.names if c not in VOLATILE]
        if rows_a != rows_b or [schema_a.field(c) for c in keep] != [
            schema_b.field(c) for c in keep if c in schema_b.names
        ]:
            out[name] = f"rows {rows_a} vs {rows_b}, or other columns"
            continue
        kinds = {c: schema_a.field(c).type for c in keep}
        floats = {
            c
            for c, k in kinds.items()
            if pa.types.is_floating(k) or (pa.types.is_list(k) and pa.types.is_floating(k.value_type))
        }
        order = [
            (c, "ascending") for c in keep if not pa.types.is_list(kinds[c]) and not pa.types.is_floating(kinds[c])
        ]
        sorted_by = {}
        for key, folder in (("a", folder_a), ("b", folder_b)):
            t = folder.read(name, [c for c, _ in order]) if order else None
            sorted_by[key] = pc.sort_indices(t, sort_keys=order) if order else pa.array(np.arange(rows_a))
        worst, differs, inexact = 0.0, [], set()
        for c in keep:
            if c not in floats:
                ca, cb = (folder.read(name, [c]).column(0) for folder in (folder_a, folder_b))
                if not ca.take(sorted_by["a"]).equals(cb.take(sorted_by["b"])):
                    differs.append(c)
                continue
            bad = False
            for lo, sa, sb in _in_order(((folder_a, sorted_by["a"]), (folder_b, sorted_by["b"])), name, c, rows_a):
                listed = pa.types.is_list(kinds[c])
                x, y = (np.asarray(s.flatten() if listed else s, float) for s in (sa, sb))
                same = np.isnan(x) == np.isnan(y)
                gap = float(np.nanmax(np.abs(x - y))) if x.size and not np.isnan(x).all() else 0.0
                worst = max(worst, gap)
                bad = bad or not same.all() or gap > 1e-6
                # Which rows differ at all (in any bit), for a list column by the row its values belong to.
                row_of = (
                    lo + np.repeat(np.arange(len(sa)), pc.list_value_length(sa).to_numpy(zero_copy_only=False))
                    if listed
                    else lo + np.arange(len(sa))
                )
                inexact.update(row_of[~same | (np.nan_to_num(x) != np.nan_to_num(y))].tolist())
            if bad:
                differs.append(c)
        out[name] = {
            "max_float_diff": worst,
            "rows_not_bit_equal": len(inexact),
            "rows": rows_a,
            **({"differs": differs} if differs else {}),
        }
    return out


def finished(run: dict, name: str) -> dict:
    """`run` (scale.run_once's record), checked to have finished every stage: a run that stopped
    (Ray not starting on a loaded machine) still exits 0 through the benchmark's driver."""
    stopped = [stage for stage, seconds in run["stages_s"].items() if seconds is None]
    if stopped:
        raise RuntimeError(f"the {name} run stopped in {stopped}; see its run folder's logs/")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000, help="images of the finished run")
    parser.add_argument("--added", type=float, default=0.1, help="the share of images added")
    parser.add_argument("--humans", type=int, default=9, help="human descriptions per image")
    parser.add_argument("--model-texts", type=int, default=8, help="model texts per image (imported models' rows)")
    parser.add_argument(
        "--pairs", type=int, default=1, help="incremental and fresh runs done in turns, this many of each"
    )
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error("--pairs must be 1 or more")
    from tests.hf_tiny import save_sentence_encoder

    work = args.work or Path(tempfile.mkdtemp(prefix="vlm-incremental-"))
    encoder = work / "encoder"
    if not (encoder / "modules.json").exists():
        save_sentence_encoder(encoder)
    n_all = round(args.images * (1 + args.added))
    full = make_study(work / "full", n_all, encoder, args.humans, args.model_texts)
    base = subset(full.parent, work / "base", {f"img{i:07d}" for i in range(args.images)})
    start = time.monotonic()
    incremental, fresh, finished_base = work / "run-incremental", work / "run-fresh", work / "run-base"
    for out in (incremental, fresh, finished_base):  # an earlier run's folders: each run here starts empty
        shutil.rmtree(out, ignore_errors=True)
    runs = {"base": finished(run_once(base, incremental), "base")}
    if args.pairs > 1:  # the finished run, copied for each pair's incremental run (times to the nanosecond)
        shutil.copytree(incremental, finished_base)
    pairs = []
    for pair in range(args.pairs):
        if pair:
            shutil.rmtree(incremental)
            shutil.copytree(finished_base, incremental)
            shutil.rmtree(fresh)
        order = [("incremental", incremental), ("fresh", fresh)]
        for name, out in order if pair % 2 == 0 else order[::-1]:
            runs[name] = finished(run_once(full, out), name)
        seconds = {f"{name}_s": runs[name]["total_s"] for name in ("incremental", "fresh")}
        pairs.append({**seconds, "ratio": round(seconds["incremental_s"] / seconds["fresh_s"], 3)})
        print(json.dumps({"pair": pair, **pairs[-1]}), file=sys.stderr, flush=True)
    shutil.rmtree(finished_base, ignore_errors=True)
    times = {
        "images": args.images,
        "added": n_all - args.images,
        "humans": args.humans,
        "model_texts": args.model_texts,
        **{f"{k}_s": r["total_s"] for k, r in runs.items()},
        **({"pairs": pairs} if args.pairs > 1 else {}),
        "incremental_over_fresh": statistics.median(p["ratio"] for p in pairs),
        "stages_s": {k: r["stages_s"] for k, r in runs.items()},
    }
    print(json.dumps(times), file=sys.stderr, flush=True)  # kept if the comparison below fails
    tables = compare(fresh, incremental)
    result = {
        **times,
        "tables_equal": all(isinstance(v, dict) and "differs" not in v for v in tables.values()),
        "tables": tables,
        "wall_s": round(time.monotonic() - start, 1),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
