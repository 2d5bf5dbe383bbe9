"""One fault, one problem: a bad row of the images table is not reported again through every
description, vote, rating and imported caption of its image; and an imported model that lacks
rows is a warning with its counts (what `validate` prints), not a silent gap."""

from __future__ import annotations

import csv
import io
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vlm_decade.core.errors import InputError
from vlm_decade.studies import study_from_dict
from vlm_decade.studies.decade import pipeline

from .test_ingest import Study


def imported_captions(study: Study, rows: list[tuple[str, str]]) -> str:
    path = study.root / "captions.csv"
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["image_id", "variant", "text"])
        writer.writerows([(i, v, f"a caption of {i} ({v})") for i, v in rows])
    return str(path)


def config(study: Study, captions: str, variants: str = "full"):
    data = study.write()
    return study_from_dict(
        {
            "name": "s",
            "data": {k: str(v) for k, v in data.model_dump().items() if v is not None},
            "ranking": {"top_k": 1, "bottom_k": 1},
            "models": [
                {
                    "name": "udc",
                    "backend": "imported",
                    "model_id": "udc",
                    "era": "pre-mllm",
                    "variants": variants,
                    "options": {"file": captions},
                }
            ],
        }
    )


def float_tiff() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.array([[-3.0, 9.0]], dtype=np.float32)).save(buf, format="TIFF")
    return buf.getvalue()


def fault(study: Study, kind: str, k: int) -> None:
    """One thing wrong with images row k (0-based) of the study."""
    name = study.images[k][2]
    if kind == "corrupt file":
        study.files[name] = b"not an image"
    elif kind == "missing file":
        del study.files[name]
    elif kind == "no faithful reading":
        study.files[name] = float_tiff()
    elif kind == "empty dataset":
        study.images[k][1] = ""
    elif kind == "empty file cell":
        study.images[k][2] = ""
    elif kind == "fifo":
        del study.files[name]
        (study.image_dir / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(study.image_dir / name)


FAULTS = ["corrupt file", "missing file", "no faithful reading", "empty dataset", "empty file cell"]
FAULTS += ["fifo"] if hasattr(os, "mkfifo") else []


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(FAULTS), st.integers(0, 1))
def test_one_bad_images_row_is_one_problem(tmp_path_factory, kind, k):
    study = Study(tmp_path_factory.mktemp("study"))
    captions = imported_captions(study, [("im1", "full"), ("im2", "full")])
    fault(study, kind, k)
    with pytest.raises(InputError) as info:
        pipeline.check(config(study, captions))
    (problem,) = info.value.problems  # not one more per description, vote and caption of the image
    assert (problem.file, problem.row) == (study.path("images.csv"), k + 2)


def test_an_unreadable_images_table_is_said_once_for_the_imported_file(tmp_path):
    study = Study(tmp_path)
    captions = imported_captions(study, [("im1", "full"), ("im2", "full")])
    cfg = config(study, captions)
    (study.root / "images.csv").write_text("image_id,dataset\nim1,coco\n")  # no `file` column
    with pytest.raises(InputError) as info:
        pipeline.check(cfg)
    about_captions = [p for p in info.value.problems if p.file == captions]
    assert len(about_captions) == 1 and "not checked" in about_captions[0].message


def test_a_caption_of_a_really_unknown_image_is_still_named(tmp_path):
    study = Study(tmp_path)
    captions = imported_captions(study, [("im1", "full"), ("ghost", "full")])
    study.files["im1.png"] = b"junk"
    with pytest.raises(InputError) as info:
        pipeline.check(config(study, captions))
    where = sorted((p.file, p.row, p.field) for p in info.value.problems)
    assert where == sorted([(study.path("images.csv"), 2, "file"), (captions, 3, "image_id")])


def test_an_imported_file_missing_rows_is_a_warning_with_counts(tmp_path):
    # 2 images x 4 variants (full, m1, m2, m3) = 8 pairs asked for; the file has 3 of them.
    study = Study(tmp_path)
    captions = imported_captions(study, [("im1", "full"), ("im2", "full"), ("im1", "m2")])
    cfg = config(study, captions, variants="all")
    data = pipeline.check(cfg)  # not an error
    _, warnings = pipeline.summary(cfg, data)
    (line,) = warnings
    assert "model 'udc'" in line and "5 of the 8" in line
    assert "m1: 2 of 2, m2: 1 of 2, m3: 2 of 2" in line and "full" not in line.split("(")[1].split(")")[0]


def test_a_complete_imported_file_gives_no_warning(tmp_path):
    study = Study(tmp_path)
    cfg = config(study, imported_captions(study, [("im1", "full"), ("im2", "full")]))
    assert pipeline.summary(cfg, pipeline.check(cfg))[1] == []


def test_a_run_prints_the_missing_rows_before_its_stages(tmp_path, monkeypatch):
    from vlm_decade.core.progress import Reporter
    from vlm_decade.core.runner import StudyRun

    class Said(Reporter):
        def __init__(self):
            super().__init__(quiet=True)
            self.lines: list[str] = []

        def say(self, message: str) -> None:
            self.lines.append(message)

    study = Study(tmp_path)
    cfg = config(study, imported_captions(study, [("im1", "full")])).model_copy(update={"output": tmp_path / "run"})
    monkeypatch.setattr(StudyRun, "__call__", lambda self, *stages: None)  # the stages themselves are not the point
    reporter = Said()
    pipeline.run(cfg, reporter)
    (line,) = [s for s in reporter.lines if "model 'udc'" in s]
    assert "1 of the 2" in line and "full: 1 of 2" in line


def test_an_imported_model_without_its_file_is_located_as_every_study_file_field_is(tmp_path):
    study = Study(tmp_path)
    cfg = config(study, imported_captions(study, [("im1", "full")]))
    second = cfg.models[0].model_copy(update={"name": "bare", "options": {}})
    cfg = cfg.model_copy(update={"models": [cfg.models[0], second]})
    with pytest.raises(InputError) as info:
        pipeline.check(cfg)
    said = [(p.file, p.field) for p in info.value.problems if "needs options" in p.message]
    assert said == [("study file", "models[1].options.file")]
