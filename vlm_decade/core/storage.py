"""Where images are read from: a local path, or an object-storage URI (`s3://bucket/key`,
`gs://bucket/key`) read through pyarrow.fs, so the workers of a cluster need no shared disk.

Each store's SDK finds credentials, region and endpoint in the environment as it always does
(`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `AWS_EC2_METADATA_DISABLED`, `GOOGLE_APPLICATION_CREDENTIALS`,
...); nothing is stored in the run folder. A location is text: a URI as given, a local path made
absolute. The run folder itself stays on a local or shared disk (docs/cluster.md).
"""

from __future__ import annotations

import io
import os
import posixpath
import re
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

from pyarrow import fs

from vlm_decade.core.tables import regular_file_problem

SCHEMES = ("s3", "gs")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_uri(location: str | Path) -> bool:
    """Whether `location` names an object (`scheme://...`) rather than a local path."""
    return isinstance(location, str) and _URI.match(location) is not None


def uri_problem(uri: str) -> str | None:
    """Why `uri` cannot name an image folder or file (an unsupported scheme, no bucket), or None."""
    scheme = _URI.match(uri).group(1).lower()
    if scheme not in SCHEMES:
        return f"'{scheme}://' is not supported: use a local path, s3:// or gs://"
    if not uri[len(scheme) + 3:].split("/", 1)[0]:
        return "the URI names no bucket"
    return None


def join(folder: str | Path, name: str) -> str:
    """The location of `name` inside `folder`. Under a URI, `.` and `..` are resolved as a local path's
    would be, so `a/../b.png` and `b.png` are the same object."""
    if not is_uri(folder):
        return os.path.abspath(Path(folder) / name)
    scheme, rest = folder.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    key = posixpath.normpath(posixpath.join("/", prefix, name)).lstrip("/")
    return f"{scheme}://{bucket}/{key}"


@lru_cache(maxsize=None)
def _store(scheme: str, bucket: str) -> fs.FileSystem:
    return fs.FileSystem.from_uri(f"{scheme}://{bucket}")[0]  # one client per bucket and process


def _object(uri: str) -> tuple[fs.FileSystem, str]:
    scheme, rest = uri.split("://", 1)
    return _store(scheme.lower(), rest.split("/", 1)[0]), rest.rstrip("/")


def _info(uri: str) -> fs.FileInfo:
    store, key = _object(uri)
    return store.get_file_info(key)


def file_problem(location: str | Path) -> str | None:
    """Why `location` cannot be read as a file (missing, a folder, not a regular file, a store that
    cannot be reached), or None."""
    if not is_uri(location):
        return regular_file_problem(location)
    problem = uri_problem(str(location))
    if problem is not None:
        return problem
    try:
        kind = _info(str(location)).type
    except OSError as exc:
        return f"cannot be read: {exc}"
    if kind == fs.FileType.NotFound:
        return "not found"
    if kind == fs.FileType.Directory:
        return "is a folder, not a file"
    return None


def is_folder(location: str | Path) -> bool:
    """Whether `location` is a folder (under a URI: a bucket, or a prefix that holds objects)."""
    if not is_uri(location):
        return Path(location).is_dir()
    if uri_problem(str(location)) is not None:
        return False
    try:
        return _info(str(location)).type == fs.FileType.Directory
    except OSError:
        return False


def stat(location: str | Path) -> tuple[int, int]:
    """(size in bytes, modification time in ns) of a file; OSError when it cannot be read."""
    if not is_uri(location):
        st = os.stat(location)
        return st.st_size, st.st_mtime_ns
    info = _info(str(location))
    if info.type != fs.FileType.File:
        raise FileNotFoundError(str(location))
    return info.size, info.mtime_ns or 0


def read_bytes(location: str | Path) -> bytes:
    """A file's whole content; OSError when it cannot be read."""
    if not is_uri(location):
        with open(location, "rb") as fh:
            return fh.read()
    store, key = _object(str(location))
    with store.open_input_stream(key) as stream:
        return stream.read()


def open_file(location: str | Path) -> BinaryIO:
    """A file opened for reading: a local file as it is, an object read into memory."""
    if not is_uri(location):
        return open(location, "rb")
    return io.BytesIO(read_bytes(location))
