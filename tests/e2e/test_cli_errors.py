"""Bad input through the command line: every problem named (file, row, field), exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import vlm_decade

pytestmark = pytest.mark.e2e


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def corrupt_image(d: Path) -> None:
    (d / "images" / "coffee.png").write_bytes(b"not a png at all")


def missing_column(d: Path) -> None:
    _replace(d / "descriptions.csv", "description_id,", "descr_id,")


def bad_encoding(d: Path) -> None:
    raw = (d / "descriptions.csv").read_bytes()
    lines = raw.split(b"\n")
    lines[3] = lines[3].replace(b"a", b"\xe9", 1)  # Latin-1 bytes in a UTF-8 file
    (d / "descriptions.csv").write_bytes(b"\n".join(lines))


def unknown_image_in_votes(d: Path) -> None:
    _replace(d / "votes.csv", "\nastronaut,", "\nastronot,")


def imported_unknown_image(d: Path) -> None:
    _replace(d / "imported_captions.csv", "\nastronaut,", "\nastronot,")


def missing_weights(d: Path) -> None:
    (d / "empty_weights").mkdir()
    _replace(d / "study.yaml", "    batch_size: 4\n", "    batch_size: 4\n    path: empty_weights\n")


def bad_hand_label(d: Path) -> None:
    _replace(d / "hand_labels.csv", "ssd-template,coffee,recognition,yes", "ssd-template,coffee,recognizing,maybe")


def openworld_bad_granularity(d: Path) -> None:
    _replace(d / "openworld" / "labels.csv", ",prototypical,", ",very-prototypical,")


def openworld_label_not_a_class(d: Path) -> None:
    _replace(d / "openworld" / "labels.csv", ",Dalmatian,", ",Dalmation,")


CASES = {
    "corrupt image": (corrupt_image, ["coffee.png"]),
    "missing column": (missing_column, ["descriptions.csv", "row 1", "'description_id'"]),
    "bad encoding": (bad_encoding, ["descriptions.csv", "row 4", "UTF-8"]),
    "unknown image in votes": (unknown_image_in_votes, ["votes.csv", "field 'image_id'", "astronot"]),
    "imported file names an unknown image": (
        imported_unknown_image,
        ["imported_captions.csv", "field 'image_id'", "astronot"],
    ),
    "missing weights": (missing_weights, ["empty_weights", "frozen_inference_graph.pb"]),
    "bad hand label": (bad_hand_label, ["hand_labels.csv", "row 4", "field 'error_type'", "field 'present'"]),
    "Study B: unknown granularity": (openworld_bad_granularity, ["labels.csv", "row 2", "field 'granularity'"]),
    "Study B: label not among the class names": (
        openworld_label_not_a_class,
        ["labels.csv", "field 'label'", "Dalmation"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_named_and_nothing_is_written(case, pristine, tmp_path):
    import shutil

    inputs = tmp_path / "inputs"
    shutil.copytree(pristine, inputs)
    damage, expected = CASES[case]
    damage(inputs)
    out = tmp_path / "run"
    study = inputs / ("openworld" if case.startswith("Study B") else "") / "study.yaml"

    checked = vlm_decade("validate", str(study))
    assert checked.returncode == 2, checked.stderr
    message = " ".join(checked.stderr.split())
    for fragment in expected:
        assert fragment in message, message

    ran = vlm_decade("run", str(study), "--out", str(out))
    assert ran.returncode == 2, ran.stderr
    assert "nothing was run or written" in ran.stderr
    assert not out.exists()


def test_validate_accepts_the_demo_study(pristine):
    result = vlm_decade("validate", str(pristine / "study.yaml"))
    assert result.returncode == 0, result.stderr
    assert "16 images in 2 datasets" in result.stderr


def test_validate_accepts_the_demo_openworld_study_and_says_li_will_be_skipped(pristine):
    result = vlm_decade("validate", str(pristine / "openworld" / "study.yaml"))
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert "Study B, 40 labelled images in 2 datasets" in said and "LI will be skipped" in said
