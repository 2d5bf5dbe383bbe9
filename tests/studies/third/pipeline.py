"""The third study's pipeline (`studies.Pipeline`): `check` finds the images, `run` writes them and
their mean brightness through the spine (`core.runner.run_study`: the run folder, its manifest, a
stage skipped when current), `estimate` sends nothing, `summary` counts the images, `redraw_report`
has no report to draw, `export` is the brightness table. `demo` lays out three images and the study."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image

from tests.studies.third.config import ThirdConfig
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage, StudyRun, given, run_study

DATASET = "shades"


def check(study: ThirdConfig, cache=None) -> pa.Table:
    """The images table: every PNG in the study's folder, by name; InputError when there is none."""
    files = sorted(Path(study.images).glob("*.png"))
    if not files:
        raise InputError([Problem(str(study.images), "no PNG images in the folder", field="images")])
    rows = []
    for path in files:
        with Image.open(path) as im:
            width, height = im.size
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        rows.append(
            {
                "image_id": path.stem,
                "dataset": DATASET,
                "path": str(path),
                "sha256": digest,
                "width": width,
                "height": height,
            }
        )
    return pa.Table.from_pylist(rows)


def _brightness(run: StudyRun) -> dict[str, pa.Table]:
    images = run.table("images")
    means = [float(np.asarray(Image.open(p).convert("L")).mean()) / 255 for p in images["path"].to_pylist()]
    return {"brightness": pa.table({"image_id": images["image_id"], "brightness": pa.array(means, pa.float64())})}


def run(study: ThirdConfig, reporter: Reporter | None = None) -> RunFolder:
    images = check(study)
    stages = [given("images", images), Stage("brightness", ("images",), {}, _brightness, needs_ray=False)]
    return run_study(study, reporter, f" (third study): {images.num_rows} images", stages, kind="third")


def estimate(study: ThirdConfig, data: pa.Table) -> tuple[list, tuple[str, ...]]:
    return [], ()


def summary(study: ThirdConfig, data: pa.Table) -> tuple[str, list[str]]:
    return f"{data.num_rows} images", []


def redraw_report(folder: RunFolder, study: ThirdConfig) -> list[str]:
    return []


def export(folder: RunFolder, study: ThirdConfig) -> pa.Table:
    return folder.read("brightness").sort_by("image_id")


def demo(out: str | Path) -> ThirdConfig:
    """The third study's demo: three grey images in `out/inputs`, its run folder `out`."""
    from vlm_decade.studies import study_from_dict

    inputs = Path(out) / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    for name, level in (("dark", 30), ("mid", 128), ("light", 230)):
        Image.new("RGB", (16, 12), (level, level, level)).save(inputs / f"{name}.png")
    return study_from_dict(
        {
            "study": "third",
            "name": "third demo",
            "demo": True,
            "images": str(inputs),
            "models": [{"name": "eye", "backend": "imported", "model_id": "eye"}],
            "output": str(Path(out)),
        }
    )
