"""What the `responses` table's cache keys were made from, kept beside it (`.cache/responses-keys.parquet`)
so that a later run need not hash again the keys of the jobs whose inputs are unchanged.

A job's cache key hashes its model's settings and prompt, its mask, its image's sha256, background
and dataset's class names, and, for a model whose answers are a file's rows, its answer's text
(`plan.KeyTemplate`). Every row of a written `responses` table holds its job's key as the run that
wrote it planned it (`rows.collect_rows` keeps no other row), so when a job's model has the same
constant part of its key (`plan.key_context`) and its image the same dataset, sha256 and background as
then, the job's key is its row's. A file's answer is not kept here: it is the row's own text, which
the next run compares with the file's (`rows.RowsSoFar.kept_keys`). The record names the table it
describes by its fingerprint: a table written by a later run, or not trusted, is not described, and
every key is made again.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vlm_decade.core.files import atomic_write_bytes
from vlm_decade.core.parquet import table_bytes

KEYED_FILE = Path(".cache") / "responses-keys.parquet"
KEY_ROWS_SCHEMA = pa.schema([(c, pa.string()) for c in ("image_id", "dataset", "sha256", "background")])
_TABLE, _CONTEXTS = b"vlm_decade.responses", b"vlm_decade.contexts"


def key_rows(images: pa.Table) -> pa.Table:
    """The images' columns that go into their jobs' cache keys (`KEY_ROWS_SCHEMA`); an images table
    written before transparency was recorded has every image opaque (background null)."""
    rows = images.select(["image_id", "dataset", "sha256"])
    if "background" in images.column_names:
        return rows.append_column("background", images.column("background"))
    return rows.append_column("background", pa.nulls(images.num_rows, pa.string()))


class KeyInputs:
    """The key rows of the images a `responses` table was planned over and each model's
    `plan.key_context`, for the table whose fingerprint is `table`."""

    def __init__(self, rows: pa.Table, contexts: dict[str, str], table: str):
        self.rows, self.contexts, self.table = rows, contexts, table

    @classmethod
    def load(cls, run_folder: str | Path, table: str | None) -> KeyInputs | None:
        """What the kept record says, if it describes the table of fingerprint `table` (None: no
        table to describe); None when there is none, it cannot be read, or it describes another."""
        path = Path(run_folder) / KEYED_FILE
        if table is None or not path.is_file():
            return None
        try:
            source = pq.ParquetFile(path)
            meta = source.metadata.metadata or {}
            if meta.get(_TABLE, b"").decode() != table:
                return None
            rows = source.read().cast(KEY_ROWS_SCHEMA)
            contexts = json.loads(meta[_CONTEXTS])
        except Exception:  # noqa: BLE001 - a damaged record only costs hashing every key again
            return None
        return cls(rows, contexts, table) if isinstance(contexts, dict) else None

    def save(self, run_folder: str | Path) -> None:
        path = Path(run_folder) / KEYED_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {_TABLE: self.table.encode(), _CONTEXTS: json.dumps(self.contexts, sort_keys=True).encode()}
        atomic_write_bytes(path, table_bytes(self.rows.cast(KEY_ROWS_SCHEMA).replace_schema_metadata(meta)))

    def unchanged(self, rows: pa.Table) -> np.ndarray:
        """Per image of `rows` (`key_rows`), whether it was planned with the same dataset, sha256 and
        background (both null: opaque then and now)."""
        at = pc.index_in(rows.column("image_id"), value_set=self.rows.column("image_id").combine_chunks())
        same = pc.is_valid(at)
        for column in ("dataset", "sha256", "background"):
            now, then = rows.column(column), self.rows.column(column).take(at)
            equal = pc.fill_null(pc.equal(now, then), False)
            same = pc.and_(same, pc.or_(equal, pc.and_(pc.is_null(now), pc.is_null(then))))
        return np.asarray(same.to_numpy(zero_copy_only=False), bool)
