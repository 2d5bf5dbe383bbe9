"""Statistics per group of a metadata column (`analysis.group_by`, docs/data-format.md#metadata).

A study's analysis runs once on all its images (the rows as they have always been, `group_by` and
`group` null) and once more per value of each grouping variable, on that group's images alone, with
the same seed: resampling streams depend on the seed and the dataset's name only, so a group's rows
are exactly what the analysis of a study holding just those images gives. A family's comparisons are
then BH-corrected together across the variable's groups (per metric and prompt, as the family is
without groups), since slicing by a variable multiplies the tests the family makes.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.stats._core import bh_qvalues

GROUP_COLUMNS = ("group_by", "group")  # appended to every statistics table; null on the ungrouped rows
GROUPED_TABLES = ("stats", "comparisons", "paired_tests")  # the tables that hold per-group rows


def image_groups(metadata: pa.Table, variable: str) -> dict[str, list[str]]:
    """Each value of `variable` -> the ids of its images, values sorted; an empty cell is in no group."""
    groups: dict[str, list[str]] = defaultdict(list)
    for image_id, value in zip(metadata.column("image_id").to_pylist(), metadata.column(variable).to_pylist()):
        if value:
            groups[value].append(image_id)
    return dict(sorted(groups.items()))


def restrict(table: pa.Table, image_ids) -> pa.Table:
    """The rows of `table` (it has `image_id`) about these images."""
    return table.filter(pc.is_in(table.column("image_id"), pa.array(list(image_ids), pa.string())))


def with_group(table: pa.Table, variable: str | None, group: str | None) -> pa.Table:
    """`table` with the grouping variable and the group appended (null, null: all images)."""
    for name, value in zip(GROUP_COLUMNS, (variable, group)):
        table = table.append_column(name, pa.array([value] * table.num_rows, pa.string()))
    return table


def ungrouped(table: pa.Table) -> pa.Table:
    """The rows about all images (a table written before grouping existed has no others)."""
    if "group" not in table.column_names:
        return table
    return table.filter(pc.is_null(table.column("group")))


def per_group(table: pa.Table) -> dict[str, dict[str, pa.Table]]:
    """Each grouping variable's rows by group, {variable: {group: rows}} in the table's order (the
    study's variables, each one's groups sorted); empty for a table without groups."""
    if "group" not in table.column_names:
        return {}
    grouped = table.filter(pc.is_valid(table.column("group")))
    out: dict[str, dict[str, pa.Table]] = {}
    for variable, group in dict.fromkeys(
        zip(grouped.column("group_by").to_pylist(), grouped.column("group").to_pylist())
    ):
        rows = pc.and_(pc.equal(grouped.column("group_by"), variable), pc.equal(grouped.column("group"), group))
        out.setdefault(variable, {})[group] = grouped.filter(rows)
    return out


def correct_across_groups(table: pa.Table, strata, alpha: float) -> pa.Table:
    """`q` and `significant` again, by BH over the p-values of all groups' rows that share the values
    of `strata` (a list of column names, or a function of a row giving its stratum); a row without a
    p keeps no q."""
    rows = table.to_pylist()
    key = strata if callable(strata) else (lambda r: tuple(r[c] for c in strata))
    at: dict[tuple, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        at[key(r)].append(i)
    q = np.full(len(rows), np.nan)
    for members in at.values():
        q[members] = bh_qvalues(np.array([np.nan if rows[i]["p"] is None else rows[i]["p"] for i in members]))
    significant = [None if np.isnan(v) else bool(v <= alpha) for v in q]
    q_column = pa.array([None if np.isnan(v) else float(v) for v in q], pa.float64())
    table = table.set_column(table.schema.get_field_index("q"), "q", q_column)
    field = table.schema.field("significant")
    return table.set_column(table.schema.get_field_index("significant"), field, pa.array(significant, field.type))


def grouped_tables(analyse, inputs: dict[str, pa.Table], metadata: pa.Table | None, group_by, strata, alpha):
    """`analyse(inputs) -> {name: table}` on all images, then per group of each variable in
    `group_by` (each input restricted to the group's images), all in one table per name with
    GROUP_COLUMNS; `strata[name]`: how a table's comparisons are BH-corrected across groups (None:
    a table of estimates, not corrected)."""
    whole = analyse(inputs)
    out = {name: [with_group(t, None, None)] for name, t in whole.items()}
    for variable in dict.fromkeys(group_by):
        parts: dict[str, list[pa.Table]] = defaultdict(list)
        for group, ids in image_groups(metadata, variable).items():
            for name, t in analyse({k: restrict(v, ids) for k, v in inputs.items()}).items():
                parts[name].append(with_group(t, variable, group))
        for name, tables in parts.items():
            joined = pa.concat_tables(tables)
            if strata.get(name) is not None and joined.num_rows:
                joined = correct_across_groups(joined, strata[name], alpha)
            out[name].append(joined)
    return {name: pa.concat_tables(tables) for name, tables in out.items()}
