"""The embeddings table: its rows (one vector per text and encoder, keyed by the sha256 of the
stripped text), and where a run finds the vectors it may keep: the last table's files, if it
verifies, and the parts a killed run or this one saved, read a table at a time and, where a row
group's footer says it holds no row wanted, not read at all.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from vlm_decade.core.config import EncoderConfig
from vlm_decade.core.runfolder import RunFolder

EMBEDDINGS_SCHEMA = pa.schema(
    [
        ("text_sha256", pa.string()),
        ("encoder", pa.string()),
        ("encoder_key", pa.string()),
        ("dim", pa.int32()),
        # Variable-length so encoders of different widths share one table; `dim` says the width.
        ("vector", pa.list_(pa.float32())),
        # An API encoder's vector: sync or batch, the mode that bought it (a cached one: the mode of
        # its purchase); null for a local encoder, and in tables written before the column existed.
        ("mode", pa.string()),
    ]
)
VECTOR_BATCH = 4096  # rows read at a time
KEY_BATCH = 65_536  # rows read at a time without their vectors
# The columns whose ranges in a row group's footer tell which buckets its rows may fall in.
RANGED = ["text_sha256", "encoder_key"]


def encoder_key(cfg: EncoderConfig) -> str:
    """What decides an encoder's vectors (not its display name or batch size)."""
    return cfg.key(without=("name",))


def vector_rows(keys, vectors: np.ndarray, cfg: EncoderConfig, modes: list[str] | None = None) -> pa.Table:
    """The table's rows of encoder `cfg`'s `vectors` of the texts `keys`; `modes`: the mode that bought
    each (an API encoder's), else null."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim).cast(pa.list_(pa.float32()))
    return pa.table(
        {
            "text_sha256": pa.array(keys, pa.string()),
            "encoder": pa.array([cfg.name] * n, pa.string()),
            "encoder_key": pa.array([encoder_key(cfg)] * n, pa.string()),
            "dim": pa.array([dim] * n, pa.int32()),
            "vector": column,
            "mode": pa.array(modes if modes is not None else [None] * n, pa.string()),
        },
        schema=EMBEDDINGS_SCHEMA,
    )


def previous_files(folder: RunFolder) -> list[tuple[Path, dict[str, Any] | None]]:
    """The last table's files, if it verifies (`folder.trusted`): its segments, each with its
    record, or the one file (no record) of a table written before tables had segments."""
    if not folder.trusted("embeddings"):
        return []
    record = folder.manifest()["files"]["embeddings"]
    if "segments" in record:
        return [(folder.segment_folder("embeddings") / s["name"], s) for s in record["segments"]]
    return [(folder.table_path("embeddings"), None)]


def vector_sources(
    folder: RunFolder,
    previous: list,
    columns: list[str] | None = None,
    skip: frozenset[int] = frozenset(),
    touches: Callable[[dict], bool] | None = None,
):
    """The vectors this run may reuse, as (source, table) a table at a time (never all at once):
    the `previous` table's files (source: their place in it), but those in `skip`, then the parts
    a killed run or this one saved (source: `len(previous)`). Rows written before the `mode`
    column existed get it empty. With `touches` (whether a row group, by the least and greatest
    of its `RANGED` columns, may hold rows wanted), the row groups and parts whose footers say it
    holds none are not read."""

    def whole(table: pa.Table) -> pa.Table:
        if columns is None and "mode" not in table.column_names:
            table = table.append_column("mode", pa.nulls(table.num_rows, pa.string()))
        return table.cast(pa.schema([EMBEDDINGS_SCHEMA.field(c) for c in table.column_names]))

    # Keys alone are read many row groups at a time: each table taken is spread over 256 buckets.
    rows = VECTOR_BATCH if columns is None or "vector" in columns else KEY_BATCH
    for source, (path, _) in enumerate(previous):
        if source not in skip:
            groups = None if touches is None else folder.touched_row_groups(path, RANGED, touches)
            for batch in folder.file_batches(path, columns=columns, batch_size=rows, row_groups=groups):
                yield source, whole(pa.Table.from_batches([batch]))
    keep = None if touches is None else partial(_touched, folder, touches)
    for table in folder.iter_parts("embeddings", EMBEDDINGS_SCHEMA, columns, keep=keep):
        yield len(previous), whole(table)


def _touched(folder: RunFolder, touches: Callable[[dict], bool], path: Path) -> bool:
    """Whether a part may hold rows `touches` wants: yes, unless its footer says none of its row
    groups does (a part whose footer cannot be read is read, and said to be damaged)."""
    groups = folder.touched_row_groups(path, RANGED, touches)
    return groups is None or bool(groups)


@contextmanager
def spill_folder(folder: RunFolder):
    """The folder beside the tables where the stage spreads its rows over buckets: emptied before
    and removed after (what a killed run left there is of no use)."""
    spill = folder.root / ".spill" / "embeddings"
    shutil.rmtree(spill, ignore_errors=True)
    try:
        yield spill
    finally:
        shutil.rmtree(spill, ignore_errors=True)
