"""Hand error labels: read and check a lab's own labels (subject, image_id, error_type, present,
and an optional `note` saying why, kept in the evidence).

They override the automatic labels where given (`agreement.apply_hand_labels`), and their
agreement with the automatic ones is reported per error type (Cohen's kappa).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from vlm_decade.core.columns import first_rows
from vlm_decade.core.errors import Problems
from vlm_decade.core.tables import read_table

HAND_COLUMNS = ("subject", "image_id", "error_type", "present")
HAND_SCHEMA = pa.schema([(c, pa.string()) for c in HAND_COLUMNS[:3]] + [("present", pa.bool_()), ("note", pa.string())])
TRUE, FALSE = {"1", "true", "yes", "y"}, {"0", "false", "no", "n"}


def check_hand_labels(path: str | Path, subjects, image_ids, error_types, problems: Problems) -> pa.Table | None:
    """The good rows (sorted) or None when the file cannot be read; every bad cell is a problem."""
    table = read_table(Path(path), HAND_COLUMNS, problems, optional=("note",), flags=("present",))
    if table is None:
        return None
    subjects, image_ids, error_types = set(subjects), set(image_ids), tuple(error_types)
    every = [
        {c: (";".join(v) if isinstance(v, list) else v).strip() for c, v in ((c, row.cells[c]) for c in HAND_COLUMNS)}
        for row in table.rows
    ]
    keyed = ("subject", "image_id", "error_type")
    first = first_rows(
        pa.table({c: [cells[c] for cells in every] for c in keyed}),
        np.array([all(cells[c] for c in keyed) for cells in every], bool),
    )
    rows = []
    for i, (row, cells) in enumerate(zip(table.rows, every)):
        bad = [(c, f"'{c}' is empty") for c, v in cells.items() if not v]
        if cells["subject"] and cells["subject"] not in subjects:
            bad.append(("subject", f"unknown subject '{cells['subject']}' (not a model of the study)"))
        if cells["image_id"] and cells["image_id"] not in image_ids:
            bad.append(("image_id", f"unknown image_id '{cells['image_id']}' (not in the images table)"))
        if cells["error_type"] and cells["error_type"] not in error_types:
            bad.append(("error_type", f"unknown error_type '{cells['error_type']}' (one of: {', '.join(error_types)})"))
        present = cells["present"].lower()
        if present and present not in TRUE | FALSE:
            bad.append(("present", f"present '{cells['present']}' is not 1/0, true/false or yes/no"))
        key = (cells["subject"], cells["image_id"], cells["error_type"])
        if all(key) and first[i] != i:
            bad.append(
                (
                    "error_type",
                    f"a second label for subject '{key[0]}', image '{key[1]}', {key[2]} "
                    f"(first at row {table.rows[first[i]].number})",
                )
            )
        for field, message in bad:
            problems.add(table.file, message, row=row.number, field=field)
        if not bad:
            note = row.cells["note"]
            rows.append(
                {
                    **{c: cells[c] for c in HAND_COLUMNS[:3]},
                    "present": present in TRUE,
                    "note": (";".join(note) if isinstance(note, list) else note).strip(),
                }
            )
    rows.sort(key=lambda r: (r["subject"], r["image_id"], r["error_type"]))
    return pa.Table.from_pylist(rows, schema=HAND_SCHEMA)
