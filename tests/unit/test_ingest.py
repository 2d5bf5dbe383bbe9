"""Study A ingestion: the tables it builds from a hand-worked study, and one test per kind of bad input."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from vlm_decade.core.errors import InputError
from vlm_decade.imaging.masks import MaskConfig
from vlm_decade.studies.decade.config import DataConfig, RankingConfig
from vlm_decade.studies.decade.data import load_study_data

from .input_files import png_bytes, write_csv

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "study_a"

IMAGE_HEADER = ["image_id", "dataset", "file", "note"]  # "note": a further column, kept as metadata
DESCRIPTION_HEADER = ["description_id", "image_id", "worker_id", "condition", "text"]
VOTE_HEADER = ["image_id", "rater_id", "trial", "shown", "chosen"]


class Study:
    """A valid two-image study in a folder; tests change the rows, then `load()`.

    Votes worked by hand (own-image showings only; a distractor's showing or win counts nowhere):
      im1: a1 2/3, a3 1/2, a2 1/3, a4 0/3, a5 0/3  -> gold a1, top a3 (beats a2 on win rate), other a2 a4,
           bottom a5 (ties a4 on 0/3; the seeded draw, ranking.seed on stream im1, puts a4 first); a6 is masked.
      im2: b3 2/2, b2 1/2, b1 0/2, b4 0/1, b5 0/2  -> gold b3, top b2, other b1 b4, bottom b5.
    With top_k = bottom_k = 1.
    """

    def __init__(self, root: Path):
        self.root = root
        self.image_dir = root / "pics"
        self.image_dir.mkdir()
        self.images = [["im1", "coco", "im1.png", "x"], ["im2", "coco", "sub/im2.png", ""]]
        self.files = {"im1.png": png_bytes(12, 8, 1), "sub/im2.png": png_bytes(10, 6, 2)}
        self.descriptions = [[f"a{i}", "im1", f"w{i}", "full", f"text a{i}"] for i in range(1, 6)]
        self.descriptions += [["a6", "im1", "w6", "m1", "masked text"]]
        self.descriptions += [[f"b{i}", "im2", f"w{i}", "full", f"text b{i}"] for i in range(1, 6)]
        self.votes = [
            ["im1", "r1", "1", "a1;a2;a3;b1", "a2"],
            ["im1", "r1", "2", "a4;a5;a1;b2", "a1"],
            ["im1", "r2", "1", "a1;a2;a4;b3", "a1"],
            ["im1", "r2", "2", "a2;a5;b4", "b4"],  # the distractor wins: no vote for anyone
            ["im1", "r3", "1", "a3;a4;a5;b5", "a3"],
            ["im2", "r1", "1", "b1;b2;b3;a1", "b3"],
            ["im2", "r1", "2", "b3; b4 ;b5;a2", "b3"],  # spaces around ids are ignored
            ["im2", "r2", "1", "b1;b2;b5;a3", "b2"],
        ]
        self.use_votes = True
        self.ranking = RankingConfig(top_k=1, bottom_k=1)

    def write(self) -> DataConfig:
        for name, data in self.files.items():
            path = self.image_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        write_csv(self.root / "images.csv", IMAGE_HEADER, self.images)
        write_csv(self.root / "descriptions.csv", DESCRIPTION_HEADER, self.descriptions)
        if self.use_votes:
            write_csv(self.root / "votes.csv", VOTE_HEADER, self.votes)
        return DataConfig(
            images=self.root / "images.csv",
            image_dir=self.image_dir,
            descriptions=self.root / "descriptions.csv",
            votes=self.root / "votes.csv" if self.use_votes else None,
        )

    def load(self, data: DataConfig | None = None):
        return load_study_data(data or self.write(), self.ranking, MaskConfig(count=3))

    def problems(self, data: DataConfig | None = None):
        with pytest.raises(InputError) as info:
            self.load(data)
        return info.value.problems

    def path(self, name: str) -> str:
        return str(self.root / name)


@pytest.fixture
def study(tmp_path):
    return Study(tmp_path)


def within_seconds(seconds: float, fn):
    """fn()'s result, or a failure if it has not returned in time (a blocked read would hang the suite)."""
    import threading

    outcome: dict = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the test's thread
            outcome["error"] = exc

    worker = threading.Thread(target=target, daemon=True)  # a daemon: a blocked one does not hold the exit
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def only(problems, **where):
    """The one problem whose attributes match `where`."""
    hits = [p for p in problems if all(getattr(p, k) == v for k, v in where.items())]
    assert len(hits) == 1, f"expected one problem matching {where}, got {problems}"
    return hits[0]


# --- the tables built from good input ---------------------------------------------------------------


def test_images_table(study):
    result = study.load()
    images = result.images.to_pylist()
    assert result.images.column_names == [
        "image_id",
        "dataset",
        "path",
        "sha256",
        "width",
        "height",
        "mode",
        "background",
    ]
    assert [r["image_id"] for r in images] == ["im1", "im2"]
    assert images[1]["path"] == str(study.image_dir / "sub" / "im2.png")
    assert os.path.isabs(images[0]["path"])
    assert images[1]["sha256"] == hashlib.sha256(study.files["sub/im2.png"]).hexdigest()
    assert (images[0]["width"], images[0]["height"]) == (12, 8)
    assert (images[1]["width"], images[1]["height"]) == (10, 6)
    assert [r["mode"] for r in images] == ["RGB", "RGB"]
    assert [r["background"] for r in images] == [None, None]  # opaque: nothing composited


def test_references_ranked_by_votes_as_worked_by_hand(study):
    result = study.load()
    refs = result.references
    assert refs.column_names == [
        "description_id",
        "image_id",
        "dataset",
        "condition",
        "worker_id",
        "role",
        "votes",
        "shown",
        "text",
    ]
    rows = {r["description_id"]: (r["role"], r["votes"], r["shown"]) for r in refs.to_pylist()}
    assert rows == {
        "a1": ("gold", 2, 3),
        "a2": ("other", 1, 3),
        "a3": ("top", 1, 2),
        "a4": ("other", 0, 3),
        "a5": ("bottom", 0, 3),
        "a6": ("masked", 0, 0),
        "b1": ("other", 0, 2),
        "b2": ("top", 1, 2),
        "b3": ("gold", 2, 2),
        "b4": ("other", 0, 1),
        "b5": ("bottom", 0, 2),
    }
    # Sorted by image_id, condition, description_id: im1's full ones, then its m1 one, then im2.
    assert refs["description_id"].to_pylist() == ["a1", "a2", "a3", "a4", "a5", "a6", "b1", "b2", "b3", "b4", "b5"]
    assert set(refs["dataset"].to_pylist()) == {"coco"}
    assert result.ranking_method == {"coco": "votes"}


def test_no_votes_file_falls_back_to_consensus(study):
    study.use_votes = False
    study.descriptions = [
        ["d1", "im1", "w1", "full", "A man rides a horse."],
        ["d2", "im1", "w2", "full", "A man rides a horse on the beach."],
        ["d3", "im1", "w3", "full", "A horse on the beach."],
        ["d4", "im1", "w4", "full", "Stock markets fell today."],
        ["e1", "im2", "w1", "full", "A lone description."],
    ]
    result = study.load()
    roles = dict(zip(result.references["description_id"].to_pylist(), result.references["role"].to_pylist()))
    assert roles["d2"] == "gold" and roles["d4"] == "bottom"
    assert roles["e1"] == "gold"  # a single description: gold only
    assert set(result.references["votes"].to_pylist()) == {0}
    assert result.ranking_method == {"coco": "consensus"}


def test_method_is_chosen_per_dataset(study):
    study.images.append(["im3", "csb", "im3.png", ""])
    study.files["im3.png"] = png_bytes(seed=3)
    study.descriptions += [["c1", "im3", "w1", "full", "two people talk"], ["c2", "im3", "w2", "full", "people talk"]]
    assert study.load().ranking_method == {"coco": "votes", "csb": "consensus"}


def test_a_dataset_with_votes_for_only_some_images_is_an_error(study):
    study.votes = [v for v in study.votes if v[0] == "im1"]
    problem = only(study.problems(), file=study.path("votes.csv"))
    assert problem.field == "image_id"
    assert "dataset 'coco'" in problem.message and "im2" in problem.message and "im1" not in problem.message


def test_the_images_tables_further_columns_are_kept_as_metadata(study):
    write_csv(
        study.root / "meta.csv", IMAGE_HEADER + ["category", "source"], [r + ["dog", "web"] for r in study.images]
    )
    data = study.write().model_copy(update={"images": study.root / "meta.csv"})
    metadata = study.load(data).metadata
    assert metadata.to_pylist() == [
        {"image_id": "im1", "note": "x", "category": "dog", "source": "web"},
        {"image_id": "im2", "note": "", "category": "dog", "source": "web"},
    ]
    # Parquet metadata may be numbers or flags; it is kept as text.
    columns = {c: [r[i] for r in study.images] for i, c in enumerate(IMAGE_HEADER)}
    pq.write_table(pa.table({**columns, "difficulty": [0.5, 2.0], "hard": [False, True]}), study.root / "m.parquet")
    data = data.model_copy(update={"images": study.root / "m.parquet"})
    assert study.load(data).metadata.to_pylist() == [
        {"image_id": "im1", "note": "x", "difficulty": "0.5", "hard": "False"},
        {"image_id": "im2", "note": "", "difficulty": "2.0", "hard": "True"},
    ]


def test_an_unknown_group_by_column_names_the_field_and_the_columns(study):
    write_csv(study.root / "meta.csv", IMAGE_HEADER + ["category"], [r + ["dog"] for r in study.images])
    data = study.write().model_copy(update={"images": study.root / "meta.csv"})
    with pytest.raises(InputError) as info:
        load_study_data(data, study.ranking, MaskConfig(count=3), group_by=("categroy",))
    problem = only(info.value.problems, field="analysis.group_by")
    assert problem.message == (
        "'categroy' is no metadata column of meta.csv; its metadata columns: note, category (did you mean 'category'?)"
    )


def test_parquet_tables_and_list_valued_shown(study):
    data = study.write()
    images = pa.table({c: [r[i] for r in study.images] for i, c in enumerate(IMAGE_HEADER)})
    pq.write_table(images, study.root / "images.parquet")
    votes = {c: [r[i] for r in study.votes] for i, c in enumerate(VOTE_HEADER)}
    votes["shown"] = [s.split(";") for s in votes["shown"]]
    pq.write_table(pa.table(votes), study.root / "votes.parquet")
    data = data.model_copy(update={"images": study.root / "images.parquet", "votes": study.root / "votes.parquet"})
    assert study.load(data).references.equals(study.load().references)


def test_the_documented_example_loads_as_documented():
    data = DataConfig(
        images=EXAMPLE / "images.csv",
        image_dir=EXAMPLE,
        descriptions=EXAMPLE / "descriptions.csv",
        votes=EXAMPLE / "votes.csv",
    )
    result = load_study_data(data, RankingConfig(top_k=2, bottom_k=2), MaskConfig())
    roles = {r["description_id"]: r["role"] for r in result.references.to_pylist()}
    assert result.ranking_method == {"coco": "votes", "csb": "consensus"}
    assert [k for k, v in roles.items() if v == "gold"] == ["c1a", "c2c", "s1a"]
    assert {k for k, v in roles.items() if v == "top"} == {"c1b", "c1c", "c2a", "c2b", "s1b", "s1c"}
    assert {k for k, v in roles.items() if v == "bottom"} == {"c1e", "c1f", "c2d", "c2f", "s1e", "s1f"}
    # The paper's 4 + 4 shrink to 2 + 2 on six descriptions: the same roles.
    assert load_study_data(data, RankingConfig(), MaskConfig()).references.equals(result.references)


def test_loading_writes_nothing(study):
    data = study.write()
    before = sorted(p for p in study.root.rglob("*"))
    study.load(data)
    assert sorted(p for p in study.root.rglob("*")) == before


def test_a_utf8_bom_is_fine(study):
    data = study.write()
    raw = (study.root / "descriptions.csv").read_bytes()
    (study.root / "descriptions.csv").write_bytes(b"\xef\xbb\xbf" + raw)
    assert study.load(data).references.num_rows == 11


# --- bad input: each names file, row and field --------------------------------------------------------


def test_missing_image_file(study):
    del study.files["sub/im2.png"]
    p = only(study.problems(), field="file")
    assert (p.file, p.row) == (study.path("images.csv"), 3)
    assert "not found" in p.message and "im2.png" in p.message


def test_a_folder_named_like_an_image(study):
    del study.files["im1.png"]
    (study.image_dir / "im1.png").mkdir()
    p = only(study.problems(), field="file")
    assert (p.file, p.row) == (study.path("images.csv"), 2)
    assert "folder" in p.message


def test_an_unreadable_image(study, monkeypatch):
    # Permission denied, as a user's file would be (chmod 0 cannot show it: the tests run as root).
    import builtins

    from vlm_decade.core import storage

    real = builtins.open

    def denied(path, *args, **kwargs):
        if str(path).endswith("im1.png"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(storage.objects, "open", denied, raising=False)
    p = only(study.problems(), field="file")
    assert p.row == 2 and "cannot read" in p.message and "Permission denied" in p.message


def test_an_image_under_a_file(study):
    study.files["blocker"] = b"a file, not a folder"
    study.images[0][2] = "blocker/im1.png"
    p = only(study.problems(), field="file")
    assert p.row == 2 and "a part of the path is a file" in p.message


def test_bytes_that_are_not_an_image(study):
    study.files["im1.png"] = b"this is not a png"
    p = only(study.problems(), field="file")
    assert p.row == 2 and "not a readable image" in p.message


def test_a_truncated_png(study):
    whole = png_bytes(64, 64, 9)
    study.files["sub/im2.png"] = whole[: len(whole) // 2]
    p = only(study.problems(), field="file")
    assert p.row == 3 and "not a readable image" in p.message


def test_missing_image_folder(study):
    data = study.write().model_copy(update={"image_dir": study.root / "nowhere"})
    p = only(study.problems(data), field="data.image_dir")
    assert p.file == study.path("nowhere") and "not found" in p.message


def test_duplicate_image_id(study):
    study.images.append(["im1", "coco", "im1.png", ""])
    p = only(study.problems(), field="image_id")
    assert (p.file, p.row) == (study.path("images.csv"), 4)
    assert "duplicate image_id 'im1'" in p.message and "row 2" in p.message


def test_duplicate_description_id(study):
    study.descriptions.append(["a1", "im2", "w9", "full", "again"])
    p = only(study.problems(), field="description_id")
    assert (p.file, p.row) == (study.path("descriptions.csv"), 13)
    assert "duplicate description_id 'a1'" in p.message and "row 2" in p.message


def test_description_of_an_unknown_image(study):
    study.descriptions.append(["z1", "ghost", "w1", "full", "text"])
    p = only(study.problems(), field="image_id")
    assert (p.file, p.row) == (study.path("descriptions.csv"), 13)
    assert "unknown image_id 'ghost'" in p.message


@pytest.mark.parametrize(
    "row, vote, field, said",
    [
        (10, ["ghost", "r9", "1", "a1;a2", "a1"], "image_id", "unknown image_id 'ghost'"),
        (4, {"shown": "a1;a2;nope"}, "shown", "unknown description id 'nope'"),
        (2, {"chosen": "nope"}, "chosen", "unknown description id 'nope'"),
        (2, {"chosen": "a5"}, "chosen", "'a5' is not among the shown"),
    ],
    ids=["unknown image", "shows an unknown description", "chooses an unknown description", "chosen not among shown"],
)
def test_a_bad_vote_is_named_by_its_row_and_field(study, row, vote, field, said):
    """`vote` is a vote added at the end (a list) or cells changed in the vote at `row` (a dict)."""
    if isinstance(vote, list):
        study.votes.append(vote)
    else:
        for column, value in vote.items():
            study.votes[row - 2][VOTE_HEADER.index(column)] = value
    p = only(study.problems(), field=field)
    assert (p.file, p.row) == (study.path("votes.csv"), row)
    assert said in p.message


def test_vote_showing_nothing_of_its_image_or_repeating_a_trial(study):
    study.votes.append(["im1", "r9", "1", "b1;b2", "b1"])
    study.votes.append(["im1", "r1", "1", "a1;a2", "a1"])
    problems = study.problems()
    assert "no description of image 'im1'" in only(problems, row=10, field="shown").message
    assert "duplicate vote" in only(problems, row=11, field="trial").message


def test_whitespace_only_text(study):
    study.descriptions[3][4] = "  \t "
    p = only(study.problems(), field="text")
    assert (p.file, p.row) == (study.path("descriptions.csv"), 5)
    assert "empty" in p.message


def test_bytes_that_are_not_utf8_name_the_row(study):
    data = study.write()
    path = study.root / "descriptions.csv"
    lines = path.read_bytes().split(b"\r\n")
    lines[2] = lines[2].replace(b"text a2", b"caf\xe9 a2")  # Latin-1, not UTF-8
    path.write_bytes(b"\r\n".join(lines))
    p = only(study.problems(data), field="text")
    assert (p.file, p.row) == (str(path), 3)
    assert "UTF-8" in p.message


def test_missing_column(study):
    data = study.write()
    write_csv(study.root / "descriptions.csv", ["description_id", "image_id", "condition", "text"], [])
    p = only(study.problems(data), field="worker_id")
    assert (p.file, p.row) == (study.path("descriptions.csv"), 1)
    assert "missing column 'worker_id'" in p.message


def test_unknown_condition(study):
    study.descriptions[5][3] = "m4"
    p = only(study.problems(), field="condition")
    assert (p.file, p.row) == (study.path("descriptions.csv"), 7)
    assert "unknown condition 'm4'" in p.message and "full, m1, m2, m3" in p.message


def test_missing_table_files(study):
    data = study.write()
    (study.root / "votes.csv").unlink()
    data = data.model_copy(update={"descriptions": study.root / "absent.csv"})
    problems = study.problems(data)
    assert "not found" in only(problems, file=study.path("absent.csv")).message
    assert "not found" in only(problems, file=study.path("votes.csv")).message


def test_unsupported_table_format(study):
    data = study.write().model_copy(update={"images": study.root / "images.xlsx"})
    assert "unsupported table format" in only(study.problems(data), file=study.path("images.xlsx")).message


def test_an_image_without_a_full_description(study):
    study.descriptions = [d for d in study.descriptions if d[1] != "im2"]
    study.votes = [v for v in study.votes if v[0] != "im2"]
    problems = study.problems()
    p = only(problems, file=study.path("images.csv"))
    assert (p.row, p.field) == (3, "image_id")
    assert "'im2' has no 'full' description" in p.message


def test_a_row_with_too_many_fields(study):
    study.descriptions.append(["z1", "im1", "w1", "full", "a, b", "spill"])
    p = only(study.problems(), row=13)
    assert "has 6 fields but the header has 5" in p.message


def test_every_problem_comes_back_at_once(study):
    study.files["im1.png"] = b"junk"
    study.images.append(["im2", "coco", "im1.png", ""])
    study.descriptions[0][4] = ""
    study.descriptions[1][3] = "m7"
    study.votes[0][4] = "a5"
    where = {(p.file, p.row, p.field) for p in study.problems()}
    assert where == {
        (study.path("images.csv"), 2, "file"),
        (study.path("images.csv"), 4, "image_id"),
        (study.path("descriptions.csv"), 2, "text"),
        (study.path("descriptions.csv"), 3, "condition"),
        (study.path("votes.csv"), 2, "chosen"),
    }


def test_an_image_with_no_faithful_8_bit_reading(study):
    buf = io.BytesIO()
    Image.fromarray(np.array([[-1.0, 0.5], [2.0, 0.0]], dtype=np.float32)).save(buf, format="TIFF")
    study.files["sub/im2.png"] = buf.getvalue()  # the extension does not matter, the content does
    p = only(study.problems(), field="file")
    assert p.row == 3 and "no faithful 8-bit reading" in p.message and "from -1 to 2" in p.message


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_an_image_path_that_is_a_fifo_is_refused_without_blocking(study):
    data = study.write()
    (study.image_dir / "im1.png").unlink()
    os.mkfifo(study.image_dir / "im1.png")  # reading it would wait forever for a writer
    p = only(within_seconds(30, lambda: study.problems(data)), field="file")
    assert p.row == 2 and "FIFO" in p.message


def test_an_unterminated_quote_does_not_swallow_descriptions(study):
    data = study.write()
    path = study.root / "descriptions.csv"
    lines = path.read_bytes().split(b"\r\n")
    lines[3] = lines[3].replace(b"text a3", b'"text a3')  # the quote opens in row 4 and never closes
    path.write_bytes(b"\r\n".join(lines))
    (p,) = study.problems(data)
    assert (p.file, p.row) == (str(path), 4) and "never closes" in p.message


def test_parquet_columns_of_the_wrong_type_are_named(study):
    data = study.write()
    columns = {c: [r[i] for r in study.images] for i, c in enumerate(IMAGE_HEADER)}
    columns["file"] = [f.encode() for f in columns["file"]]  # binary paths
    pq.write_table(pa.table(columns), study.root / "images.parquet")
    descriptions = {c: [r[i] for r in study.descriptions] for i, c in enumerate(DESCRIPTION_HEADER)}
    descriptions["worker_id"] = [float(i) for i in range(len(study.descriptions))]  # 1.0 is no id
    pq.write_table(pa.table(descriptions), study.root / "descriptions.parquet")
    data = data.model_copy(
        update={"images": study.root / "images.parquet", "descriptions": study.root / "descriptions.parquet"}
    )
    problems = study.problems(data)
    assert "binary" in only(problems, field="file", row=1).message
    assert "double" in only(problems, field="worker_id", row=1).message


def test_unchanged_images_are_not_read_again_and_changed_ones_are(study, tmp_path, monkeypatch):
    from vlm_decade.stages import images

    data = study.write()
    first = images.ImageCache()
    reference = load_study_data(data, study.ranking, MaskConfig(count=3), first).images
    first.save(tmp_path / "run")
    reads = []
    real = images._inspect_image
    monkeypatch.setattr(images, "_inspect_image", lambda path: reads.append(path) or real(path))
    again = load_study_data(data, study.ranking, MaskConfig(count=3), images.ImageCache.of(tmp_path / "run")).images
    assert again.equals(reference) and reads == []  # size and time unchanged: nothing read
    touched = study.image_dir / "im1.png"
    touched.write_bytes(png_bytes(12, 8, 5))  # same size, new bytes and time
    changed = load_study_data(data, study.ranking, MaskConfig(count=3), images.ImageCache.of(tmp_path / "run")).images
    assert reads == [str(touched)]
    assert changed.column("sha256")[0].as_py() != reference.column("sha256")[0].as_py()
    reads.clear()
    load_study_data(data, study.ranking, MaskConfig(count=3), images.ImageCache.of(tmp_path / "run", rehash=True))
    assert sorted(reads) == sorted(str(study.image_dir / f) for f in study.files)  # --rehash reads everything


def test_the_images_ids_are_handed_on_before_the_descriptions_are_read(study, monkeypatch):
    """What needs the ids and memory of its own (the models' files) runs between the two, so that
    it is not held beside the descriptions: the ids that passed and the images table; every id the
    table names, and no table, when an image is bad."""
    import vlm_decade.studies.decade.data as data_module

    read, calls = data_module.read_table, []
    monkeypatch.setattr(data_module, "read_table", lambda path, *a, **k: calls.append(path.name) or read(path, *a, **k))

    def handed(image_ids, images):
        calls.append((sorted(image_ids.to_pylist()), None if images is None else images.num_rows))

    data = study.write()
    loaded = load_study_data(data, study.ranking, MaskConfig(count=3), images_checked=handed)
    ids = sorted(loaded.images.column("image_id").to_pylist())
    assert calls[:3] == ["images.csv", (ids, len(ids)), "descriptions.csv"]
    (data.image_dir / f"{ids[0]}.png").write_bytes(b"not an image")
    calls.clear()
    with pytest.raises(InputError):
        load_study_data(data, study.ranking, MaskConfig(count=3), images_checked=handed)
    assert calls[:3] == ["images.csv", (ids, None), "descriptions.csv"]
