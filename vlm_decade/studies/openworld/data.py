"""Study B's input: labelled images and each dataset's class names (docs/openworld-data.md).

`load_openworld_data` reads the labels table (one row per image: where its file is, its class label and
its dataset's label granularity) and the class-names table (each dataset's candidate list for the
closed-world baselines). It decodes every image once and checks everything; all problems (file,
spreadsheet row, field) come back together as one InputError, and nothing is written. Reading and the
image checks are Study A's (`vlm_decade.studies.decade.data`), so both studies report bad input the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from vlm_decade.core.errors import InputError, Problems
from vlm_decade.core.names import closest, did_you_mean
from vlm_decade.core.tables import Row, Table, cell_present, cell_text, read_table
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
from vlm_decade.studies.rows import FirstRows

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
) -> OpenWorldData:
    """Read and check Study B's input; every problem is raised together as one InputError.
    `group_by`: the study's `analysis.group_by`, each a column the labels table must have."""
    problems = Problems()
    labels_t = read_table(
        Path(labels), LABEL_COLUMNS, problems, (ACCEPTED_COLUMN,), lists=(ACCEPTED_COLUMN,), extra=True
    )
    classes_t = read_table(Path(classnames), CLASSNAME_COLUMNS, problems)
    class_lists = _check_classnames(classes_t, problems) if classes_t is not None else None

    images = {}
    known = None
    granularity: dict[str, str] = {}
    if labels_t is not None:
        images = check_images(labels_t, image_dir, problems, cache, background)
        known = declared_ids(labels_t)
        granularity = _check_labels(labels_t, problems)
        check_group_by(group_by, labels_t, problems)
        if class_lists is not None:
            _check_labels_in_class_lists(labels_t, class_lists, classes_t.name, problems)
    if problems:
        # With the ids the labels table names, so the models' files are checked against them.
        raise InputError(problems.items, image_ids=known)

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
    """Check each row's label and granularity; return each dataset's granularity (the first row's)."""
    granularity: dict[str, str] = {}
    first_rows = FirstRows()
    for row in table.rows:
        if not cell_present(row, table, ("label", "granularity"), problems):
            continue
        value = cell_text(row, "granularity")
        if value not in GRANULARITIES:
            message = (
                f"unknown granularity '{value}'{did_you_mean(value, GRANULARITIES)}: "
                f"expected one of {', '.join(GRANULARITIES)}"
            )
            problems.add(table.file, message, row=row.number, field="granularity")
            continue
        dataset = cell_text(row, "dataset")
        if not dataset:  # already reported by the image checks
            continue
        first = first_rows.again(dataset, row.number)
        if first is None:
            granularity[dataset] = value
        elif value != granularity[dataset]:
            message = (
                f"granularity '{value}' differs from '{granularity[dataset]}' given for dataset '{dataset}' "
                f"at row {first}: a dataset has one granularity"
            )
            problems.add(table.file, message, row=row.number, field="granularity")
    return granularity


def _check_labels_in_class_lists(
    table: Table, class_lists: dict[str, list[str]], source: str, problems: Problems
) -> None:
    """Every labelled dataset has a class list (reported once, at its first row), and every label is in it."""
    known = {d: set(names) for d, names in class_lists.items()}
    reported: set[str] = set()
    for row in table.rows:
        dataset, label = cell_text(row, "dataset"), cell_text(row, "label")
        if not dataset or not label:  # already reported as empty
            continue
        if dataset not in known:
            if dataset not in reported:
                reported.add(dataset)
                message = f"dataset '{dataset}' has no class names in {source}"
                problems.add(table.file, message, row=row.number, field="dataset")
            continue
        if label not in known[dataset]:
            count = len(class_lists[dataset])
            message = f"label '{label}' is not among the {count} class names of dataset '{dataset}' in {source}"
            near = closest(label, class_lists[dataset])
            if near:
                message += f" (did you mean '{near}'? labels must match exactly)"
            problems.add(table.file, message, row=row.number, field="label")


def accepted_names(row: Row) -> list[str]:
    """The row's accepted alternatives to its label: the `accepted` cell split at `|` (a Parquet
    list as it is), each stripped; blanks, repeats and the label itself are dropped."""
    value = row.cells[ACCEPTED_COLUMN]
    names = value if isinstance(value, list) else value.split(ACCEPTED_SEPARATOR)
    label = cell_text(row, "label")
    return [n for n in dict.fromkeys(str(n).strip() for n in names) if n and n != label]


def _labels_table(table: Table) -> pa.Table:
    rows = sorted(table.rows, key=lambda r: cell_text(r, "image_id"))
    columns = {c: [cell_text(r, c) for r in rows] for c in LABELS_SCHEMA.names if c != ACCEPTED_COLUMN}
    columns[ACCEPTED_COLUMN] = [accepted_names(r) for r in rows]
    return pa.table(columns, schema=LABELS_SCHEMA)


__all__ = [
    "ACCEPTED_COLUMN",
    "CLASSNAME_COLUMNS",
    "GRANULARITIES",
    "IMAGES_SCHEMA",
    "LABELS_SCHEMA",
    "LABEL_COLUMNS",
    "OpenWorldData",
    "load_openworld_data",
]
