"""The image checks on a pool of threads find what they find in one thread: the same `images` table
and the same problems in the same order, for hand-built images among which some are bad; the
cache's time and progress cover the checks."""

from __future__ import annotations

import csv
import hashlib
import io
import os
import threading
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from vlm_decade.core import storage
from vlm_decade.core.errors import Problems
from vlm_decade.core.tables import read_table
from vlm_decade.stages.images import IMAGE_COLUMNS, ImageCache, check_images, images_table


def _png(width: int, height: int, seed: int, mode: str = "RGB") -> bytes:
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    if mode == "RGBA":
        pixels[0, 0, 3] = 0  # one transparent pixel
    buf = io.BytesIO()
    Image.fromarray(pixels.squeeze(), mode=mode).save(buf, format="PNG")
    return buf.getvalue()


def _study(tmp_path) -> tuple[dict[str, bytes], object]:
    whole = _png(40, 30, 5)
    files = {
        "a.png": _png(12, 8, 1),
        "b.png": _png(9, 21, 2, "L"),
        "broken.png": whole[: len(whole) // 2],
        "c.png": _png(16, 16, 3, "RGBA"),
        "text.png": b"this is not a png",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    rows = [["a", "d1", "a.png"], ["broken", "d1", "broken.png"], ["b", "d2", "b.png"]]
    rows += [["gone", "d2", "missing.png"], ["c", "d1", "c.png"], ["text", "d2", "text.png"]]
    with open(tmp_path / "images.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([list(IMAGE_COLUMNS), *rows])
    return files, tmp_path / "images.csv"


def _check(csv_path, folder, workers, cache=None):
    problems = Problems()
    images = check_images(read_table(csv_path, IMAGE_COLUMNS, problems), folder, problems, cache, workers=workers)
    return images_table(images), [(p.file, p.row, p.field, p.message) for p in problems.items]


def test_parallel_checks_find_what_serial_ones_do(tmp_path):
    files, csv_path = _study(tmp_path)
    serial_table, serial_problems = _check(csv_path, tmp_path, workers=1)
    shown = []

    def track(description, total):
        shown.append((description, total))
        return nullcontext(lambda n=1: shown.append(n))

    cache = ImageCache(track=track)
    parallel_table, parallel_problems = _check(csv_path, tmp_path, workers=2, cache=cache)
    assert parallel_table.equals(serial_table)
    assert parallel_problems == serial_problems
    assert shown[0] == ("images", 6) and sum(shown[1:]) == 6 and cache.seconds > 0  # shown as the pool goes
    # ... and what they find is what the files are, worked out here by hand.
    good = {
        "a": ("a.png", 12, 8, "RGB", None),
        "b": ("b.png", 9, 21, "L", None),
        "c": ("c.png", 16, 16, "RGBA", "#ffffff"),
    }
    rows = {r["image_id"]: r for r in serial_table.to_pylist()}
    for image_id, (name, width, height, mode, background) in good.items():
        row = rows[image_id]
        assert row["sha256"] == hashlib.sha256(files[name]).hexdigest()
        assert (row["width"], row["height"], row["mode"], row["background"]) == (width, height, mode, background)
    assert [(row, field) for _, row, field, _ in serial_problems] == [(3, "file"), (5, "file"), (7, "file")]
    assert serial_problems[1][3] == f"image file not found: {tmp_path / 'missing.png'}"
    assert "not a readable image" in serial_problems[0][3] and "not a readable image" in serial_problems[2][3]


def test_by_default_small_images_stay_in_one_thread_and_slow_ones_go_to_the_pool(tmp_path, monkeypatch):
    """The default (workers None) times the first PROBE files of a chunk in the calling thread: tiny
    images are then all checked there (threads would take turns at the GIL, slower than one), while
    files that take longer than SERIAL_BELOW_S each go to the pool; either way the results are the
    serial check's, in order."""
    from vlm_decade.stages import images as stage

    names = [f"im{i:02d}.png" for i in range(3 * stage.PROBE)]
    for i, name in enumerate(names):
        (tmp_path / name).write_bytes(_png(8, 6, i))
    (tmp_path / names[-1]).write_bytes(b"not an image")
    paths = [str(tmp_path / name) for name in names]
    serial = list(stage._inspect_all(paths, 1))
    inspect, threads = stage._inspect_image, []

    def watched(path, pause=0.0):
        threads.append(threading.current_thread().name)
        time.sleep(pause)
        return inspect(path)

    monkeypatch.setattr(stage, "_inspect_image", watched)
    assert list(stage._inspect_all(paths, None)) == serial
    assert set(threads) == {threading.current_thread().name}  # 8x6 PNGs: well under SERIAL_BELOW_S each
    threads[:] = []
    monkeypatch.setattr(stage, "_inspect_image", partial(watched, pause=2 * stage.SERIAL_BELOW_S))
    assert list(stage._inspect_all(paths, None)) == serial
    here = threading.current_thread().name
    assert threads[: stage.PROBE] == [here] * stage.PROBE and here not in threads[stage.PROBE :]


_SCRIPT = """
import json, sys
from pathlib import Path
import multiprocessing.forkserver
from vlm_decade.core.errors import Problems
from vlm_decade.core.tables import read_table
from vlm_decade.stages import images as stage

with open(sys.argv[2], "a") as fh:  # at the top level, with no __main__ guard, as a user's script may be
    fh.write("ran\\n")
stage.PROCESSES_FROM = 1
problems = Problems()
found = stage.check_images(read_table(Path(sys.argv[1]), stage.IMAGE_COLUMNS, problems), Path(sys.argv[1]).parent, problems)
print(json.dumps({
    "images": stage.images_table(found).to_pylist(),
    "problems": [[p.file, p.row, p.field, p.message] for p in problems.items],
    "forkserver": multiprocessing.forkserver._forkserver._forkserver_pid is not None,
}))
"""


def test_many_quick_images_are_checked_on_processes_as_in_one_thread(tmp_path):
    """From PROCESSES_FROM quick images on, the checks go to a pool of processes (from a forkserver),
    and find what one thread finds, the bad file's problem included; a driver's script without a
    `__main__` guard is not run again in them."""
    import json
    import subprocess
    import sys

    from vlm_decade.stages import images as stage

    rows = [[f"i{i}", "d", f"i{i}.png"] for i in range(2 * stage.PROBE)]
    for i in range(len(rows)):
        (tmp_path / f"i{i}.png").write_bytes(_png(6, 4, i))
    (tmp_path / "i20.png").write_bytes(b"not an image")
    with open(tmp_path / "images.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([list(IMAGE_COLUMNS), *rows])
    (tmp_path / "check.py").write_text(_SCRIPT)
    ran = tmp_path / "ran.txt"
    out = subprocess.run(
        [sys.executable, str(tmp_path / "check.py"), str(tmp_path / "images.csv"), str(ran)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    serial_table, serial_problems = _check(tmp_path / "images.csv", tmp_path, workers=1)
    assert found["forkserver"] and ran.read_text() == "ran\n"
    assert found["images"] == serial_table.to_pylist()
    assert [tuple(p) for p in found["problems"]] == serial_problems and serial_problems[0][1] == 22


def test_a_killed_driver_leaves_no_process_of_its_checks_behind(tmp_path):
    """SIGKILL of the driver mid-check: its processes (and their forkserver) end within seconds."""
    import signal
    import subprocess
    import sys

    psutil = __import__("psutil")  # Ray's dependency
    image = _png(400, 300, 1)  # noise: a few ms to decode, so that the checks outlast the kill
    rows = [[f"i{i}", "d", f"i{i}.png"] for i in range(3000)]
    for i in range(len(rows)):
        (tmp_path / f"i{i}.png").write_bytes(image)
    with open(tmp_path / "images.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([list(IMAGE_COLUMNS), *rows])
    script = _SCRIPT.replace("stage.PROCESSES_FROM = 1", "stage.PROCESSES_FROM, stage.SERIAL_BELOW_S = 1, 1.0")
    (tmp_path / "check.py").write_text(script)
    args = [sys.executable, str(tmp_path / "check.py"), str(tmp_path / "images.csv"), str(tmp_path / "ran.txt")]
    driver = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(psutil.Process(driver.pid).children(recursive=True)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # the forkserver, then its processes
        children = psutil.Process(driver.pid).children(recursive=True)
        assert len(children) >= 3 and driver.poll() is None
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive


def test_when_a_process_dies_the_rest_are_checked_in_the_driver(tmp_path, monkeypatch):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from vlm_decade.stages import images as stage

    paths = []
    for i in range(2 * stage.PROBE):
        (tmp_path / f"{i}.png").write_bytes(_png(5, 5, i))
        paths.append(str(tmp_path / f"{i}.png"))
    dying = ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("forkserver"), initializer=os._exit, initargs=(3,)
    )
    monkeypatch.setattr(stage._Processes, "pool", lambda self, quick: None if self._closed else dying)
    monkeypatch.setattr(stage, "PROCESSES_FROM", 1)
    with stage._Processes() as processes:
        assert list(stage._inspect_all(paths, None, processes)) == list(stage._inspect_all(paths, 1))
        assert processes.pool(10**6) is None  # not asked again for the rest of the check
    dying.shutdown()


def test_the_checks_are_timed_and_their_progress_shown(tmp_path):
    _, csv_path = _study(tmp_path)
    shown = []

    def track(description, total):
        shown.append((description, total))
        return nullcontext(lambda n=1: shown.append(n))

    cache = ImageCache(track=track)
    _check(csv_path, tmp_path, workers=1, cache=cache)
    assert shown[0] == ("images", 6) and shown[1:] == [0, 1, 1, 1, 1, 1, 1]
    assert cache.seconds > 0
    # Again with what the first check found: the good images come from the cache, in one step.
    again, shown[:] = ImageCache(cache.found, track), []
    _check(csv_path, tmp_path, workers=1, cache=again)
    assert shown == [("images", 6), 3, 1, 1, 1]
    # What a check found waits in a file of its own until the run folder takes it, as it was found.
    found = cache.found
    cache.save(tmp_path / "run")
    saved = ImageCache.of(tmp_path / "run", track=track)
    assert saved.known.equals(found) and found.num_rows == 3 and not cache.known.num_rows
    shown[:] = []
    _check(csv_path, tmp_path, workers=1, cache=saved)
    assert shown == [("images", 6), 3, 1, 1, 1]


def test_the_images_stage_takes_the_time_of_the_checks(tmp_path):
    """The checks run before the stage; the stage's recorded and said time is theirs."""
    from vlm_decade.core.config import RuntimeConfig
    from vlm_decade.core.progress import Reporter
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.core.runner import StudyRun, given
    from vlm_decade.core.runtime import LazyRay

    said = []
    reporter = Reporter(quiet=True)
    reporter.say = said.append
    folder = RunFolder(tmp_path / "run")
    StudyRun(folder, reporter, LazyRay(RuntimeConfig())).run_stage(given("images", pa.table({"x": [1]}), 12.5))
    assert 12.5 <= folder.manifest()["stages"]["images"]["seconds"] < 20  # once, plus the write (a loaded machine)
    assert said[-1].endswith("1 images in 12.5s")


_SEGMENTS = st.sampled_from(["a", "b.png", ".", "..", "", "x y", "é", "..."])


@settings(max_examples=300, deadline=None)
@given(
    folder=st.sampled_from(["imgs", "./imgs/", "../imgs", "/tmp/x", "/", "//srv/x", "a/../b"]),
    lead=st.sampled_from(["", "/", "//", "./"]),
    segments=st.lists(_SEGMENTS, max_size=5),
)
def test_an_image_files_place_is_where_pathlib_puts_it(folder, lead, segments):
    """A file's path under a local image folder, as the checks make it for every image: the one
    `Path(folder) / name` names (absolute, `.` and `..` resolved), by a cheaper join."""
    name = lead + "/".join(segments)
    assert storage.join(folder, name) == os.path.abspath(Path(folder) / name)
