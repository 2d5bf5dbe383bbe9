"""When a run starts Ray and the encoder actors while it still checks the images, the descriptions and
the models' files (`pipeline.adds_to_a_finished_run`): images added to a run whose embed stage
finished (new ids as soon as the images table is read, new files once the images are checked), and
only then; a fresh run, a fully cached rerun, a killed run and a study with local models' actors
start nothing ahead (docs/architecture.md)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage
from vlm_decade.stages.images import ImageCache
from vlm_decade.studies.decade.pipeline import adds_to_a_finished_run


def _responses(frees_cluster: bool) -> Stage:
    return Stage("responses", (), None, lambda run: {}, frees_cluster=frees_cluster)


@pytest.fixture
def checked(tmp_path):
    """Two caches of one image folder: one that read an image it did not know, one that knew them all."""
    paths = []
    for i in range(2):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(np.full((4, 4, 3), i, np.uint8)).save(path)
        paths.append(str(path))
    first = ImageCache(track=None)
    first.inspect(paths[:1])
    cached = ImageCache(first.found)
    cached.inspect(paths[:1])
    added = ImageCache(first.found)
    added.inspect(paths)
    return {"added": added, "cached": cached}


def _folder(tmp_path, state: str | None) -> str:
    """A run folder whose embed stage is in `state` (None: no manifest), and whose images table
    names img0 and img1."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    RunFolder(run).write("images", pa.table({"image_id": ["img0", "img1"], "sha256": ["a" * 64, "b" * 64]}))
    if state is not None:
        (run / "manifest.json").write_text(json.dumps({"stages": {"embeddings": {"state": state}}}))
    return str(run)


def test_images_added_to_a_run_whose_embed_stage_finished_start_it_ahead(tmp_path, checked):
    assert checked["added"].unknown == 1 and checked["cached"].unknown == 0
    assert adds_to_a_finished_run(_folder(tmp_path, "done"), _responses(True), checked["added"])


@pytest.mark.parametrize(
    "ids, added",
    [(["img1", "img2"], True), (["img1"], False), (["img0", "img1"], False)],
)
def test_an_images_table_naming_an_image_the_finished_run_lacks_starts_it_ahead_as_soon_as_it_is_read(
    tmp_path, ids, added
):
    """Before any image is checked: new ids start it; the finished run's ids (all or some) do not
    (its files may still have changed: the image checks say so)."""
    run = _folder(tmp_path, "done")
    assert adds_to_a_finished_run(run, _responses(True), image_ids=pa.array(ids)) is added
    assert not adds_to_a_finished_run(run, _responses(False), image_ids=pa.array(ids))  # a local model's actors


def test_a_finished_run_whose_images_table_cannot_be_read_starts_nothing_on_ids(tmp_path):
    run = _folder(tmp_path, "done")
    (tmp_path / "run" / "images.parquet").write_bytes(b"not parquet")
    assert not adds_to_a_finished_run(run, _responses(True), image_ids=pa.array(["img2"]))
    (tmp_path / "run" / "images.parquet").unlink()
    assert not adds_to_a_finished_run(run, _responses(True), image_ids=pa.array(["img2"]))


@pytest.mark.parametrize(
    "state, cache, frees, why",
    [
        ("done", "cached", True, "a fully cached rerun starts nothing"),
        (None, "added", True, "a fresh run: its long stages hide the start"),
        ("running", "added", True, "a killed run's embed stage"),
        ("incomplete", "added", True, "an embed stage that stopped"),
        ("done", "added", False, "a local model's actors could wait for ever behind the encoders'"),
    ],
)
def test_other_runs_start_nothing_ahead(tmp_path, checked, state, cache, frees, why):
    assert not adds_to_a_finished_run(_folder(tmp_path, state), _responses(frees), checked[cache]), why
    if cache == "added":  # nor do new ids
        assert not adds_to_a_finished_run(
            _folder(tmp_path / "ids", state), _responses(frees), image_ids=pa.array(["x"])
        )


def test_an_unreadable_manifest_starts_nothing_and_is_left_as_it_is(tmp_path, checked):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{not json")
    assert not adds_to_a_finished_run(str(run), _responses(True), checked["added"])
    assert not adds_to_a_finished_run(str(run), _responses(True), image_ids=pa.array(["img2"]))
    assert (run / "manifest.json").read_text() == "{not json"  # set aside only by a run that holds the folder
    assert [p.name for p in run.iterdir()] == ["manifest.json"]


@pytest.mark.parametrize("error, closing", [("input", ["close_soon"]), ("other", ["close"])])
def test_a_run_refused_for_its_input_shuts_ray_down_beside_saying_why(monkeypatch, error, closing):
    """Ray started ahead for the images a refused run adds takes seconds to finish starting and shut
    down: the problems are said meanwhile (`close_soon`; the process's end waits for it). Any other
    failure closes it before it goes on."""
    from types import SimpleNamespace

    from vlm_decade.core.errors import InputError, Problem
    from vlm_decade.studies.decade import pipeline

    calls = []

    class Ray:
        def __init__(self, runtime):
            pass

        def close_soon(self):
            calls.append("close_soon")

        def close(self):
            calls.append("close")

    def refused(study, reporter, ray):
        raise InputError([Problem("images.csv", "image file not found", 3, "file")]) if error == "input" else OSError()

    monkeypatch.setattr(pipeline, "LazyRay", Ray)
    monkeypatch.setattr(pipeline, "_run", refused)
    with pytest.raises(InputError if error == "input" else OSError):
        pipeline.run(SimpleNamespace(runtime=None))
    assert calls == closing


def test_the_process_ends_only_once_a_shutdown_handed_to_close_soon_is_done(tmp_path):
    """What `close_soon` hands to its thread (a start under way seen through, Ray shut down) is
    finished before the process ends, though the main thread ended first (a refused run's)."""
    import subprocess
    import sys

    done = tmp_path / "closed"
    script = (
        "import sys, time\n"
        "from vlm_decade.core.runtime import LazyRay\n"
        "ray = LazyRay(None)\n"
        "shut_down = ray._close\n"
        "def slow():\n"
        "    time.sleep(1.0)\n"
        "    shut_down()\n"
        "    open(sys.argv[1], 'w').write('closed')\n"
        "ray._close = slow\n"
        "ray.close_soon()\n"
    )
    ended = subprocess.run([sys.executable, "-c", script, str(done)], capture_output=True, text=True, timeout=60)
    assert ended.returncode == 0, ended.stderr
    assert done.read_text() == "closed"
