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
# What one shard's check found: its keys, member locations and findings in order, and the problem
# that stopped it (None when it was read to its end).
ShardFound = tuple[list[str], list[str], list[Found | str], str | None]
# Local shards of at least this many bytes in all are checked on processes: about a second's decoding of
# small images, which repays the pool's start (as `images.PROCESSES_FROM` does for loose files).
PROCESSES_FROM_BYTES = 32 << 20
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
    kept = _gather(_check_all(readable, cache, columns), readable, background, problems)
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
    found = kept.take(at)
    good = pc.and_(pa.array(taken_images(ids, datasets, limit)), pc.and_(held, pc.is_null(found.column("problem"))))
    out = {"path": pc.fill_null(found.column("path"), "")}
    for column, empty in zip(CHECKED_SCHEMA.names[4:], _NOTHING):
        out[column] = pc.if_else(
            pc.fill_null(good, False), found.column(column), pa.scalar(empty, CHECKED_SCHEMA.field(column).type)
        )
    cache.settle()
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
    and each shard's own problem (None: read to its end). What was found clean is added to the cache.
    A shard's findings become Arrow as they come: no Python object per image outlives its shard."""
    keys = [(location, *storage.stat(location)) for location in locations]
    tables: list[pa.Table | None] = _cached(cache, keys)
    stopped: list[str | None] = [None] * len(keys)
    todo = [i for i, result in enumerate(tables) if result is None]
    cache.unknown += len(todo)
    with cache.track("image shards", len(locations)) as advance:
        advance(len(locations) - len(todo))
        for i, result in zip(todo, _inspect_shards([locations[i] for i in todo], [keys[i][1] for i in todo], columns)):
            tables[i], stopped[i] = _as_table(result), result[3]
            advance(1)
    for (_, size, mtime), table, problem in zip(keys, tables, stopped):  # the cached too: the cache keeps them
        if problem is None and table.column("problem").null_count == table.num_rows:
            stamp = [pa.array([size] * table.num_rows, pa.int64()), pa.array([mtime] * table.num_rows, pa.int64())]
            cache.add(pa.table([table.column("path"), *stamp, *table.columns[2:7]], schema=CACHE_SCHEMA))
    return pa.concat_tables([FOUND_SCHEMA.empty_table(), *tables]), stopped


def _as_table(found: ShardFound) -> pa.Table:
    keys, where, results, _ = found
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
    """`inspect_shard` of each, in order: local shards of PROCESSES_FROM_BYTES or more in all on a
    pool of processes (decoding holds the GIL), else, and a bucket's (whose reading is waiting), on
    threads."""
    check: Callable[[str], ShardFound] = _Inspect(columns)
    done = 0
    if locations and not storage.is_uri(locations[0]) and len(locations) > 1 and sum(sizes) >= PROCESSES_FROM_BYTES:
        with _Processes() as processes:
            pool = processes.pool(PROCESSES_FROM)  # asked for as for that many quick images: the shards hold more
            if pool is not None:
                try:
                    with _main_not_run_again():
                        answers = pool.map(check, locations)
                    for found in answers:
                        yield found
                        done += 1
                except BrokenProcessPool:  # a process died (killed, out of memory): the rest on threads
                    pass
    with ThreadPoolExecutor() as pool:
        yield from pool.map(check, locations[done:])


class _Inspect:
    """`inspect_shard` with a Parquet shard's column names: a picklable task for a process."""

    def __init__(self, columns: tuple[str | None, str | None]):
        self.columns = columns

    def __call__(self, location: str) -> ShardFound:
        return inspect_shard(location, *self.columns)


def inspect_shard(location: str, key_column: str | None = None, image_column: str | None = None) -> ShardFound:
    """Stream one shard and check each image in it (`images.inspect_bytes`): its keys, member
    locations and findings, and what stopped the shard short (None when it was read to its end)."""
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
    return keys, where, found, problem


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
    found = found.filter(pc.not_equal(keys, ""))
    order = pc.sort_indices(found, [("key", "ascending")]).to_numpy()  # stable: of one key, the first found first
    ordered = found.column("key").take(order).to_numpy(zero_copy_only=False)
    again = np.r_[False, ordered[1:] == ordered[:-1]] if len(order) else np.zeros(0, dtype=bool)
    first = np.maximum.accumulate(np.where(again, 0, np.arange(len(order))))  # each row's first of its key
    paths = found.column("path")
    for i in np.flatnonzero(again):
        member, other = parse_member(paths[int(order[i])].as_py()), parse_member(paths[int(order[first[i]])].as_py())
        problems.add(
            member.shard,
            f"key '{ordered[i]}' (member {member.name}) is also in {other.shard} (member {other.name}): "
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
        columns=pa.table({"image_id": keys, "dataset": pa.array([dataset] * len(keys), pa.string())}),
        numbers=pa.array(np.arange(len(keys)), pa.int64()),
    )
