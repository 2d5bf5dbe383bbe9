"""The images of a study read from shards (`data.shards`: WebDataset tar or Parquet shards, local or
in a bucket; `core.storage.shards`), checked as `stages.images.check_images` checks loose files.

Each shard is a task: it is streamed once, and every image in it decoded, hashed and measured
(`images.inspect_bytes`), on a pool of threads (a bucket's, whose reading is waiting) or of processes
(`images._Processes`, for several local shards). The result is `check_images`' CHECKED_SCHEMA table,
an image's `path` its member location (`core.storage.members`), so the models, the viewer and a later
check read it back by one ranged read. An image's id is its key. What a shard's images found is kept
in the run folder's image cache by the shard's path, size and modification time: a shard unchanged
since a clean check is not read again. The images are those of the shards, with `dataset` given;
or, when the study gives a table keyed by image_id (Study A's images, Study B's labels), that
table's rows, each of which a shard must hold. Refused, each named by its shard and member: a
pattern that names no shard, a missing shard, a shard that cannot be read to its end (a truncated
tar), a member that is no image, and a key in two places.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core import storage
from vlm_decade.core.errors import STUDY_FILE, Problems
from vlm_decade.core.storage.members import parse as parse_member  # of locations made here: parsed, not looked up
from vlm_decade.core.tables import Table
from vlm_decade.imaging.decode import NO_BACKGROUND, WHITE
from vlm_decade.stages.images import (
    CACHE_SCHEMA,
    CHECKED_SCHEMA,
    CHUNK,
    PROCESSES_FROM,
    Found,
    ImageCache,
    _main_not_run_again,
    _Processes,
    checked_rows,
    inspect_bytes,
    taken_images,
)

FIELD = "data.shards"
# What one shard's check found: a FOUND_SCHEMA table of its images in order, and the problem that
# stopped it (None when it was read to its end).
ShardFound = tuple[pa.Table, str | None]
# The local shards left after the first are checked on processes when the first's time says they
# would take this long in one thread: the pool's start (0.5 to 1 s) is then repaid on two cores, as
# `images.PROCESSES_FROM` quick images repay it for loose files.
PROCESSES_FROM_S = 1.0
_NOTHING: Found = ("", 0, 0, "", False)
# What one image of a shard was found to be: its key, member location, finding (empty where it was found
# bad) and what is wrong with it (null: nothing).
FOUND_SCHEMA = pa.schema(
    [("key", pa.string()), ("path", pa.string())]
    + [CACHE_SCHEMA.field(c) for c in CACHE_SCHEMA.names[3:]]
    + [("problem", pa.string())]
)
_SHARD = r"^(?P<shard>.+?\.(?:tar|parquet))#"


def check_shard_images(
    shards: str | list[str],
    table: Table | None,
    dataset: str | None,
    problems: Problems,
    cache: ImageCache | None = None,
    background: str = WHITE,
    limit: int | None = None,
    columns: tuple[str | None, str | None] = (None, None),
) -> tuple[Table, pa.Table] | None:
    """(the table of images, its images checked as CHECKED_SCHEMA) from `shards` (a pattern or a
    list); None, with problems added, when no shard could be read. `table`: the study's rows keyed
    by image_id (its `file` column not read), or None for every image of the shards, of `dataset`.
    `columns`: a Parquet shard's key and image column (None: the usual names). `limit` as
    `check_images`' (every shard is still read: which keys it holds is known only then)."""
    try:
        locations = storage.expand(shards)
    except ValueError as exc:
        problems.add(STUDY_FILE, str(exc), field=FIELD)
        return None
    readable = _readable(locations, shards, problems)
    if not readable:
        return None
    cache = cache or ImageCache()
    checked = _check_all(readable, cache, columns)
    cache.settle()  # every shard is looked up: what earlier checks found is no longer needed here
    kept = _gather(checked, readable, background, problems)
    del checked  # its rows are `kept`'s, or let go
    if table is None:
        table = _keys_table(readable[0], kept.column("key"), dataset or "")
    keep = checked_rows(table, ("image_id", "dataset"), problems)
    ids, rows = table.text("image_id").filter(keep), table.numbers.filter(keep)
    datasets = table.text("dataset").filter(keep)
    at = pc.index_in(ids, value_set=kept.column("key"))
    held = pc.is_valid(at)
    for image_id, row in zip(ids.filter(pc.invert(held)).to_pylist(), rows.filter(pc.invert(held)).to_pylist()):
        if image_id:
            problems.add(table.file, f"no shard holds image_id '{image_id}' ({_named(shards)})", row, "image_id")
    # The shards' images in the table's order: as found when the table is theirs (no copy made).
    same = at.null_count == 0 and len(at) == kept.num_rows and bool(np.all(at.to_numpy() == np.arange(len(at))))
    found = kept if same else kept.take(at)
    del kept
    good = pc.and_(pa.array(taken_images(ids, datasets, limit)), pc.and_(held, pc.is_null(found.column("problem"))))
    good = pc.fill_null(good, False)
    every = pc.all(good).as_py() is not False  # then the findings are kept as they are: no copy
    out = {"path": pc.fill_null(found.column("path"), "")}
    for column, empty in zip(CHECKED_SCHEMA.names[4:], _NOTHING):
        kind = CHECKED_SCHEMA.field(column).type
        out[column] = found.column(column) if every else pc.if_else(good, found.column(column), pa.scalar(empty, kind))
    checked = {"image_id": ids, "row": rows, "dataset": datasets} | out
    return table, pa.table(checked, schema=CHECKED_SCHEMA)


def study_shard_images(data, table: Table | None, problems: Problems, cache: ImageCache | None, limit: int | None):
    """`check_shard_images` of a study's `data` section (its `shards`, `dataset`, `background`,
    `key_column` and `image_column`)."""
    columns = (data.key_column, data.image_column)
    return check_shard_images(data.shards, table, data.dataset, problems, cache, data.background, limit, columns)


def _named(shards: str | list[str]) -> str:
    patterns = [shards] if isinstance(shards, str) else list(shards)
    return "data.shards " + ", ".join(patterns[:3]) + (f" and {len(patterns) - 3} more" if len(patterns) > 3 else "")


def _readable(locations: list[str], shards: str | list[str], problems: Problems) -> list[str]:
    """The shards that can be read; the others are problems (one, when none can)."""
    missing = {location: storage.file_problem(location) for location in locations}
    readable = [location for location in locations if missing[location] is None]
    if not readable:
        first = f"; the first, {locations[0]}: {missing[locations[0]]}" if locations else ""
        problems.add(STUDY_FILE, f"{_named(shards)} names no shard that can be read{first}", field=FIELD)
        return []
    for location, problem in missing.items():
        if problem is not None:
            problems.add(location, f"shard {problem}", field=FIELD)
    return readable


def _check_all(
    locations: list[str], cache: ImageCache, columns: tuple[str | None, str | None]
) -> tuple[pa.Table, list]:
    """`inspect_shard` of each shard, from the cache while the shard's size and time are unchanged since
    a check that found it clean: every image's finding as one FOUND_SCHEMA table (in the shards' order),
    and each shard's own problem (None: read to its end). What was found clean is added to the cache."""
    keys = [(location, *storage.stat(location)) for location in locations]
    cached: list[pa.Table | None] = _cached(cache, keys)
    stopped: list[str | None] = [None] * len(keys)
    todo = [i for i, result in enumerate(cached) if result is None]
    cache.unknown += len(todo)
    fresh = _inspect_shards([locations[i] for i in todo], [keys[i][1] for i in todo], columns)
    found = _Found(cache)
    with cache.track("image shards", len(locations)) as advance:
        advance(len(locations) - len(todo))
        for i, (_, size, mtime) in enumerate(keys):
            table, cached[i] = cached[i], None
            if table is None:
                table, stopped[i] = next(fresh)
                advance(1)
            found.add(table, size, mtime, stopped[i] is None and table.column("problem").null_count == table.num_rows)
    return found.table(), stopped


class _Found:
    """The shards' findings, gathered into tables of about CHUNK rows as they come (a table per shard
    would keep a few small buffers per shard); each chunk's rows from clean shards are added to the
    cache, stamped with their shard's size and time (the cache keeps the shards it knew too)."""

    def __init__(self, cache: ImageCache):
        self.cache = cache
        self.chunks: list[pa.Table] = []
        self._tables: list[pa.Table] = []
        self._stamps: list[tuple[int, int, int, bool]] = []  # (rows, size, time, clean) of each shard
        self._rows = 0

    def add(self, table: pa.Table, size: int, mtime: int, clean: bool) -> None:
        self._tables.append(table)
        self._stamps.append((table.num_rows, size, mtime, clean))
        self._rows += table.num_rows
        if self._rows >= CHUNK:
            self._flush()

    def table(self) -> pa.Table:
        self._flush()
        return pa.concat_tables([FOUND_SCHEMA.empty_table(), *self.chunks])

    def _flush(self) -> None:
        if not self._tables:
            return
        chunk = pa.concat_tables(self._tables).combine_chunks()
        rows, size, mtime, clean = (np.array(c) for c in zip(*self._stamps))
        stamps = [pa.array(np.repeat(size, rows), pa.int64()), pa.array(np.repeat(mtime, rows), pa.int64())]
        known = pa.table([chunk.column("path"), *stamps, *chunk.columns[2:7]], schema=CACHE_SCHEMA)
        self.cache.add(known if clean.all() else known.filter(pa.array(np.repeat(clean, rows))))
        self.chunks.append(chunk)
        self._tables, self._stamps, self._rows = [], [], 0


def _as_table(keys: list[str], where: list[str], results: list[Found | str]) -> pa.Table:
    good = [_NOTHING if isinstance(r, str) else r for r in results]
    problem = [r if isinstance(r, str) else None for r in results]
    return pa.table([keys, where, *([g[j] for g in good] for j in range(5)), problem], schema=FOUND_SCHEMA)


def _cached(cache: ImageCache, keys: list[tuple[str, int, int]]) -> list[pa.Table | None]:
    """What the cache knows of each shard (path, size, time): its members' findings, or None."""
    known = cache.known
    shard = pc.struct_field(pc.extract_regex(known.column("path"), _SHARD + ".*$"), [0]) if known.num_rows else None
    if shard is None:
        return [None] * len(keys)
    known = known.append_column("shard", shard)
    asked = pa.table(
        [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys], list(range(len(keys)))],
        names=["shard", "bytes", "mtime_ns", "at"],
    )
    hits = known.join(asked, ["shard", "bytes", "mtime_ns"], join_type="inner", use_threads=False)
    hits = hits.sort_by([("at", "ascending"), ("path", "ascending")])
    out: list[pa.Table | None] = [None] * len(keys)
    at = hits.column("at").to_numpy()
    starts = np.flatnonzero(np.r_[True, at[1:] != at[:-1]]) if len(at) else np.array([], dtype=np.int64)
    for begin, end in zip(starts, np.r_[starts[1:], len(at)]):
        rows = hits.slice(begin, end - begin)
        key = pa.array([_key_of(p) for p in rows.column("path").to_pylist()], pa.string())
        found = [rows.column(c) for c in CACHE_SCHEMA.names[3:]]
        out[at[begin]] = pa.table(
            [key, rows.column("path"), *found, pa.nulls(len(key), pa.string())], schema=FOUND_SCHEMA
        )
    return out


def _key_of(location: str) -> str:
    """The key of the image a member location names (a tar member's name up to its extension)."""
    member = parse_member(location)
    if member.column is not None:
        return member.name
    named = storage.split_key(member.name)
    return named[0] if named else member.name


def _inspect_shards(
    locations: list[str], sizes: list[int], columns: tuple[str | None, str | None]
) -> Iterator[ShardFound]:
    """`inspect_shard` of each, in order. Local shards: the first in this thread, timed; the rest on a
    pool of processes (decoding holds the GIL) when, at the first's rate by bytes, they would take
    PROCESSES_FROM_S or more (one in cores + 1 of them still in this thread, which would otherwise
    only wait for the others), else on threads, as a bucket's are (whose reading is waiting)."""
    check: Callable[[str], ShardFound] = _Inspect(columns)
    if locations and not storage.is_uri(locations[0]):
        start = time.perf_counter()
        yield check(locations[0])
        took, locations, rest = time.perf_counter() - start, locations[1:], sum(sizes[1:])
        if locations and took * rest / max(sizes[0], 1) >= PROCESSES_FROM_S:
            with _Processes() as processes:
                pool = processes.pool(PROCESSES_FROM)  # as for that many quick images: the work is more
                done = 0
                if pool is not None:
                    share = 1 + (
                        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
                    )
                    try:
                        with _main_not_run_again():  # the processes start as their work is handed over
                            theirs = {i: pool.submit(check, s) for i, s in enumerate(locations) if i % share}
                        for i, location in enumerate(locations):  # every share-th here: this thread would wait
                            yield theirs.pop(i).result() if i in theirs else check(location)
                            done += 1
                    except BrokenProcessPool:  # a process died (killed, out of memory): the rest on threads
                        pass
                locations = locations[done:]
    with ThreadPoolExecutor() as pool:
        yield from pool.map(check, locations)


class _Inspect:
    """`inspect_shard` with a Parquet shard's column names: a picklable task for a process."""

    def __init__(self, columns: tuple[str | None, str | None]):
        self.columns = columns

    def __call__(self, location: str) -> ShardFound:
        return inspect_shard(location, *self.columns)


def inspect_shard(location: str, key_column: str | None = None, image_column: str | None = None) -> ShardFound:
    """Stream one shard and check each image in it (`images.inspect_bytes`): its keys, member
    locations and findings as a FOUND_SCHEMA table (Arrow, which a process hands back as a few
    buffers, not an object per image), and what stopped the shard short (None when read to its end)."""
    keys: list[str] = []
    where: list[str] = []
    found: list[Found | str] = []
    problem = None
    try:
        for key, member, data in storage.read_shard(location, key_column, image_column):
            keys.append(key)
            where.append(member.location)
            found.append(inspect_bytes(data, member.name))
    except storage.ShardError as exc:
        problem = str(exc).removeprefix(f"{location}: ")
    except OSError as exc:
        problem = f"cannot be read: {getattr(exc, 'strerror', None) or exc}"
    return _as_table(keys, where, found), problem


def _gather(checked: tuple[pa.Table, list], locations: list[str], background: str, problems: Problems) -> pa.Table:
    """The findings of every image of the shards, the first of each key; the problems of each shard
    and member, and of a key that two members hold, are added (looked at one by one: only those)."""
    found, stopped = checked
    for shard, problem in zip(locations, stopped):
        if problem is not None:
            problems.add(shard, problem, field=FIELD)
    keys = found.column("key")
    for location in found.column("path").filter(pc.equal(keys, "")).to_pylist():
        member = parse_member(location)
        problems.add(member.shard, f"member {member.name}: its key is empty", field=FIELD)
    if pc.any(pc.equal(keys, "")).as_py():
        found = found.filter(pc.not_equal(keys, ""))
    order = pc.sort_indices(found, [("key", "ascending")])  # stable: of one key, the first found first
    ordered = found.column("key").take(order)
    n = len(ordered)
    again = np.r_[False, pc.equal(ordered.slice(1), ordered.slice(0, n - 1)).to_numpy()] if n else np.zeros(0, bool)
    kept = found
    if again.any():  # a key in two places: each named, the first kept
        order = order.to_numpy()
        first = np.maximum.accumulate(np.where(again, 0, np.arange(n)))  # each row's first of its key
        paths = found.column("path")
        for i in np.flatnonzero(again):
            member, other = (
                parse_member(paths[int(order[i])].as_py()),
                parse_member(paths[int(order[first[i]])].as_py()),
            )
            problems.add(
                member.shard,
                f"key '{ordered[i].as_py()}' (member {member.name}) is also in {other.shard} (member {other.name}): "
                "a key names one image",
                field=FIELD,
            )
        kept = found.take(np.sort(order[~again]))
    bad = pc.is_valid(kept.column("problem"))
    if background == NO_BACKGROUND:
        bad = pc.or_(bad, kept.column("transparent"))
    for key, location, problem in zip(*(kept.column(c).filter(bad).to_pylist() for c in ("key", "path", "problem"))):
        member = parse_member(location)
        why = f": {problem}" if problem else " has transparent pixels, and data.background is none"
        problems.add(member.shard, f"member {member.name} (key '{key}'){why}", field=FIELD)
    return kept


def _keys_table(source: str, keys: pa.ChunkedArray, dataset: str) -> Table:
    """The table of images a study without one has: every key of the shards, of `dataset`."""
    return Table(
        file=source,
        name=Path(source).name,
        columns=pa.table({"image_id": keys, "dataset": pa.repeat(pa.scalar(dataset, pa.string()), len(keys))}),
        numbers=pa.array(np.arange(len(keys)), pa.int64()),
    )
