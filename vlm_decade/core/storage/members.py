"""Where one image lies inside a shard: the location the run folder records as an image's `path`
when the images come from WebDataset tar shards or Parquet shards (docs/data-format.md, "Shards").

A location names the shard, the member and what a single ranged read needs, so that every reader
(the images check, the models through `imaging.decode.load_image`, the viewer) reads one image
without streaming its shard:

- tar: `<shard>.tar#<member name>@<offset>+<size>`: the member's data begins `offset` bytes into the
  shard (tarfile's `TarInfo.offset_data`) and is `size` bytes long;
- Parquet: `<shard>.parquet#<key>@<row group>:<row>:<column>`: the image is row `row` of row group
  `row group`, in column `column` (binary, or a struct whose `bytes` field holds them);
- Arrow (a Hugging Face `save_to_disk` file, an IPC stream): `<file>.arrow#<key>@<batch>:<row>:<column>`,
  the record batch in place of the row group.

A location is one only when the shard part ends in `.tar`, `.parquet` or `.arrow` and the suffix after the
member parses; any other path, one with a `#` in its name included, is an ordinary file. Nothing
here reads anything: `objects` reads what a location names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TAR, PARQUET, ARROW = ".tar", ".parquet", ".arrow"
_TAR = re.compile(r"^(?P<shard>.+?\.tar)#(?P<member>.+)@(?P<offset>\d+)\+(?P<size>\d+)$", re.DOTALL)
_PARQUET = re.compile(
    r"^(?P<shard>.+?\.(?:parquet|arrow))#(?P<member>.*)@(?P<group>\d+):(?P<row>\d+):(?P<column>[^@#:/]+)$", re.DOTALL
)


@dataclass(frozen=True)
class Member:
    """One image in a shard: for a tar, its member name, data offset and size; for Parquet, its key,
    row group, row and image column (`offset`, `size` then the row group and row)."""

    shard: str
    name: str
    offset: int
    size: int
    column: str | None = None  # Parquet's image column; None for a tar

    @property
    def location(self) -> str:
        if self.column is None:
            return f"{self.shard}#{self.name}@{self.offset}+{self.size}"
        return f"{self.shard}#{self.name}@{self.offset}:{self.size}:{self.column}"


def tar_member(shard: str, name: str, offset: int, size: int) -> Member:
    """The member of a tar shard; ValueError when its location would not read back as it (a shard
    whose own path holds `.tar#`)."""
    return _checked(Member(shard, name, offset, size))


def parquet_row(shard: str, key: str, column: str, group: int, row: int) -> Member:
    """Row `row` of row group `group` of a Parquet shard (of record batch `group` of an Arrow file);
    ValueError as `tar_member`'s, or for a column name with `@`, `#`, `:` or `/`."""
    return _checked(Member(shard, key, group, row, column))


def _checked(member: Member) -> Member:
    if parse(member.location) != member:
        raise ValueError(f"{member.shard}: member '{member.name}' cannot be recorded unambiguously")
    return member


def parse(location: object) -> Member | None:
    """The member a location names, or None for an ordinary path or URI."""
    if not isinstance(location, str) or "#" not in location:
        return None
    found = _TAR.match(location)
    if found is not None:
        return Member(found["shard"], found["member"], int(found["offset"]), int(found["size"]))
    found = _PARQUET.match(location)
    if found is not None:
        return Member(found["shard"], found["member"], int(found["group"]), int(found["row"]), found["column"])
    return None
