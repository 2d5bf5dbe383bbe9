"""Importing jsPsych's data (studies/decade/human/importing.py): hand-built records in each of
jsPsych's forms become the tables docs/data-format.md defines, with the documented exclusions, and
bad files are refused naming file and record. The gold standard of the imported votes equals a hand
tally of the chosen ids."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from vlm_decade.cli import app
from vlm_decade.core.errors import InputError
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.data import load_study_data
from vlm_decade.studies.decade.human.design import describe_design, rank_design, rate_design, write_experiment
from vlm_decade.studies.decade.human.importing import Exclusions, import_experiment

IMAGES = ("boat", "dog", "kite")
STUDY = """name: human-import
data: {images: images.csv, image_dir: ., descriptions: descriptions.csv}
ranking: {top_k: 1, bottom_k: 1}
models:
  - {name: m1, backend: ssd-template, model_id: ssd_mobilenet_v2_coco_2018_03_29, era: pre-mllm}
"""


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    """Three images of one dataset, four `full` descriptions each, one model."""
    root = tmp_path_factory.mktemp("study")
    with open(root / "images.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["image_id", "dataset", "file"])
        for k, image in enumerate(IMAGES):
            Image.new("RGB", (32, 24), (60 * k, 90, 200 - 60 * k)).save(root / f"{image}.png")
            w.writerow([image, "set", f"{image}.png"])
    with open(root / "descriptions.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["description_id", "image_id", "worker_id", "condition", "text"])
        for image in IMAGES:
            for j in range(1, 5):
                w.writerow([f"{image}-{j}", image, f"w{j}", "full", f"a {image}, in words of worker {j}"])
    (root / "study.yaml").write_text(STUDY)
    return root


def _experiment(study_dir: Path, design, name: str) -> tuple[Path, dict]:
    files = {i: study_dir / f"{i}.png" for i in IMAGES}
    folder = study_dir / "human" / name
    return folder, write_experiment(design, files, folder, seed=3)


def _records(design, meta: dict, design_participant: str, who: str, answer, rt: float = 2500.0, end: bool = True):
    """A participant's jsPsych records, as the experiment writes them; `answer(row)` fills a trial's data."""
    base = {"vd_experiment": meta["experiment_id"], "vd_participant": who, "vd_design_participant": design_participant}
    records = [{**base, "trial_type": "html-button-response", "trial_index": 0, "rt": 900, "vd_kind": "instructions"}]
    rows = sorted((r for r in design.rows if r["participant"] == design_participant), key=lambda r: r["trial"])
    for row in rows:
        data = {
            "vd_trial": row["trial"],
            "vd_kind": row["kind"],
            "image_id": row["image_id"],
            "condition": row["condition"],
        }
        if row["options"]:
            data["options"] = row["options"].split(";")
        records.append({**base, "trial_type": "x", "trial_index": len(records), "rt": rt, **data, **answer(row)})
    if end:
        records.append(
            {**base, "trial_type": "x", "trial_index": len(records), "vd_kind": "end", "completion_code": "c"}
        )
    return records


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def ranked(study_dir):
    """Three rank participants in three forms: a JSON array, a jsPsych CSV and a JATOS line; p003
    chooses distractors. Each of the others picks the option that sorts first among its own image's."""
    design = rank_design(
        {i: [f"{i}-{j}" for j in range(1, 5)] for i in IMAGES},
        dict.fromkeys(IMAGES, "set"),
        {f"{i}-{j}": "t" for i in IMAGES for j in range(1, 5)},
        shown=2,
        distractors=1,
        participants=3,
        attention_rate=0.2,
        seed=3,
    )
    folder, meta = _experiment(study_dir, design, "rank")

    def best(row):
        if row["kind"] == "attention":
            return {"chosen": row["answer"], "attention_passed": True}
        own = sorted(o for o in row["options"].split(";") if o not in row["distractors"].split(";"))
        return {"chosen": own[0]}

    def distractor(row):
        return {
            "chosen": row["distractors"].split(";")[0] if row["kind"] == "rank" else row["answer"],
            "attention_passed": True,
        }

    data = folder / "data"
    data.mkdir()
    (data / "alice.json").write_text(json.dumps(_records(design, meta, "p001", "alice", best)))
    bob = _records(design, meta, "p002", "bob", best)
    columns = sorted({k for r in bob for k in r})
    with open(study_dir / "bob.csv", "w", newline="") as fh:  # jsPsych's CSV: arrays as JSON text
        w = csv.DictWriter(fh, columns)
        w.writeheader()
        for r in bob:
            w.writerow(
                {
                    k: json.dumps(v) if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else v
                    for k, v in r.items()
                }
            )
    (study_dir / "jatos.txt").write_text(json.dumps(_records(design, meta, "p003", "carol", distractor)) + "\n")
    return design, folder, meta


def test_votes_and_a_gold_from_a_hand_tally(study_dir, ranked):
    design, folder, _ = ranked
    study = load_study(study_dir / "study.yaml")
    written = import_experiment(
        study, folder, [folder / "data", study_dir / "bob.csv", study_dir / "jatos.txt"], Exclusions(), folder
    )
    votes = _read(written["rank"])
    people = {r["participant"]: r for r in _read(written["participants"])}
    assert people["carol"]["kept"] == "no" and "distractor in 6 of 6" in people["carol"]["reason"]
    assert people["alice"]["kept"] == people["bob"]["kept"] == "yes" and people["alice"]["trials"] == "6"
    assert len(votes) == 12 and {v["rater_id"] for v in votes} == {"alice", "bob"}
    # the hand tally: alice and bob each chose, per trial, the own option that sorts first
    tally = Counter()
    for row in design.rows:
        if row["participant"] in ("p001", "p002") and row["kind"] == "rank":
            tally[min(o for o in row["options"].split(";") if o not in row["distractors"].split(";"))] += 1
    assert Counter(v["chosen"] for v in votes) == tally
    data = load_study_data(study.data.model_copy(update={"votes": written["rank"]}), study.ranking, study.masks)
    gold = {r["image_id"]: r["description_id"] for r in data.references.to_pylist() if r["role"] == "gold"}
    for image in IMAGES:
        mine = {d: n for d, n in tally.items() if d.startswith(image)}
        top = max(mine.values())
        assert gold[image] in {d for d, n in mine.items() if n == top} and mine[gold[image]] == top


def test_exclusions(study_dir):
    design = describe_design(list(IMAGES), per_image=1, per_participant=3, attention_rate=0.34, seed=1)
    folder, meta = _experiment(study_dir, design, "describe-x")
    ok = lambda row: {"text": f"a {row['image_id']} seen", "attention_passed": row["kind"] == "attention"}  # noqa: E731
    failing = lambda row: {"text": "x", "attention_passed": False}  # noqa: E731
    files = {
        "p001": _records(design, meta, "p001", "fast", ok, rt=300),
        "p001b": _records(design, meta, "p001", "unfinished", ok, end=False),
        "p001c": _records(design, meta, "p001", "careless", failing),
    }
    for name, records in files.items():
        (study_dir / f"{name}.json").write_text(json.dumps(records))
    study = load_study(study_dir / "study.yaml")
    paths = [study_dir / f"{n}.json" for n in files]
    with pytest.raises(InputError) as refused:  # every one left out: no description of any image
        import_experiment(study, folder, paths, Exclusions(), folder)
    assert not (folder / "descriptions.csv").exists()
    assert "image 'boat' has no 'full' description in descriptions.csv" in "\n".join(map(str, refused.value.problems))
    rules = Exclusions(attention_failures=1, median_rt_ms=200, unfinished=False)
    written = import_experiment(study, folder, paths[:2], rules, folder)
    people = {r["participant"]: r["kept"] for r in _read(written["participants"])}
    assert people == {"fast": "yes", "unfinished": "yes"}
    described = _read(written["describe"])
    assert {(d["description_id"], d["text"]) for d in described} == {
        (f"{i}-{w}", f"a {i} seen") for i in IMAGES for w in ("fast", "unfinished")
    }
    written = import_experiment(study, folder, paths, Exclusions(attention_failures=1), folder)
    reasons = {r["participant"]: r["reason"] for r in _read(written["participants"])}
    assert reasons["fast"].startswith("median response time 300 ms")
    assert reasons["unfinished"] == "unfinished: no end record"
    assert reasons["careless"] == ""


def test_ratings(study_dir):
    pairs = [{"subject": "m1", "image_id": i, "text": f"m1 on {i}", "gold": f"gold {i}"} for i in IMAGES]
    design = rate_design(pairs, raters=2, seed=5)
    folder, meta = _experiment(study_dir, design, "rate")
    score = {"boat": 2, "dog": 4, "kite": 5}
    for who, p in (("r1", "p001"), ("r2", "p002")):
        records = _records(
            design, meta, p, who, lambda row: {"rating": score[row["image_id"]], "subject": row["subject"]}
        )
        (study_dir / f"{who}.json").write_text(json.dumps(records))
    written = import_experiment(
        load_study(study_dir / "study.yaml"),
        folder,
        [study_dir / "r1.json", study_dir / "r2.json"],
        Exclusions(),
        folder,
    )
    got = {(r["rater_id"], r["image_id"]): float(r["rating"]) for r in _read(written["rate"])}
    assert got == {(w, i): score[i] for w in ("r1", "r2") for i in IMAGES}


def _refused(study_dir, folder, paths) -> str:
    with pytest.raises(InputError) as refused:
        import_experiment(load_study(study_dir / "study.yaml"), folder, paths, Exclusions(), folder)
    return "\n".join(map(str, refused.value.problems))


def test_bad_files_are_refused_naming_file_and_record(study_dir, ranked):
    design, folder, meta = ranked
    alice = json.loads((folder / "data" / "alice.json").read_text())
    other = [dict(r, vd_experiment="0123456789abcdef") for r in alice]
    (study_dir / "other.json").write_text(json.dumps(other))
    message = _refused(study_dir, folder, [study_dir / "other.json"])
    assert f"{study_dir / 'other.json'}, field 'vd_experiment': record 1: vd_experiment '0123456789abcdef'" in message
    (study_dir / "again.txt").write_text(json.dumps(alice) + "\n" + json.dumps(alice) + "\n")
    message = _refused(study_dir, folder, [study_dir / "again.txt"])
    assert f"{study_dir / 'again.txt'}, line 2, field 'vd_participant': record 1: participant 'alice' twice" in message
    lacking = [dict(r, image_id="cat") if r.get("vd_trial") == 2 else r for r in alice]
    (study_dir / "cat.json").write_text(json.dumps(lacking))
    message = _refused(study_dir, folder, [study_dir / "cat.json"])
    assert "record 3: image_id 'cat' is not in the study's images" in message


def test_the_command(study_dir, ranked):
    _, folder, _ = ranked
    run = CliRunner().invoke(app, ["human", "import", str(study_dir / "study.yaml"), "rank"])
    assert run.exit_code == 0, run.output
    assert f"rank: {folder / 'votes.csv'}" in run.output
    assert [r["participant"] for r in _read(folder / "participants.csv")] == ["alice"]
    bad = CliRunner().invoke(
        app, ["human", "import", str(study_dir / "study.yaml"), "rank", str(study_dir / "nothing.json")]
    )
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_the_plan_command(study_dir, ranked):
    _, folder, _ = ranked
    study = load_study(study_dir / "study.yaml")
    votes = import_experiment(study, folder, [folder / "data", study_dir / "bob.csv"], Exclusions(), folder)["rank"]
    args = [
        "human",
        "plan",
        str(study_dir / "study.yaml"),
        "--votes",
        str(votes),
        "--sizes",
        "2,4",
        "--resamples",
        "200",
    ]
    run = CliRunner().invoke(app, args)
    assert run.exit_code == 0, run.output
    assert "pilot: 2 ranking participants" in run.output
    assert CliRunner().invoke(app, ["human", "plan", str(study_dir / "study.yaml")]).exit_code == 2  # no pilot data


def test_the_design_command(study_dir, tmp_path):
    study = str(study_dir / "study.yaml")
    out = tmp_path / "rank"
    args = [
        "human",
        "design",
        study,
        "rank",
        "--out",
        str(out),
        "--shown",
        "2",
        "--distractors",
        "1",
        "--participants",
        "2",
    ]
    run = CliRunner().invoke(app, args)
    assert run.exit_code == 0, run.output
    assert f"{out}: 2 participants, 12 trials" in run.output
    assert len(_read(out / "design.csv")) == 12 and sorted(p.name for p in (out / "images").iterdir()) == [
        f"{i}.png" for i in IMAGES
    ]
    bad = CliRunner().invoke(
        app, ["human", "design", study, "rank", "--out", str(tmp_path / "x"), "--distractors", "9"]
    )
    assert bad.exit_code == 2 and "too few descriptions" in bad.output and not (tmp_path / "x").exists()


def test_a_trial_under_the_floor_is_left_out(study_dir):
    pairs = [{"subject": "m1", "image_id": i, "text": f"m1 on {i}", "gold": f"gold {i}"} for i in IMAGES]
    design = rate_design(pairs, raters=1, seed=6)
    folder, meta = _experiment(study_dir, design, "rate-fast")
    records = _records(design, meta, "p001", "quick", lambda row: {"rating": 3})
    hurried = next(r for r in records if r.get("vd_kind") == "rate")
    hurried["rt"] = 120
    (study_dir / "quick.json").write_text(json.dumps(records))
    rules = Exclusions(trial_rt_ms=500)
    written = import_experiment(load_study(study_dir / "study.yaml"), folder, [study_dir / "quick.json"], rules, folder)
    assert {r["image_id"] for r in _read(written["rate"])} == set(IMAGES) - {hurried["image_id"]}
    (person,) = _read(written["participants"])
    assert (person["kept"], person["trials"], person["fast_trials"]) == ("yes", "3", "1")
