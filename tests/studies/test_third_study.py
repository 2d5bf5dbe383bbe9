"""A study is one registration: the third study (`tests.studies.third`, defined only in the tests)
runs through `vlm-decade run`, is seen in the viewer and runs as a `ray job submit` script, with
nothing in the package changed for it. The job is run in-process, as the head would run its
script, not submitted to a Ray head (tests/e2e/test_ray_job.py does that for Study A): the job
entry is resolved through the registry, as a file of another study is refused naming its script."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image
from starlette.testclient import TestClient
from typer.testing import CliRunner

from tests.studies.third import THIRD
from vlm_decade import job
from vlm_decade.cli import app
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.studies import STUDIES, load_study, pipeline_of, schema_markdown
from vlm_decade.studies.registry import Study, register
from vlm_decade.view.app import create_app
from vlm_decade.view.runs import open_run

from ..unit.pages import Page

ROOT = Path(__file__).resolve().parents[2]
LEVELS = {"dark": 30, "light": 230, "mid": 128}


@pytest.fixture(scope="module", autouse=True)
def third():
    """The third study registered for this module's tests only."""
    register(THIRD)
    yield THIRD
    STUDIES.pop(THIRD.name)


def study_file(folder: Path) -> Path:
    """A third-study file over three grey images; its run folder `folder/run`."""
    images = folder / "images"
    images.mkdir(parents=True)
    for name, level in LEVELS.items():
        Image.new("L", (8, 6), level).save(images / f"{name}.png")
    path = folder / "study.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "study": "third",
                "name": "third",
                "images": "images",
                "models": [{"name": "eye", "backend": "imported", "model_id": "eye"}],
                "output": "run",
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """The third study run by `vlm-decade run`, in-process."""
    path = study_file(tmp_path_factory.mktemp("third"))
    done = CliRunner().invoke(app, ["run", str(path)])
    assert done.exit_code == 0, done.output
    return path.parent / "run"


def test_the_registry_knows_it_by_its_files_study_and_refuses_another_under_its_name(tmp_path):
    study = load_study(study_file(tmp_path))
    assert isinstance(study, THIRD.config) and pipeline_of(study).__name__ == THIRD.pipeline
    assert "| `images` |" in schema_markdown("third")
    register(THIRD)  # the same record again: nothing changes
    with pytest.raises(ValueError, match="registered already"):
        register(Study(**{**vars(THIRD), "job": "elsewhere.py"}))


def test_vlm_decade_run_writes_its_table_through_the_run_folder(run_folder):
    folder = RunFolder(run_folder)
    brightness = dict(zip(*folder.read("brightness").select(["image_id", "brightness"]).to_pydict().values()))
    assert brightness == pytest.approx({name: level / 255 for name, level in LEVELS.items()})
    manifest = folder.manifest()
    assert manifest["config"]["study"] == "third" and manifest["pipeline"] == ["images", "brightness"]
    again = CliRunner().invoke(app, ["run", str(run_folder.parent / "study.yaml")])
    assert again.exit_code == 0 and "skip brightness" in again.output  # the spine's resume, as any study's


def test_the_viewer_shows_its_gallery_image_and_model_pages(run_folder):
    client = TestClient(create_app(open_run(run_folder)), base_url="http://127.0.0.1:8765")
    gallery = client.get("/")
    assert gallery.status_code == 200
    text = Page(gallery.text).sections[""]
    assert "Third study: brightness" in text and "Mean brightness" in text
    assert [a["data-image"] for tag, a in Page(gallery.text).tags if tag == "a" and "data-image" in a] == sorted(LEVELS)
    assert f"{230 / 255:.3f}" in text
    image = client.get("/image/light")
    assert image.status_code == 200 and f"mean brightness {230 / 255:.3f}" in image.text
    assert client.get("/picture/thumb/light").headers["content-type"] == "image/jpeg"
    assert client.get("/model/eye").status_code == 200
    assert client.get("/image/nothing").status_code == 404 and client.get("/confusions").status_code == 404


def test_it_runs_as_a_job_from_its_script(tmp_path, monkeypatch, capsys):
    path = study_file(tmp_path)
    monkeypatch.setattr(sys, "argv", [THIRD.job, "--config", str(path), "--out", str(tmp_path / "job")])
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(ROOT / THIRD.job), run_name="__main__")
    assert ended.value.code == 0, capsys.readouterr().err
    assert f"run folder: {(tmp_path / 'job').resolve()}" in capsys.readouterr().out
    assert RunFolder(tmp_path / "job").read("brightness").num_rows == len(LEVELS)


def test_its_job_runs_its_demo_and_a_file_of_another_study_is_sent_to_its_script(tmp_path, capsys):
    assert job.main("third", "test", ["--demo", "--out", str(tmp_path / "demo")]) == 0
    assert RunFolder(tmp_path / "demo").read("brightness").num_rows == 3
    assert job.main("decade", "test", ["--config", str(study_file(tmp_path / "b"))]) == 2
    assert f"a `study: third` file; run it with {THIRD.job}" in capsys.readouterr().err
