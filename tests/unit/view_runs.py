"""Small run folders built by hand for the view's and the reports' tests: every value is written
here, so a test can say what a page must show without running a study. Tables are written as a run
writes them, their hashes recorded in the manifest, so the view verifies them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
from PIL import Image

from vlm_decade.core.runfolder import RunFolder
from vlm_decade.stats import STATS_SCHEMA
from vlm_decade.studies.openworld.statistics import PROMPT, STATS_B_SCHEMA

MODELS = ("alpha", "beta")
VARIANTS = ("full", "m1", "m2", "m3")
# image_id -> dataset, colour
IMAGES = {
    "a1": ("ds-a", (200, 30, 30)),
    "a2": ("ds-a", (30, 200, 30)),
    "a3": ("ds-a", (30, 30, 200)),
    "b1": ("ds-b", (200, 200, 30)),
    "b2": ("ds-b", (30, 200, 200)),
    "b3": ("ds-b", (200, 30, 200)),
}
# Full-image similarity to the gold standard: (alpha, beta, human:top); b3 has no alpha score.
SIMILARITY = {
    "a1": (0.30, 0.60, 0.80),
    "a2": (0.70, 0.65, 0.75),
    "a3": (0.50, 0.20, 0.90),
    "b1": (0.10, 0.55, 0.70),
    "b2": (0.90, 0.40, 0.85),
    "b3": (None, 0.35, 0.60),
}
# (model, image, error type) labels that are present; everything else is absent.
PRESENT = {
    ("alpha", "a1", "detection"),
    ("alpha", "b1", "detection"),
    ("beta", "a3", "detection"),
    ("alpha", "a3", "recognition"),
    ("beta", "b2", "hallucination"),
    ("alpha", "a2", "spatial_dependence"),
    ("beta", "a2", "spatial_dependence"),
    ("beta", "b1", "spatial_dependence"),
}
ERROR_TYPES = ("detection", "recognition", "scene_understanding", "hallucination", "spatial_dependence")
BOX = [0.1, 0.2, 0.6, 0.9]
PROBE_QUESTION = "Is there a cup in the hand of the person?"
# model, dataset -> estimate, ci_low, ci_high (None: a budget stop left no estimate)
STATS = {
    ("alpha", "ds-a"): (0.5, 0.3, 0.7),
    ("alpha", "ds-b"): (0.5, 0.1, 0.9),
    ("beta", "ds-a"): (0.483, 0.2, 0.65),
    ("beta", "ds-b"): (None, None, None),
}
DECADE_CONFIG = {
    "study": "decade",
    "name": "hand-built",
    "data": {"images": "/nowhere/images.csv", "image_dir": "/nowhere", "descriptions": "/nowhere/d.csv"},
    "models": [
        {"name": "alpha", "backend": "imported", "model_id": "alpha", "era": "pre-mllm"},
        {"name": "beta", "backend": "openai", "model_id": "gpt-x", "era": "mllm"},
    ],
    "encoders": [{"name": "SIM", "backend": "sentence-transformers"}],
}


def write(root: Path, name: str, rows: list[dict], schema: pa.Schema | None = None) -> None:
    """Table `name` written and recorded in the manifest (fingerprint and file hash), as a stage does."""
    table = pa.Table.from_pylist(rows, schema=schema) if schema is not None else pa.Table.from_pylist(rows)
    folder = RunFolder(root)
    fingerprint, record = folder.write(name, table)
    manifest = folder.manifest()
    manifest.setdefault("tables", {})[name] = fingerprint
    manifest.setdefault("files", {})[name] = record
    folder.save_manifest(manifest)


def images_rows(root: Path, images: dict) -> list[dict]:
    folder = root / "inputs"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for image_id, (dataset, colour) in images.items():
        path = folder / f"{image_id}.png"
        Image.new("RGB", (64, 48), colour).save(path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        rows.append(
            {"image_id": image_id, "dataset": dataset, "path": str(path), "sha256": digest, "width": 64, "height": 48}
        )
    return rows


def decade_run(root: Path, tables: tuple[str, ...] | None = None) -> Path:
    """A Study A run folder: images (files too), references, responses, scores, stats, errors,
    detections, probes, spatial and error_stats; `tables` keeps only those named (images always)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps({"config": DECADE_CONFIG}))
    dataset_of = {i: d for i, (d, _) in IMAGES.items()}
    made = {"images": images_rows(root, IMAGES)}
    made["references"] = [
        {
            "description_id": f"{i}-{role}",
            "image_id": i,
            "dataset": dataset_of[i],
            "condition": "full",
            "worker_id": role,
            "role": role,
            "votes": votes,
            "shown": 12,
            "text": f"{role} description of {i}" + (" <b>bold</b>" if role == "gold" else ""),
        }
        for i in IMAGES
        for role, votes in (("gold", 9), ("top", 5), ("bottom", 1), ("other", 0))
    ] + [
        {
            "description_id": f"{i}-m1",
            "image_id": i,
            "dataset": dataset_of[i],
            "condition": "m1",
            "worker_id": "w",
            "role": "masked",
            "votes": None,
            "shown": None,
            "text": f"masked description of {i}",
        }
        for i in IMAGES
    ]
    made["responses"] = [
        {
            "subject": m,
            "image_id": i,
            "variant": v,
            "prompt_id": "default",
            "text": None if (m, i, v) == ("beta", "b3", "m2") else f"{m} says {i} {v}",
            "status": "error" if (m, i, v) == ("beta", "b3", "m2") else "ok",
            "error": "RateLimitError: budget reached" if (m, i, v) == ("beta", "b3", "m2") else "",
        }
        for m in MODELS
        for i in IMAGES
        for v in VARIANTS
    ]
    scores = []
    for i, values in SIMILARITY.items():
        for subject, value in zip((*MODELS, "human:top"), values):
            if value is not None:
                scores.append(
                    {
                        "subject": subject,
                        "image_id": i,
                        "dataset": dataset_of[i],
                        "variant": "full",
                        "metric": "SIM",
                        "value": value,
                    }
                )
        for v in VARIANTS[1:]:
            scores.append(
                {
                    "subject": "alpha",
                    "image_id": i,
                    "dataset": dataset_of[i],
                    "variant": v,
                    "metric": "SIM",
                    "value": 0.25,
                }
            )
    made["scores"] = scores
    made["stats"] = [
        {
            "subject": m,
            "dataset": d,
            "metric": "SIM",
            "variant": "full",
            "estimate": e,
            "ci_low": lo,
            "ci_high": hi,
            "n_images": 3,
            "n_resamples": 1000,
            "seed": 1,
            "method": "percentile",
        }
        for (m, d), (e, lo, hi) in STATS.items()
    ]
    errors = []
    for m in MODELS:
        for i in IMAGES:
            for t in ERROR_TYPES:
                present = (m, i, t) in PRESENT
                if t == "spatial_dependence":
                    method, evidence = (
                        "masks",
                        {"model_r": -0.5 if present else 0.9, "human_mean_r": 0.8, "human_sd_r": 0.1, "reason": ""},
                    )
                elif m == "beta":
                    method = "probe"
                    transcript = [{"kind": "presence", "question": PROBE_QUESTION, "answer": "No.", "reading": "no"}]
                    evidence = {
                        "relevant": ["cup"],
                        "mentioned": [],
                        "findings": [{"object": "cup", "anchor": "the person", "transcript": transcript}]
                        if present
                        else [],
                    }
                elif t == "recognition" and present:
                    method = "detector"
                    evidence = {
                        "relevant": ["cup"],
                        "mentioned": ["bowl"],
                        "findings": [
                            {
                                "object": "cup",
                                "phrase": "a cup",
                                "relevant": True,
                                "named_as": "bowl",
                                "similarity": 0.61,
                                "detection": {"label": "cup", "score": 0.88, "box": BOX},
                            }
                        ],
                    }
                else:
                    method = "detector"
                    evidence = {
                        "relevant": ["cup"],
                        "mentioned": [],
                        "findings": [{"object": "cup", "phrase": "a cup"}] if present else [],
                    }
                errors.append(
                    {
                        "subject": m,
                        "image_id": i,
                        "dataset": dataset_of[i],
                        "error_type": t,
                        "present": present,
                        "method": method,
                        "evidence": json.dumps(evidence),
                    }
                )
    made["errors"] = errors
    box = {"label": "cup", "score": 0.88, "x0": BOX[0], "y0": BOX[1], "x1": BOX[2], "y1": BOX[3]}
    other = {"label": "person", "score": 0.7, "x0": 0.0, "y0": 0.0, "x1": 0.5, "y1": 1.0}
    made["detections"] = [
        {"image_id": i, "status": "ok", "error": "", "detections": [box, other] if i == "a3" else [other]}
        for i in IMAGES
    ]
    made["probes"] = [
        {
            "subject": "beta",
            "image_id": i,
            "round": 1,
            "kind": "presence",
            "object": "cup",
            "anchor": "the person",
            "question": PROBE_QUESTION,
            "answer": "No.",
            "status": "ok",
            "error": "",
            "cost_usd": 0.0,
        }
        for i in IMAGES
    ]
    made["spatial"] = [
        {
            "subject": m,
            "image_id": i,
            "dataset": dataset_of[i],
            "mask_ids": ["m1", "m2", "m3"],
            "model_profile": [0.2, 0.5, 0.9],
            "human_profile": [0.9, 0.5, 0.2],
            "model_r": -0.5,
            "human_mean_r": 0.8,
            "human_sd_r": 0.1,
            "z": -13.0,
            "n_human": 9,
            "n_pseudo": 27,
            "sde": (m, i, "spatial_dependence") in PRESENT,
            "reason": "",
        }
        for m in MODELS
        for i in IMAGES
    ]
    made["error_stats"] = [
        {
            "subject": m,
            "dataset": d,
            "metric": t,
            "variant": "full",
            "estimate": sum((m, i, t) in PRESENT for i in IMAGES if dataset_of[i] == d) / 3,
            "ci_low": 0.0,
            "ci_high": 1.0,
            "n_images": 3,
            "n_resamples": 1000,
            "seed": 1,
            "method": "percentile",
        }
        for m in MODELS
        for d in ("ds-a", "ds-b")
        for t in ERROR_TYPES
    ]
    for name, rows in made.items():
        if tables is None or name in tables or name == "images":
            write(root, name, rows, STATS_SCHEMA if name in ("stats", "error_stats") else None)
    return root


OPENWORLD_CONFIG = {
    "study": "openworld",
    "name": "hand-built-b",
    "data": {"image_dir": "/nowhere", "labels": "/nowhere/labels.csv", "classnames": "/nowhere/classes.csv"},
    "models": [
        {"name": "alpha", "backend": "imported", "model_id": "alpha"},
        {"name": "beta", "backend": "imported", "model_id": "beta"},
    ],
    "prompts": [
        {"id": "default", "text": "What type of object is in this image?"},
        {"id": "specific", "text": "Be specific."},
    ],
}
# image -> label, granularity; predictions per model: (prediction, LI, CS, outcome)
LABELS = {
    "a1": ("dalmatian", "fine-grained"),
    "a2": ("cat", "prototypical"),
    "a3": ("yurt", "very fine-grained"),
    "b1": ("dog", "prototypical"),
    "b2": ("spoonbill", "fine-grained"),
    "b3": ("truck", "prototypical"),
}
PREDICTIONS = {
    ("alpha", "a1"): ("dog", 0.0, 0.70, "granularity"),
    ("beta", "a1"): ("dalmatian", 1.0, 0.95, "correct"),
    ("alpha", "a2"): ("cat", 1.0, 0.99, "correct"),
    ("beta", "a2"): ("kitten", 1.0, 0.45, "ambiguity"),
    ("alpha", "a3"): ("tent", 0.0, 0.30, "confusion"),
    ("beta", "a3"): ("tent", 0.0, 0.20, "confusion"),
    ("alpha", "b1"): ("dog", 1.0, 0.98, "correct"),
    ("beta", "b1"): ("animal", 0.0, 0.60, "granularity"),
    ("alpha", "b2"): ("heron", 0.0, 0.40, "confusion"),
    ("beta", "b2"): ("spoonbill", 1.0, 0.97, "correct"),
    ("alpha", "b3"): ("truck", 1.0, 0.96, "correct"),
    ("beta", "b3"): ("car", 0.0, 0.50, "confusion"),
}


FAILED_B = ("beta", "b3", "specific")  # a response that failed: no prediction
# Study B's stats: (model, prompt, dataset or group, metric) -> estimate, ci_low, ci_high
OPENWORLD_STATS = {
    ("alpha", "default", "prototypical", "TI"): (2 / 3, 0.0, 1.0),
    ("alpha", "default", "prototypical", "CS"): (0.943, 0.9, 0.98),
    ("alpha", "default", "all", "TI"): (0.5, 0.2, 0.8),
    ("alpha", "default", "ds-a", "TI"): (1 / 3, 0.0, 1.0),
    ("alpha", "specific", "all", "TI"): (None, None, None),
    ("alpha", "default", "all", "outcome:confusion"): (1 / 3, 0.0, 0.67),
    ("beta", "default", "all", "TI"): (1 / 3, 0.0, 0.67),
}


def openworld_run(root: Path) -> Path:
    """A Study B run folder: images (files too), labels, responses (one failed), predictions and stats."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps({"config": OPENWORLD_CONFIG}))
    dataset_of = {i: d for i, (d, _) in IMAGES.items()}
    write(root, "images", images_rows(root, IMAGES))
    write(
        root,
        "labels",
        [{"image_id": i, "dataset": dataset_of[i], "label": lab, "granularity": g} for i, (lab, g) in LABELS.items()],
    )
    write(
        root,
        "responses",
        [
            {
                "subject": m,
                "image_id": i,
                "variant": "full",
                "prompt_id": p,
                "text": None if (m, i, p) == FAILED_B else PREDICTIONS[(m, i)][0],
                "status": "error" if (m, i, p) == FAILED_B else "ok",
                "error": "TimeoutError: no answer in 60 s" if (m, i, p) == FAILED_B else "",
            }
            for (m, i) in PREDICTIONS
            for p in ("default", "specific")
        ],
    )
    write(
        root,
        "predictions",
        [
            {
                "subject": m,
                "image_id": i,
                "dataset": dataset_of[i],
                "granularity": LABELS[i][1],
                "prompt_id": p,
                "label": LABELS[i][0],
                "prediction": pred,
                "TI": float(LABELS[i][0] in pred),
                "LI": li,
                "SS": cs - 0.05,
                "CS": cs if p == "default" else 1 - cs,
                "best_concept": pred,
                "judge_answer": str(int(li)),
                "outcome": outcome if p == "default" else "unjudged",
                "inputs_sha256": "0" * 64,  # the run's bookkeeping, which the export leaves out
            }
            for (m, i), (pred, li, cs, outcome) in PREDICTIONS.items()
            for p in ("default", "specific")
            if (m, i, p) != FAILED_B
        ],
    )
    write(
        root,
        "stats",
        [
            {
                "subject": m,
                "dataset": d,
                "metric": metric,
                PROMPT: p,
                "estimate": e,
                "ci_low": lo,
                "ci_high": hi,
                "n_images": 3,
                "n_resamples": 1000,
                "seed": 1,
                "method": "percentile",
            }
            for (m, p, d, metric), (e, lo, hi) in OPENWORLD_STATS.items()
        ],
        STATS_B_SCHEMA,
    )
    return root
