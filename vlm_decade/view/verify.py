"""What the viewer may show, checked before it is shown.

- A table is read only while its file hashes as the manifest recorded when the run wrote it
  (`files`). The check hashes the file once per state of the table and the manifest (size,
  modification time, inode), so a large run opens fast and a table edited while the viewer runs is
  noticed at the next request.
- An image is read only from the path a verified images table records, and only while its bytes
  hash to the sha256 recorded beside it.
- A cache file under `.view/` is opened only as a regular file in a real folder inside `.view/`: no
  link is followed, neither the entry (`O_NOFOLLOW`) nor a folder on the way (checked with `lstat`).
- Cache file names are built from checked hex digests and fixed tags only, never from table text.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from pathlib import Path

import duckdb

from vlm_decade.core import storage
from vlm_decade.core.files import atomic_write_bytes
from vlm_decade.core.runfolder import RunFolder

CACHE = ".view"  # thumbnails, variants and heat maps made on demand, inside the run folder
CACHE_FOLDERS = ("thumbs", "variants", "heatmaps")
SHA256 = re.compile(r"[0-9a-f]{64}")
PARSED_QUERIES = 1024  # the queries whose tables are remembered (a page's differ only in its ids and offset)
CACHE_NAME = re.compile(r"[0-9a-f]{64}-[0-9a-z]{1,32}\.(jpg|png)")


class Unverified(Exception):
    """A table of the run does not match the manifest's record of it: the viewer shows nothing from it."""


class Missing(Exception):
    """The image file the run lists cannot be shown (moved, deleted, not an image, not the bytes the run hashed)."""


def _state(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


class TableCheck:
    """The tables of one run folder, each checked against the manifest's file record before it is read."""

    def __init__(self, folder: RunFolder):
        self.folder = folder
        self._known: dict[str, tuple[tuple, str | None]] = {}  # table -> (state of table and manifest, problem)
        self._lock = threading.Lock()
        # Queries are parsed on a connection that has no tables: where the names are views, DuckDB
        # reports the files behind them rather than the names.
        self._parsed: dict[str, frozenset[str]] = {}  # query -> the tables it reads
        self._parser = duckdb.connect(
            ":memory:", config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
        )

    def problem(self, name: str) -> str | None:
        """None when table `name` hashes as the manifest records; else what is wrong."""
        # One check at a time: requests that arrive while a large table is hashed wait for its answer
        # instead of hashing it again.
        with self._lock:
            state = (_state(self.folder.table_path(name)), _state(self.folder.manifest_path))
            known = self._known.get(name)
            if known is not None and known[0] == state:
                return known[1]
            try:
                record = self.folder.manifest().get("files", {}).get(name)
                problem = self.folder.verified(name, record if isinstance(record, dict) else None)
            except (ValueError, OSError, KeyError, TypeError, AttributeError) as exc:
                problem = f"{self.folder.manifest_path.name} cannot be read for {name}'s record ({exc})"
            self._known[name] = (state, problem)
            return problem

    def require_for(self, sql: str) -> None:
        """Raise Unverified when a table that query `sql` reads does not verify."""
        with self._lock:
            names = self._parsed.get(sql)
            if names is None:
                if len(self._parsed) >= PARSED_QUERIES:
                    self._parsed.clear()
                # The parser takes no parameters; the view's queries hold `?` only as parameters, never in text.
                names = self._parsed[sql] = frozenset(self._parser.get_table_names(sql.replace("?", "NULL")))
        self.require(names)

    def require(self, names) -> None:
        """Raise Unverified for the first of `names` that does not verify."""
        for name in sorted(names):
            problem = self.problem(name)
            if problem is not None:
                raise Unverified(f"{problem}: the view shows no data from it until the run writes it again")


def image_digest(image: dict) -> str:
    """The image's recorded sha256, checked to be one (it names the cache files); raises Missing."""
    digest = image.get("sha256")
    if not isinstance(digest, str) or not SHA256.fullmatch(digest):
        raise Missing(f"{image.get('image_id')}: the run records no valid sha256 for it")
    return digest


def image_bytes(image: dict) -> bytes:
    """The bytes of the image file at its recorded path, when they hash to its recorded sha256;
    raises Missing otherwise."""
    digest, path = image_digest(image), image.get("path")
    if not isinstance(path, str) or not path:
        raise Missing("the run records no path for it")
    problem = storage.file_problem(path)  # before reading: a FIFO or a folder would block or fail
    if problem is not None:
        raise Missing(f"{path}: {problem}")
    try:
        data = storage.read_bytes(path)
    except (OSError, ValueError) as exc:
        raise Missing(f"{path}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise Missing(f"{path}: not the file the run recorded (its bytes do not match the recorded sha256)")
    return data


def _cache_folder(root: Path, folder: str, make: bool) -> Path | None:
    """`.view/<folder>` as a real folder inside the run (made first if `make`), or None where it is
    absent or any part of it is a link or not a folder."""
    if folder not in CACHE_FOLDERS:
        raise ValueError(f"no cache folder {folder!r}")
    path = root.resolve()
    for part in (CACHE, folder):
        path = path / part
        try:
            if make:
                os.mkdir(path)
        except FileExistsError:
            pass
        except OSError:
            return None
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return None
        except OSError:
            return None
    return path


def _checked_name(name: str) -> str:
    if not CACHE_NAME.fullmatch(name):
        raise ValueError(f"not a cache file name: {name!r}")
    return name


def read_cached(root: Path, folder: str, name: str) -> bytes | None:
    """The bytes of cache entry `.view/<folder>/<name>` when it is a regular file there, else None."""
    where = _cache_folder(root, folder, make=False)
    if where is None:
        return None
    try:
        fd = os.open(where / _checked_name(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return fh.read()


def write_cached(root: Path, folder: str, name: str, data: bytes) -> None:
    """Save a cache entry; the rename replaces a link or stray file of that name rather than
    writing through it. Where `.view/` cannot be made or written, nothing is saved."""
    where = _cache_folder(root, folder, make=True)
    if where is None:
        return
    try:
        atomic_write_bytes(where / _checked_name(name), data)
    except OSError:
        pass
