"""The images of a study, checked: every file read once, fully decoded, hashed and measured.

Both studies' data loaders call `check_images` on their table's rows (image_id, dataset, file); the
result becomes the run folder's `images` table (image_id, dataset, path, sha256, width, height,
mode, background; a table written before `background` reads it as null). Each file is decoded as
the models will see it (`vlm_decade.imaging.decode`), and one that cannot be converted to 8-bit RGB
faithfully, is no regular file (a FIFO would block), or has transparency when the study's
`data.background` is `none`, is refused here. What a check found is kept in the run folder
(`ImageCache`, `.cache/images.parquet`) by the file's path, size and modification time, so a later
check reads only new or changed files (every file with `runtime.rehash`). Those are checked in the
driver, not in Ray tasks, so that `validate` and a run refuse bad input before Ray starts. The first
`PROBE` files of each chunk are timed: a small local image's check is mostly Python, which holds the
GIL, so a chunk of quick ones (under `SERIAL_BELOW_S` each) is checked in the calling thread or,
from `PROCESSES_FROM` left, on a pool of processes (`_Processes`, from a forkserver that has
imported this module, so none pays the imports and none is forked from the driver, whose threads
may hold a lock); slower files, and an object store's (`image_dir` may be a URI,
`vlm_decade.core.storage`), whose reading is waiting, go to a pool of threads. The checks' time and
progress are the `images` stage's (`ImageCache.seconds`, `track`). Images in shards (`data.shards`)
are checked by `stages.shard_images` with these same pieces (`inspect_bytes`, `checked_rows`, the cache).
"""

from __future__ import annotations

import functools
import hashlib
import io
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vlm_decade.core import storage
from vlm_decade.core.columns import first_rows
from vlm_decade.core.errors import STUDY_FILE, Problems
from vlm_decade.core.files import atomic_file, atomic_write_bytes
from vlm_decade.core.names import did_you_mean
from vlm_decade.core.parquet import table_bytes, write_table
from vlm_decade.core.smoke import first_rows_per_dataset
from vlm_decade.core.tables import Table
from vlm_decade.imaging.decode import NO_BACKGROUND, WHITE, ImageDecodeError, decode_image

IMAGE_COLUMNS = ("image_id", "dataset", "file")
IMAGES_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("dataset", pa.string()),
        ("path", pa.string()),
        ("sha256", pa.string()),
        ("width", pa.int64()),
        ("height", pa.int64()),
        ("mode", pa.string()),  # the file's own pixel mode (Pillow's name: RGB, L, I;16, F, ...)
        ("background", pa.string()),  # what its transparent pixels are composited onto; null: none are
    ]
)


# What `check_images` found, a row per image (in the table's order): its row in the user's table, and
# what reading the file found (empty and zero where it could not be read, or was not).
CHECKED_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("row", pa.int64()),
        ("dataset", pa.string()),
        ("path", pa.string()),
        ("sha256", pa.string()),
        ("width", pa.int64()),
        ("height", pa.int64()),
        ("mode", pa.string()),
        ("transparent", pa.bool_()),
    ]
)


CACHE_FILE = Path(".cache") / "images.parquet"
CACHE_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("bytes", pa.int64()),
        ("mtime_ns", pa.int64()),
        ("sha256", pa.string()),
        ("width", pa.int64()),
        ("height", pa.int64()),
        ("mode", pa.string()),
        ("transparent", pa.bool_()),
    ]
)
# What inspecting one file found: (sha256, width, height, mode, transparent).
Found = tuple[str, int, int, str, bool]


# A progress display: given a description and a total, a context yielding `advance(n)` (`Reporter.track`).
Track = Callable[[str, int], AbstractContextManager[Callable[[int], None]]]


def _no_track(description: str, total: int) -> AbstractContextManager[Callable[[int], None]]:
    return nullcontext(lambda n=1: None)


_KEY = ["path", "bytes", "mtime_ns"]
_FOUND = CACHE_SCHEMA.names[3:]  # what inspecting a file found, in `Found`'s order
CHUNK = 1 << 13  # images checked at a time: the Python objects a check needs live for one chunk
# Below this median check time per image (of the first PROBE of a chunk), one thread beats a pool on
# 2 cores: threads gain only on the decoding and reading that release the GIL (benchmarks/image_checks.py).
SERIAL_BELOW_S = 0.4e-3
PROBE = 16
# Quick images left in a chunk from which a pool of processes is started: about a second's work in one
# thread, which two cores repay with the pool's first start (0.5 to 1 s) included. Once started, the
# pool takes every later chunk's quick images, however few.
PROCESSES_FROM = 8000
PROCESS_BATCH = 64  # images handed to a process at a time


class ImageCache:
    """What earlier checks found, per (path, size, modification time), and what this one found, as
    CACHE_SCHEMA tables (no Python object per image outlives a chunk of checks); `seconds` the
    checks took, their progress shown through `track`."""

    def __init__(self, known: pa.Table | None = None, track: Track | None = None):
        self.known = known if known is not None else CACHE_SCHEMA.empty_table()
        self._found: list[pa.Table] = []
        self._settled = None  # `settle`'s file of what was found, until `save`
        self.track = track or _no_track
        self.seconds = 0.0
        self.unknown = 0  # files read because the cache did not know them (new or changed)

    @classmethod
    def of(cls, run_folder: str | Path, rehash: bool = False, track: Track | None = None) -> ImageCache:
        """The cache a run folder keeps (none yet, unreadable, or `rehash`: an empty one)."""
        path = Path(run_folder) / CACHE_FILE
        if rehash or not path.is_file():
            return cls(track=track)
        try:
            known = pq.read_table(path).cast(CACHE_SCHEMA)
        except Exception:  # noqa: BLE001 - a damaged cache (or one from before `transparent`) only costs a fresh check
            return cls(track=track)
        return cls(known, track)

    @property
    def found(self) -> pa.Table:
        """What this check found, one row per (path, size, time), sorted by them."""
        if self._settled is not None and not self._found:
            self._settled.seek(0)
            return pq.read_table(self._settled)
        settled = [] if self._settled is None else [pq.read_table(self._settled)]
        found = pa.concat_tables([CACHE_SCHEMA.empty_table(), *settled, *self._found])
        order = pc.sort_indices(found, [(c, "ascending") for c in _KEY])  # stable: of equal keys, the last found last
        keys = found.select(_KEY).take(order)
        n = keys.num_rows
        # A file two rows of the images table name is found twice: its last finding is kept.
        differs = [pc.not_equal(keys.column(c).slice(0, n - 1), keys.column(c).slice(1)) for c in _KEY]
        last = pa.concat_arrays([functools.reduce(pc.or_, differs).combine_chunks(), pa.array([True])]) if n else []
        return found.take(order.filter(last) if n else order)

    def inspect(
        self,
        paths: list[str],
        workers: int | None = None,
        advance: Callable[[int], None] | None = None,
        processes: _Processes | None = None,
    ) -> list[Found | str]:
        """`_inspect_image`'s answer for each path, in order: from the cache while the file's size
        and time are unchanged, else read on `workers` threads or `processes` (`_inspect_all`).
        `advance`: the progress of a check of which these paths are a part (else they are shown as
        the whole)."""
        if advance is None:
            with self.track("images", len(paths)) as advance:
                return self.inspect(paths, workers, advance, processes)
        start = time.monotonic()
        if paths and storage.is_uri(paths[0]):
            with ThreadPoolExecutor() as pool:  # a stat is a request per object in a bucket: many at once
                keys = list(pool.map(_key, paths))
        else:  # a local stat takes microseconds, less than handing it to a thread
            keys = [_key(path) for path in paths]
        results: list[Found | str | None] = self._known(keys)
        todo = [i for i, result in enumerate(results) if result is None]
        self.unknown += len(todo)
        advance(len(paths) - len(todo))
        for i, result in zip(todo, _inspect_all([paths[i] for i in todo], workers, processes)):
            results[i] = result
            advance(1)
        kept = [(key, result) for key, result in zip(keys, results) if key is not None and not isinstance(result, str)]
        columns = [[key[j] for key, _ in kept] for j in range(3)] + [[r[j] for _, r in kept] for j in range(5)]
        self.add(pa.table(columns, schema=CACHE_SCHEMA))
        self.seconds += time.monotonic() - start
        return results

    def add(self, found: pa.Table) -> None:
        """Keep what a check found (CACHE_SCHEMA rows), for `found` and `save`."""
        self._found.append(found)

    def _known(self, keys: list[tuple[str, int, int] | None]) -> list[Found | None]:
        """What the cache knows of each key (None: nothing, or no key)."""
        asked = pa.table([[k[j] if k else None for k in keys] for j in range(3)], schema=_schema(CACHE_SCHEMA, _KEY))
        asked = asked.append_column("at", pa.array(np.arange(len(keys), dtype=np.int64)))
        known = self.known.filter(pc.is_in(self.known.column("path"), value_set=asked.column("path")))
        hits = asked.join(known, _KEY, join_type="inner", use_threads=False)
        out: list[Found | None] = [None] * len(keys)
        for at, *found in zip(*(hits.column(c).to_pylist() for c in ("at", *_FOUND))):
            out[at] = tuple(found)
        return out

    def settle(self) -> None:
        """Once a check has looked up every file: let go of what earlier checks found, and keep
        what this one found (`found`, as `save` writes it) in a temporary file, not in memory: a
        million images' records are a few hundred MB, which the descriptions' checks need."""
        found = self.found
        self._settled = tempfile.TemporaryFile()  # gone when closed, or when the process ends
        write_table(found, self._settled)
        self.known, self._found = CACHE_SCHEMA.empty_table(), []

    def save(self, run_folder: str | Path) -> None:
        """Write what this check found to the run folder's cache, and let go of every record: a run
        holds none per image after its checks."""
        if self._settled is not None and not self._found:  # written already: copied, not read
            self._settled.seek(0)
            with atomic_file(Path(run_folder) / CACHE_FILE) as out:
                shutil.copyfileobj(self._settled, out, 8 << 20)
        else:
            atomic_write_bytes(Path(run_folder) / CACHE_FILE, table_bytes(self.found))
        if self._settled is not None:
            self._settled.close()
        self.known, self._found, self._settled = CACHE_SCHEMA.empty_table(), [], None


def declared_ids(table: Table) -> pa.Array:
    """Every image_id a table of images names, its rows with problems included: what other tables may
    refer to without being called unknown."""
    ids = table.text("image_id")
    return pc.unique(ids.filter(pc.not_equal(ids, "")))


def check_images(
    table: Table,
    image_dir: str | Path,
    problems: Problems,
    cache: ImageCache | None = None,
    background: str = WHITE,
    workers: int | None = None,
    limit: int | None = None,
) -> pa.Table:
    """Every row's image, read and measured (on `workers` threads: `ImageCache.inspect`), as a
    CHECKED_SCHEMA table; `background` (#rrggbb, or `none` to refuse images with transparency) is
    the study's `data.background`. `limit` (a smoke run's, `run --limit`): only the images the run
    takes, the first `limit` of each dataset in image_id order (`core.smoke`), are read; the other
    rows are checked as rows (ids, blanks, repeats) and come back unread, for the run to leave out."""
    keep = checked_rows(table, IMAGE_COLUMNS, problems)
    ids = table.text("image_id")
    files, rows = table.text("file").filter(keep), table.numbers.filter(keep)
    images = {"image_id": ids.filter(keep), "row": rows, "dataset": table.text("dataset").filter(keep)}
    taken = taken_images(images["image_id"], images["dataset"], limit)
    if not len(table):
        problems.add(table.file, "has no images")
    folder = storage.is_folder(image_dir)
    if not folder:
        # One problem for the folder, not one per image.
        problems.add(str(image_dir), "image folder not found", field="data.image_dir")
    cache = cache or ImageCache()
    chunks = []
    with (
        cache.track("images", int(taken.sum())) if folder else nullcontext(None) as advance,
        _Processes() as processes,
    ):
        for begin in range(0, len(files), CHUNK):
            paths = [storage.join(image_dir, f) for f in files.slice(begin, CHUNK).to_pylist()]
            found: list[Found | str] = [("", 0, 0, "", False)] * len(paths)
            if folder:
                read = np.flatnonzero(taken[begin : begin + CHUNK]).tolist()
                inspected = cache.inspect([paths[j] for j in read], workers, advance, processes)
                for j, result in zip(read, inspected):
                    found[j] = result
                numbers = rows.slice(begin, CHUNK).to_pylist()
                _found_problems(
                    table.file, [paths[j] for j in read], inspected, [numbers[j] for j in read], background, problems
                )
            columns = [paths] + [[f[j] if not isinstance(f, str) else empty for f in found] for j, empty in _EMPTY]
            chunks.append(pa.table(columns, schema=_schema(CHECKED_SCHEMA, ["path", *_FOUND])))
    cache.settle()  # every file is looked up: what was known before is no longer needed
    found = pa.concat_tables([_schema(CHECKED_SCHEMA, ["path", *_FOUND]).empty_table(), *chunks]).combine_chunks()
    return pa.table(images | {c: found.column(c) for c in found.column_names}, schema=CHECKED_SCHEMA)


def checked_rows(table: Table, columns: tuple[str, ...], problems: Problems) -> pa.Array:
    """Which rows of a table of images name an image: none of `columns` empty, and an image_id no
    earlier row has (the others are problems)."""
    blank = {c: table.blank(c) for c in columns}
    present = ~np.logical_or.reduce(list(blank.values()))
    ids = table.text("image_id")
    first = first_rows(pa.table({"image_id": ids}), present)
    duplicate = present & (first < np.arange(len(table)))
    numbers = table.numbers.to_numpy()
    for i in np.flatnonzero(~present | duplicate):
        if duplicate[i]:
            image_id = ids[i].as_py()
            message = f"duplicate image_id '{image_id}' (first at row {numbers[first[i]]})"
            problems.add(table.file, message, row=int(numbers[i]), field="image_id")
            continue
        for column in columns:
            if blank[column][i]:
                problems.add(table.file, f"'{column}' is empty", row=int(numbers[i]), field=column)
    return pa.array(present & ~duplicate)


def taken_images(image_ids: pa.Array, datasets: pa.Array, limit: int | None) -> np.ndarray:
    """Which of the images are read: all, or with a smoke run's `limit` those it takes (the first of
    each dataset in image_id order, the order of the `images` table that `core.smoke` cuts)."""
    if limit is None:
        return np.ones(len(image_ids), dtype=bool)
    order = pc.sort_indices(image_ids).to_numpy()
    first = first_rows_per_dataset(pa.table({"dataset": datasets.take(order)}), limit)
    taken = np.zeros(len(image_ids), dtype=bool)
    taken[order[first]] = True
    return taken


def _schema(schema: pa.Schema, names: list[str]) -> pa.Schema:
    return pa.schema([schema.field(n) for n in names])


_EMPTY = tuple(enumerate(("", 0, 0, "", False)))  # what a file found bad, or not read, has found


def _found_problems(
    file: str, paths: list[str], found: list[Found | str], rows: list[int], background: str, problems: Problems
) -> None:
    """The problems of a chunk of images: what `_inspect_image` said, or transparency with no background."""
    for i, result in enumerate(found):
        if isinstance(result, str):
            problems.add(file, result, row=rows[i], field="file")
        elif result[4] and background == NO_BACKGROUND:
            problems.add(
                file,
                f"{paths[i]} has transparent pixels, and data.background is none: give a background "
                "(white, a colour name or #rrggbb) to composite them onto, or an image without transparency",
                row=rows[i],
                field="file",
            )


def _key(path: str) -> tuple[str, int, int] | None:
    """A file's cache key (path, size, modification time), or None when it cannot be read."""
    try:
        return (path, *storage.stat(path))
    except (OSError, ValueError):
        return None  # `_inspect_image` says what is wrong with the path


def _inspect_all(paths: list[str], workers: int | None, processes: _Processes | None = None) -> Iterator[Found | str]:
    """`_inspect_image` of each path, in order, yielded as each is done: on `workers` threads, or in
    this thread with 1. By default (None) the first PROBE local files are checked in this thread, and
    the rest on a pool of threads of Python's default size (cores + 4) when they took
    `SERIAL_BELOW_S` or more each (the median: the first file also pays Pillow's imports); else on
    `processes` when it gives a pool, or here."""
    if workers == 1:
        yield from map(_inspect_image, paths)
        return
    if workers is None and paths and not storage.is_uri(paths[0]):
        took = []
        for path in paths[:PROBE]:
            start = time.perf_counter()
            found = _inspect_image(path)
            took.append(time.perf_counter() - start)
            yield found
        paths = paths[PROBE:]
        if float(np.median(took)) < SERIAL_BELOW_S:
            pool = processes.pool(len(paths)) if processes is not None else None
            done = 0
            if pool is not None:
                try:
                    with _main_not_run_again():  # the processes start as their work is handed over
                        answers = pool.map(_inspect_image, paths, chunksize=PROCESS_BATCH)
                    for found in answers:
                        yield found
                        done += 1
                except BrokenProcessPool:  # a process died (killed, out of memory): the rest here
                    processes.close()
            yield from map(_inspect_image, paths[done:])
            return
    with ThreadPoolExecutor(workers) as pool:
        yield from pool.map(_inspect_image, paths)


class _Processes:
    """One check's pool of processes for many quick images, one per core: started when first asked
    for with PROCESSES_FROM or more (`pool`; None before, on one core, where no forkserver can be
    had, or once a process has died) and shut down on leaving the context. What its processes do
    when the driver is interrupted or killed: `_process_started`."""

    def __init__(self):
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    def __enter__(self) -> _Processes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pool(self, quick: int) -> ProcessPoolExecutor | None:
        """The pool, for `quick` images to check."""
        if self._pool is None and not self._closed and quick >= PROCESSES_FROM:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            if cores < 2 or "forkserver" not in multiprocessing.get_all_start_methods():
                self._closed = True
                return None
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__])  # heeded when the forkserver starts, once a driver
            self._pool = ProcessPoolExecutor(
                cores, mp_context=context, initializer=_process_started, initargs=(os.getpid(),)
            )
        return self._pool

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def _process_started(driver: int) -> None:
    """In each of `_Processes`' processes: Ctrl-C is the driver's to handle, and the process ends
    once the driver has (killed, it could not say so: the process would wait for work for ever)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(driver, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=watch, name="driver-watch", daemon=True).start()


@contextmanager
def _main_not_run_again():
    """While processes start: a new process of multiprocessing's would otherwise run the driver's
    main script again, to find what it defines. These need only this module, and a user's script
    without an `if __name__ == "__main__":` guard would run again in each of them."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _inspect_image(path: str) -> Found | str:
    """(sha256 of the bytes, upright width, height, mode, whether it has transparent pixels) from one
    read and one full decode, or what is wrong."""
    problem = storage.file_problem(path)
    if problem is not None:
        return f"image file {problem}: {path}"
    try:
        data = storage.read_bytes(path)
    except OSError as exc:
        return f"cannot read image file {path}: {getattr(exc, 'strerror', None) or exc}"
    return inspect_bytes(data, path)


def inspect_bytes(data: bytes, path: str) -> Found | str:
    """`_inspect_image` of an image's bytes already read; `path` names it in messages."""
    try:
        decoded = decode_image(io.BytesIO(data), path)
    except ImageDecodeError as exc:
        return str(exc)
    height, width = decoded.rgb.shape[:2]
    return hashlib.sha256(data).hexdigest(), width, height, decoded.mode, decoded.transparent


def images_table(images: pa.Table, background: str = WHITE) -> pa.Table:
    """The `images` table of `check_images`' result; `background`: what the images with transparency
    are composited onto."""
    images = images.sort_by("image_id")
    backgrounds = pc.if_else(images.column("transparent"), background, pa.scalar(None, pa.string()))
    return images.select(IMAGES_SCHEMA.names[:-1]).append_column("background", backgrounds).cast(IMAGES_SCHEMA)


def transparency_note(images: pa.Table) -> str:
    """What `validate` says of the images with transparency: how many, and what they are
    composited onto ("" when none has any)."""
    backgrounds = [b for b in images.column("background").to_pylist() if b is not None]
    if not backgrounds:
        return ""
    return (
        f"; {len(backgrounds)} of {images.num_rows} images have transparent pixels, composited onto "
        f"{', '.join(sorted(set(backgrounds)))} (data.background) before any model sees them"
    )


def metadata_table(table: Table, images: pa.Table) -> pa.Table:
    """The `metadata` table: `image_id` and the user's own further columns of the images (Study A) or
    labels (Study B) table, as text, for the images that passed their checks (`check_images`' result),
    sorted by image_id."""
    ids = table.text("image_id")
    columns = {"image_id": ids} | {c: table.text(c) for c in table.extra}
    rows = pa.table(columns).filter(pc.is_in(ids, value_set=images.column("image_id")))
    return rows.sort_by("image_id").cast(pa.schema([(c, pa.string()) for c in columns]))


def check_group_by(group_by, table: Table, problems: Problems) -> None:
    """Every `analysis.group_by` variable is one of the table's own further columns."""
    for name in group_by:
        if name not in table.extra:
            have = ", ".join(table.extra) if table.extra else "none (it has only the columns the study reads)"
            problems.add(
                STUDY_FILE,
                f"'{name}' is no metadata column of {table.name}; its metadata columns: {have}"
                + did_you_mean(name, table.extra),
                field="analysis.group_by",
            )
