"""Study B's input: labelled images and each dataset's class names (docs/openworld-data.md).

`load_openworld_data` reads the labels table (one row per image: where its file is, its class label and
its dataset's label granularity) and the class-names table (each dataset's candidate list for the
closed-world baselines). It decodes every image once and checks everything; all problems (file,
spreadsheet row, field) come back together as one InputError, and nothing is written. Reading and the
image checks are Study A's (`vlm_decade.studies.decade.data`), so both studies report bad input the same way.
`load_openworld_form` reads whichever form the study's `data` names: these tables, an image folder
of class folders (`vlm_decade.studies.forms`) read into them, or the tables with the images in shards,
named by key (`vlm_decade.stages.shard_images`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import first_rows, rows_in
from vlm_decade.core.errors import InputError, Problems
from vlm_decade.core.names import closest, did_you_mean
from vlm_decade.core.tables import Table, cell_present, cell_text, read_table
from vlm_decade.imaging.decode import WHITE
from vlm_decade.stages.images import (
    IMAGES_SCHEMA,
    ImageCache,
    check_group_by,
    check_images,
    declared_ids,
    images_table,
    metadata_table,
)
from vlm_decade.stages.shard_images import study_shard_images
from vlm_decade.studies.forms import folder_tables, name_rows
from vlm_decade.studies.hfdata import hf_tables
from vlm_decade.studies.openworld.config import OpenWorldDataConfig

LABEL_COLUMNS = ("image_id", "dataset", "file", "label", "granularity")
# Optional: the label's accepted alternative names, separated by `|` (or a Parquet list of names).
ACCEPTED_COLUMN = "accepted"
ACCEPTED_SEPARATOR = "|"
CLASSNAME_COLUMNS = ("dataset", "class_name")
# The paper groups its datasets by how specific their labels are.
GRANULARITIES = ("prototypical", "fine-grained", "very fine-grained")

LABELS_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("label", pa.string()),
        ("granularity", pa.string()),
        ("accepted", pa.list_(pa.string())),  # the label's accepted alternatives; empty for most labels
    ]
)


@dataclass(frozen=True)
class OpenWorldData:
    """Study B's checked input; both tables are sorted by image_id, the dicts by dataset."""

    images: pa.Table  # IMAGES_SCHEMA: image_id, dataset, path, sha256, width, height, mode
    labels: pa.Table  # LABELS_SCHEMA: image_id, dataset, label, granularity, accepted
    classnames: dict[str, tuple[str, ...]]  # dataset -> its class names, in the table's order
    granularity: dict[str, str]  # dataset -> one of GRANULARITIES
    metadata: pa.Table | None = None  # image_id and the labels table's further columns (stages.images.metadata_table)


def load_openworld_data(
    labels: Path,
    image_dir: str | Path,
    classnames: Path,
    cache: ImageCache | None = None,
    background: str = WHITE,
    group_by: tuple[str, ...] = (),
    limit: int | None = None,
) -> OpenWorldData:
    """Read and check Study B's input; every problem is raised together as one InputError.
    `group_by`: the study's `analysis.group_by`, each a column the labels table must have. `limit`: a
    smoke run's, whose images alone are read (`check_images`)."""
    problems = Problems()
    labels_t = read_table(
        Path(labels), LABEL_COLUMNS, problems, (ACCEPTED_COLUMN,), lists=(ACCEPTED_COLUMN,), extra=True
    )
    classes_t = read_table(Path(classnames), CLASSNAME_COLUMNS, problems)
    return _checked(labels_t, classes_t, image_dir, problems, cache, background, group_by, limit)


def load_openworld_form(
    data: OpenWorldDataConfig,
    cache: ImageCache | None = None,
    group_by: tuple[str, ...] = (),
    limit: int | None = None,
) -> OpenWorldData:
    """`load_openworld_data` of the study's `data` section, whichever form it names: the tables, an
    image folder of class folders (`studies.forms.folder_tables`), a Hugging Face dataset
    (`studies.hfdata`, its images read in place) or images in shards, whose tables are checked
    as the tables' are, a problem at one of its rows named by its image's file or dataset row."""
    if data.hf_dataset is not None:
        return _load_hf(data, cache, group_by, limit)
    if data.shards is not None:  # the labels name each image by its key: they have no `file` column
        problems = Problems()
        columns = tuple(c for c in LABEL_COLUMNS if c != "file")
        labels_t = read_table(
            Path(data.labels), columns, problems, (ACCEPTED_COLUMN,), lists=(ACCEPTED_COLUMN,), extra=True
        )
        classes_t = read_table(Path(data.classnames), CLASSNAME_COLUMNS, problems)
        return _checked(labels_t, classes_t, "", problems, cache, data.background, group_by, limit, data)
    if data.image_folder is None:
        return load_openworld_data(
            data.labels, data.image_dir, data.classnames, cache, data.background, group_by, limit
        )
    problems = Problems()
    classes = None
    if data.classnames is not None:
        given = read_table(Path(data.classnames), CLASSNAME_COLUMNS, problems)
        lists = _check_classnames(given, problems) if given is not None else {}
        classes = lists.get(data.dataset, [])
        if given is not None and not classes:
            problems.add(data.classnames, f"has no class names of dataset '{data.dataset}' (data.dataset)")
    read = folder_tables(data.image_folder, data.dataset, data.granularity, problems, classes)
    if read is None or problems:
        raise InputError(problems.items)
    labels_t, classes_t = read
    files = labels_t.columns.column("file").to_pylist()
    try:
        return _checked(labels_t, classes_t, data.image_folder, problems, cache, data.background, group_by, limit)
    except InputError as exc:
        problems = Problems()
        problems.extend(exc.problems)
        name_rows(
            problems, data.image_folder, lambda row, field: str(Path(data.image_folder) / files[row]), as_file=True
        )
        raise InputError(problems.items, exc.image_ids) from None


def _load_hf(
    data: OpenWorldDataConfig, cache: ImageCache | None, group_by: tuple[str, ...], limit: int | None
) -> OpenWorldData:
    """A Hugging Face dataset's split, its images read in place (`studies.hfdata`)."""
    problems = Problems()
    columns = (data.image_column, data.label_column)
    read = hf_tables(data.hf_dataset, data.split, columns, data.dataset, data.granularity, problems)
    if read is None:
        raise InputError(problems.items)
    labels_t, classes_t, origins = read
    try:
        return _checked(labels_t, classes_t, data.hf_dataset, problems, cache, data.background, group_by, limit)
    except InputError as exc:
        problems = Problems()
        problems.extend(exc.problems)
        name_rows(problems, data.hf_dataset, lambda row, field: origins[row], as_file=True)
        raise InputError(problems.items, exc.image_ids) from None


def _checked(
    labels_t: Table | None,
    classes_t: Table | None,
    image_dir: str | Path,
    problems: Problems,
    cache: ImageCache | None,
    background: str,
    group_by: tuple[str, ...],
    limit: int | None,
    shards: OpenWorldDataConfig | None = None,
) -> OpenWorldData:
    """The checks of the labels and class-names tables (None: could not be read) and their images,
    in `image_dir` or, when `shards` (the data section) names them, in shards."""
    class_lists = _check_classnames(classes_t, problems) if classes_t is not None else None

    images = known = None
    granularity: dict[str, str] = {}
    if labels_t is not None:
        if shards is not None:
            images = (study_shard_images(shards, labels_t, problems, cache, limit) or (None, None))[1]
        else:
            images = check_images(labels_t, image_dir, problems, cache, background, limit=limit)
        known = declared_ids(labels_t)
        granularity = _check_labels(labels_t, problems)
        check_group_by(group_by, labels_t, problems)
        if class_lists is not None:
            _check_labels_in_class_lists(labels_t, class_lists, classes_t.name, problems)
    if problems:
        # With the ids the labels table names, so the models' files are checked against them.
        raise InputError(problems.items, image_ids=None if known is None else set(known.to_pylist()))

    datasets = sorted(granularity)
    return OpenWorldData(
        images=images_table(images, background),
        labels=_labels_table(labels_t),
        # A class list of a dataset with no labelled image is not needed: it is left out.
        classnames={d: tuple(class_lists[d]) for d in datasets},
        granularity={d: granularity[d] for d in datasets},
        metadata=metadata_table(labels_t, images),
    )


def _check_classnames(table: Table, problems: Problems) -> dict[str, list[str]]:
    """Each dataset's class names in row order. A repeated name is kept: real lists have them
    (clip-benchmark's ImageNet names 'missile' and 'sunglasses' twice) and they are harmless."""
    lists: dict[str, list[str]] = {}
    for row in table.rows:
        if cell_present(row, table, CLASSNAME_COLUMNS, problems):
            lists.setdefault(cell_text(row, "dataset"), []).append(cell_text(row, "class_name"))
    if not table.rows:
        problems.add(table.file, "has no class names")
    return lists


def _check_labels(table: Table, problems: Problems) -> dict[str, str]:
    """Check each row's label and granularity; return each dataset's granularity (the first row's).
    The checks run on whole columns; only the rows found bad are looked at one by one."""
    blank = {c: table.blank(c) for c in ("label", "granularity")}
    present = ~(blank["label"] | blank["granularity"])
    value, dataset = table.text("granularity"), table.text("dataset")
    known = pc.is_in(value, value_set=pa.array(GRANULARITIES)).to_numpy(zero_copy_only=False)
    counted = present & known & pc.not_equal(dataset, "").to_numpy(zero_copy_only=False)
    first = first_rows(pa.table({"dataset": dataset}), counted)
    given = value.take(pa.array(np.where(first >= 0, first, 0)))
    rows = np.arange(len(table))
    differs = counted & (first < rows) & pc.not_equal(value, given).to_numpy(zero_copy_only=False)
    numbers = table.numbers.to_numpy()
    for i in np.flatnonzero(~present | (present & ~known) | differs):
        row = int(numbers[i])
        if not present[i]:
            for column in ("label", "granularity"):
                if blank[column][i]:
                    problems.add(table.file, f"'{column}' is empty", row=row, field=column)
        elif not known[i]:
            v = value[i].as_py()
            message = (
                f"unknown granularity '{v}'{did_you_mean(v, GRANULARITIES)}: expected one of {', '.join(GRANULARITIES)}"
            )
            problems.add(table.file, message, row=row, field="granularity")
        else:
            message = (
                f"granularity '{value[i].as_py()}' differs from '{given[i].as_py()}' given for dataset "
                f"'{dataset[i].as_py()}' at row {numbers[first[i]]}: a dataset has one granularity"
            )
            problems.add(table.file, message, row=row, field="granularity")
    firsts = np.flatnonzero(counted & (first == rows))
    return dict(zip(dataset.take(firsts).to_pylist(), value.take(firsts).to_pylist()))


def _check_labels_in_class_lists(
    table: Table, class_lists: dict[str, list[str]], source: str, problems: Problems
) -> None:
    """Every labelled dataset has a class list (reported once, at its first row), and every label is in it."""
    dataset, label = table.text("dataset"), table.text("label")
    given = pc.and_(pc.not_equal(dataset, ""), pc.not_equal(label, "")).to_numpy(zero_copy_only=False)
    listed = pc.is_in(dataset, value_set=pa.array(list(class_lists), pa.string())).to_numpy(zero_copy_only=False)
    pairs = [(d, n) for d, names in class_lists.items() for n in names]
    names = pa.table({"dataset": [d for d, _ in pairs], "label": [n for _, n in pairs]}, schema=_PAIRS)
    in_list = rows_in(pa.table({"dataset": dataset, "label": label}), names)
    numbers = table.numbers.to_numpy()
    reported: set[str] = set()
    for i in np.flatnonzero(given & ~(listed & in_list)):
        d, name = dataset[i].as_py(), label[i].as_py()
        if not listed[i]:
            if d not in reported:
                reported.add(d)
                problems.add(
                    table.file, f"dataset '{d}' has no class names in {source}", row=int(numbers[i]), field="dataset"
                )
            continue
        count = len(class_lists[d])
        message = f"label '{name}' is not among the {count} class names of dataset '{d}' in {source}"
        near = closest(name, class_lists[d])
        if near:
            message += f" (did you mean '{near}'? labels must match exactly)"
        problems.add(table.file, message, row=int(numbers[i]), field="label")


_PAIRS = pa.schema([("dataset", pa.string()), ("label", pa.string())])


def accepted_names(value: str | list[str], label: str) -> list[str]:
    """A row's accepted alternatives to its `label`: the `accepted` cell split at `|` (a Parquet
    list as it is), each stripped; blanks, repeats and the label itself are dropped."""
    names = value if isinstance(value, list) else value.split(ACCEPTED_SEPARATOR)
    return [n for n in dict.fromkeys(str(n).strip() for n in names) if n and n != label]


def _labels_table(table: Table) -> pa.Table:
    columns = {c: table.text(c) for c in LABELS_SCHEMA.names if c != ACCEPTED_COLUMN}
    # Most labels have no alternatives: only the rows that give some are split in Python.
    given = np.flatnonzero(~table.blank(ACCEPTED_COLUMN))
    cells = table.columns.column(ACCEPTED_COLUMN).take(pa.array(given, pa.int64())).to_pylist()
    names = [
        accepted_names(v, lab) for v, lab in zip(cells, columns["label"].take(pa.array(given, pa.int64())).to_pylist())
    ]
    lengths = np.zeros(len(table) + 1, dtype=np.int32)
    lengths[given + 1] = [len(n) for n in names]
    values = pa.array([n for each in names for n in each], pa.string())
    columns[ACCEPTED_COLUMN] = pa.ListArray.from_arrays(pa.array(np.cumsum(lengths), pa.int32()), values)
    return pa.table(columns, schema=LABELS_SCHEMA).sort_by("image_id")


__all__ = [
    "ACCEPTED_COLUMN",
    "CLASSNAME_COLUMNS",
    "GRANULARITIES",
    "IMAGES_SCHEMA",
    "LABELS_SCHEMA",
    "LABEL_COLUMNS",
    "OpenWorldData",
    "load_openworld_data",
    "load_openworld_form",
]
