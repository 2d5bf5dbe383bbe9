"""A smoke run (`run --limit N`): the first N images of each dataset and what refers to them, its own
run folder, and no resuming across the two kinds of run."""

from contextlib import nullcontext
from dataclasses import dataclass

import pyarrow as pa

from vlm_decade.core.smoke import first_images, resume_problem, smoke_folder
from vlm_decade.report.html import environment


@dataclass(frozen=True)
class Data:
    images: pa.Table
    references: pa.Table
    ranking: dict
    ratings: pa.Table | None = None


def test_the_first_n_images_of_each_dataset_and_only_their_rows_are_kept():
    images = pa.table({"image_id": ["a1", "b1", "a2", "a3", "b2"], "dataset": ["A", "B", "A", "A", "B"]})
    references = pa.table({"image_id": ["a3", "a1", "b2", "a2", "b1"], "text": ["3", "1", "B2", "2", "B1"]})
    data = Data(images, references, {"A": "votes"})
    cut = first_images(data, 2)
    assert cut.images.to_pydict() == {"image_id": ["a1", "b1", "a2", "b2"], "dataset": ["A", "B", "A", "B"]}
    assert cut.references.to_pydict() == {"image_id": ["a1", "b2", "a2", "b1"], "text": ["1", "B2", "2", "B1"]}
    assert cut.ranking == {"A": "votes"} and cut.ratings is None
    assert first_images(data, None) is data


def test_a_smoke_run_has_its_own_folder_by_default():
    assert smoke_folder("/runs/study", 5) == "/runs/study-smoke5"
    assert smoke_folder("s3://bucket/runs/study/", 2) == "s3://bucket/runs/study-smoke2"


def test_a_run_folder_is_never_resumed_by_the_other_kind_of_run():
    full, smoke = {"started": "t", "limit": None}, {"started": "t", "limit": 5}
    assert resume_problem({}, 5, "/r") is None  # a new folder takes either
    assert resume_problem(full, None, "/r") is None and resume_problem(smoke, 5, "/r") is None
    assert resume_problem({"started": "t"}, None, "/r") is None  # written before runs recorded a limit: full
    assert "holds a run of the full study" in resume_problem(full, 5, "/r")
    refused = resume_problem(smoke, None, "/r")
    assert "/r holds a smoke run of the first 5 images of each dataset" in refused and "the full study" in refused
    assert "--limit 3" in resume_problem(smoke, 3, "/r")


def test_the_report_says_it_is_a_smoke_run():
    macros = environment().get_template("_report.html").module
    assert "Only the first 4 images of each" in str(macros.smoke({"limit": 4}))
    assert "Only the first 1 image of each" in str(macros.smoke({"limit": 1}))
    assert str(macros.smoke({"limit": None})).strip() == ""


def test_a_smoke_run_reads_only_the_images_it_runs(tmp_path):
    """`run --limit 2` on 30 images in two datasets, listed in no particular order: only the first two
    of each dataset in image_id order are read (the progress counts 4), so an unreadable file among
    the others refuses nothing, and the data is that of those four images."""
    from PIL import Image

    from vlm_decade.stages.images import ImageCache
    from vlm_decade.studies import load_study
    from vlm_decade.studies.decade import pipeline

    ids = [f"img{i:02d}" for i in range(30)]
    dataset = {i: ("coco", "csb")[n % 2] for n, i in enumerate(ids)}
    taken = ["img00", "img01", "img02", "img03"]  # the first two of coco (00, 02) and of csb (01, 03)
    for i in ids:
        if i in taken:
            Image.new("RGB", (4, 4), (200, 0, 0)).save(tmp_path / f"{i}.png")
        else:
            (tmp_path / f"{i}.png").write_text("not an image: read, it would be refused")
    rows = [f"{i},{dataset[i]},{i}.png" for i in reversed(ids)]
    (tmp_path / "images.csv").write_text("image_id,dataset,file\n" + "\n".join(rows) + "\n")
    texts = [f"{i}-{k},{i},w{k},full,a red square {k}" for i in ids for k in range(3)]
    (tmp_path / "descriptions.csv").write_text("description_id,image_id,worker_id,condition,text\n" + "\n".join(texts))
    (tmp_path / "answers.csv").write_text("image_id,variant,text\n" + "\n".join(f"{i},full,red" for i in ids))
    (tmp_path / "study.yaml").write_text(
        "name: smoke\ndata: {images: images.csv, image_dir: ., descriptions: descriptions.csv}\n"
        "models:\n  - {name: m, backend: imported, model_id: m, era: pre-mllm, options: {file: answers.csv}}\n"
        "encoders:\n  - name: SBERT-SI\n"
    )
    study = load_study(tmp_path / "study.yaml").model_copy(update={"limit": 2})
    totals = []

    def track(description, total):
        totals.append(total)
        return nullcontext(lambda n=1: None)

    data = pipeline.check(study, ImageCache(track=track))
    assert totals == [4]
    assert data.images.column("image_id").to_pylist() == taken
    assert sorted(set(data.references.column("image_id").to_pylist())) == taken
