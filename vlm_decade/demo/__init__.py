"""The bundled demo of Study A: 16 real photos, hand-written descriptions, simulated votes.

The photos are real: 16 images that ship inside scikit-image (`skimage.data`), in two sets of 8 that
play the roles of the paper's two image sets: `everyday` (common objects, like MS-COCO) and
`specialist` (scientific imagery a COCO-trained captioner cannot understand, standing in for the
harder CSB set). Everything else is made up for the demo and says so:

* the human descriptions (10 per photo, plus 3 per masked third) were written for this demo by its
  author, as fictional crowd workers w01..w19; no crowd was asked;
* the ranking votes that choose the gold standard are simulated by `make_votes.py`;
* `imported_captions.csv` is a hand-written stand-in for a file of captions from an old model.

So the demo's numbers show the pipeline working, and are no findings about people or models.
See data/README.md.

`materialize(dest)` writes the photos as PNGs and copies the tables and the study file into `dest`;
run the study file it returns.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np

from vlm_decade.core.files import write_if_changed

DATA_DIR = Path(__file__).resolve().parent / "data"
STUDY_FILE = Path(__file__).resolve().parent / "study.yaml"
OPENWORLD_STUDY_FILE = Path(__file__).resolve().parent / "openworld.yaml"
TABLES = (
    "images.csv",
    "descriptions.csv",
    "votes.csv",
    "imported_captions.csv",
    "ratings.csv",
    "hand_labels.csv",
    "README.md",
)

_SOURCE = re.compile(r"^skimage\.data\.(?P<name>[a-z_]+)(?:\[(?P<index>\d+)\])?$")


def images() -> list[dict[str, str]]:
    """The rows of data/images.csv (image_id, dataset, file, source)."""
    with (DATA_DIR / "images.csv").open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def photo(source: str) -> np.ndarray:
    """The RGB uint8 HxWx3 array for a `source` such as `skimage.data.coins` or
    `skimage.data.stereo_motorcycle[0]`; gray images get their one channel repeated three times."""
    match = _SOURCE.match(source)
    if match is None:
        raise ValueError(f"unsupported photo source {source!r}; expected skimage.data.<name>[<index>]")
    try:
        from skimage import data as skdata
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("the demo's photos come from scikit-image: pip install 'vlm-decade[demo]'") from exc
    array = getattr(skdata, match["name"])()
    if match["index"] is not None:
        array = array[int(match["index"])]
    array = np.asarray(array)
    if array.dtype != np.uint8:
        raise ValueError(f"{source}: expected uint8 pixels, got {array.dtype}")
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"{source}: expected an RGB or gray image, got shape {array.shape}")
    return np.ascontiguousarray(array)


def png_bytes(array: np.ndarray) -> bytes:
    """Encode an RGB array as PNG with fixed settings and no metadata, so the bytes never vary."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", optimize=False, compress_level=6)
    return buffer.getvalue()


def materialize(dest: str | Path) -> Path:
    """Lay the demo out in `dest` and return the path of `dest/study.yaml`.

    Writes the 16 photos as RGB PNGs into `dest/images/` and copies the CSV tables, the data README and
    the study file next to them. Idempotent: files that already hold the same bytes are left alone.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for row in images():
        write_if_changed(dest / "images" / row["file"], png_bytes(photo(row["source"])))
    for name in TABLES:
        write_if_changed(dest / name, (DATA_DIR / name).read_bytes())
    study = dest / "study.yaml"
    write_if_changed(study, STUDY_FILE.read_bytes())
    return study


def decade_demo(out: str | Path):
    """Study A's demo, its inputs laid out in `out/inputs`, its tables going to `out`."""
    from vlm_decade.studies import load_study

    out = Path(out)
    return load_study(materialize(out / "inputs"), output=out)


def openworld_demo(out: str | Path):
    """Study B's demo, its inputs laid out in `out/inputs`, its tables going to `out`."""
    from vlm_decade.demo.openworld import materialize as materialize_openworld
    from vlm_decade.studies import load_study

    out = Path(out)
    inputs = materialize_openworld(out / "inputs")
    write_if_changed(inputs / "study.yaml", OPENWORLD_STUDY_FILE.read_bytes())
    return load_study(inputs / "study.yaml", output=out)


def drop_unkeyed(study):
    """The study without API models and encoders whose key is missing, and a note for each: the
    demo runs offline, so it leaves them out and says so rather than failing."""
    from vlm_decade.models.api.keys import api_key, key_hint
    from vlm_decade.models.routing import api_provider

    notes: list[str] = []

    def keyed(entries, what: str) -> tuple:
        kept = []
        for entry in entries:
            p = api_provider(entry.backend)
            if p and api_key(p) is None:
                notes.append(f"skipping {what} {entry.name}: no {key_hint(p)} set")
            else:
                kept.append(entry)
        return tuple(kept)

    update = {"models": keyed(study.models, "model")}
    if hasattr(study, "encoders"):  # Study B's Sentence-BERT encoder is always local
        update["encoders"] = keyed(study.encoders, "encoder")
    return study.model_copy(update=update), notes


def demo_studies(out: str | Path) -> list:
    """Every registered study's demo under `out`, each in the folder of its name: Study A in
    `out/decade`, Study B in `out/openworld`."""
    from vlm_decade.studies import STUDIES
    from vlm_decade.studies.registry import resolve

    return [resolve(entry.demo)(Path(out) / name) for name, entry in STUDIES.items()]


__all__ = [
    "DATA_DIR",
    "STUDY_FILE",
    "OPENWORLD_STUDY_FILE",
    "decade_demo",
    "demo_studies",
    "drop_unkeyed",
    "openworld_demo",
    "images",
    "materialize",
    "photo",
    "png_bytes",
]
