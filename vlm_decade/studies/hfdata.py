"""Study B's input from a Hugging Face dataset on disk (docs/openworld-data.md): one saved with
`save_to_disk` (Arrow IPC stream files, their features in `dataset_info.json`, their files in
`state.json`) or its Parquet files (the features in the schema's `huggingface` metadata), read with
pyarrow alone (the `datasets` package is not needed). A split is chosen by name; the labels are the
`ClassLabel` feature's integers, named by its `names`; the image column is a struct of `bytes` and
`path`. The images stage checks files, so each image's bytes are written into the run folder's
`inputs/<dataset>/<split>/` (once: an unchanged file is not written again), and taken away again
when the input is refused. The result is the labels and class-names tables of the CSV form
(`core.tables.Table`), checked as those are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from vlm_decade.core.errors import Problems
from vlm_decade.core.files import write_if_changed
from vlm_decade.core.tables import Table
from vlm_decade.studies.forms import table

FIELD = "data.hf_dataset"


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _split_files(root: Path, split: str, problems: Problems) -> tuple[list[Path], dict] | None:
    """The split's data files (Arrow or Parquet) and the dataset's features, or None with a problem."""
    folder = root
    if (root / "dataset_dict.json").is_file():
        splits = _json(root / "dataset_dict.json").get("splits", [])
        if split not in splits:
            problems.add(root, f"has no split '{split}' (data.split): its splits are {', '.join(splits)}")
            return None
        folder = root / split
    if (folder / "state.json").is_file():
        state = _json(folder / "state.json")
        if state.get("_split") not in (None, split):
            problems.add(folder, f"holds split '{state['_split']}', not '{split}' (data.split)")
            return None
        info = folder / "dataset_info.json"
        features = _json(info).get("features", {}) if info.is_file() else {}
        return [folder / f["filename"] for f in state.get("_data_files", [])], features
    files = sorted(p for p in root.rglob("*.parquet") if p.name.startswith(f"{split}-") or p.parent.name == split)
    if not files:
        problems.add(root, f"no `save_to_disk` folder (state.json) and no Parquet files of split '{split}'")
        return None
    metadata = pq.read_schema(files[0]).metadata or {}
    info = json.loads(metadata.get(b"huggingface", b"{}"))
    return files, info.get("info", {}).get("features", {})


def _read(file: Path, columns: list[str]) -> pa.Table:
    if file.suffix == ".parquet":
        return pq.read_table(file, columns=columns)
    with pa.memory_map(str(file)) as source:
        return pa.ipc.open_stream(source).read_all().select(columns)


def _schema(file: Path) -> pa.Schema:
    if file.suffix == ".parquet":
        return pq.read_schema(file)
    with pa.memory_map(str(file)) as source:
        return pa.ipc.open_stream(source).schema


def hf_tables(
    root: Path,
    split: str,
    columns: tuple[str, str],
    dataset: str,
    granularity: str,
    inputs: Path,
    problems: Problems,
) -> tuple[Table, Table, list[Path], list[str]] | None:
    """The labels and class-names tables of a dataset's split (`columns`: its image and label
    columns), its images written under `inputs`; the files newly written (to take away on refusal)
    and, per row, where it came from (`file`, row n). None, with problems and nothing written, when
    the dataset, its image column or its class names cannot be found, or a row cannot be used."""
    root = Path(root)
    if not root.is_dir():
        problems.add(root, "Hugging Face dataset folder not found", field=FIELD)
        return None
    found = _split_files(root, split, problems)
    if found is None:
        return None
    files, features = found
    image_column, label_column = columns
    names = features.get(label_column, {}).get("names") if isinstance(features.get(label_column), dict) else None
    if not names:
        problems.add(
            root,
            f"label column '{label_column}' has no class names: a ClassLabel feature with `names` (data.label_column)",
        )
    schema = _schema(files[0])
    image_type = schema.field(image_column).type if image_column in schema.names else None
    if image_type is None or not pa.types.is_struct(image_type) or image_type.get_field_index("bytes") < 0:
        problems.add(
            files[0],
            f"no image column '{image_column}' of {{bytes, path}} (data.image_column): columns {', '.join(schema.names)}",
        )
    if label_column not in schema.names:
        problems.add(
            files[0], f"no label column '{label_column}' (data.label_column): columns {', '.join(schema.names)}"
        )
    if problems:
        return None
    rows: list[tuple[bytes, str, int]] = []
    origins: list[str] = []
    for file in files:
        read = _read(file, [image_column, label_column])
        images = read.column(image_column).combine_chunks()
        for n, (data, path, label) in enumerate(
            zip(
                images.field("bytes").to_pylist(),
                images.field("path").to_pylist(),
                read.column(label_column).to_pylist(),
            )
        ):
            where = f"{file}, row {n}"
            if not data:
                problems.add(file, f"row {n}: '{image_column}' has no bytes")
            if label is None or not 0 <= label < len(names):
                problems.add(file, f"row {n}: label {label} is not a class number (0 to {len(names) - 1})")
            rows.append((data, Path(path or "").suffix.lower(), label))
            origins.append(where)
    if problems:
        return None
    labels: dict[str, list[str]] = {c: [] for c in ("image_id", "dataset", "file", "label", "granularity", "accepted")}
    written = []
    for i, (data, suffix, label) in enumerate(rows):
        file = f"{dataset}/{split}/{i:06d}{suffix}"
        target = inputs / file
        target.parent.mkdir(parents=True, exist_ok=True)
        if write_if_changed(target, data):
            written.append(target)
        for column, value in zip(labels, (f"{split}/{i:06d}", dataset, file, names[label], granularity, "")):
            labels[column].append(value)
    classes = table(root, {"dataset": [dataset] * len(names), "class_name": list(names)}, list(range(len(names))))
    return table(root, labels, list(range(len(rows)))), classes, written, origins
