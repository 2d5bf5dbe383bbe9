"""Study B's input from a Hugging Face dataset on disk (docs/openworld-data.md): one saved with
`save_to_disk` (Arrow IPC stream files, their features in `dataset_info.json`, their files in
`state.json`) or its Parquet files (the features in the schema's `huggingface` metadata), read with
pyarrow alone (the `datasets` package is not needed). A split is chosen by name; the labels are the
`ClassLabel` feature's integers, named by its `names`; the image column is a struct of `bytes` and
`path`. The images are read in place, never copied: each image's `file` is its location in the
dataset's file (`core.storage.members`: a Parquet row group's row, or an Arrow record batch's), which
the images check, the models and the viewer read as they read a file. The result is the labels and
class-names tables of the CSV form (`core.tables.Table`), checked as those are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from vlm_decade.core.errors import Problems
from vlm_decade.core.storage.members import parquet_row
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


def _places(file: Path) -> list[tuple[int, int]]:
    """(row group or record batch, row in it) of each row of a data file, in order."""
    if file.suffix == ".parquet":
        metadata = pq.ParquetFile(file).metadata
        sizes = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    else:
        with pa.memory_map(str(file)) as source:
            sizes = [batch.num_rows for batch in pa.ipc.open_stream(source)]
    return [(group, row) for group, size in enumerate(sizes) for row in range(size)]


def hf_tables(
    root: Path,
    split: str,
    columns: tuple[str, str],
    dataset: str,
    granularity: str,
    problems: Problems,
) -> tuple[Table, Table, list[str]] | None:
    """The labels and class-names tables of a dataset's split (`columns`: its image and label
    columns), each image's `file` its row's location in the dataset's files; and, per row, where it
    came from (`file`, row n). None, with problems, when the dataset, its image column or its class
    names cannot be found, or a row cannot be used."""
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
    labels: dict[str, list[str]] = {c: [] for c in ("image_id", "dataset", "file", "label", "granularity", "accepted")}
    origins: list[str] = []
    for file in files:
        read = _read(file, [label_column])
        for n, (label, (group, row)) in enumerate(zip(read.column(label_column).to_pylist(), _places(file))):
            if label is None or not 0 <= label < len(names):
                problems.add(file, f"row {n}: label {label} is not a class number (0 to {len(names) - 1})")
                continue
            image_id = f"{split}/{len(origins):06d}"
            try:
                where = parquet_row(str(file.resolve()), image_id, image_column, group, row).location
            except ValueError as exc:  # a column or folder name that a location cannot hold unambiguously
                problems.add(file, f"row {n}: {exc}")
                return None
            for column, value in zip(labels, (image_id, dataset, where, names[label], granularity, "")):
                labels[column].append(value)
            origins.append(f"{file}, row {n}")
    if problems:
        return None
    classes = table(root, {"dataset": [dataset] * len(names), "class_name": list(names)}, list(range(len(names))))
    return table(root, labels, list(range(len(origins)))), classes, origins
