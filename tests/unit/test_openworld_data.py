"""Study B's input: the tables built from good data, one Problem per kind of bad input, and the demo's
real photos, labels and class lists checked against the packages they come from."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import required
from vlm_decade.core.errors import InputError
from vlm_decade.stages.images import IMAGES_SCHEMA
from vlm_decade.studies.openworld.data import LABELS_SCHEMA, load_openworld_data

from .input_files import png_bytes, write_csv

LABEL_HEADER = ["image_id", "dataset", "file", "label", "granularity"]
# CIFAR-10's own batches.meta label_names, in class-number order (Krizhevsky, 2009).
CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class Study:
    """A valid three-image, two-dataset Study B input in a folder; tests change the rows, then `load()`."""

    def __init__(self, root: Path):
        self.root = root
        self.image_dir = root / "pics"
        self.image_dir.mkdir()
        self.files = {"b.png": png_bytes(12, 8, 1), "a.png": png_bytes(10, 6, 2), "sub/c.png": png_bytes(7, 5, 3)}
        # Deliberately not in image_id order, with an extra column that must be ignored.
        self.extra_column = "note"
        self.labels = [
            ["toy_b", "toys", "b.png", "cat", "prototypical", "x"],
            ["toy_a", "toys", "a.png", "dog", "prototypical", ""],
            ["bird_c", "birds", "sub/c.png", "scarlet tanager", "very fine-grained", ""],
        ]
        self.classnames = [
            ["toys", "dog"],
            ["toys", "cat"],
            ["birds", "scarlet tanager"],
            ["birds", "summer tanager"],
            ["unused", "anything"],
        ]

    def write(self) -> tuple[Path, Path]:
        for name, content in self.files.items():
            (self.image_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (self.image_dir / name).write_bytes(content)
        labels = write_csv(self.root / "labels.csv", LABEL_HEADER + [self.extra_column], self.labels)
        classnames = write_csv(self.root / "classnames.csv", ["dataset", "class_name"], self.classnames)
        return labels, classnames

    def load(self):
        labels, classnames = self.write()
        return load_openworld_data(labels, self.image_dir, classnames)

    def problems(self) -> set[tuple[str, int | None, str | None]]:
        with pytest.raises(InputError) as caught:
            self.load()
        return {(Path(p.file).name, p.row, p.field) for p in caught.value.problems}

    def messages(self) -> list[str]:
        with pytest.raises(InputError) as caught:
            self.load()
        return [str(p) for p in caught.value.problems]


@pytest.fixture
def study(tmp_path) -> Study:
    return Study(tmp_path)


# --- good data -------------------------------------------------------------------------------------


def test_good_data_builds_sorted_tables_with_file_hashes(study):
    data = study.load()
    assert data.images.schema == IMAGES_SCHEMA
    assert data.labels.schema == LABELS_SCHEMA
    assert data.images["image_id"].to_pylist() == ["bird_c", "toy_a", "toy_b"]
    assert data.labels.to_pylist() == [
        {
            "image_id": "bird_c",
            "dataset": "birds",
            "label": "scarlet tanager",
            "granularity": "very fine-grained",
            "accepted": [],
        },
        {"image_id": "toy_a", "dataset": "toys", "label": "dog", "granularity": "prototypical", "accepted": []},
        {"image_id": "toy_b", "dataset": "toys", "label": "cat", "granularity": "prototypical", "accepted": []},
    ]
    files = {"bird_c": "sub/c.png", "toy_a": "a.png", "toy_b": "b.png"}
    sizes = {"bird_c": (7, 5), "toy_a": (10, 6), "toy_b": (12, 8)}
    for row in data.images.to_pylist():
        path = study.image_dir / files[row["image_id"]]
        assert row["path"] == str(path.resolve())
        assert row["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert (row["width"], row["height"]) == sizes[row["image_id"]]
    # Class lists keep the table's order; a list of a dataset with no labelled image is left out.
    assert data.classnames == {"birds": ("scarlet tanager", "summer tanager"), "toys": ("dog", "cat")}
    assert list(data.granularity.items()) == [("birds", "very fine-grained"), ("toys", "prototypical")]


def test_accepted_names_are_split_at_bars_or_read_as_a_parquet_list(study):
    # Blanks, a repeat and the label itself are dropped; a name need not be in the class list.
    cells = {"toy_b": "kitten|cat", "toy_a": "", "bird_c": " red tanager | | tanager|red tanager"}
    study.extra_column = "accepted"
    study.labels = [r[:5] + [cells[r[0]]] for r in study.labels]
    data = study.load()
    expected = {"bird_c": ["red tanager", "tanager"], "toy_a": [], "toy_b": ["kitten"]}
    assert dict(zip(data.labels["image_id"].to_pylist(), data.labels["accepted"].to_pylist())) == expected
    lists = {"bird_c": ["red tanager", " tanager"], "toy_a": None, "toy_b": ["kitten", "cat"]}
    columns = {c: [r[i] for r in study.labels] for i, c in enumerate(LABEL_HEADER)}
    columns["accepted"] = [lists[r[0]] for r in study.labels]
    pq.write_table(pa.table(columns), study.root / "labels.parquet")
    parquet = load_openworld_data(study.root / "labels.parquet", study.image_dir, study.root / "classnames.csv")
    assert parquet.labels.equals(data.labels)


def test_the_labels_tables_further_columns_are_kept_as_metadata_and_can_group(study):
    data = study.load()
    assert data.metadata.to_pylist() == [
        {"image_id": "bird_c", "note": ""},
        {"image_id": "toy_a", "note": ""},
        {"image_id": "toy_b", "note": "x"},
    ]
    labels, classnames = study.write()
    assert load_openworld_data(labels, study.image_dir, classnames, group_by=("note",)).metadata.equals(data.metadata)
    with pytest.raises(InputError) as caught:
        load_openworld_data(labels, study.image_dir, classnames, group_by=("notes",))
    assert [str(p) for p in caught.value.problems] == [
        "study file, field 'analysis.group_by': 'notes' is no metadata column of labels.csv; "
        "its metadata columns: note (did you mean 'note'?)"
    ]


def test_parquet_tables_load_like_csv(study):
    csv_data = study.load()
    labels = study.root / "labels.parquet"
    classnames = study.root / "classnames.parquet"
    pq.write_table(pa.table({c: [r[i] for r in study.labels] for i, c in enumerate(LABEL_HEADER)}), labels)
    names = {"dataset": [r[0] for r in study.classnames], "class_name": [r[1] for r in study.classnames]}
    pq.write_table(pa.table(names), classnames)
    data = load_openworld_data(labels, study.image_dir, classnames)
    assert data.labels.equals(csv_data.labels)
    assert data.images.equals(csv_data.images)
    assert data.classnames == csv_data.classnames


def test_repeated_class_names_are_kept_in_order(study):
    # clip-benchmark's ImageNet list names 'missile' and 'sunglasses' twice; that is not an error.
    study.classnames.insert(1, ["toys", "dog"])
    assert study.load().classnames["toys"] == ("dog", "dog", "cat")


# --- bad input: each problem names file, row and field ---------------------------------------------


def test_duplicate_image_id_names_the_later_row(study):
    study.labels.append(["toy_a", "toys", "b.png", "cat", "prototypical", ""])
    assert study.problems() == {("labels.csv", 5, "image_id")}
    assert any("first at row 3" in m for m in study.messages())


def test_empty_label_and_blank_granularity(study):
    study.labels[0][3] = "   "
    study.labels[1][4] = ""
    assert study.problems() == {("labels.csv", 2, "label"), ("labels.csv", 3, "granularity")}


def test_unknown_granularity_lists_the_allowed_ones(study):
    study.labels[2][4] = "Very Fine-Grained"
    assert study.problems() == {("labels.csv", 4, "granularity")}
    [message] = study.messages()
    assert "prototypical, fine-grained, very fine-grained" in message
    assert "(did you mean 'very fine-grained'?)" in message


def test_a_dataset_with_two_granularities_is_reported_at_the_disagreeing_row(study):
    study.labels[1][4] = "fine-grained"
    assert study.problems() == {("labels.csv", 3, "granularity")}
    [message] = study.messages()
    assert "'prototypical' given for dataset 'toys' at row 2" in message


def test_missing_and_undecodable_image_files(study):
    study.labels[0][2] = "nowhere.png"
    study.files["a.png"] = b"not an image at all"
    study.files["sub/c.png"] = png_bytes(7, 5, 3)[:60]  # truncated: only a full decode finds it
    assert study.problems() == {("labels.csv", 2, "file"), ("labels.csv", 3, "file"), ("labels.csv", 4, "file")}
    messages = study.messages()
    assert any("image file not found" in m and "nowhere.png" in m for m in messages)
    assert any("not a readable image" in m and "a.png" in m for m in messages)


def test_label_not_in_its_class_list_names_the_row_and_suggests_the_spelling(study):
    study.labels[0][3] = "Cat"  # the list has 'cat'
    study.labels[2][3] = "cardinal"
    assert study.problems() == {("labels.csv", 2, "label"), ("labels.csv", 4, "label")}
    messages = study.messages()
    assert any("label 'Cat' is not among the 2 class names of dataset 'toys' in classnames.csv" in m for m in messages)
    assert any("did you mean 'cat'?" in m for m in messages)
    assert not any("did you mean" in m and "cardinal" in m for m in messages)


def test_a_labelled_dataset_without_class_names_is_reported_once(study):
    study.classnames = [r for r in study.classnames if r[0] != "toys"]
    assert study.problems() == {("labels.csv", 2, "dataset")}  # the first of the two 'toys' rows


def test_class_list_rows_need_both_fields(study):
    study.classnames.append(["toys", " "])
    study.classnames.append(["", "cow"])
    assert study.problems() == {("classnames.csv", 7, "class_name"), ("classnames.csv", 8, "dataset")}


def test_a_missing_column_and_a_missing_class_names_file_are_reported_together(study):
    labels, _ = study.write()
    write_csv(labels, ["image_id", "dataset", "file", "label"], [["x", "toys", "a.png", "cat"]])
    with pytest.raises(InputError) as caught:
        load_openworld_data(labels, study.root / "no-such-folder", study.root / "no-such.csv")
    found = {(Path(p.file).name, p.row, p.field) for p in caught.value.problems}
    assert found == {("labels.csv", 1, "granularity"), ("no-such.csv", None, None)}


def test_missing_image_folder_is_one_problem(study):
    labels, classnames = study.write()
    with pytest.raises(InputError) as caught:
        load_openworld_data(labels, study.root / "elsewhere", classnames)
    found = [(Path(p.file).name, p.row, p.field) for p in caught.value.problems]
    assert found == [("elsewhere", None, "data.image_dir")]


def test_all_problems_come_together_and_nothing_is_written(study):
    study.labels.append(["toy_a", "toys", "b.png", "cat", "prototypical", ""])  # duplicate id
    study.labels[2][4] = "coarse"
    study.classnames.append(["birds", ""])
    study.write()
    before = sorted(p.relative_to(study.root) for p in study.root.rglob("*"))
    assert study.problems() == {
        ("labels.csv", 5, "image_id"),
        ("labels.csv", 4, "granularity"),
        ("classnames.csv", 7, "class_name"),
    }
    assert sorted(p.relative_to(study.root) for p in study.root.rglob("*")) == before


# --- the bundled demo: real photos, labels that follow from the file names -------------------------


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        required.missing(name, "pip install --no-deps foolbox==3.3.4 clip-benchmark==1.6.2")
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="module")
def clip_benchmark_names() -> dict[str, list[str]]:
    return json.loads((_package_dir("clip_benchmark") / "datasets" / "en_classnames.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    _package_dir("foolbox")
    from vlm_decade.demo.openworld import materialize

    dest = tmp_path_factory.mktemp("openworld-demo")
    assert materialize(dest) == dest
    return dest, load_openworld_data(dest / "labels.csv", dest / "images", dest / "classnames.csv")


def test_demo_materialises_forty_real_photos_byte_for_byte(demo):
    dest, data = demo
    assert data.images.num_rows == 40
    assert data.labels.num_rows == 40
    foolbox_data = _package_dir("foolbox") / "data"
    for row in data.images.to_pylist():
        source = foolbox_data / Path(row["path"]).name
        assert row["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    sizes = {(r["dataset"], r["width"], r["height"]) for r in data.images.to_pylist()}
    assert ("cifar10", 32, 32) in sizes and ("imagenet", 512, 512) in sizes


def test_demo_labels_are_the_file_names_class_numbers_in_the_class_lists(demo):
    _, data = demo
    pattern = re.compile(r"^(?P<dataset>cifar10|imagenet)_(?P<index>\d\d)_(?P<cls>\d+)\.(png|jpg)$")
    paths = dict(zip(data.images["image_id"].to_pylist(), data.images["path"].to_pylist()))
    by_dataset = {"cifar10": 0, "imagenet": 0}
    for row in data.labels.to_pylist():
        match = pattern.match(Path(paths[row["image_id"]]).name)
        assert match and match["dataset"] == row["dataset"]
        assert row["label"] == data.classnames[row["dataset"]][int(match["cls"])]
        by_dataset[row["dataset"]] += 1
    assert by_dataset == {"cifar10": 20, "imagenet": 20}
    labels = dict(zip(data.labels["image_id"].to_pylist(), data.labels["label"].to_pylist()))
    # Hand-checked against the photos: ImageNet 243, 251, 129, 915; the first CIFAR-10 test image is a cat.
    assert [labels[i] for i in ("imagenet_00", "imagenet_16", "imagenet_14", "imagenet_08")] == [
        "Bullmastiff",
        "Dalmatian",
        "spoonbill",
        "yurt",
    ]
    assert [labels[f"cifar10_{i:02d}"] for i in range(4)] == ["cat", "ship", "ship", "airplane"]
    assert data.granularity == {"cifar10": "prototypical", "imagenet": "fine-grained"}


def test_demo_class_lists_equal_their_sources(demo, clip_benchmark_names):
    _, data = demo
    assert list(data.classnames["imagenet"]) == clip_benchmark_names["imagenet1k"]
    assert len(data.classnames["imagenet"]) == 1000
    assert list(data.classnames["cifar10"]) == CIFAR10_NAMES
    # clip-benchmark has no CIFAR-10 list, which is why the names above come from CIFAR-10 itself.
    assert "cifar10" not in clip_benchmark_names


def test_materialize_is_idempotent(demo):
    from vlm_decade.demo.openworld import materialize

    dest, _ = demo
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in dest.rglob("*") if p.is_file()}
    materialize(dest)
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in dest.rglob("*") if p.is_file()}
    assert after == before
    assert len([p for p in before if p.parent.name == "images"]) == 40


# --- one fault, one problem (docs/openworld-data.md) -----------------------------------------------


PROMPTS = [{"id": "default", "text": "What is it?"}, {"id": "specific", "text": "Be specific."}]


def _imported_study(study, header: list[str], rows: list[list[str]], **fields):
    """Study B on `study`'s files with one imported model, whose answers.csv holds `rows` under
    `header`; `fields`: the study's others."""
    from vlm_decade.studies import study_from_dict

    answers = write_csv(study.root / "answers.csv", header, rows)
    labels, classnames = study.write()
    return study_from_dict(
        {
            "name": "b",
            "study": "openworld",
            "judge": None,
            "data": {"labels": str(labels), "image_dir": str(study.image_dir), "classnames": str(classnames)},
            "models": [{"name": "old", "backend": "imported", "model_id": "old", "options": {"file": str(answers)}}],
            **fields,
        }
    )


def _the_problem(config):
    """The one problem that checking `config` finds."""
    from vlm_decade.studies.openworld import pipeline

    with pytest.raises(InputError) as caught:
        pipeline.check(config)
    (problem,) = caught.value.problems
    return problem


def test_prompt_ids_in_the_variant_column_are_one_problem_that_says_where_they_belong(study):
    rows = [[i, p, f"{i} under {p}"] for i in ("toy_a", "toy_b", "bird_c") for p in ("default", "specific")]
    problem = _the_problem(_imported_study(study, ["image_id", "variant", "text"], rows, prompts=PROMPTS))
    assert (Path(problem.file).name, problem.row, problem.field) == ("answers.csv", 2, "variant")
    assert "'default' (3 rows, first row 2), 'specific' (3 rows, first row 3)" in problem.message
    assert "if these are prompt ids, put them in a `prompt` column" in problem.message


def test_an_unknown_prompt_in_the_prompt_column_is_one_problem(study):
    rows = [
        ["toy_a", "full", "defualt", "a dog"],
        ["toy_b", "full", "defualt", "a cat"],
        ["bird_c", "full", "", "a bird"],
    ]
    problem = _the_problem(_imported_study(study, ["image_id", "variant", "prompt", "text"], rows, prompts=PROMPTS))
    assert (Path(problem.file).name, problem.row, problem.field) == ("answers.csv", 2, "prompt")
    assert "unknown prompt 'defualt' (2 rows, first row 2)" in problem.message


def test_an_imported_file_with_answers_per_prompt_is_warned_of_the_answers_it_lacks(study):
    from vlm_decade.studies.openworld import pipeline

    rows = [
        ["toy_a", "full", "default", "a dog"],
        ["toy_a", "full", "specific", "a puppy"],
        ["toy_b", "full", "", "a cat"],
    ]
    config = _imported_study(study, ["image_id", "variant", "prompt", "text"], rows, prompts=PROMPTS)
    (line,) = pipeline.incomplete_models(config, pipeline.check(config))
    assert "no description for 2 of the 6 (image, variant, prompt) answers" in line and "full: 2 of 6" in line


def test_one_bad_labels_row_is_one_problem_with_an_imported_model(study):
    study.files["a.png"] = b"not a png"  # row 3
    rows = [["toy_b", "full", "a cat"], ["toy_a", "full", "a dog"], ["bird_c", "full", "a bird"]]
    config = _imported_study(study, ["image_id", "variant", "text"], rows)
    problem = _the_problem(config)  # the image only: its answer in answers.csv is not "unknown"
    assert (Path(problem.file).name, problem.row, problem.field) == ("labels.csv", 3, "file")
    with pytest.raises(InputError) as loaded:
        load_openworld_data(config.data.labels, study.image_dir, config.data.classnames)
    assert loaded.value.image_ids == {"toy_a", "toy_b", "bird_c"}  # what the models' files are checked against


def test_labels_in_parquet_of_the_wrong_type_are_named(study):
    labels, classnames = study.write()
    columns = {c: [r[i] for r in study.labels] for i, c in enumerate(LABEL_HEADER)}
    columns["image_id"] = [1.0, 2.0, 3.0]
    pq.write_table(pa.table(columns), study.root / "labels.parquet")
    with pytest.raises(InputError) as caught:
        load_openworld_data(study.root / "labels.parquet", study.image_dir, classnames)
    (problem,) = caught.value.problems
    assert (problem.row, problem.field) == (1, "image_id") and "double" in problem.message
