"""The docs' example study, as shipped and with every optional section switched on (pairwise metric,
human ratings, STS-B check, error taxonomy with hand labels), runs to its report and reruns for free:
three images, one model, two datasets (one without votes), so most groups are tiny or empty."""

import csv
import shutil
from pathlib import Path

import yaml

from .conftest import vlm_decade

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "study_a"


def _everything_on(folder: Path) -> Path:
    shutil.copytree(EXAMPLE, folder)
    study = yaml.safe_load((folder / "study.yaml").read_text())
    with open(folder / "ratings.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rater_id", "subject", "image_id", "rating"])
        for rater, offset in (("r1", 0), ("r2", 1), ("r3", 2)):
            for k, image in enumerate(("coco_1", "coco_2", "csb_1")):
                w.writerow([rater, "ssd-template", image, 1 + (k + offset) % 5])
    with open(folder / "hand_labels.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["subject", "image_id", "error_type", "present", "note"])
        w.writerow(["ssd-template", "coco_1", "hallucination", "no", "checked by eye"])
    study["data"] |= {"ratings": "ratings.csv", "hand_labels": "hand_labels.csv"}
    study["metrics"] = [{"name": "BERTScore", "kind": "bertscore", "num_layers": 6}]
    study["stsb_check"] = True
    study["taxonomy"] = {}
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    return folder / "study.yaml"


def test_the_example_as_shipped_runs(tmp_path):
    done = vlm_decade("run", str(EXAMPLE / "study.yaml"), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "run" / "report.html").exists()


def test_the_example_with_every_optional_section_runs_and_reruns_for_free(tmp_path):
    study = _everything_on(tmp_path / "example")
    assert vlm_decade("validate", str(study)).returncode == 0
    out = tmp_path / "run"
    done = vlm_decade("run", str(study), "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    for name in (
        "report.html",
        "errors.html",
        "stats.parquet",
        "errors.parquet",
        "metric_validation.parquet",
        "stsb.parquet",
    ):
        assert (out / name).exists(), name
    again = vlm_decade("run", str(study), "--out", str(out))
    assert again.returncode == 0 and "run " not in again.stderr.replace("run folder", ""), again.stderr[-2000:]


def test_names_from_the_data_never_write_outside_the_run_folder(tmp_path):
    """Image ids, model and encoder names that look like paths stay file names inside the run folder."""
    study = _everything_on(tmp_path / "place" / "example")
    nasty = {"coco_1": "../../../../escaped", "coco_2": "/tmp/absolute", "csb_1": "a/b\\\\c"}
    for name in ("images.csv", "descriptions.csv", "votes.csv", "ratings.csv", "hand_labels.csv"):
        path = study.parent / name
        text = path.read_text()
        for old, new in nasty.items():
            text = (
                text.replace(old + ",", new + ",")
                .replace("," + old + ",", "," + new + ",")
                .replace("," + old + "\n", "," + new + "\n")
            )
        path.write_text(text)
    config = yaml.safe_load(study.read_text())
    config["encoders"][0]["name"] = "../../../../encoder"
    config["models"][0]["name"] = "../model"
    for f in ("ratings.csv", "hand_labels.csv"):
        path = study.parent / f
        path.write_text(path.read_text().replace("ssd-template", "../model"))
    study.write_text(yaml.safe_dump(config))
    outside = sorted(p for p in Path("/tmp").glob("*") if "escaped" in p.name or "encoder" in p.name)
    before = {p for p in (tmp_path).rglob("*")}
    out = tmp_path / "place" / "run"
    done = vlm_decade("run", str(study), "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    new = {p for p in tmp_path.rglob("*")} - before
    assert new and all(p.is_relative_to(out) for p in new), sorted(str(p) for p in new if not p.is_relative_to(out))
    assert sorted(p for p in Path("/tmp").glob("*") if "escaped" in p.name or "encoder" in p.name) == outside
    figures = sorted(p.name for p in (out / "figures").glob("similarity_*.png"))
    assert figures[0] == "similarity_BERTScore.png" and "encoder-" in figures[1]  # the encoder's name, made safe
