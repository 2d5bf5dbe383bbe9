"""The run folder: one Parquet table per stage, `manifest.json`, and crash-safe partial results.

Every file is written to a temporary name in the same folder and renamed into place, so a reader
(or a re-run after SIGKILL) sees either the old file or the new one, never half of one. A stage
that produces rows incrementally appends finished batches as parts under `.parts/<table>/`; the
parts survive a crash and are folded into the table when the stage completes.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def table_fingerprint(table: pa.Table) -> str:
    """A content hash of a table's schema and rows (independent of Parquet writer details)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


class RunFolder:
    """The folder a study writes: tables, manifest, report. The driver alone writes it."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # tables -----------------------------------------------------------------------------------
    def table_path(self, name: str) -> Path:
        return self.root / f"{name}.parquet"

    def has(self, name: str) -> bool:
        return self.table_path(name).exists()

    def read(self, name: str) -> pa.Table:
        return pq.read_table(self.table_path(name))

    def write(self, name: str, table: pa.Table) -> str:
        """Write a table atomically; return its content fingerprint."""
        atomic_write_bytes(self.table_path(name), table_bytes(table))
        return table_fingerprint(table)

    # partial results ----------------------------------------------------------------------------
    def _parts_dir(self, name: str) -> Path:
        return self.root / ".parts" / name

    def append_part(self, name: str, table: pa.Table) -> None:
        if table.num_rows:
            # Time-ordered names: a later attempt at a row sorts after an earlier one.
            part = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
            atomic_write_bytes(self._parts_dir(name) / part, table_bytes(table))

    def read_parts(self, name: str, schema: pa.Schema) -> pa.Table:
        files = sorted(self._parts_dir(name).glob("part-*.parquet"))
        if not files:
            return schema.empty_table()
        return pa.concat_tables([pq.read_table(f).cast(schema) for f in files])

    def parts(self, name: str, schema: pa.Schema, rows: int = 1, seconds: float = 0.0, on_save=None) -> "PartWriter":
        """A buffer of finished rows for table `name`, saved as a part every `rows` rows or `seconds`."""
        return PartWriter(self, name, schema, rows, seconds, on_save)

    def clear_parts(self, name: str) -> None:
        folder = self._parts_dir(name)
        for f in folder.glob("part-*.parquet"):
            f.unlink()
        if folder.exists():
            folder.rmdir()

    # manifest -----------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def manifest(self) -> dict[str, Any]:
        if self.manifest_path.exists():
            return json.loads(self.manifest_path.read_text(encoding="utf-8"))
        return {}

    def save_manifest(self, manifest: dict[str, Any]) -> None:
        atomic_write_bytes(self.manifest_path, (json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n").encode())

    def update_manifest(self, **fields: Any) -> dict[str, Any]:
        manifest = self.manifest()
        manifest.update(fields)
        self.save_manifest(manifest)
        return manifest


class PartWriter:
    """Finished rows of an incremental stage, saved as parts: whenever `rows` rows or `seconds` have
    gathered, and on leaving the `with` block (an exception included), so what is done is kept.
    `on_save` runs after each part is saved (the API stages record the money spent then)."""

    def __init__(self, folder: RunFolder, name: str, schema: pa.Schema, rows: int, seconds: float, on_save=None):
        self.folder, self.name, self.schema = folder, name, schema
        self.rows, self.seconds, self.on_save = rows, seconds, on_save
        self.buffer: list[dict] = []
        self.since = time.monotonic()

    def add(self, rows: list[dict]) -> None:
        self.buffer += rows
        if len(self.buffer) >= self.rows or time.monotonic() - self.since >= self.seconds:
            self.save()

    def save(self) -> None:
        if self.buffer:
            self.folder.append_part(self.name, pa.Table.from_pylist(self.buffer, schema=self.schema))
            self.buffer = []
            if self.on_save is not None:
                self.on_save()
        self.since = time.monotonic()

    def __enter__(self) -> "PartWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.save()
