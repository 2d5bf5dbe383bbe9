"""The data forms people keep read as the tables of the CSV form: a COCO captions JSON (Study A), and
an image folder of class folders or a Hugging Face dataset on disk (Study B), give the CSV + files
run's tables (a Hugging Face dataset's image paths aside: each its row's place in the dataset's files),
and each bad input of a form exits 2 through `validate`, named by its JSON path, folder, file or
dataset row, with no traceback and nothing written."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from vlm_decade.cli import app
from vlm_decade.core import storage
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
    for key in ("images", "descriptions", "captions_json", "image_dir", "votes"):
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
    # `license`, `height` and `width` are metadata, as further columns of the images table would be.
    assert by_coco.metadata.to_pydict() == {
        "image_id": ["1", "2"],
        "license": ["3", "3"],
        "height": ["16", "16"],
        "width": ["16", "16"],
    }


def test_coco_image_fields_are_metadata_but_links_and_nested_values(study_a):
    document = coco_document()
    document["images"][0] |= {
        "date_captured": "2013-11-14 17:02:52",
        "coco_url": "http://images.cocodataset.org/val2017/a.png",
        "flickr_url": "http://farm4.staticflickr.com/a.png",
        "url": "http://example.org/a.png",
        "tags": ["red"],  # nested here...
        "ratio": 0.5,
        "crowd": True,
        "note": None,
    }
    document["images"][1] |= {"tags": "green", "ratio": 1, "dataset": "other", "file": "x.png"}  # ...text here
    (study_a / "captions.json").write_text(json.dumps(document))
    data = load_a(study_a, {"captions_json": "captions.json", "image_dir": "imgs", "dataset": "tiny"})
    # Hand-worked: fields in the order they first appear; a field an entry lacks, or null, is empty;
    # numbers and flags as Python writes them; links, the fields the table reads and `tags` (a list
    # in one entry) are left out.
    assert data.metadata.to_pydict() == {
        "image_id": ["1", "2"],
        "license": ["3", "3"],
        "height": ["16", "16"],
        "width": ["16", "16"],
        "date_captured": ["2013-11-14 17:02:52", ""],
        "ratio": ["0.5", "1"],
        "crowd": ["True", ""],
        "note": ["", ""],
    }
    assert data.images.column("dataset").to_pylist() == ["tiny", "tiny"]
    assert data.images.column("path").to_pylist() == [str(study_a / "imgs" / n) for n in ("a.png", "b.png")]


def test_a_coco_metadata_field_groups_the_analysis(study_a):
    document = coco_document()
    for entry, kind in zip(document["images"], ("warm", "cool")):
        entry["tone"] = kind
    (study_a / "captions.json").write_text(json.dumps(document))
    raw = yaml.safe_load((study_a / "coco.yaml").read_text())
    for group_by, code in ((["tone"], 0), (["license_x"], 2)):
        raw["analysis"] = {"group_by": group_by}
        (study_a / "grouped.yaml").write_text(yaml.safe_dump(raw))
        done = CliRunner().invoke(app, ["validate", str(study_a / "grouped.yaml")])
        assert done.exit_code == code, done.output
    assert "its metadata columns: license, height, width, tone" in " ".join(done.output.split())


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
    assert "Traceback" not in output
    assert done.exception is None or isinstance(done.exception, SystemExit)
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


# --- Study B: a Hugging Face dataset on disk ----------------------------------------------------------

FEATURES = {"image": {"_type": "Image"}, "label": {"names": ["cat", "dog"], "_type": "ClassLabel"}}


def hf_rows(folder: Path) -> pa.Table:
    """The study_b images as a dataset's rows: `image` {bytes, path} and `label` (a class number)."""
    files = sorted(PETS)
    images = [{"bytes": (folder / "pics" / f).read_bytes(), "path": Path(f).name} for f in files]
    labels = [["cat", "dog"].index(f.split("/")[0]) for f in files]
    return pa.table({"image": images, "label": pa.array(labels, pa.int64())})


def save_to_disk(root: Path, rows: pa.Table, features: dict) -> None:
    """The layout of `DatasetDict.save_to_disk` with one split, `train`."""
    (root / "train").mkdir(parents=True)
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    with pa.OSFile(str(root / "train" / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
    (root / "train" / "dataset_info.json").write_text(json.dumps({"features": features}))
    state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": "train"}
    (root / "train" / "state.json").write_text(json.dumps(state))


def parquet_files(root: Path, rows: pa.Table, features: dict) -> None:
    """The hub's layout: data/train-00000-of-00001.parquet, the features in its `huggingface` metadata."""
    (root / "data").mkdir(parents=True)
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    pq.write_table(rows.replace_schema_metadata(metadata), root / "data" / "train-00000-of-00001.parquet")


@pytest.fixture
def study_hf(study_b):
    """study_b's images as a Hugging Face dataset saved to disk (`hf.yaml`) and as Parquet files
    (`hfpq.yaml`), with the tables they must equal (`hfcsv.yaml`: ids are `train/<row>`)."""
    rows = hf_rows(study_b)
    save_to_disk(study_b / "saved", rows, FEATURES)
    parquet_files(study_b / "hub", rows, FEATURES)
    save_to_disk(study_b / "dict", rows, FEATURES)
    shutil.move(study_b / "dict" / "train", study_b / "one")  # one `Dataset` saved, not a `DatasetDict`
    lines = [f"train/{i:06d},pets,{f},{f.split('/')[0]},prototypical" for i, f in enumerate(sorted(PETS))]
    (study_b / "hflabels.csv").write_text("image_id,dataset,file,label,granularity\n" + "\n".join(lines) + "\n")
    ids = "".join(f"train/{i:06d},full,x\n" for i in range(len(PETS)))
    (study_b / "c.csv").write_text("image_id,variant,text\n" + ids)
    raw = yaml.safe_load((study_b / "folder.yaml").read_text())
    hf = {"dataset": "pets", "granularity": "prototypical", "split": "train"}
    tables = {"labels": "hflabels.csv", "image_dir": "pics", "classnames": "classes.csv"}
    for name, data in (
        ("hf", {**hf, "hf_dataset": "saved"}),
        ("hfpq", {**hf, "hf_dataset": "hub"}),
        ("hfone", {**hf, "hf_dataset": "one"}),
        ("hfcsv", tables),
    ):
        (study_b / f"{name}.yaml").write_text(yaml.safe_dump({**raw, "data": data, "output": "run"}))
    return study_b


def load_hf(study_file: Path):
    from vlm_decade.studies import load_study
    from vlm_decade.studies.openworld.data import load_openworld_form

    study = load_study(study_file)
    return load_openworld_form(study.data)


@pytest.mark.parametrize("form", ["hf", "hfpq", "hfone"])
def test_a_hugging_face_dataset_gives_the_csv_forms_tables(study_hf, form):
    by_csv = load_hf(study_hf / "hfcsv.yaml")
    by_hf = load_hf(study_hf / f"{form}.yaml")
    # The images are read in place from the dataset's files: only their paths differ, each its row's location.
    assert by_hf.images.drop_columns(["path"]).equals(by_csv.images.drop_columns(["path"]))
    files = sorted(PETS)
    for image_id, path in zip(by_hf.images["image_id"].to_pylist(), by_hf.images["path"].to_pylist()):
        member = storage.member(path)
        assert member is not None and member.name == image_id and member.column == "image"
        assert storage.read_bytes(path) == (study_hf / "pics" / files[int(image_id.split("/")[1])]).read_bytes()
    assert not (study_hf / "run").exists()  # nothing copied into the run folder
    assert by_hf.labels.equals(by_csv.labels)
    assert by_hf.classnames == by_csv.classnames == {"pets": ("cat", "dog")}


def test_validate_says_the_hugging_face_dataset_and_its_counts(study_hf):
    done = CliRunner().invoke(app, ["validate", str(study_hf / "hf.yaml")])
    output = " ".join(done.output.split())
    assert done.exit_code == 0, output
    assert "3 labelled images in 1 dataset (pets: prototypical)" in output
    assert f"read from the Hugging Face dataset {study_hf / 'saved'} (split train)" in output


@pytest.mark.parametrize("form", ["saved", "hub"])
def test_a_dataset_without_an_image_column_or_class_names_is_refused(study_hf, form):
    write = save_to_disk if form == "saved" else parquet_files
    rows = hf_rows(study_hf)
    shutil.rmtree(study_hf / form)
    write(study_hf / form, rows.rename_columns(["picture", "label"]), FEATURES)
    yaml_file = "hf.yaml" if form == "saved" else "hfpq.yaml"
    refused(
        study_hf / yaml_file, "no image column 'image' of {bytes, path} (data.image_column): columns picture, label"
    )
    shutil.rmtree(study_hf / form)
    write(study_hf / form, rows, {"image": {"_type": "Image"}, "label": {"dtype": "int64", "_type": "Value"}})
    refused(study_hf / yaml_file, "label column 'label' has no class names")


def test_a_split_the_dataset_lacks_and_a_bad_image_are_refused_naming_them(study_hf):
    raw = yaml.safe_load((study_hf / "hf.yaml").read_text())
    raw["data"]["split"] = "test"
    (study_hf / "hf.yaml").write_text(yaml.safe_dump(raw))
    refused(study_hf / "hf.yaml", "has no split 'test' (data.split): its splits are train")
    rows = hf_rows(study_hf)
    images = rows.column("image").to_pylist()
    images[1]["bytes"] = b"not an image"
    shutil.rmtree(study_hf / "saved")
    save_to_disk(study_hf / "saved", rows.set_column(0, "image", pa.array(images)), FEATURES)
    raw["data"]["split"] = "train"
    (study_hf / "hf.yaml").write_text(yaml.safe_dump(raw))
    saved = study_hf / "saved" / "train" / "data-00000-of-00001.arrow"
    refused(study_hf / "hf.yaml", f"{saved}, row 1: not a readable image")


def test_a_label_that_is_no_class_number_is_refused_naming_its_row(study_hf):
    rows = hf_rows(study_hf)
    shutil.rmtree(study_hf / "hub")
    parquet_files(study_hf / "hub", rows.set_column(1, "label", pa.array([0, 5, 1], pa.int64())), FEATURES)
    refused(study_hf / "hfpq.yaml", "train-00000-of-00001.parquet: row 1: label 5 is not a class number (0 to 1)")


def test_votes_rank_a_captions_jsons_descriptions_as_they_rank_the_tables(study_a):
    shown = ";".join(str(10 + k) for k in range(3)), ";".join(str(13 + k) for k in range(3))
    rows = [f"{image},r{r},1,{shown[n]},{10 + 3 * n + (r % 3)}" for n, image in enumerate("12") for r in range(3)]
    (study_a / "votes.csv").write_text("image_id,rater_id,trial,shown,chosen\n" + "\n".join(rows) + "\n")
    tables = {"images": "images.csv", "image_dir": "imgs", "descriptions": "humans.csv", "votes": "votes.csv"}
    coco = {"captions_json": "captions.json", "image_dir": "imgs", "dataset": "tiny", "votes": "votes.csv"}
    by_csv, by_coco = load_a(study_a, tables), load_a(study_a, coco)
    assert by_coco.references.equals(by_csv.references)
    assert by_coco.ranking_method == by_csv.ranking_method == {"tiny": "votes"}


def said(study_file: Path, counts: str, form: str) -> None:
    """`validate` passes the study and ends its line with `form` after `counts`."""
    done = CliRunner().invoke(app, ["validate", str(study_file)])
    output = " ".join(done.output.split())
    assert done.exit_code == 0, output
    assert counts in output and form in output, output
    assert output.index(counts) < output.index(form)


def test_validate_says_which_form_study_a_was_read_from(study_a):
    counts = "2 images in 1 dataset (tiny), 6 human descriptions"
    tables = f"{study_a / 'images.csv'} and {study_a / 'humans.csv'}, images from the folder {study_a / 'imgs'}"
    said(study_a / "csv.yaml", counts, f"; read from the tables {tables}")
    said(study_a / "coco.yaml", counts, f"; read from the COCO captions JSON {study_a / 'captions.json'}")


def test_validate_says_which_form_study_b_was_read_from(study_hf):
    """The image folder's line: test_validate_says_the_image_folder_and_its_counts."""
    counts = "3 labelled images in 1 dataset (pets: prototypical)"
    tables = f"{study_hf / 'hflabels.csv'} and {study_hf / 'classes.csv'}, images from the folder {study_hf / 'pics'}"
    said(study_hf / "hfcsv.yaml", counts, f"; read from the tables {tables}")
    said(study_hf / "hf.yaml", counts, f"; read from the Hugging Face dataset {study_hf / 'saved'} (split train)")
