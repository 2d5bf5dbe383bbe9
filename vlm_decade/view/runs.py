"""A run folder opened for looking at: its study (from manifest.json), which tables it has, and a
DuckDB connection with one view per table, so pages filter, sort and page through the Parquet files
in SQL without loading them into Python.

The tables are those its study's registration names (`studies.registry`); only `images` is
required, every other table is optional and a page shows what the run has.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.runfolder import RunFolder, open_run_folder
from vlm_decade.core.storage import is_uri
from vlm_decade.studies import STUDIES, AnyStudy, recorded_study
from vlm_decade.view.verify import TableCheck


@dataclass
class RunView:
    """What the pages need of a run: its folder, study, tables and a DuckDB connection over them.
    A query reads only tables that verify against the manifest (`verify.TableCheck`)."""

    folder: RunFolder
    study: AnyStudy
    tables: tuple[str, ...]
    connection: duckdb.DuckDBPyConnection
    _lock: threading.Lock = field(default_factory=threading.Lock)
    checks: TableCheck = field(init=False)

    def __post_init__(self):
        self.checks = TableCheck(self.folder)

    @property
    def root(self) -> Path:
        return self.folder.root

    @property
    def kind(self) -> str:
        return self.study.study

    def has(self, table: str) -> bool:
        return table in self.tables

    @property
    def models(self) -> list[str]:
        """The study's model names, in its order."""
        return [m.name for m in self.study.models]

    def rows(self, sql: str, params: list | tuple = ()) -> list[dict]:
        """The rows of a query as dicts; raises verify.Unverified when a table it reads does not
        verify. Each call gets its own cursor: requests run on several threads."""
        with self._lock:
            cursor = self.connection.cursor()
        try:
            self.checks.require_for(sql)
            result = cursor.execute(sql, list(params))
            names = [d[0] for d in result.description]
            return [dict(zip(names, row)) for row in result.fetchall()]
        finally:
            cursor.close()

    def columns(self, table: str) -> tuple[str, ...]:
        """The column names of one of the run's tables (none when the run lacks it)."""
        if not self.has(table):
            return ()
        with self._lock:
            cursor = self.connection.cursor()
        try:
            return tuple(d[0] for d in cursor.execute(f'SELECT * FROM "{table}" LIMIT 0').description)
        finally:
            cursor.close()

    def values(self, sql: str, params: list | tuple = ()) -> list:
        """The first column of a query."""
        return [next(iter(r.values())) for r in self.rows(sql, params)]

    def image(self, image_id: str) -> dict | None:
        """The images table's row of one image, or None when the run does not list it."""
        rows = self.rows("SELECT * FROM images WHERE image_id = ?", [image_id])
        return rows[0] if rows else None


def _quoted(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def open_run(location: str | Path) -> RunView:
    """The run folder at `location` (a path, or the URI of one in a bucket: its working copy), or an
    InputError that says why it is not one."""
    if not is_uri(str(location)):
        location = Path(location).resolve()
    folder, manifest = open_run_folder(location)
    study = recorded_study(manifest, str(folder.manifest_path))
    if not folder.has("images"):
        raise InputError(
            [
                Problem(
                    str(folder.table_path("images")), "missing: the run has no images table yet (run the study first)"
                )
            ]
        )
    # Parquet reading is built in; DuckDB must not fetch extensions from the network on its own.
    connection = duckdb.connect(
        ":memory:", config={"threads": 2, "autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    present = []
    for name in STUDIES[study.study].tables:  # a run that lacks one simply has no such section
        if folder.has(name):
            try:
                connection.execute(
                    f'CREATE VIEW "{name}" AS SELECT * FROM read_parquet({_quoted(folder.table_path(name))})'
                )
            except duckdb.Error as exc:
                raise InputError(
                    [Problem(str(folder.table_path(name)), f"not a readable Parquet table: {exc}")]
                ) from None
            present.append(name)
    return RunView(folder, study, tuple(present), connection)
