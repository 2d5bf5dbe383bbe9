"""The data forms people keep read as the tables of the CSV form: a COCO captions JSON (Study A) and an
image folder of class folders (Study B) give the CSV + files run's tables (ids and paths aside where
the form sets them), and each bad input of the form exits 2 through `validate`, named by its JSON path
or folder, with no traceback and nothing written."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from vlm_decade.cli import app
from vlm_decade.studies import study_from_dict
from vlm_decade.studies.decade.config import RankingConfig
from vlm_decade.studies.decade.data import load_study_data

IMPORTED = {"name": "old", "backend": "imported", "model_id": "x", "era": "pre-mllm", "options": {"file": "c.csv"}}
COLOURS = {"a": (200, 0, 0), "b": (0, 200, 0)}
CAPTIONS = {
    "a": ["a red square", "a square of red", "red, square and flat"],
    "b": ["a green square", "a square of green", "green, square and flat"],
}


def images(folder: Path) -> None:
    folder.mkdir(parents=True)
    for name, colour in COLOURS.items():
        Image.new("RGB", (16, 16), colour).save(folder / f"{name}.png")


def coco_document() -> dict:
    return {
        "info": {"description": "tiny"},
        "images": [
            {"id": 1, "file_name": "a.png", "license": 3, "height": 16, "width": 16},
            {"id": 2, "file_name": "b.png", "license": 3, "height": 16, "width": 16},
        ],
        "annotations": [
            {"id": 10 + 3 * n + k, "image_id": n + 1, "caption": text}
            for n, name in enumerate(COLOURS)
            for k, text in enumerate(CAPTIONS[name])
        ],
    }


@pytest.fixture
def study_a(tmp_path):
    """The same Study A input as CSV tables (`csv.yaml`) and as a COCO captions JSON (`coco.yaml`)."""
    images(tmp_path / "imgs")
    ids = {"a": "1", "b": "2"}
    (tmp_path / "images.csv").write_text("image_id,dataset,file\n1,tiny,a.png\n2,tiny,b.png\n")
    rows = [
        f'{10 + 3 * n + k},{ids[name]},{10 + 3 * n + k},full,"{text}"'
        for n, name in enumerate(COLOURS)
        for k, text in enumerate(CAPTIONS[name])
    ]
    (tmp_path / "humans.csv").write_text("description_id,image_id,worker_id,condition,text\n" + "\n".join(rows) + "\n")
    (tmp_path / "captions.json").write_text(json.dumps(coco_document()))
    (tmp_path / "c.csv").write_text("image_id,variant,text\n1,full,red\n2,full,green\n")
    base = {"name": "forms", "models": [IMPORTED]}
    csv_data = {"images": "images.csv", "image_dir": "imgs", "descriptions": "humans.csv"}
    coco_data = {"captions_json": "captions.json", "image_dir": "imgs", "dataset": "tiny"}
    for name, data in (("csv", csv_data), ("coco", coco_data)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({**base, "data": data}))
    return tmp_path


def load_a(folder: Path, data: dict):
    raw = {"name": "forms", "models": [IMPORTED], "data": copy.deepcopy(data)}
    for key in ("images", "descriptions", "captions_json", "image_dir"):
        if key in raw["data"]:
            raw["data"][key] = str(folder / raw["data"][key])
    study = study_from_dict(raw)
    return load_study_data(study.data, RankingConfig(), study.masks)


def test_coco_captions_give_the_csv_forms_tables(study_a):
    by_csv = load_a(study_a, {"images": "images.csv", "image_dir": "imgs", "descriptions": "humans.csv"})
    by_coco = load_a(study_a, {"captions_json": "captions.json", "image_dir": "imgs", "dataset": "tiny"})
    # The worker of a caption without `worker_id` is the caption's own id, as the CSV above gives it.
    assert by_coco.images.equals(by_csv.images)
    assert by_coco.references.equals(by_csv.references)
    assert by_coco.ranking_method == by_csv.ranking_method == {"tiny": "consensus"}
    assert by_coco.metadata.column_names == ["image_id"]  # `license`, `height`... are ignored


def test_validate_says_the_captions_json_and_its_counts(study_a):
    done = CliRunner().invoke(app, ["validate", str(study_a / "coco.yaml")])
    output = " ".join(done.output.split())
    assert done.exit_code == 0, output
    assert "2 images in 1 dataset (tiny), 6 human descriptions" in output
    assert "read from the COCO captions JSON" in output and "captions.json" in output


def refused(study_file: Path, *expected: str) -> None:
    folder = study_file.parent
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    done = CliRunner().invoke(app, ["validate", str(study_file)])
    output = " ".join(done.output.split())
    assert done.exit_code == 2, output
    assert "Traceback" not in output and done.exception is None or isinstance(done.exception, SystemExit)
    for text in expected:
        assert text in output, output
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before  # nothing written


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d["annotations"][4].update(image_id=7), "annotations[4].image_id: unknown image id '7'"),
        (lambda d: d.pop("annotations"), "annotations: missing"),
        (lambda d: d["annotations"][2].update(caption="  "), "annotations[2].caption: empty"),
        (lambda d: d["annotations"][3].update(id=10), "annotations[3].id: duplicate caption id '10'"),
        (lambda d: d["images"].append({"id": 1, "file_name": "b.png"}), "images[2].id: duplicate image id '1'"),
        (lambda d: d["images"][1].update(file_name="gone.png"), "images[1].file_name:"),
    ],
)
def test_bad_captions_json_is_refused_by_its_json_path(study_a, change, expected):
    document = coco_document()
    change(document)
    (study_a / "captions.json").write_text(json.dumps(document))
    refused(study_a / "coco.yaml", "captions.json", expected)


# --- Study B: an image folder, one folder per class ----------------------------------------------------

PETS = {"cat/a.png": (200, 0, 0), "cat/b.png": (0, 200, 0), "dog/c.png": (0, 0, 200)}


@pytest.fixture
def study_b(tmp_path):
    """The same Study B input as tables (`csv.yaml`) and as an image folder (`folder.yaml`)."""
    for file, colour in PETS.items():
        (tmp_path / "pics" / file).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (12, 8), colour).save(tmp_path / "pics" / file)
    (tmp_path / "pics" / "cat" / "README.txt").write_text("not an image: left out")
    rows = [f"{f[:-4]},pets,{f},{f.split('/')[0]},prototypical" for f in PETS]
    (tmp_path / "labels.csv").write_text("image_id,dataset,file,label,granularity\n" + "\n".join(rows) + "\n")
    (tmp_path / "classes.csv").write_text("dataset,class_name\npets,cat\npets,dog\n")
    (tmp_path / "c.csv").write_text("image_id,variant,text\n" + "".join(f"{f[:-4]},full,x\n" for f in PETS))
    model = {k: v for k, v in IMPORTED.items() if k != "era"}  # Study B's models have no era
    base = {"study": "openworld", "name": "forms", "models": [model], "judge": None}
    tables = {"labels": "labels.csv", "image_dir": "pics", "classnames": "classes.csv"}
    folder = {"image_folder": "pics", "dataset": "pets", "granularity": "prototypical"}
    for name, data in (("csv", tables), ("folder", folder), ("listed", {**folder, "classnames": "classes.csv"})):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({**base, "data": data}))
    return tmp_path


def load_b(study_file: Path):
    from vlm_decade.studies import load_study
    from vlm_decade.studies.openworld.data import load_openworld_form

    study = load_study(study_file)
    return load_openworld_form(study.data)


def test_an_image_folder_gives_the_csv_forms_tables(study_b):
    by_csv = load_b(study_b / "csv.yaml")
    for form in ("folder", "listed"):
        by_folder = load_b(study_b / f"{form}.yaml")
        assert by_folder.images.equals(by_csv.images)
        assert by_folder.labels.equals(by_csv.labels)
        assert by_folder.classnames == by_csv.classnames == {"pets": ("cat", "dog")}
        assert by_folder.granularity == by_csv.granularity


def test_validate_says_the_image_folder_and_its_counts(study_b):
    done = CliRunner().invoke(app, ["validate", str(study_b / "folder.yaml")])
    output = " ".join(done.output.split())
    assert done.exit_code == 0, output
    assert "3 labelled images in 1 dataset (pets: prototypical)" in output
    assert f"read from the image folder {study_b / 'pics'}" in output


def test_an_empty_class_folder_is_refused_by_its_name(study_b):
    (study_b / "pics" / "bird").mkdir()
    refused(study_b / "folder.yaml", f"{study_b / 'pics' / 'bird'}: class folder 'bird' has no images")


def test_a_class_folder_the_class_list_lacks_is_refused_by_its_name(study_b):
    (study_b / "classes.csv").write_text("dataset,class_name\npets,cat\npets,cow\n")
    refused(study_b / "listed.yaml", f"{study_b / 'pics' / 'dog'}: class folder 'dog' is not in the class list")


def test_a_bad_image_in_a_class_folder_is_named_by_its_file(study_b):
    (study_b / "pics" / "dog" / "d.png").write_bytes(b"not a png")
    refused(study_b / "folder.yaml", f"{study_b / 'pics' / 'dog' / 'd.png'}: ")
