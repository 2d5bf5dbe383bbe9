"""Files written whole, hashed and named safely: the one way anything in the package writes a file.

A file is written to a temporary name in its own folder, synced to the disk and renamed into place,
and the folder is synced after the rename, so a reader (or a run after SIGKILL or a power cut) sees
the old file or the new one, never half of one. The temporary file is created with `FILE_MODE` and
the kernel takes this process's umask off it, so a written file gets the permissions any other new
file of the process gets (mkstemp alone would give 0600). A temporary file is named
`.<name>.<random>.tmp`, beside the file it becomes (a name the run folder's mirror never copies:
`core.storage.mirror`).

This is the bottom of the package: it imports nothing of it.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path

FILE_MODE = 0o666  # asked of the kernel for every new file; the umask is taken off it


def _temporary(path: Path) -> tuple[int, Path]:
    """A new temporary file beside `path`, opened for writing, that no other writer has."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), FILE_MODE), tmp
        except FileExistsError:
            continue


def _sync_folder(folder: Path) -> None:
    """Make a rename inside `folder` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse to sync a folder; the file itself is synced
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | Path):
    """A binary file to write `path` through: a temporary file in the same folder, synced and renamed
    into place when the block ends, removed if the block fails, so `path` is the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temporary(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` whole (`atomic_file`)."""
    with atomic_file(path) as fh:
        fh.write(data)


def write_if_changed(path: str | Path, data: bytes) -> bool:
    """Write `path` whole unless it already holds exactly these bytes; True if written."""
    path = Path(path)
    if path.is_file() and path.read_bytes() == data:
        return False
    atomic_write_bytes(path, data)
    return True


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, read a block at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """A file name for a name from the user's data (an image id, a model, encoder or metric name):
    letters, digits, '.', '_' and '-' only, never '.' or '..' or hidden, at most 80 characters. A name
    that had to change gets a short hash of the original, so two names never share a file."""
    cleaned = _UNSAFE.sub("_", text).lstrip(".")[:64]
    if cleaned == text and cleaned:
        return cleaned
    return f"{cleaned or 'name'}-{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"
