"""The run folder: one Parquet table per stage, `manifest.json`, and crash-safe partial results.

Every file is written whole (`core.files`), so a reader (or a re-run after SIGKILL) sees either the
old file or the new one, never half of one; tables are written and read by the Parquet codec
(`core.parquet`). Nothing is trusted because it exists:
- each table's content fingerprint (`tables`, `core.fingerprints`) and the sha256, size and time of its file (`files`)
  are recorded in the manifest when it is written, and a table is used again only while its file
  still has that size and time or, when its time changed, still hashes the same (`verified`;
  `runtime.rehash` hashes every file); the fingerprint also travels inside the file's metadata, so
  a table verifies on its own when the manifest is lost;
- a stage that produces rows incrementally appends finished batches as parts under
  `.parts/<table>/`, each named with the hash of its bytes: a part that does not hash to its name
  (truncated by a crash or a full disk) is discarded and its rows are done again;
- a manifest that cannot be read is set aside under another name and rebuilt from what verifies.
A table a run adds to, rather than rewrites (the embeddings), is a folder of segments
(`<table>/segment-NNNNNN.parquet`, a Parquet file each, read in order as one table, as pandas,
pyarrow and Ray Data read such a folder): a run writes one new segment and keeps the segments whose
every row it still wants as they are, file for file (`write_segment`, `segments_record`). Its record
lists each segment's hash; what of the table the manifest does not record (a segment of a run killed
before it saved the manifest, the one-file table a segmented one replaced) is removed (`prune_segments`).
One run at a time: `lock()` holds an exclusive lock on the folder (a lock file that names the pid
and host; the operating system releases it when that process dies, however it dies), and for a run
folder in a bucket, the bucket's lease too (`storage.Lease`: one run per URI across machines).
A run folder in object storage is this folder as its local working copy, kept in step with the
bucket by a `storage.Mirror`: pulled when a run takes the lock, each part pushed as it is saved,
everything else with each manifest save (the manifest last) and when the lock is released.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.files import FILE_MODE, atomic_file, atomic_write_bytes, file_sha256
from vlm_decade.core.fingerprints import Fingerprinter, batches_of, table_fingerprint
from vlm_decade.core.parquet import ROW_GROUP_ROWS, column_ranges, file_batches, table_bytes, writer_options
from vlm_decade.core.storage import Lease, LeaseHeld, Mirror, is_uri, uri_problem, working_copy

FINGERPRINT_KEY = b"vlm_decade.fingerprint"
PART = re.compile(r"^part-(\d{20})-([0-9a-f]{16})\.parquet$")
SEGMENT = re.compile(r"^segment-(\d{6})\.parquet$")


def _pause_for_a_kill(table: str) -> None:
    """The kill tests' hook: with VLM_DECADE_PAUSE_AFTER_PART="<table>:<file>" set, the first part of
    <table> makes the process create <file> and wait to be killed, so a test kills it after some but
    not all of a stage's work, whatever the machine's speed."""
    hook = os.environ.get("VLM_DECADE_PAUSE_AFTER_PART", "")
    wanted, _, signal_file = hook.partition(":")
    if wanted == table and signal_file and not Path(signal_file).exists():  # once: a stop may save the rest
        atomic_write_bytes(Path(signal_file), str(os.getpid()).encode())
        # Short sleeps: a Ctrl-C that the kernel hands to one of Ray's threads is only seen by
        # this (the main) thread once its sleep ends.
        while True:
            time.sleep(0.1)


def _write_file(path: Path, schema: pa.Schema, batches, row_group_rows: int) -> tuple[str, dict[str, Any], int]:
    """`RunFolder.write_batches` to any path: the fingerprint, the file record and the row count."""
    fingerprint = Fingerprinter(schema)
    rows = 0
    with atomic_file(path) as fh:
        with pq.ParquetWriter(fh, schema, **writer_options(schema)) as writer:
            for batch in batches:
                for piece in pa.Table.from_batches([batch]).to_batches(max_chunksize=row_group_rows):
                    fingerprint.add(piece)
                    writer.write_batch(piece, row_group_size=row_group_rows)
                    rows += piece.num_rows
            digest = fingerprint.hexdigest()
            writer.add_key_value_metadata({FINGERPRINT_KEY: digest.encode()})
    return digest, _file_record(path), rows


# A recorded file's time is set this far past the time the file system gave it: any later write
# gets the clock's time, and a write within the same tick of that coarse clock (milliseconds) would
# otherwise leave the time as recorded.
STAMP_NS = 1000


def _file_record(path: Path, written: bool = True) -> dict[str, Any]:
    """What `verified` checks of a file whose bytes are as wanted: its sha256 and size, and its time:
    for a file just `written`, set past the file system's (`STAMP_NS`) where the file system keeps
    the time to the nanosecond it is set to (where it does not, the record has no time and the file
    is hashed whenever it is checked); for one written long before (found when a manifest is
    rebuilt), the time it has."""
    stat = path.stat()
    record = {"sha256": file_sha256(path), "bytes": stat.st_size}
    if not written:
        return record | {"mtime_ns": stat.st_mtime_ns}
    stamp = stat.st_mtime_ns + STAMP_NS
    os.utime(path, ns=(stat.st_atime_ns, stamp))
    if path.stat().st_mtime_ns == stamp:
        record["mtime_ns"] = stamp
    return record


def _file_problem(path: Path, record: dict, rehash: bool = False) -> str | None:
    """None when the file at `path` has the size and sha256 `record` says; else what is wrong. A
    file with the size and time recorded is not hashed again, unless `rehash`: a table of gigabytes
    is checked in microseconds, as `make` and the image cache trust an unchanged file."""
    if not path.is_file():
        return f"{path.name} is missing"
    stat = path.stat()
    if stat.st_size == record["bytes"] and not rehash and record.get("mtime_ns") == stat.st_mtime_ns:
        return None
    if stat.st_size != record["bytes"] or file_sha256(path) != record["sha256"]:
        return f"{path.name} does not match the hash recorded when it was written"
    return None


def _self_verified(path: Path) -> tuple[str, dict[str, Any], int] | None:
    """A Parquet file's own fingerprint, its file record and rows, when the fingerprint it carries
    matches its rows; else None."""
    try:
        stored = (pq.ParquetFile(path).metadata.metadata or {}).get(FINGERPRINT_KEY)
        table = pq.read_table(path)
        if stored is None or stored.decode() != table_fingerprint(table):
            return None
    except Exception:  # noqa: BLE001 - a damaged Parquet file raises many kinds of error
        return None
    return stored.decode(), _file_record(path, written=False), table.num_rows


def segments_record(segments: list[dict[str, Any]]) -> dict[str, Any]:
    """A segmented table as the runner records it (`runner.Written`'s fields): its fingerprint
    (of its segments' fingerprints, in order), its file record (the segments' records) and rows."""
    fingerprint = hashlib.sha256(json.dumps([s["fingerprint"] for s in segments]).encode()).hexdigest()
    return {"fingerprint": fingerprint, "file": {"segments": segments}, "rows": sum(s["rows"] for s in segments)}


class RunFolderBusy(RuntimeError):
    """Another live process holds the run folder's lock."""


class RunFolder:
    """The folder a study writes: tables, manifest, report. The driver alone writes it.

    `say` reports what the folder found and set right (a corrupt table redone, a part discarded);
    `rehash`: every table is hashed when it is checked, whatever its recorded time (`_file_problem`)."""

    def __init__(self, root: str | Path, say: Callable[[str], None] | None = None, rehash: bool = False):
        self.root = Path(root)
        self.rehash = rehash
        self.say = say if say is not None else (lambda message: None)
        self.repairs = False  # set while a run holds the folder: only then is a damaged manifest rebuilt
        self.mirror = Mirror.of(self.root)  # None unless this is the working copy of a folder in a bucket
        self.location = self.mirror.uri if self.mirror is not None else str(self.root)  # what the user named

    def file(self, *parts: str) -> Path:
        """A path inside the run folder (for the report's files); ValueError for one that would
        land outside it. Names from the user's data go through `files.safe_name` first."""
        path = self.root.joinpath(*parts)
        if not path.resolve().is_relative_to(self.root.resolve()) or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"{path} is not inside the run folder {self.root}")
        return path

    # tables -----------------------------------------------------------------------------------
    def table_path(self, name: str) -> Path:
        """Table `name`'s file (a segmented table's is its `segment_folder`)."""
        return self.root / f"{name}.parquet"

    def segment_folder(self, name: str) -> Path:
        return self.root / name

    def has(self, name: str) -> bool:
        return self.table_path(name).exists() or self.segmented(name)

    def segmented(self, name: str) -> bool:
        """Whether table `name` is a folder of segments, not one file."""
        return self.segment_folder(name).is_dir()

    def segments(self, name: str) -> list[Path]:
        """The segment files of a segmented table, in order."""
        return sorted(p for p in self.segment_folder(name).iterdir() if SEGMENT.match(p.name))

    def _files(self, name: str) -> list[Path]:
        return self.segments(name) if self.segmented(name) else [self.table_path(name)]

    def read(self, name: str, columns: list[str] | None = None) -> pa.Table:
        tables = [pq.read_table(f, columns=columns) for f in self._files(name)]
        return pa.concat_tables(tables) if len(tables) != 1 else tables[0]

    def schema(self, name: str) -> pa.Schema:
        return pq.read_schema(self._files(name)[0])

    def num_rows(self, name: str) -> int:
        return sum(pq.ParquetFile(f).metadata.num_rows for f in self._files(name))

    def write(self, name: str, table: pa.Table) -> tuple[str, dict[str, Any]]:
        """Write a table atomically. Returns its content fingerprint (the manifest's `tables`, what
        later stages' fingerprints use) and its file record (the manifest's `files`: sha256 and size,
        what `verified` checks)."""
        fingerprint, record, _ = self.write_batches(name, table.schema, batches_of(table, ROW_GROUP_ROWS))
        return fingerprint, record

    def write_batches(
        self, name: str, schema: pa.Schema, batches, row_group_rows: int = ROW_GROUP_ROWS
    ) -> tuple[str, dict[str, Any], int]:
        """Write a table from an iterator of record batches without holding it whole (row groups
        as they come), to a temporary file renamed into place; its fingerprint goes into the file's
        metadata too. Row groups hold at most `row_group_rows` rows (a reader decodes one whole
        row group at a time: keep them small for wide rows). Returns the fingerprint, the file
        record and the row count."""
        return _write_file(self.table_path(name), schema, batches, row_group_rows)

    def write_segment(
        self, name: str, number: int, schema: pa.Schema, batches, row_group_rows: int = ROW_GROUP_ROWS
    ) -> dict[str, Any]:
        """Write segment `number` of table `name` (`write_batches`' way) and return its record:
        its file's name, fingerprint, rows, sha256 and size (what `segments_record` joins)."""
        path = self.segment_folder(name) / f"segment-{number:06d}.parquet"
        fingerprint, record, rows = _write_file(path, schema, batches, row_group_rows)
        return {"name": path.name, "fingerprint": fingerprint, "rows": rows, **record}

    def batches(
        self,
        name: str,
        columns: list[str] | None = None,
        batch_size: int = ROW_GROUP_ROWS,
        touches: Callable[[dict], bool] | None = None,
        ranged: list[str] | None = None,
    ):
        """Table `name` as record batches, in order, a row group at a time (for tables too big to read
        whole). With `touches` (`touched_row_groups` of its `ranged` columns), the row groups its
        footer rules out are not read."""
        for path in self._files(name):
            groups = None if touches is None else self.touched_row_groups(path, ranged or [], touches)
            if groups != []:
                yield from self.file_batches(path, columns, batch_size, row_groups=groups)

    def row_groups(self, name: str, newest_first: bool = False):
        """Table `name`'s row groups, in order (`newest_first`: a segmented table's last segment
        first, each segment's groups in order), each as a function of the columns to read of it,
        for a reader that looks at some columns of a group before it reads the others."""
        files = self._files(name)
        for path in reversed(files) if newest_first else files:
            source = pq.ParquetFile(path, pre_buffer=False)
            for group in range(source.num_row_groups):
                yield partial(source.read_row_group, group, use_threads=False)

    # The codec's readers, as the folder's own: a test or a benchmark watches or stubs a stage's reads here.
    file_batches = staticmethod(file_batches)
    column_ranges = staticmethod(column_ranges)

    @classmethod
    def touched_row_groups(cls, path: Path, columns: list[str], touches: Callable[[dict], bool]) -> list[int] | None:
        """The row groups of the file at `path` that may hold rows wanted: those whose least and
        greatest of `columns` (`column_ranges`) `touches` says may; None where the footer cannot be
        read (the file is read whole, and whoever reads it says it is damaged)."""
        ranges = cls.column_ranges(path, columns)
        return None if ranges is None else [g for g, group in enumerate(ranges) if touches(group)]

    def verified(self, name: str, record: dict | None) -> str | None:
        """None when table `name` is there and its file hashes as its `files` record says (for a
        segmented table: each segment the record lists); else what is wrong."""
        if record and "segments" in record:
            folder = self.segment_folder(name)
            for segment in record["segments"]:
                problem = _file_problem(folder / segment["name"], segment, self.rehash)
                if problem is not None:
                    return f"{folder.name}/{problem}"
            return None
        path = self.table_path(name)
        if not path.exists():
            return f"{path.name} is missing"
        if not record or "sha256" not in record:
            return f"{path.name} has no recorded hash"
        return _file_problem(path, record, self.rehash)

    def trusted(self, name: str) -> bool:
        """Whether table `name` is there as the last finished stage wrote it (it verifies): what an
        incremental stage may resume from. A table that is there but does not verify is said."""
        problem = self.verified(name, self.manifest().get("files", {}).get(name))
        if problem is not None and self.has(name):
            self.say(f"     [yellow]{problem}: its rows are not reused[/yellow]")
        return problem is None

    def previous(self, name: str) -> pa.Table | None:
        """Table `name` if it is `trusted`, else None."""
        return self.read(name) if self.trusted(name) else None

    def self_verified(self, name: str) -> tuple[str, dict[str, Any]] | None:
        """Table `name`'s fingerprint and file record, rebuilt from the file alone (the fingerprint
        it carries matches its rows; for a segmented table, each segment's), or None when it does
        not verify."""
        if self.segmented(name):
            found = [_self_verified(path) for path in self.segments(name)]
            if not found or any(f is None for f in found):
                return None
            record = segments_record(
                [
                    {"name": p.name, "fingerprint": f[0], "rows": f[2], **f[1]}
                    for p, f in zip(self.segments(name), found)
                ]
            )
            return record["fingerprint"], record["file"]
        found = _self_verified(self.table_path(name))
        return None if found is None else found[:2]

    def prune_segments(self, name: str) -> None:
        """Remove what of table `name` the manifest does not record: segment files a run wrote but
        was killed before recording (their rows are done again), and the one-file table a
        segmented one replaced. A no-op for a table that is neither."""
        record = self.manifest().get("files", {}).get(name) or {}
        if self.segmented(name):
            recorded = {s["name"] for s in record.get("segments", [])}
            for segment in self.segments(name):
                if segment.name not in recorded:
                    segment.unlink()
            if not recorded:
                shutil.rmtree(self.segment_folder(name))
        if "segments" in record:
            self.table_path(name).unlink(missing_ok=True)

    # partial results ----------------------------------------------------------------------------
    def _parts_dir(self, name: str) -> Path:
        return self.root / ".parts" / name

    def append_part(self, name: str, table: pa.Table) -> None:
        if table.num_rows:
            data = table_bytes(table)
            # Time-ordered names (a later attempt at a row sorts after an earlier one) that carry
            # the hash of their bytes, so a damaged part is told from a whole one.
            part = f"part-{time.time_ns():020d}-{hashlib.sha256(data).hexdigest()[:16]}.parquet"
            atomic_write_bytes(self._parts_dir(name) / part, data)
            if self.mirror is not None:
                self.mirror.push([self._parts_dir(name) / part])
            _pause_for_a_kill(name)

    def stored_bytes(self, name: str) -> int:
        """The bytes of table `name`'s files and of its parts so far (0: none)."""
        files = self._files(name) if self.has(name) else []
        return sum(f.stat().st_size for f in files) + self.parts_bytes(name)

    def parts_bytes(self, name: str, besides: set[str] | frozenset[str] = frozenset()) -> int:
        """The bytes of the parts table `name` has saved so far, but those named in `besides` (the
        `seen` of `iter_parts`: what a later call would read)."""
        return sum(f.stat().st_size for f in self._parts_dir(name).glob("part-*.parquet") if f.name not in besides)

    def iter_parts(
        self,
        name: str,
        schema: pa.Schema,
        columns: list[str] | None = None,
        seen: set[str] | None = None,
        discard: bool = True,
        keep: Callable[[Path], bool] | None = None,
    ):
        """Every whole part of table `name` (its `columns`), one table at a time in the order
        written; damaged ones are said and left out, and deleted unless `discard` is false (a look
        at the folder, as `vlm-decade status` takes, changes nothing in it). With `seen`, the parts
        named in it are passed over and those read are added to it: a later call reads only the
        parts saved since. With `keep`, a part for whose path it is false is passed over unread."""
        for f in sorted(self._parts_dir(name).glob("part-*.parquet")):
            if keep is not None and not keep(f):
                continue
            if seen is not None:
                if f.name in seen:
                    continue
                seen.add(f.name)
            found = PART.match(f.name)
            data = f.read_bytes()
            if found is None or hashlib.sha256(data).hexdigest()[:16] != found.group(2):
                fate = "discarded, its rows are done again" if discard else "left out (the next run discards it)"
                self.say(f"     [yellow]{name}: part {f.name} is damaged; {fate}[/yellow]")
                if discard:
                    f.unlink()
                continue
            table = pq.read_table(pa.BufferReader(data), columns=columns)
            yield table.cast(pa.schema([schema.field(c) for c in table.column_names]))

    def read_parts(
        self, name: str, schema: pa.Schema, columns: list[str] | None = None, discard: bool = True
    ) -> pa.Table:
        """Every whole part of table `name` (its `columns`), in the order written; damaged ones are
        left out (and deleted, unless `discard` is false: `iter_parts`)."""
        tables = list(self.iter_parts(name, schema, columns, discard=discard))
        if tables:
            return pa.concat_tables(tables)
        return (schema if columns is None else pa.schema([schema.field(c) for c in columns])).empty_table()

    def parts(self, name: str, schema: pa.Schema, rows: int = 1, seconds: float = 0.0, on_save=None) -> PartWriter:
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
        """The manifest. One that cannot be read raises ValueError, except while a run holds the
        folder (`lock`): then it is set aside (renamed, kept) and rebuilt from the tables that verify
        on their own; its stage records are lost, so every stage runs again, resuming from those
        tables."""
        if not self.manifest_path.exists():
            return {}
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            if isinstance(manifest, dict):
                return manifest
            problem: Exception = ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            problem = exc
        if not self.repairs:
            raise ValueError(f"not readable as JSON ({problem})")
        aside = self.manifest_path.with_name(f"manifest.json.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(self.manifest_path, aside)
        tables, files = {}, {}
        named = {p.stem for p in self.root.glob("*.parquet")} | {
            p.name for p in self.root.iterdir() if p.is_dir() and any(SEGMENT.match(f.name) for f in p.iterdir())
        }
        for name in sorted(named):
            found = self.self_verified(name)
            if found is not None:
                tables[name], files[name] = found
        self.say(
            f"[yellow]{self.manifest_path} could not be read: kept as {aside.name}; rebuilt from the "
            f"{len(tables)} tables that verify, and every stage runs again[/yellow]"
        )
        manifest = {"tables": tables, "files": files}
        self.save_manifest(manifest)
        return manifest

    def save_manifest(self, manifest: dict[str, Any]) -> None:
        atomic_write_bytes(
            self.manifest_path, (json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n").encode()
        )
        if self.mirror is not None and self.repairs:
            self.mirror.push()

    def update_manifest(self, **fields: Any) -> dict[str, Any]:
        manifest = self.manifest()
        manifest.update(fields)
        self.save_manifest(manifest)
        return manifest

    # one run at a time --------------------------------------------------------------------------
    @contextmanager
    def lock(self):
        """Hold the folder's exclusive lock for the `with` block; RunFolderBusy if a live process
        holds it. The lock file names its holder; the OS releases the lock when the holder dies, so
        a lock left by a killed run is taken over (and said)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
                raise RunFolderBusy(
                    f"{self.root} is in use by {holder}; wait for that run to end, or use another --out"
                ) from None
            left = os.pread(fd, 256, 0).decode(errors="replace").strip()
            if left:
                self.say(
                    f"[yellow]{self.root}: an earlier run ({left}) ended without releasing the folder; taking over[/yellow]"
                )
            me = f"pid {os.getpid()} on {socket.gethostname()}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, me.encode(), 0)
            pulled = False
            lease = Lease(self.mirror.uri, self.say) if self.mirror is not None else None
            try:
                if lease is not None:
                    self.mirror.check()  # a store that does not answer is said as such, not as a lease problem
                    try:
                        lease.take()
                    except LeaseHeld as exc:
                        raise RunFolderBusy(str(exc)) from None
                    count = self.mirror.pull()
                    pulled = True
                    if count:
                        self.say(f"{self.location}: {count} files brought into the working copy {self.root}")
                self.repairs = True
                yield
            finally:
                try:
                    if pulled:
                        self.mirror.push()  # what the run wrote since its last manifest save, however it ended
                finally:
                    if lease is not None:
                        lease.release()
                    os.ftruncate(fd, 0)
        finally:
            self.repairs = False
            os.close(fd)  # closing releases the lock


@dataclass(frozen=True)
class Kept:
    """What a run folder holds that a rerun does not redo: the stages finished (done, or incomplete
    with their rows kept), in the manifest's order, and by table the parts saved of unfinished stages."""

    stages: tuple[str, ...]
    parts: dict[str, list[Path]]


def kept(root: str | Path, manifest: dict[str, Any]) -> Kept:
    """What the run folder at `root`, whose manifest is `manifest`, keeps for a rerun (`Kept`)."""
    stages = manifest.get("stages")
    finished = tuple(
        name
        for name, record in (stages.items() if isinstance(stages, dict) else ())
        if isinstance(record, dict) and record.get("state") in ("done", "incomplete")
    )
    tables = sorted(p for p in (Path(root) / ".parts").glob("*") if p.is_dir())
    return Kept(finished, {table.name: sorted(table.glob("part-*.parquet")) for table in tables})


def open_run_folder(location: str | Path) -> tuple[RunFolder, dict[str, Any]]:
    """The run folder a command reads (`report`, `view`, `status`, `cancel`) and its manifest. A run
    folder in a bucket (a URI) is first brought into its local working copy. A location that holds no
    run, and a manifest that cannot be read or records no study, are an InputError naming the file."""
    text = str(location)
    if is_uri(text):
        problem = uri_problem(text)
        if problem is not None:
            raise InputError([Problem(text, problem, field="RUN_DIR")])
        root = working_copy(text)
        Mirror(root).pull()
    else:
        root = Path(location)
    folder = RunFolder(root)
    where = str(folder.manifest_path)
    if not folder.root.is_dir():
        raise InputError([Problem(where, "no run here (no such folder)")])
    if folder.manifest_path.is_dir():
        raise InputError([Problem(where, "is a folder, not a file")])
    try:
        manifest = folder.manifest()
    except ValueError as exc:  # cut short or overwritten
        raise InputError([Problem(where, f"damaged: {exc}")]) from None
    except OSError as exc:
        raise InputError([Problem(where, f"cannot be read: {exc.strerror or exc}")]) from None
    if "config" not in manifest:
        raise InputError([Problem(where, "no run here (manifest.json missing, empty or without the study's config)")])
    if not isinstance(manifest["config"], dict):
        raise InputError([Problem(where, "damaged: the study's config is not a mapping", field="config")])
    return folder, manifest


class PartWriter:
    """Finished rows of an incremental stage, saved as parts: whenever `rows` rows or `seconds` have
    gathered, and on leaving the `with` block (an exception included), so what is done is kept.
    `add` takes rows as dicts or as an Arrow table; `on_save` runs after each part is saved (the API
    stages record the money spent then)."""

    def __init__(self, folder: RunFolder, name: str, schema: pa.Schema, rows: int, seconds: float, on_save=None):
        self.folder, self.name, self.schema = folder, name, schema
        self.rows, self.seconds, self.on_save = rows, seconds, on_save
        self.buffer: list[pa.Table] = []
        self.count = 0
        self.since = time.monotonic()

    def add(self, rows: list[dict] | pa.Table) -> None:
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows, schema=self.schema)
        self.buffer.append(table)
        self.count += table.num_rows
        if self.count >= self.rows or time.monotonic() - self.since >= self.seconds:
            self.save()

    def save(self) -> None:
        if self.count:
            self.folder.append_part(self.name, pa.concat_tables(self.buffer))
            self.buffer, self.count = [], 0
            if self.on_save is not None:
                self.on_save()
        self.since = time.monotonic()

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.save()
