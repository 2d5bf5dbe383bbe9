"""Per-row reuse: a stage whose rows each depend on one unit's own inputs (an image's file, its
texts) computes only the units that are new or changed, and keeps the others' rows from its last table.

Each row carries `inputs_sha256`, the hash of what its unit's rows were computed from (the stage's
settings and the unit's own inputs, `unit_inputs`). A run's stage hands `reuse` the units it wants,
each with that hash; the last table's rows of a unit whose hash is unchanged, and whose rows all
finished (`status` ok, where there is one), are kept as they were, every other unit is computed,
and the table is put together in one order (`order`), so it equals the table a run of every unit
gives, row for row. Statistics over all images are not per row: their stages are recomputed whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

INPUTS = "inputs_sha256"


def unit_inputs(settings: Any, *columns: pa.Array | pa.ChunkedArray | Sequence) -> pa.Array:
    """Per row, the sha256 of `settings` (JSON) and the row's value in each column (strings, or
    anything JSON writes: lists of keys, numbers): what one unit's rows are computed from."""
    head = inputs_head(settings)
    values = [c.to_pylist() if isinstance(c, pa.Array | pa.ChunkedArray) else list(c) for c in columns]
    return pa.array(
        [
            hashlib.sha256(json.dumps([head, *row], separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()
            for row in zip(*values)
        ],
        pa.string(),
    )


def inputs_head(settings: Any) -> str:
    """The settings' part of every unit's inputs (`unit_inputs`), as JSON."""
    return json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)


def _key(table: pa.Table, columns: list[str]) -> pa.ChunkedArray | pa.Array:
    """One string per row joining its `columns` (strings), to match rows of two tables whatever else they hold."""
    if len(columns) == 1:
        return table.column(columns[0])
    return pc.binary_join_element_wise(*[table.column(c) for c in columns], "\x1f")


def reusable(previous: pa.Table | None, wanted: pa.Table, unit: list[str], schema: pa.Schema) -> pa.Table:
    """The rows of `previous` (the stage's last table) to keep: those of the units of `wanted` whose
    `inputs_sha256` is unchanged and whose rows all finished. None of them from a table of another
    schema (a run folder of an earlier version)."""
    if previous is None or previous.schema.remove_metadata() != schema.remove_metadata() or not previous.num_rows:
        return schema.empty_table()
    previous = previous.filter(pc.is_valid(previous.column(INPUTS)))
    keys = _key(previous, [*unit, INPUTS])
    if "status" in previous.column_names:
        unfinished = pc.unique(pc.filter(_whole(keys), pc.not_equal(previous.column("status"), "ok")))
        if len(unfinished):
            previous = previous.filter(pc.invert(pc.is_in(keys, unfinished)))
            keys = _key(previous, [*unit, INPUTS])
    return previous.filter(pc.is_in(keys, _whole(_key(wanted, [*unit, INPUTS]))))


def reuse(
    previous: pa.Table | None,
    wanted: pa.Table,
    unit: list[str],
    compute: Callable[[pa.Table], pa.Table],
    schema: pa.Schema,
    order: list[str],
) -> tuple[pa.Table, int]:
    """The stage's table: `previous`'s rows of the `reusable` units, and `compute(todo)`'s rows of
    the others (`todo`: those rows of `wanted`, its unit columns and `inputs_sha256`, in order of
    unit; compute is not called when there are none). compute returns rows of `schema` less
    `inputs_sha256`, which each row gets from its unit. Sorted by `order` (it must order the rows
    fully, for the table to equal a fresh run's). Returns the table and how many units were computed."""
    kept = reusable(previous, wanted, unit, schema)
    wanted = wanted.select([*unit, INPUTS])
    todo = wanted.filter(pc.invert(pc.is_in(_key(wanted, unit), _whole(_key(kept, unit)))))
    todo = todo.sort_by([(c, "ascending") for c in unit])
    parts = [kept.select(schema.names).cast(schema)]
    if todo.num_rows:
        made = compute(todo)
        at = pc.index_in(_key(made, unit), _whole(_key(todo, unit)))
        if at.null_count:
            raise RuntimeError(f"{at.null_count} computed rows belong to no unit asked for")
        made = made.append_column(INPUTS, todo.column(INPUTS).take(at))
        parts.append(made.select(schema.names).cast(schema))
    table = pa.concat_tables(parts).combine_chunks()
    return table.take(pc.sort_indices(table, sort_keys=[(c, "ascending") for c in order])), todo.num_rows


def _whole(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
