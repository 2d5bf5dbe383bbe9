"""Experiment folders written by hand, as docs/human.md's interface lays them out (design.csv,
texts.csv, images/, experiment.json), for the experiment builder's, the server's and the browser's
tests: each experiment's design for two participants, with one attention check each."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

from PIL import Image

COLUMNS = (
    "experiment", "participant", "trial", "kind", "image_id", "image", "condition",
    "options", "distractors", "subject", "text", "gold", "answer",
)  # fmt: skip
SCALE = {"min": 1, "max": 5, "step": 1, "labels": ["not similar", "", "", "", "same meaning"]}
COLOURS = {"dog": (200, 40, 40), "kite": (40, 160, 40), "boat": (40, 40, 200)}
TEXTS = {
    "dog-1": "A dog runs across a lawn.",
    "dog-2": "A brown dog chases a ball.",
    "kite-1": "Children fly a kite on a beach.",
    "kite-2": "A red kite high above the sand.",
    "boat-1": "A small boat on a calm lake.",
    "check-1": "Attention check: choose this sentence, whatever the image shows.",
    "check-2": "Attention check: choose this sentence, whatever the image shows.",
}


def _row(experiment: str, participant: str, trial: int, kind: str, image_id: str, **cells) -> dict:
    row = dict.fromkeys(COLUMNS, "")
    row |= {"experiment": experiment, "participant": participant, "trial": str(trial), "kind": kind}
    return row | {"image_id": image_id, "image": f"{image_id}.png", "condition": "full"} | cells


def rows_of(experiment: str) -> list[dict]:
    """Two participants' trials: two of the experiment's kind and one attention check each."""
    rows = []
    for n, participant in enumerate(("p001", "p002"), 1):
        if experiment == "describe":
            rows += [
                _row("describe", participant, 1, "describe", "dog"),
                _row("describe", participant, 2, "attention", "kite", text="Include the word 'lantern'.", answer="lantern"),
                _row("describe", participant, 3, "describe", "kite", condition="mask-1"),
            ]  # fmt: skip
        elif experiment == "rank":
            rows += [
                _row("rank", participant, 1, "rank", "dog", options="dog-2;boat-1;dog-1", distractors="boat-1"),
                _row("rank", participant, 2, "rank", "kite", options="kite-1;dog-1;kite-2", distractors="dog-1"),
                _row("rank", participant, 3, "attention", "dog", options=f"dog-1;check-{n};kite-2", answer=f"check-{n}"),
            ]  # fmt: skip
        else:
            rows += [
                _row("rate", participant, 1, "rate", "dog", subject="m1", text="A dog.", gold=TEXTS["dog-1"]),
                _row("rate", participant, 2, "rate", "kite", subject="m2", text="A bird.", gold=TEXTS["kite-1"]),
                _row("rate", participant, 3, "attention", "kite", text="Rate this one 5.", gold=TEXTS["kite-1"], answer="5"),
            ]  # fmt: skip
    return rows


def write_folder(root: Path, experiment: str, rows: list[dict] | None = None) -> Path:
    """An experiment folder for `experiment` (default rows: `rows_of`); its experiment id is the first
    16 hex digits of design.csv's SHA-256, its completion code fixed."""
    rows = rows_of(experiment) if rows is None else rows
    root.mkdir(parents=True, exist_ok=True)
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    design = out.getvalue().encode()
    (root / "design.csv").write_bytes(design)
    used = sorted({o for r in rows for o in r["options"].split(";") if o})
    with open(root / "texts.csv", "w", newline="", encoding="utf-8") as fh:
        texts = csv.writer(fh)
        texts.writerow(["description_id", "text"])
        texts.writerows([key, TEXTS[key]] for key in used if key in TEXTS)
    (root / "images").mkdir(exist_ok=True)
    for image_id, colour in COLOURS.items():
        Image.new("RGB", (96, 64), colour).save(root / "images" / f"{image_id}.png")
    meta = {
        "experiment": experiment,
        "experiment_id": hashlib.sha256(design).hexdigest()[:16],
        "seed": 0,
        "scale": SCALE,
        "completion_code": "VD-TEST1234",
    }
    (root / "experiment.json").write_text(json.dumps(meta))
    return root
