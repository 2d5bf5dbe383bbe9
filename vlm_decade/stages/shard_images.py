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
    found = _check_all(readable, cache, columns)
    where = _gather(found, readable, background, problems)
    if table is None:
        table = _keys_table(readable[0], list(where), dataset or "")
    keep = checked_rows(table, ("image_id", "dataset"), problems)
    ids, rows = table.text("image_id").filter(keep), table.numbers.filter(keep)
    datasets = table.text("dataset").filter(keep)
    taken = taken_images(ids, datasets, limit)
    out: dict[str, list] = {c: [] for c in ("path", "sha256", "width", "height", "mode", "transparent")}
    for image_id, row, take in zip(ids.to_pylist(), rows.to_pylist(), taken.tolist()):
        location, result = where.get(image_id, ("", None))
        if result is None and image_id:
            problems.add(table.file, f"no shard holds image_id '{image_id}' ({_named(shards)})", row, "image_id")
        good = take and not isinstance(result, str) and result is not None
        for column, value in zip(out, (location, *(result if good else _NOTHING))):
            out[column].append(value)
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


def _check_all(locations: list[str], cache: ImageCache, columns: tuple[str | None, str | None]) -> list[ShardFound]:
    """`inspect_shard` of each shard, in order, from the cache while the shard's size and time are
    unchanged since a check that found it clean; what was found clean is added to the cache."""
    keys = [(location, *storage.stat(location)) for location in locations]
    found: list[ShardFound | None] = _cached(cache, keys)
    todo = [i for i, result in enumerate(found) if result is None]
    cache.unknown += len(todo)
    with cache.track("image shards", len(locations)) as advance:
        advance(len(locations) - len(todo))
        for i, result in zip(todo, _inspect_shards([locations[i] for i in todo], [keys[i][1] for i in todo], columns)):
            found[i] = result
            advance(1)
    for key, (_, where, results, problem) in zip(keys, found):
        if problem is None and not any(isinstance(r, str) for r in results):
            rows = [where, [key[1]] * len(where), [key[2]] * len(where)] + [[r[j] for r in results] for j in range(5)]
            cache.add(pa.table(rows, schema=CACHE_SCHEMA))
    return found


def _cached(cache: ImageCache, keys: list[tuple[str, int, int]]) -> list[ShardFound | None]:
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
    out: list[ShardFound | None] = [None] * len(keys)
    paths, at = hits.column("path").to_pylist(), hits.column("at").to_pylist()
    findings = list(zip(*(hits.column(c).to_pylist() for c in CACHE_SCHEMA.names[3:])))
    for i in sorted(range(len(paths)), key=lambda i: paths[i]):
        entry = out[at[i]] = out[at[i]] or ([], [], [], None)
        entry[0].append(_key_of(paths[i]))
        entry[1].append(paths[i])
        entry[2].append(findings[i])
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


def _gather(found: list[ShardFound], locations: list[str], background: str, problems: Problems) -> dict:
    """key -> (member location, finding) of every image of the shards; the problems of each shard
    and member, and of a key that two members hold, are added."""
    where: dict[str, tuple[str, Found | str]] = {}
    for shard, (keys, locations_, results, problem) in zip(locations, found):
        if problem is not None:
            problems.add(shard, problem, field=FIELD)
        for key, location, result in zip(keys, locations_, results):
            name = parse_member(location).name
            if not key:
                problems.add(shard, f"member {name}: its key is empty", field=FIELD)
                continue
            if key in where:
                other = parse_member(where[key][0])
                problems.add(
                    shard,
                    f"key '{key}' (member {name}) is also in {other.shard} (member {other.name}): "
                    "a key names one image",
                    field=FIELD,
                )
                continue
            where[key] = (location, result)
            if isinstance(result, str):
                problems.add(shard, f"member {name} (key '{key}'): {result}", field=FIELD)
            elif result[4] and background == NO_BACKGROUND:
                problems.add(
                    shard,
                    f"member {name} (key '{key}') has transparent pixels, and data.background is none",
                    field=FIELD,
                )
    return where


def _keys_table(source: str, keys: list[str], dataset: str) -> Table:
    """The table of images a study without one has: every key of the shards, of `dataset`."""
    return Table(
        file=source,
        name=Path(source).name,
        columns=pa.table({"image_id": pa.array(keys, pa.string()), "dataset": pa.array([dataset] * len(keys))}),
        numbers=pa.array(np.arange(len(keys)), pa.int64()),
    )
