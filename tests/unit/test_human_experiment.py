"""The experiment builder (studies/decade/human/experiment.py): index.html and trials/<participant>.json
carry the design of design.csv (read back from the page's JSON block and the trial files, checked
against the CSV read independently), only relative URLs to files the folder has, texts that survive
any markup, jsPsych byte for byte as vendored, and a refused design names its file, row and field."""

from __future__ import annotations

import csv
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from vlm_decade.core.errors import InputError
from vlm_decade.studies.decade.human.experiment import VENDORED, build_experiment

from .human_folder import TEXTS, rows_of, write_folder


class _Page(HTMLParser):
    """The design JSON block and every src/href of a page."""

    def __init__(self):
        super().__init__()
        self.urls, self.design, self._in_design = [], None, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.urls += [attrs[key] for key in ("src", "href") if key in attrs]
        self._in_design = tag == "script" and attrs.get("id") == "vd-design"

    def handle_data(self, data):
        if self._in_design:
            self.design = json.loads(data)
            self._in_design = False


def _page(folder: Path) -> _Page:
    page = _Page()
    page.feed((folder / "index.html").read_text(encoding="utf-8"))
    return page


@pytest.mark.parametrize("experiment", ["describe", "rank", "rate"])
def test_the_page_carries_every_trial_of_the_design(tmp_path, experiment):
    folder = write_folder(tmp_path / experiment, experiment)
    build_experiment(folder)
    design = _page(folder).design
    with open(folder / "design.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert design["participants"] == ["p001", "p002"]
    assert sorted(p.name for p in (folder / "trials").iterdir()) == ["p001.json", "p002.json"]
    texts = {}
    for participant in design["participants"]:
        mine = json.loads((folder / "trials" / f"{participant}.json").read_text())
        trials, texts = mine["trials"], texts | mine["texts"]
        assert mine["participant"] == participant
        assert mine["texts"] == {o: TEXTS[o] for t in trials for o in t["options"]}
        expected = sorted((r for r in rows if r["participant"] == participant), key=lambda r: int(r["trial"]))
        assert [t["trial"] for t in trials] == [1, 2, 3]
        for trial, row in zip(trials, expected):
            assert trial["kind"] == row["kind"] and trial["image_id"] == row["image_id"]
            assert trial["image"] == row["image"] and trial["condition"] == row["condition"]
            assert trial["options"] == [o for o in row["options"].split(";") if o]
            assert (trial["text"], trial["gold"], trial["answer"]) == (row["text"], row["gold"], row["answer"])
    meta = json.loads((folder / "experiment.json").read_text())
    assert design["experiment_id"] == meta["experiment_id"] and design["completion_code"] == "VD-TEST1234"
    assert design["scale"] == meta["scale"] and design["experiment"] == experiment
    used = {o for r in rows for o in r["options"].split(";") if o}
    assert texts == {key: TEXTS[key] for key in used}
    # The example is p001's first trial that is not an attention check, with the texts it shows.
    assert design["example"] == json.loads((folder / "trials" / "p001.json").read_text())["trials"][0]
    assert design["example_texts"] == {o: TEXTS[o] for o in design["example"]["options"]}


def test_relative_urls_to_files_the_folder_has(tmp_path):
    folder = write_folder(tmp_path / "rank", "rank")
    build_experiment(folder)
    urls = _page(folder).urls
    assert "experiment.js" in urls and "jspsych/jspsych.js" in urls and "jspsych/jspsych.css" in urls
    for url in urls:
        if url in ("jatos.js", "data:,"):  # JATOS' own script; the empty icon
            continue
        assert "://" not in url and not url.startswith("/") and (folder / url).is_file(), url
    for vendored in VENDORED.iterdir():
        assert (folder / "jspsych" / vendored.name).read_bytes() == vendored.read_bytes()
    assert (folder / "jspsych" / "LICENSE").read_text().startswith("The MIT License")


def test_texts_with_markup_come_back_as_written(tmp_path):
    rows = rows_of("rate")
    nasty = '</script><script>alert(1)</script> & "quotes" <b>\''
    rows[0]["text"] = nasty
    folder = write_folder(tmp_path / "rate", "rate", rows)
    build_experiment(folder)
    assert _page(folder).design["example"]["text"] == nasty  # p001's first trial, in index.html
    assert "<script>alert" not in (folder / "index.html").read_text()


def test_building_again_writes_nothing(tmp_path):
    folder = write_folder(tmp_path / "rank", "rank")
    build_experiment(folder)
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}
    build_experiment(folder)
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} == before


def test_a_bad_design_is_refused_naming_file_row_and_field(tmp_path):
    rows = rows_of("rank")
    rows[1]["options"] = "kite-1;nowhere;kite-2"  # row 3 of design.csv
    rows[4]["image"] = "../escape.png"  # row 6
    rows[5]["trial"] = "0"  # row 7
    rows[2]["participant"] = "../p001"  # row 4
    folder = write_folder(tmp_path / "rank", "rank", rows)
    with pytest.raises(InputError) as caught:
        build_experiment(folder)
    found = {(Path(p.file).name, p.row, p.field) for p in caught.value.problems}
    assert found == {
        ("design.csv", 3, "options"),
        ("design.csv", 4, "participant"),
        ("design.csv", 6, "image"),
        ("design.csv", 7, "trial"),
    }
    assert not (folder / "index.html").exists()


def test_a_design_changed_after_it_was_written_is_refused(tmp_path):
    folder = write_folder(tmp_path / "rank", "rank")
    (folder / "design.csv").write_bytes((folder / "design.csv").read_bytes().replace(b"dog-2;boat-1", b"boat-1;dog-2"))
    with pytest.raises(InputError) as caught:
        build_experiment(folder)
    [problem] = caught.value.problems
    assert Path(problem.file).name == "experiment.json" and problem.field == "experiment_id"


def test_a_folder_written_by_the_design_builds(tmp_path):
    """The contract between the two halves: what design.write_experiment writes, built as it is."""
    from PIL import Image

    from vlm_decade.studies.decade.human.design import rank_design, write_experiment

    files = {}
    for i in range(9):
        files[f"img{i}"] = tmp_path / f"source{i}.jpg"
        Image.new("RGB", (8, 8), (20 * i, 0, 0)).save(files[f"img{i}"])
    descriptions = {image: [f"{image}-d{j}" for j in range(10)] for image in files}
    texts = {d: f"text of {d}" for ids in descriptions.values() for d in ids}
    design = rank_design(descriptions, dict.fromkeys(files, "set"), texts, participants=2, attention_rate=0.1, seed=3)
    write_experiment(design, files, tmp_path / "rank", seed=3)
    build_experiment(tmp_path / "rank")
    built = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "rank" / "trials").iterdir()}
    assert sorted(built) == _page(tmp_path / "rank").design["participants"] == ["p001", "p002"]
    for participant, held in built.items():
        trials = held["trials"]
        mine = sorted((r for r in design.rows if r["participant"] == participant), key=lambda r: r["trial"])
        assert [(t["trial"], t["kind"], t["options"]) for t in trials] == [
            (r["trial"], r["kind"], r["options"].split(";")) for r in mine
        ]
    assert any(t["kind"] == "attention" for t in built["p001"]["trials"])
    assert all(built["p001"]["texts"][option] for t in built["p001"]["trials"] for option in t["options"])
