"""Files by location: a local path or an object-storage URI (`s3://bucket/key`, `gs://...`), read
through pyarrow.fs, so the workers of a cluster need no shared disk. Each store's SDK finds
credentials, region and endpoint in the environment as it always does (`AWS_ACCESS_KEY_ID`,
`AWS_ENDPOINT_URL`, `AWS_EC2_METADATA_DISABLED`, `GOOGLE_APPLICATION_CREDENTIALS`,
`STORAGE_EMULATOR_HOST` for a GCS emulator, ...); nothing of them is stored. A location may also
name one image inside a tar or Parquet shard (`members`): it is read with one ranged read of the
shard, and its size and time are the shard's.
"""

from __future__ import annotations

import os
import posixpath
import re
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs

from vlm_decade.core.errors import StoreError
from vlm_decade.core.storage.members import ARROW, Member
from vlm_decade.core.storage.members import parse as parse_member
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
    if not uri[len(scheme) + 3 :].split("/", 1)[0]:
        return "the URI names no bucket"
    return None


def join(folder: str | Path, name: str) -> str:
    """The location of `name` inside `folder`. Under a URI, `.` and `..` are resolved as a local path's
    would be, so `a/../b.png` and `b.png` are the same object."""
    if not is_uri(folder):
        return os.path.abspath(os.path.join(folder, name))  # as `Path(folder) / name` would, at a twentieth of the cost
    scheme, rest = folder.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    key = posixpath.normpath(posixpath.join("/", prefix, name)).lstrip("/")
    return f"{scheme}://{bucket}/{key}"


# Google's client libraries take a GCS emulator's address from this variable (pyarrow's does not); an
# emulator takes no credentials. S3's counterpart, AWS_ENDPOINT_URL, pyarrow reads itself.
GCS_EMULATOR = "STORAGE_EMULATOR_HOST"


def gcs_emulator() -> tuple[str, str] | None:
    """(scheme, host:port) of the GCS emulator named by $STORAGE_EMULATOR_HOST, or None."""
    address = os.environ.get(GCS_EMULATOR, "")
    if not address:
        return None
    scheme, _, host = address.rpartition("://")
    return scheme or "http", host.rstrip("/")


@cache
def _store(scheme: str, bucket: str) -> fs.FileSystem:
    emulator = gcs_emulator() if scheme == "gs" else None
    if emulator is not None:
        return fs.GcsFileSystem(endpoint_override=emulator[1], scheme=emulator[0], anonymous=True)
    return fs.FileSystem.from_uri(f"{scheme}://{bucket}")[0]  # one client per bucket and process


def locate(uri: str) -> tuple[fs.FileSystem, str]:
    """The store that holds the object at `uri`, and the object's path in it (bucket/key)."""
    scheme, rest = uri.split("://", 1)
    return _store(scheme.lower(), rest.split("/", 1)[0]), rest.rstrip("/")


def _info(uri: str) -> fs.FileInfo:
    store, key = locate(uri)
    return store.get_file_info(key)


def file_problem(location: str | Path) -> str | None:
    """Why `location` cannot be read as a file (missing, a folder, not a regular file, a store that
    cannot be reached), or None. Of a shard's member: its shard's, or that the member lies past the
    shard's end."""
    member = shard_member(location)
    if member is not None:
        # A bucket's shard is asked once (its size), not twice; a local one is checked first (a FIFO would block).
        problem = None if is_uri(member.shard) else file_problem(member.shard)
        if problem is not None:
            return problem
        try:
            size = stat(member.shard)[0]
        except (OSError, ValueError):
            return file_problem(member.shard) or "cannot be read"
        if member.column is None and size < member.offset + member.size:
            return f"member {member.name} lies past the end of shard {member.shard} (changed since it was recorded?)"
        return None
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
    """Whether `location` is a folder (under a URI: a bucket, or a prefix that holds objects);
    StoreError when the store cannot be asked."""
    if not is_uri(location):
        return Path(location).is_dir()
    if uri_problem(str(location)) is not None:
        return False
    try:
        return _info(str(location)).type == fs.FileType.Directory
    except OSError as exc:  # the store did not answer: not the user's input, so not "not found"
        raise StoreError(f"{location}: could not look into the bucket: {exc}") from None


def stat(location: str | Path) -> tuple[int, int]:
    """(size in bytes, modification time in ns) of a file (of a shard's member: of its shard); OSError
    when it cannot be read."""
    member = shard_member(location)
    if member is not None:
        return stat(member.shard)
    if not is_uri(location):
        st = os.stat(location)
        return st.st_size, st.st_mtime_ns
    info = _info(str(location))
    if info.type != fs.FileType.File:
        raise FileNotFoundError(str(location))
    return info.size, info.mtime_ns or 0


def read_bytes(location: str | Path) -> bytes:
    """A file's whole content, or a shard member's; OSError when it cannot be read."""
    member = shard_member(location)
    if member is not None:
        return _member_bytes(member)
    if not is_uri(location):
        with open(location, "rb") as fh:
            return fh.read()
    store, key = locate(str(location))
    with store.open_input_stream(key) as stream:
        return stream.read()


def shard_member(location: str | Path) -> Member | None:
    """The shard member `location` names; None for a file, a local file whose own name merely looks
    like a member's (`x.tar#a@1+2`) included."""
    member = parse_member(location)
    if member is not None and not is_uri(location) and os.path.lexists(location):
        return None
    return member


def open_file(location: str):
    """A file opened for random access (seek, ranged reads): a local file, or an object through pyarrow.fs."""
    if not is_uri(location):
        return open(location, "rb")
    store, key = locate(location)
    return store.open_input_file(key)


def _member_bytes(member: Member) -> bytes:
    """One ranged read of a tar member's data, or one row group's image column of a Parquet shard, or
    one record batch's of an Arrow file."""
    if member.shard.endswith(ARROW):
        return _arrow_bytes(member)
    with open_file(member.shard) as fh:
        if member.column is None:
            fh.seek(member.offset)
            data = fh.read(member.size)
            if len(data) != member.size:
                raise OSError(f"member {member.name} lies past the end of shard {member.shard}")
            return data
        try:
            column = pq.ParquetFile(fh).read_row_group(member.offset, columns=[member.column]).column(0)
            value = column[member.size].as_py()
        except (ValueError, IndexError, KeyError, TypeError) as exc:  # pyarrow's errors are ValueErrors
            raise OSError(f"{member.name} cannot be read from shard {member.shard}: {exc}") from None
    return _image_bytes(member, value)


def _arrow_bytes(member: Member) -> bytes:
    """The image of one row of an Arrow IPC stream file (`save_to_disk`'s): its batches are walked to
    the member's, which a memory map makes a matter of reading their headers."""
    with pa.memory_map(member.shard) if not is_uri(member.shard) else open_file(member.shard) as source:
        try:
            reader = pa.ipc.open_stream(source)
            for _ in range(member.offset):
                reader.read_next_batch()
            value = reader.read_next_batch().column(member.column)[member.size].as_py()
        except (StopIteration, ValueError, IndexError, KeyError, TypeError) as exc:
            raise OSError(f"{member.name} cannot be read from {member.shard}: {exc or 'no such batch'}") from None
    return _image_bytes(member, value)


def _image_bytes(member: Member, value) -> bytes:
    data = value.get("bytes") if isinstance(value, dict) else value
    if not isinstance(data, bytes):
        raise OSError(f"{member.name}: shard {member.shard} holds no image bytes at row {member.size}")
    return data
