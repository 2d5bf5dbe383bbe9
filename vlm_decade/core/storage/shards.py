"""Image shards: WebDataset tar shards and Parquet shards with image bytes, local or in a bucket,
read as a stream of (key, member, bytes), never unpacked to files (docs/data-format.md, "Shards").

- `expand` turns a study's `data.shards` (a brace pattern such as `train-{000000..000009}.tar`, with
  zero-padded ranges and comma lists, or a list of such) into shard locations, in order;
- `read_shard` streams one shard: a tar header by header over the file or a pyarrow.fs input stream
  (one sequential read, as a bucket serves best), a Parquet file a row group at a time.

A tar's members are grouped by key as WebDataset does: the member name up to the first dot after
its last `/` (`images/0001.jpg` and `images/0001.txt` are key `images/0001`); a key's image is its
member with an image extension (IMAGE_EXTENSIONS), its other members (captions, JSON) are not read
here. A Parquet shard's key column is `key_column`, else the first of KEY_COLUMNS it has; its image
column `image_column`, else the first of IMAGE_COLUMNS: binary, or a Hugging Face image struct
`{bytes, path}`. Each image comes with its `members.Member`, whose location reads it back alone.

The tar reader is this module's own (`_TarReader`: ustar, GNU and pax headers, as `tarfile` reads
them; a test holds it to `tarfile`), not `tarfile` itself, whose per-member Python cost as much as
decoding a small image, nor the `webdataset` library: it needs no further dependency, streams from
every store `objects` opens, and gives each member's data offset, which is what reading one image
back by a ranged read needs.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import PlainValidator, WithJsonSchema

from vlm_decade.core.storage.members import PARQUET, TAR, Member, parquet_row, tar_member
from vlm_decade.core.storage.objects import is_uri, locate, open_file, stat, uri_problem

IMAGE_EXTENSIONS = frozenset(("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm", "pnm"))
KEY_COLUMNS = ("__key__", "key", "image_id")
IMAGE_COLUMNS = ("image", "jpg", "png", "webp", "img", "image_bytes")
MAX_SHARDS = 1_000_000  # what one pattern may expand to: a typo such as {0..99999999} is refused, not listed
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")
_KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # WebDataset's: key, then every extension after its first dot


class ShardError(Exception):
    """A shard that cannot be read to its end, or is no shard of images; the message names it."""


def expand(shards: str | list[str]) -> list[str]:
    """Every shard location a pattern (or each of a list of patterns) names, in order; ValueError for
    a brace that expands to nothing or to more than MAX_SHARDS, or a name that is no .tar or .parquet."""
    patterns = [shards] if isinstance(shards, str) else list(shards)
    out: list[str] = []
    for pattern in patterns:
        out.extend(_expand(pattern, MAX_SHARDS - len(out)))
    for location in out:
        if not location.endswith((TAR, PARQUET)):
            raise ValueError(f"'{location}' is no shard: a shard is an uncompressed .tar or a .parquet file")
    return out


def _expand(pattern: str, room: int) -> list[str]:
    found = _BRACE.search(pattern)
    if found is None:
        return [pattern]
    body, head, tail = found[1], pattern[: found.start()], pattern[found.end() :]
    numbers = _RANGE.match(body)
    if numbers is not None:
        first, last = numbers[1], numbers[2]
        width = len(first) if first.startswith("0") or len(first) == len(last) else 0
        step = 1 if int(last) >= int(first) else -1
        count = abs(int(last) - int(first)) + 1
        if count > room:
            raise ValueError(f"'{pattern}' names more than {MAX_SHARDS} shards")
        choices = [str(n).zfill(width) for n in range(int(first), int(last) + step, step)]
    elif "," in body:
        choices = body.split(",")
    else:
        raise ValueError(f"'{{{body}}}' in '{pattern}' is neither a range {{000..009}} nor a list {{a,b}}")
    out: list[str] = []
    for choice in choices:
        out.extend(_expand(head + choice + tail, room - len(out)))
        if len(out) > room:
            raise ValueError(f"'{pattern}' names more than {MAX_SHARDS} shards")
    return out


def _patterns(value: Any) -> list[str]:
    values = [value] if isinstance(value, (str, Path)) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, (str, Path)) for v in values):
        raise ValueError("give a shard pattern (text, e.g. shards/train-{000000..000009}.tar) or a list of them")
    patterns = [str(v) for v in values]
    for pattern in patterns:
        problem = uri_problem(pattern) if is_uri(pattern) else None
        if problem is not None:
            raise ValueError(problem)
    expand(patterns)  # its braces and names, checked here: the study file is refused before anything is read
    return patterns


# A study's `data.shards`: a brace pattern or a list of them, each a path (made absolute against the
# study file's folder, as every path of it is) or an s3:// or gs:// URI; kept as patterns.
ShardPatterns = Annotated[
    list[Path],  # its text in the field tables; a single pattern is taken too
    PlainValidator(_patterns),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
]


def split_key(name: str) -> tuple[str, str] | None:
    """(key, extension) of a tar member's name, as WebDataset groups members; None for a name with
    no extension (or a hidden file such as `._0001.jpg`), which holds no sample."""
    found = _KEY.match(name)
    return (found[1], found[2]) if found else None


def read_shard(
    shard: str, key_column: str | None = None, image_column: str | None = None
) -> Iterator[tuple[str, Member, bytes]]:
    """(key, member, image bytes) of each image in a shard, in the shard's order. ShardError, once
    the images before it are given, when the shard cannot be read to its end (a truncated tar) or
    has no key or image column (Parquet); OSError when it cannot be opened."""
    try:
        if shard.endswith(PARQUET):
            yield from _parquet_images(shard, key_column, image_column)
        else:
            yield from _tar_images(shard)
    except ValueError as exc:  # a member whose location would not read back as it
        raise ShardError(str(exc)) from None


def _tar_images(shard: str) -> Iterator[tuple[str, Member, bytes]]:
    last = None
    size = stat(shard)[0]
    if is_uri(shard):
        store, key = locate(shard)
        stream = store.open_input_stream(key)  # sequential: no seek, one request for the whole shard
    else:
        stream = open(shard, "rb", buffering=1 << 20)
    with stream:
        reader = _TarReader(stream)
        try:
            for name, offset, data in reader.files(_is_image):
                last = name
                yield split_key(name)[0], tar_member(shard, name, offset, len(data)), data
        except _Damaged as exc:
            raise ShardError(_damaged(shard, last, str(exc))) from None
    # A header cut short, or none where one is due, ends the members as the archive's end would: a
    # shard with no end-of-archive block after its last member was cut.
    if size - reader.end < _BLOCK:
        raise ShardError(_damaged(shard, last, f"it ends at byte {size} with no end-of-archive block"))


def _is_image(name: str) -> bool:
    named = split_key(name)
    return named is not None and named[1].lower() in IMAGE_EXTENSIONS


class _Damaged(Exception):
    """A tar that cannot be read on (the message says why)."""


class _TarReader:
    """The regular files of a tar stream, read in one pass: POSIX ustar, GNU (long names) and pax
    headers, as `tarfile` reads them, at a tenth of its cost a member (the per-member Python of
    `tarfile.TarInfo` is most of a small image's reading). `end`: where the end-of-archive blocks
    begin, or where the members stopped (a header cut short)."""

    def __init__(self, stream):
        self.stream = stream
        self.end = 0
        self._at = 0

    def _read(self, n: int) -> bytes:
        data = self._some(n)
        if len(data) < n:
            raise _Damaged("unexpected end of data")
        self._at += n
        return data

    def _some(self, n: int) -> bytes:
        """Up to `n` bytes, fewer only at the stream's end (a stream may give less than asked before it)."""
        data = self.stream.read(n)
        while len(data) < n:
            more = self.stream.read(n - len(data))
            if not more:
                break
            data += more
        return data

    def files(self, wanted: Callable[[str], bool]) -> Iterator[tuple[str, int, bytes]]:
        """(name, data offset, data) of each regular file whose name is `wanted`, in order."""
        pax: dict[str, str] = {}  # the global pax records (`g`), for every later member
        extra: dict[str, str] = {}  # what a pax (`x`) or GNU long-name (`L`) header says of the next
        while True:
            header = self._some(_BLOCK)
            if len(header) < _BLOCK or header.count(0) == _BLOCK:
                self.end = self._at  # the end, or a header cut short (which `_tar_images` refuses)
                return
            self._at += _BLOCK
            kind, name, size = _header(header, self._at - _BLOCK)
            if kind in (b"x", b"g", b"L", b"K"):
                data = self._read(size + (-size % _BLOCK))[:size]
                if kind == b"L":
                    extra["path"] = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif kind != b"K":
                    (extra if kind == b"x" else pax).update(_pax_records(data, self._at))
                continue
            if kind == b"S":
                raise _Damaged(f"member {name} is a GNU sparse file, which no image shard holds")
            said, extra = pax | extra, {}
            name = said.get("path", name)
            if "size" in said:
                size = int(said["size"])
            regular = kind in _REGULAR and not (kind == b"\0" and name.endswith("/"))
            if not regular and kind in _SUPPORTED:
                continue  # a directory, link or device: no data follows
            offset, data = self._at, self._read(size + (-size % _BLOCK))
            if regular and wanted(name):
                yield name, offset, data[:size]


_BLOCK = tarfile.BLOCKSIZE
_REGULAR = (b"0", b"\0", b"7")
_SUPPORTED = (*_REGULAR, b"1", b"2", b"3", b"4", b"5", b"6")


def _header(block: bytes, at: int) -> tuple[bytes, str, int]:
    """(type, name, size) of one tar header block at byte `at`; _Damaged for a bad checksum."""
    try:
        stored = _number(block[148:156])
        size = _number(block[124:136])
    except ValueError:
        raise _Damaged(f"invalid header at byte {at}") from None
    unsigned = sum(block) - sum(block[148:156]) + 8 * 32  # the checksum field counts as spaces
    if stored != unsigned and stored != unsigned - 256 * sum(b >= 128 for b in block[:148] + block[156:]):
        raise _Damaged(f"bad checksum in the header at byte {at}")
    kind = block[156:157]
    name = block[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    prefix = block[345:500].split(b"\0", 1)[0]
    if prefix and kind not in (b"L", b"K", b"S"):
        name = prefix.decode("utf-8", "surrogateescape") + "/" + name
    if kind == b"5" or (kind == b"\0" and name.endswith("/")):
        name = name.rstrip("/")
    return kind, name, size


def _number(field: bytes) -> int:
    """A header's number: octal text, or GNU's base-256 (first byte 0x80, or 0xff when negative)."""
    if field[:1] in (b"\x80", b"\xff"):
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[0] == 0xFF else n
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def _pax_records(data: bytes, at: int) -> dict[str, str]:
    """The `length key=value\\n` records of a pax header's data."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise _Damaged(f"invalid pax header before byte {at}") from None
        key, equals, value = data[space + 1 : pos + length - 1].partition(b"=")
        if length < 1 or not equals or data[pos + length - 1 : pos + length] != b"\n":
            raise _Damaged(f"invalid pax header before byte {at}")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _damaged(shard: str, last: str | None, why: str) -> str:
    after = f" after member {last}" if last else ""
    return f"{shard}: not a readable tar shard (truncated or damaged{after}: {why})"


def _parquet_images(
    shard: str, key_column: str | None, image_column: str | None
) -> Iterator[tuple[str, Member, bytes]]:
    with open_file(shard) as fh:
        try:
            parquet = pq.ParquetFile(fh)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ShardError(f"{shard}: not a readable Parquet shard ({exc})") from None
        names = parquet.schema_arrow.names
        key = _column(shard, names, key_column, KEY_COLUMNS, "key")
        image = _column(shard, names, image_column, IMAGE_COLUMNS, "image")
        for group in range(parquet.num_row_groups):
            try:
                rows = parquet.read_row_group(group, columns=[key, image])
            except (pa.ArrowInvalid, OSError) as exc:
                raise ShardError(f"{shard}: row group {group} cannot be read ({exc})") from None
            images = rows.column(1)
            if pa.types.is_struct(images.type):
                if images.type.get_field_index("bytes") < 0:
                    raise ShardError(f"{shard}: image column '{image}' is a struct without a `bytes` field")
                images = pc.struct_field(images, "bytes")
            if not (pa.types.is_binary(images.type) or pa.types.is_large_binary(images.type)):
                raise ShardError(f"{shard}: image column '{image}' holds {images.type}, not image bytes")
            for row, (name, data) in enumerate(zip(rows.column(0).to_pylist(), images.to_pylist())):
                name = "" if name is None else str(name)
                yield name, parquet_row(shard, name, image, group, row), data or b""


def _column(shard: str, names: list[str], given: str | None, usual: tuple[str, ...], what: str) -> str:
    if given is not None:
        if given not in names:
            raise ShardError(f"{shard}: has no {what} column '{given}' (its columns: {', '.join(names)})")
        return given
    for name in usual:
        if name in names:
            return name
    raise ShardError(
        f"{shard}: has no {what} column ({' or '.join(usual)}; its columns: {', '.join(names)}): name it in the study file"
    )
