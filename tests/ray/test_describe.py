"""The describe stage on Ray: same rows as direct calls, whatever the actors and batch size; a bad
image fails its own row only; finished rows are never described twice."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from vlm_decade.core.runfolder import RunFolder
from vlm_decade.demo import materialize
from vlm_decade.imaging.masks import apply_mask, mask_specs
from vlm_decade.models.backends import Stimulus, backend_class
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.data import load_study_data

from .conftest import describe_stage

pytestmark = pytest.mark.ray
KEEP = {"astronaut", "chelsea", "coffee", "motorcycle", "retina"}


@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    """The demo study with the SSD captioner only, on five of its images."""
    study = load_study(materialize(tmp_path_factory.mktemp("study")))
    study = study.model_copy(update={"models": tuple(m for m in study.models if m.name == "ssd-template")})
    images = load_study_data(study.data, study.ranking, study.masks).images
    return study, images.filter(pa.compute.is_in(images.column("image_id"), pa.array(sorted(KEEP))))


def _describe(study, images, out, actors=1, batch_size=4):
    model = study.models[0].model_copy(update={"batch_size": batch_size})
    study = study.model_copy(
        update={"models": (model,), "runtime": study.runtime.model_copy(update={"actors_per_model": actors})}
    )

    return describe_stage(study, images, out)


def _stable(table: pa.Table) -> pa.Table:
    return table.drop_columns(["latency_s"])


def test_ray_rows_equal_direct_calls(small_study, tmp_path):
    study, images = small_study
    table = _describe(study, images, tmp_path / "a")
    assert table.num_rows == len(KEEP) * 4 and set(table.column("status").to_pylist()) == {"ok"}
    backend = backend_class("ssd-template")(study.models[0])
    specs = {s.mask_id: s for s in mask_specs(study.masks)}
    for row in table.to_pylist():
        path = images.filter(pa.compute.equal(images.column("image_id"), row["image_id"])).column("path")[0].as_py()
        rgb = np.asarray(Image.open(path).convert("RGB"))
        image = rgb if row["variant"] == "full" else apply_mask(rgb, specs[row["variant"]])
        direct = backend.describe([Stimulus(row["image_id"], row["variant"], image, "")])[0]
        assert row["text"] == direct.text, row
    texts = {(r["image_id"], r["variant"]): r["text"] for r in table.to_pylist()}
    assert "cat" in texts[("chelsea", "full")].lower()


@pytest.mark.parametrize("actors,batch_size", [(2, 1), (1, 3)])
def test_same_table_whatever_the_layout(small_study, tmp_path, actors, batch_size):
    study, images = small_study
    reference = _describe(study, images, tmp_path / "ref")
    other = _describe(study, images, tmp_path / "other", actors=actors, batch_size=batch_size)
    assert _stable(other).equals(_stable(reference))


def test_a_bad_image_fails_its_row_only_and_is_retried_next_time(small_study, tmp_path):
    study, images = small_study
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    paths = [
        str(broken) if i == "coffee" else p
        for i, p in zip(images.column("image_id").to_pylist(), images.column("path").to_pylist())
    ]
    broken_images = images.set_column(images.column_names.index("path"), "path", pa.array(paths))
    table = _describe(study, broken_images, tmp_path / "run")
    failed = table.filter(pa.compute.equal(table.column("status"), "error")).to_pylist()
    assert {r["image_id"] for r in failed} == {"coffee"} and len(failed) == 4
    assert "could not read image" in failed[0]["error"]
    assert sum(r["status"] == "ok" for r in table.to_pylist()) == (len(KEEP) - 1) * 4

    # The file is mended (same bytes as hashed, so the same cache key) and the stage runs again:
    # only the failed rows are described.
    run = RunFolder(tmp_path / "run")
    run.write("responses", table)
    shutil.copy(images.filter(pa.compute.equal(images.column("image_id"), "coffee")).column("path")[0].as_py(), broken)
    again = _describe(study, broken_images, tmp_path / "run")
    assert set(again.column("status").to_pylist()) == {"ok"}
    unchanged = [r for r in table.to_pylist() if r["status"] == "ok"]
    assert all(r in again.to_pylist() for r in unchanged)  # kept as they were, latency included


def test_more_actors_than_cpus_is_a_clear_error_not_a_hang(small_study, tmp_path):
    from vlm_decade.core.errors import InputError

    study, images = small_study
    with pytest.raises(InputError, match=r"3 actors x 1 CPU = 3 CPU, but this Ray has 2"):
        _describe(study, images, tmp_path / "run", actors=3)


def test_a_model_that_cannot_start_gives_rows_that_say_its_own_error(small_study, tmp_path):
    """An option `validate` refuses, given straight to the stage: the actors' constructor raises, and
    every row says what the backend said when built here, not Ray's wrapper."""
    study, images = small_study
    model = study.models[0].model_copy(update={"options": {"score_threshold": 5}})
    with pytest.raises(ValueError) as raised:
        backend_class("ssd-template")(model)
    table = describe_stage(study.model_copy(update={"models": (model,)}), images, tmp_path / "run")
    assert table.num_rows == len(KEEP) * 4 and set(table.column("status").to_pylist()) == {"error"}
    (said,) = set(table.column("error").to_pylist())
    assert said == f"ValueError: {str(raised.value).splitlines()[0]}" and "score_threshold" in said
    assert not any(wrapper in said for wrapper in ("\x1b", "ActorDiedError", "RayTaskError", "ray::"))


class Halting:
    """An actor whose work raises for one item."""

    def work(self, item: int) -> int:
        if item == 2:
            raise ValueError(f"\x1b[31mitem {item}\x1b[0m cannot be done")
        return item


def test_work_that_raises_in_an_actor_is_handed_back_as_its_own_exception(ray_session):
    from vlm_decade.core.dispatch import pool_map
    from vlm_decade.core.errors import error_text

    actor = ray_session.remote(Halting).options(num_cpus=0)
    done = list(pool_map(ray_session, actor.remote, 1, range(4), lambda a, item: a.work.remote(item)))
    assert sorted((d.work, d.value) for d in done if d.error is None) == [(0, 0), (1, 1), (3, 3)]
    (failed,) = [d.error for d in done if d.error is not None]
    assert type(failed) is ValueError and error_text(failed) == "ValueError: item 2 cannot be done"


def test_an_imported_model_redoes_only_the_rows_of_its_file_that_are_new_or_changed(tmp_path):
    """Rows for new images added to the file: the old responses are kept, not done again; one old
    row's text changed: that response alone is done again."""
    import csv

    study = load_study(materialize(tmp_path / "study"))
    model = next(m for m in study.models if m.backend == "imported")
    captions = tmp_path / "captions.csv"
    with open(tmp_path / "study" / "imported_captions.csv", newline="") as f:
        all_rows = list(csv.DictReader(f))
    model = model.model_copy(update={"options": {"file": str(captions)}})
    study = study.model_copy(update={"models": (model,)})
    images = load_study_data(study.data, study.ranking, study.masks).images
    first, added = sorted(KEEP)[:3], sorted(KEEP)[3:]
    out = tmp_path / "run"

    def describe(ids, rows):
        with open(captions, "w", newline="") as f:
            writer = csv.DictWriter(f, ["image_id", "variant", "text"])
            writer.writeheader()
            writer.writerows(r for r in rows if r["image_id"] in ids)
        table = describe_stage(study, images.filter(pa.compute.is_in(images.column("image_id"), pa.array(ids))), out)
        folder = RunFolder(out)
        done = folder.read_parts("responses", table.schema)  # this run's work, as run_stage folds it
        manifest = folder.manifest()
        manifest.setdefault("files", {})["responses"] = folder.write("responses", table)[1]
        folder.save_manifest(manifest)
        folder.clear_parts("responses")
        return table, sorted(zip(done.column("image_id").to_pylist(), done.column("variant").to_pylist()))

    table, done = describe(first, all_rows)
    assert table.num_rows == len(first) * 4 and len(done) == table.num_rows
    table, done = describe(first + added, all_rows)
    assert done == sorted((i, v) for i in added for v in ("full", "m1", "m2", "m3"))
    texts = {(r["image_id"], r["variant"]): r["text"] for r in table.to_pylist()}
    assert texts == {(r["image_id"], r["variant"]): r["text"] for r in all_rows if r["image_id"] in KEEP}
    changed = [
        dict(r, text="a cat on a red sofa") if (r["image_id"], r["variant"]) == ("chelsea", "m2") else r
        for r in all_rows
    ]
    table, done = describe(first + added, changed)
    assert done == [("chelsea", "m2")]
    assert {(r["image_id"], r["variant"]): r["text"] for r in table.to_pylist()}[
        ("chelsea", "m2")
    ] == "a cat on a red sofa"
