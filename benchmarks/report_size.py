"""Benchmark of the reports' size, and of the view's gallery queries, on synthetic run folders of
500, 8,000 and 100,000 images (both studies; two models; Study A with masks and error labels).

Report: the bytes of report.html (per-image content bounded to each model's worst and best images,
thumbnails embedded), of errors.html and figures/, against what a page listing every row would
hold (the per-image tables the report had before: every full-image description beside its gold
standard; every prediction), and the seconds to write it.
View: one gallery page (Study A sorted by the model-human gap and filtered by an error type; Study B
filtered by outcome and sorted by CS) through DuckDB over the Parquet files, against the obvious
alternative of reading the tables with pyarrow and filtering and sorting them in Python.

Prints one JSON line per size. Run: .venv/bin/python benchmarks/report_size.py [--sizes 500 8000 100000]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image

MODELS = ("model-a", "model-b")
SUBJECTS = (*MODELS, "human:top", "human:bottom")
MASKS = ("m1", "m2", "m3")
ERROR_TYPES = ("detection", "recognition", "scene_understanding", "hallucination", "spatial_dependence")
DATASETS = ("coco", "csb")
SENTENCE = "A person in a red jacket stands beside a bicycle on a wet street while others wait under an awning."
DECADE = {
    "study": "decade",
    "name": "synthetic",
    "data": {"images": "/x/images.csv", "image_dir": "/x", "descriptions": "/x/d.csv"},
    "models": [{"name": m, "backend": "imported", "model_id": m, "era": "pre-mllm"} for m in MODELS],
    "encoders": [{"name": "SBERT-SI", "backend": "sentence-transformers"}],
    "taxonomy": {},
}
OPENWORLD = {
    "study": "openworld",
    "name": "synthetic-b",
    "data": {"image_dir": "/x", "labels": "/x/l.csv", "classnames": "/x/c.csv"},
    "models": [{"name": m, "backend": "imported", "model_id": m} for m in MODELS],
}


def _write(root: Path, name: str, columns: dict) -> None:
    pq.write_table(pa.table(columns), root / f"{name}.parquet")


def _no_comparisons(root: Path, name: str, schema: pa.Schema | None = None) -> None:
    from vlm_decade.stats import COMPARISONS_SCHEMA

    pq.write_table((schema or COMPARISONS_SCHEMA).empty_table(), root / f"{name}.parquet")


def _stats_rows(subjects, groups, metrics, variant: str, rng, column: str = "variant") -> dict:
    """Stats rows of every subject, group and metric; Study B names the variant column `prompt_id`."""
    rows = [(s, g, m) for s in subjects for g in groups for m in metrics]
    estimate = rng.uniform(0.2, 0.8, len(rows))
    return {
        "subject": [r[0] for r in rows],
        "dataset": [r[1] for r in rows],
        "metric": [r[2] for r in rows],
        column: [variant] * len(rows),
        "estimate": estimate,
        "ci_low": estimate - 0.05,
        "ci_high": estimate + 0.05,
        "n_images": [100] * len(rows),
        "n_resamples": [10000] * len(rows),
        "seed": [1] * len(rows),
        "method": ["percentile"] * len(rows),
    }


def _images(root: Path, n: int, pictures: list[str]) -> tuple[list[str], list[str]]:
    ids = [f"img{i:06d}" for i in range(n)]
    datasets = [DATASETS[i % 2] for i in range(n)]
    _write(
        root,
        "images",
        {
            "image_id": ids,
            "dataset": datasets,
            "path": [pictures[i % len(pictures)] for i in range(n)],
            "sha256": [f"{i:064x}" for i in range(n)],
            "width": [256] * n,
            "height": [192] * n,
        },
    )
    return ids, datasets


def decade_run(root: Path, n: int, pictures: list[str], rng) -> None:
    root.mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({"config": DECADE}))
    ids, datasets = _images(root, n, pictures)
    roles = ["gold"] + ["top"] * 4 + ["bottom"] * 4
    k = len(roles)
    _write(
        root,
        "references",
        {
            "description_id": [f"{i}-{j}" for i in ids for j in range(k)],
            "image_id": np.repeat(ids, k),
            "dataset": np.repeat(datasets, k),
            "condition": ["full"] * (n * k),
            "worker_id": [f"w{j}" for _ in ids for j in range(k)],
            "role": roles * n,
            "votes": np.tile(np.arange(k)[::-1], n),
            "shown": [12] * (n * k),
            "text": [SENTENCE] * (n * k),
        },
    )
    variants = ("full", *MASKS)
    m = len(MODELS) * len(variants)
    _write(
        root,
        "responses",
        {
            "subject": np.tile(np.repeat(MODELS, len(variants)), n),
            "image_id": np.repeat(ids, m),
            "variant": list(variants) * (n * len(MODELS)),
            "prompt_id": ["default"] * (n * m),
            "text": [SENTENCE] * (n * m),
            "status": ["ok"] * (n * m),
            "error": [""] * (n * m),
        },
    )
    s = len(SUBJECTS)
    _write(
        root,
        "scores",
        {
            "subject": np.tile(SUBJECTS, n),
            "image_id": np.repeat(ids, s),
            "dataset": np.repeat(datasets, s),
            "variant": ["full"] * (n * s),
            "metric": ["SBERT-SI"] * (n * s),
            "value": rng.uniform(0.1, 0.95, n * s),
        },
    )
    _write(root, "stats", _stats_rows(SUBJECTS, DATASETS, ["SBERT-SI"], "full", rng))
    _no_comparisons(root, "comparisons")
    e = len(MODELS) * len(ERROR_TYPES)
    _write(
        root,
        "errors",
        {
            "subject": np.tile(np.repeat(MODELS, len(ERROR_TYPES)), n),
            "image_id": np.repeat(ids, e),
            "dataset": np.repeat(datasets, e),
            "error_type": list(ERROR_TYPES) * (n * len(MODELS)),
            "present": rng.random(n * e) < 0.3,
            "method": ["detector"] * (n * e),
            "evidence": [
                '{"findings": [{"object": "bicycle", "phrase": "a bicycle"}], "mentioned": ["person"], "relevant": ["bicycle"]}'
            ]
            * (n * e),
        },
    )
    p = len(MODELS)
    _write(
        root,
        "spatial",
        {
            "subject": np.tile(MODELS, n),
            "image_id": np.repeat(ids, p),
            "dataset": np.repeat(datasets, p),
            "mask_ids": [list(MASKS)] * (n * p),
            "model_profile": rng.uniform(0.3, 1, (n * p, 3)).tolist(),
            "human_profile": rng.uniform(0.3, 1, (n * p, 3)).tolist(),
            "model_r": rng.uniform(-1, 1, n * p),
            "human_mean_r": [0.6] * (n * p),
            "human_sd_r": [0.2] * (n * p),
            "z": rng.normal(0, 2, n * p),
            "n_human": [20] * (n * p),
            "n_pseudo": [8000] * (n * p),
            "sde": rng.random(n * p) < 0.2,
            "reason": [""] * (n * p),
        },
    )
    _write(root, "error_stats", _stats_rows(MODELS, DATASETS, ERROR_TYPES, "full", rng))
    impact = _stats_rows([f"error:{t}" for t in ERROR_TYPES] + ["no error"], ["all"], ["SBERT-SI"], "full", rng)
    _write(root, "impact_stats", impact)
    _no_comparisons(root, "error_comparisons")
    _no_comparisons(root, "impact_comparisons")
    _write(
        root,
        "hand_agreement",
        {
            "error_type": pa.array([], pa.string()),
            "kappa": pa.array([], pa.float64()),
            "observed_agreement": pa.array([], pa.float64()),
            "n": pa.array([], pa.int64()),
        },
    )


def openworld_run(root: Path, n: int, pictures: list[str], rng) -> None:
    from vlm_decade.studies.openworld.statistics import COMPARISONS_B_SCHEMA, PAIRED_TESTS_SCHEMA

    root.mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({"config": OPENWORLD}))
    ids, datasets = _images(root, n, pictures)
    granularity = ["prototypical" if d == "coco" else "fine-grained" for d in datasets]
    labels = [f"class {i % 1000}" for i in range(n)]
    _write(root, "labels", {"image_id": ids, "dataset": datasets, "label": labels, "granularity": granularity})
    p = len(MODELS)
    predictions = [f"class {(i * 7) % 1000}" for i in range(n * p)]
    _write(
        root,
        "responses",
        {
            "subject": np.tile(MODELS, n),
            "image_id": np.repeat(ids, p),
            "variant": ["full"] * (n * p),
            "prompt_id": ["default"] * (n * p),
            "text": predictions,
            "status": ["ok"] * (n * p),
            "error": [""] * (n * p),
        },
    )
    cs, li = rng.uniform(0, 1, n * p), (rng.random(n * p) < 0.5).astype(float)
    outcome = np.where(
        cs >= 0.55, np.where(li >= 0.5, "correct", "granularity"), np.where(li >= 0.5, "ambiguity", "confusion")
    )
    _write(
        root,
        "predictions",
        {
            "subject": np.tile(MODELS, n),
            "image_id": np.repeat(ids, p),
            "dataset": np.repeat(datasets, p),
            "granularity": np.repeat(granularity, p),
            "prompt_id": ["default"] * (n * p),
            "label": np.repeat(labels, p),
            "prediction": predictions,
            "TI": (rng.random(n * p) < 0.3).astype(float),
            "LI": li,
            "SS": cs * 0.9,
            "CS": cs,
            "best_concept": predictions,
            "judge_answer": li.astype(int).astype(str),
            "outcome": outcome,
        },
    )
    metrics = ["TI", "LI", "SS", "CS"] + [f"outcome:{o}" for o in ("correct", "granularity", "ambiguity", "confusion")]
    groups = ["prototypical", "fine-grained", "all"]
    _write(root, "stats", _stats_rows(MODELS, groups, metrics, "default", rng, column="prompt_id"))
    _no_comparisons(root, "comparisons", COMPARISONS_B_SCHEMA)
    _no_comparisons(root, "paired_tests", PAIRED_TESTS_SCHEMA)


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _listing(table: pa.Table, columns: list[str]) -> int:
    """Characters of `columns` of every row of `table` as one HTML table, drawn by the reports' own
    table macro: what a page listing every row would hold."""
    from vlm_decade.report.html import environment, grid

    return len(environment().get_template("_report.html").module.table(grid(table, columns)))


def _report(root: Path, kind: str) -> dict:
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.studies import study_from_dict

    folder = RunFolder(root)
    study = study_from_dict(copy.deepcopy(DECADE if kind == "decade" else OPENWORLD))
    start = time.perf_counter()
    if kind == "decade":
        from vlm_decade.studies.decade.report import OPTIONAL_TABLES, REPORT_TABLES, write_report

        names = [n for n in REPORT_TABLES + OPTIONAL_TABLES if folder.has(n)]
        tables = {n: folder.read(n) for n in names}
        write_report(folder, study, tables)
        responses, references = tables["responses"], tables["references"]
        full = responses.filter(pc.equal(responses.column("variant"), "full"))
        gold = references.filter(pc.equal(references.column("role"), "gold"))
        every_row = _listing(full, ["subject", "image_id", "text"]) + _listing(gold, ["image_id", "text"])
    else:
        from vlm_decade.studies.openworld.report import REPORT_TABLES, write_openworld_report

        tables = {n: folder.read(n) for n in REPORT_TABLES}
        write_openworld_report(folder, study, tables)
        every_row = _listing(
            tables["predictions"],
            ["subject", "image_id", "dataset", "granularity", "label", "prediction", "TI", "LI", "SS", "CS", "outcome"],
        )
    seconds = time.perf_counter() - start
    report = _bytes(root / "report.html")
    return {
        "report_html_bytes": report,
        "errors_html_bytes": _bytes(root / "errors.html"),
        "figures_bytes": _bytes(root / "figures"),
        "csv_tables_bytes": _bytes(root / "tables"),
        "every_row_listing_bytes": every_row,
        "every_row_over_report": round(every_row / report, 1),
        "report_seconds": round(seconds, 2),
    }


def _time(fn, repeat: int = 3) -> float:
    fn()  # warm (file metadata, page cache)
    best = min(_timed(fn) for _ in range(repeat))
    return round(best, 4)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _queries(root: Path, kind: str) -> dict:
    """First gallery page through the view (DuckDB) and through pyarrow + Python, and that both agree."""
    from vlm_decade.core.runfolder import RunFolder, file_sha256
    from vlm_decade.view import decade, openworld
    from vlm_decade.view.runs import open_run

    # The tables' hashes recorded as a run records them, so the view verifies them (at the first query).
    files = {p.stem: {"sha256": file_sha256(p), "bytes": p.stat().st_size} for p in root.glob("*.parquet")}
    RunFolder(root).update_manifest(files=files)
    view = open_run(root)
    if kind == "decade":
        q = decade.GalleryQuery(error="detection", model="model-a", metric="SBERT-SI", sort="gap:model-a")
        ours = lambda: [r["image_id"] for r in decade.gallery(view, q)["rows"]]  # noqa: E731

        def baseline() -> list[str]:
            errors = pq.read_table(
                root / "errors.parquet", columns=["subject", "image_id", "error_type", "present"]
            ).to_pylist()
            keep = {
                r["image_id"]
                for r in errors
                if r["present"] and r["error_type"] == "detection" and r["subject"] == "model-a"
            }
            scores = pq.read_table(root / "scores.parquet").to_pylist()
            value = {
                (r["subject"], r["image_id"]): r["value"]
                for r in scores
                if r["metric"] == "SBERT-SI" and r["variant"] == "full"
            }
            gap = {i: value[("human:top", i)] - value[("model-a", i)] for i in keep}
            return sorted(keep, key=lambda i: (-gap[i], i))[: decade.PAGE_SIZE]
    else:
        q = openworld.GalleryQuery(outcome="confusion", sort="cs", prompt="default")
        ours = lambda: [r["image_id"] for r in openworld.gallery(view, q)["rows"]]  # noqa: E731

        def baseline() -> list[str]:
            rows = pq.read_table(root / "predictions.parquet").to_pylist()
            keep = {r["image_id"] for r in rows if r["outcome"] == "confusion" and r["prompt_id"] == "default"}
            lowest: dict[str, float] = {}
            for r in rows:
                if r["image_id"] in keep and r["prompt_id"] == "default":
                    lowest[r["image_id"]] = min(lowest.get(r["image_id"], 2.0), r["CS"])
            return sorted(keep, key=lambda i: (lowest[i], i))[: openworld.PAGE_SIZE]

    first = _timed(ours)  # with the hashing of each table it reads (once: later pages only stat them)
    assert ours() == baseline(), "the view's page differs from the baseline's"
    seconds, base = _time(ours), _time(baseline, repeat=1)
    return {
        "first_page_seconds": round(first, 4),
        "gallery_page_seconds": seconds,
        "baseline_seconds": base,
        "speedup": round(base / seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 8000, 100000])
    args = parser.parse_args()
    rng = np.random.default_rng(20261130)
    work = Path(tempfile.mkdtemp(prefix="report-size-"))
    try:
        pictures = []
        for i in range(16):
            path = work / f"picture{i}.png"
            # Smooth pictures, as photos are (noise would make every PNG and heat map far larger than a photo's).
            y, x = np.mgrid[0:192, 0:256]
            picture = np.stack(
                [(x + 16 * i) % 256, (y * 1.3).astype(int) % 256, ((x + y) // 2 + 40 * i) % 256], axis=-1
            )
            Image.fromarray(picture.astype(np.uint8)).save(path)
            pictures.append(str(path))
        for n in args.sizes:
            result = {"images": n}
            for kind, build in (("decade", decade_run), ("openworld", openworld_run)):
                root = work / f"{kind}-{n}"
                build(root, n, pictures, rng)
                result[kind] = {**_report(root, kind), **_queries(root, kind)}
                shutil.rmtree(root)
            print(json.dumps(result), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
