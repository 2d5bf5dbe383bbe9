"""Images in WebDataset tar shards and Parquet shards: patterns expanded, members grouped by key as
WebDataset groups them, each image read back alone from its recorded member location by the one
opener (the images check, the models' decoder, the viewer), Study A and Study B fed from shards with
the tables of the loose-file run (paths aside), the shard cache, and each bad input refused by
`validate` naming its shard and member, with no traceback and nothing written."""

from __future__ import annotations

import copy
import hashlib
import io
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image
from starlette.testclient import TestClient
from typer.testing import CliRunner

from tests.e2e.test_object_storage import BUCKET, bucket, s3_server  # noqa: F401 - its moto fixtures, shared
from vlm_decade.cli import app
from vlm_decade.core import storage
from vlm_decade.core.errors import Problems
from vlm_decade.imaging.decode import load_image
from vlm_decade.stages import shard_images
from vlm_decade.stages.images import ImageCache
from vlm_decade.stages.shard_images import check_shard_images
from vlm_decade.studies import load_study, study_from_dict
from vlm_decade.studies.decade.config import RankingConfig
from vlm_decade.studies.decade.data import load_study_data
from vlm_decade.studies.openworld.data import load_openworld_form
from vlm_decade.view.app import create_app
from vlm_decade.view.runs import open_run
from vlm_decade.view.verify import Missing, image_bytes

from .test_data_forms import refused
from .view_runs import decade_run, write

IMPORTED = {"name": "old", "backend": "imported", "model_id": "x", "era": "pre-mllm", "options": {"file": "c.csv"}}
COLOURS = {"1": (200, 0, 0), "2": (0, 200, 0), "3": (0, 0, 200)}


def png(colour: tuple[int, int, int], size: int = 16) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(out, "PNG")
    return out.getvalue()


def write_tar(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def write_parquet(path: Path, keys: list[str], images: list[bytes], struct: bool, key="__key__", column="image"):
    path.parent.mkdir(parents=True, exist_ok=True)
    values = [{"bytes": b, "path": f"{k}.png"} for k, b in zip(keys, images)] if struct else images
    pq.write_table(pa.table({key: keys, column: values}), path, row_group_size=2)


# --- patterns and member locations --------------------------------------------------------------------


def test_brace_patterns_expand_as_webdataset_writes_them():
    assert storage.expand("s/train-{000008..000011}.tar") == [f"s/train-0000{n:02d}.tar" for n in (8, 9, 10, 11)]
    assert storage.expand(["a/{x,y}-{1..2}.parquet", "b.tar"]) == [
        "a/x-1.parquet",
        "a/x-2.parquet",
        "a/y-1.parquet",
        "a/y-2.parquet",
        "b.tar",
    ]
    assert storage.expand("{8..10}.tar") == ["8.tar", "9.tar", "10.tar"]  # no padding asked: none given
    for bad in ("s/{a}.tar", "s/x.zip", "s/x.tar.gz", "s/{0..9999999}.tar"):
        with pytest.raises(ValueError):
            storage.expand(bad)


def test_members_are_grouped_by_key_as_webdataset_does():
    assert storage.split_key("a/b.c/0001.seg.png") == ("a/b.c/0001", "seg.png")
    assert storage.split_key("0001.jpg") == ("0001", "jpg")
    assert storage.split_key("README") is None
    assert storage.split_key("dir/._0001.jpg") is None  # a hidden file holds no sample


def test_a_member_location_reads_back_and_an_ordinary_path_with_a_hash_stays_a_file(tmp_path):
    weird = tmp_path / "x.tar#a@1+2"  # looks like a member, is a file: its shard part names no tar
    weird.write_bytes(b"plain")
    assert storage.member(str(weird)) is None
    assert storage.read_bytes(str(weird)) == b"plain"
    odd = tmp_path / "we#ird" / "a.png"  # a folder with '#' in its name
    odd.parent.mkdir()
    odd.write_bytes(png((1, 2, 3)))
    assert storage.member(str(odd)) is None and storage.file_problem(str(odd)) is None
    member = storage.member("s/a.tar#k@x.jpg@512+100")
    assert (member.shard, member.name, member.offset, member.size, member.column) == (
        "s/a.tar",
        "k@x.jpg",
        512,
        100,
        None,
    )
    row = storage.member("s/p.parquet#key:1@3:7:image")
    assert (row.shard, row.name, row.offset, row.size, row.column) == ("s/p.parquet", "key:1", 3, 7, "image")


def test_a_tar_shard_streams_its_images_and_each_reads_back_alone(tmp_path):
    members = {
        "x/1.png": png(COLOURS["1"]),
        "x/1.txt": b"caption",
        "x/2.seg.png": png(COLOURS["3"]),  # a mask beside the image, as WebDataset names it: not the image
        "x/2.JPG": png(COLOURS["2"]),
        "notes": b"-",
    }
    write_tar(tmp_path / "s.tar", members)
    read = list(storage.read_shard(str(tmp_path / "s.tar")))
    assert [(key, data) for key, _, data in read] == [("x/1", members["x/1.png"]), ("x/2", members["x/2.JPG"])]
    for _, member, data in read:
        location = member.location
        assert storage.file_problem(location) is None
        assert storage.read_bytes(location) == data  # one ranged read, as tarfile's offset_data says
        assert storage.stat(location) == storage.stat(str(tmp_path / "s.tar"))
    assert load_image(read[0][1].location).rgb[0, 0].tolist() == list(COLOURS["1"])
    (tmp_path / "s.tar").write_bytes(b"\0" * 1024)  # the shard changed since: the member lies past its end
    assert "lies past the end of shard" in storage.file_problem(read[1][1].location)
    (tmp_path / "s.tar").unlink()
    assert storage.file_problem(read[0][1].location) == "not found"


@pytest.mark.parametrize(
    "form", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["ustar", "gnu", "pax"]
)
def test_a_tar_shard_gives_the_members_and_offsets_tarfile_reads(tmp_path, form):
    long = "p" * 120 + "/" + "q" * 90  # past ustar's 100-byte name: a prefix, a GNU long name or a pax path
    names = ["a.png", "d/é.jpg", long + ".png", "c.txt", "e.PNG", "f.gif"]
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w", format=form) as tar:
        folder = tarfile.TarInfo("d")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = 300 * i + 7  # sizes off the 512-byte blocks
            info.pax_headers = {"comment": "x" * i}  # heeded by pax only: a record before the member
            tar.addfile(info, io.BytesIO(bytes([i]) * info.size))
        link = tarfile.TarInfo("l.png")
        link.type = tarfile.SYMTYPE
        link.linkname = "a.png"
        tar.addfile(link)
    with tarfile.open(path, "r|") as tar:  # the reference: Python's own reader
        expected = [
            (info.name, info.offset_data, tar.extractfile(info).read())
            for info in tar
            if info.isfile() and info.name.lower().endswith((".png", ".jpg", ".gif"))
        ]
    assert len(expected) == 5
    got = [(member.name, member.offset, data) for _, member, data in storage.read_shard(str(path))]
    assert got == expected
    header = bytearray(path.read_bytes())
    header[600] ^= 1  # a byte of the second header's name: its checksum no longer holds
    path.write_bytes(bytes(header))
    with pytest.raises(storage.ShardError, match="bad checksum in the header at byte 512"):
        list(storage.read_shard(str(path)))


@pytest.mark.parametrize("struct", [False, True], ids=["binary", "hf-struct"])
def test_a_parquet_shard_streams_its_images_and_each_reads_back_alone(tmp_path, struct):
    keys, images = list(COLOURS), [png(c) for c in COLOURS.values()]
    write_parquet(tmp_path / "p.parquet", keys, images, struct)
    read = list(storage.read_shard(str(tmp_path / "p.parquet")))
    assert [(k, d) for k, _, d in read] == list(zip(keys, images))
    assert [m.offset for _, m, _ in read] == [0, 0, 1]  # row groups of two rows
    assert [storage.read_bytes(m.location) for _, m, _ in read] == images


def test_parquet_columns_are_found_by_name_or_named(tmp_path):
    write_parquet(tmp_path / "p.parquet", ["k"], [png((9, 9, 9))], False, key="id", column="pixels")
    with pytest.raises(storage.ShardError, match="no key column"):
        list(storage.read_shard(str(tmp_path / "p.parquet")))
    assert [k for k, _, _ in storage.read_shard(str(tmp_path / "p.parquet"), "id", "pixels")] == ["k"]


# --- the images check -------------------------------------------------------------------------------


def test_the_process_pool_and_threads_find_the_same_in_the_shards_order(tmp_path, monkeypatch):
    colours = [(i * 40 % 256, i * 90 % 256, 255 - i * 20) for i in range(12)]
    images = {f"{i:02d}": png(c, 8 + i) for i, c in enumerate(colours)}  # each its own size: order shows
    for shard in range(6):  # the first probed here; of the rest, one in three here, the others on processes
        keys = list(images)[2 * shard : 2 * shard + 2]
        write_tar(tmp_path / f"s-{shard}.tar", {f"{k}.png": images[k] for k in keys})
    pattern = str(tmp_path / "s-{0..5}.tar")
    _, threads = check_shard_images(pattern, None, "d", Problems())
    monkeypatch.setattr(shard_images, "PROCESSES_FROM_S", 0.0)  # any work at all goes to the pool
    problems = Problems()
    _, processes = check_shard_images(pattern, None, "d", problems)
    assert not problems.items and processes.equals(threads)
    expected = [(k, hashlib.sha256(b).hexdigest(), 8 + i, 8 + i) for i, (k, b) in enumerate(images.items())]
    assert list(zip(*(processes.column(c).to_pylist() for c in ("image_id", "sha256", "width", "height")))) == expected


def test_a_changed_shard_is_read_again_and_an_unchanged_one_is_not(tmp_path):
    write_tar(tmp_path / "s-0.tar", {"1.png": png(COLOURS["1"])})
    write_tar(tmp_path / "s-1.tar", {"2.png": png(COLOURS["2"])})
    pattern = str(tmp_path / "s-{0..1}.tar")
    first = ImageCache()
    _, found = check_shard_images(pattern, None, "d", Problems(), first)
    again = ImageCache(first.found)
    _, found_again = check_shard_images(pattern, None, "d", Problems(), again)
    assert again.unknown == 0 and found_again.equals(found)
    write_tar(tmp_path / "s-1.tar", {"2.png": png(COLOURS["3"])})
    changed = ImageCache(again.found)
    _, found_changed = check_shard_images(pattern, None, "d", Problems(), changed)
    assert changed.unknown == 1
    assert found_changed.column("sha256")[1].as_py() != found.column("sha256")[1].as_py()


def test_the_viewer_serves_an_image_from_its_shard_only_while_it_hashes_as_recorded(tmp_path):
    write_tar(tmp_path / "s.tar", {"1.png": png(COLOURS["1"])})
    _, found = check_shard_images(str(tmp_path / "s.tar"), None, "d", Problems())
    image = {"image_id": "1", "path": found.column("path")[0].as_py(), "sha256": found.column("sha256")[0].as_py()}
    assert image_bytes(image) == png(COLOURS["1"])
    write_tar(tmp_path / "s.tar", {"1.png": png(COLOURS["2"])})  # same size, other pixels
    with pytest.raises(Missing, match="sha256"):
        image_bytes(image)


# --- Study A from shards ----------------------------------------------------------------------------


@pytest.fixture
def study_a(tmp_path):
    """One Study A input: loose files with CSV tables (`files.yaml`), and its images in two tar
    shards (`tar.yaml`) and in a Parquet shard (`parquet.yaml`), named by image_id."""
    (tmp_path / "imgs").mkdir()
    for key, colour in COLOURS.items():
        (tmp_path / "imgs" / f"{key}.png").write_bytes(png(colour))
    (tmp_path / "images.csv").write_text("image_id,dataset,file\n" + "".join(f"{k},tiny,{k}.png\n" for k in COLOURS))
    rows = [f"{k}{n},{k},w{n},full,picture {k} seen by {n}" for k in COLOURS for n in range(3)]
    (tmp_path / "humans.csv").write_text("description_id,image_id,worker_id,condition,text\n" + "\n".join(rows) + "\n")
    (tmp_path / "c.csv").write_text("image_id,variant,text\n" + "".join(f"{k},full,thing\n" for k in COLOURS))
    write_tar(tmp_path / "shards" / "s-00.tar", {"1.png": png(COLOURS["1"]), "1.txt": b"x", "2.png": png(COLOURS["2"])})
    write_tar(tmp_path / "shards" / "s-01.tar", {"3.png": png(COLOURS["3"])})
    write_parquet(tmp_path / "pq" / "p-0.parquet", list(COLOURS), [png(c) for c in COLOURS.values()], True)
    forms = {
        "files": {"images": "images.csv", "image_dir": "imgs", "descriptions": "humans.csv"},
        "tar": {"shards": "shards/s-{00..01}.tar", "dataset": "tiny", "descriptions": "humans.csv"},
        "parquet": {"shards": ["pq/p-0.parquet"], "dataset": "tiny", "descriptions": "humans.csv"},
    }
    for name, data in forms.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({"name": "shards", "models": [IMPORTED], "data": data}))
    return tmp_path


def load_a(folder: Path, name: str):
    raw = yaml.safe_load((folder / f"{name}.yaml").read_text())
    data = copy.deepcopy(raw["data"])
    for key in ("images", "descriptions", "image_dir"):
        if key in data:
            data[key] = str(folder / data[key])
    if "shards" in data:
        shards = data["shards"]
        data["shards"] = str(folder / shards) if isinstance(shards, str) else [str(folder / s) for s in shards]
    study = study_from_dict({**raw, "data": data})
    return load_study_data(study.data, RankingConfig(), study.masks)


@pytest.mark.parametrize("form", ["tar", "parquet"])
def test_shards_give_the_loose_files_tables_but_the_paths(study_a, form):
    by_files, by_shards = load_a(study_a, "files"), load_a(study_a, form)
    others = [c for c in by_files.images.column_names if c != "path"]
    assert by_shards.images.select(others).equals(by_files.images.select(others))
    assert by_shards.references.equals(by_files.references)
    paths = by_shards.images.column("path").to_pylist()
    for path, image_id in zip(paths, by_shards.images.column("image_id").to_pylist()):
        member = storage.member(path)
        assert member is not None and member.name.startswith(image_id)
        assert storage.read_bytes(path) == (study_a / "imgs" / f"{image_id}.png").read_bytes()


def test_validate_says_the_shards_and_the_image_count(study_a):
    done = CliRunner().invoke(app, ["validate", str(study_a / "tar.yaml")])
    output = " ".join(done.output.split())
    assert done.exit_code == 0, output
    assert "3 images in 1 dataset (tiny), 9 human descriptions" in output
    assert "images read from the shards" in output and "s-{00..01}.tar" in output


def test_a_truncated_tar_is_refused_naming_the_shard_and_its_last_member(study_a):
    shard = study_a / "shards" / "s-00.tar"
    shard.write_bytes(shard.read_bytes()[:1500])  # 1.png whole, 1.txt cut
    refused(study_a / "tar.yaml", "s-00.tar", "not a readable tar shard", "after member 1.png")


def test_a_member_that_is_no_image_is_refused_naming_shard_and_member(study_a):
    write_tar(study_a / "shards" / "s-01.tar", {"3.png": b"\x89PNG not really"})
    refused(study_a / "tar.yaml", "s-01.tar", "member 3.png (key '3')", "not a readable image")


def test_a_key_in_two_shards_is_refused_naming_both(study_a):
    write_tar(study_a / "shards" / "s-01.tar", {"3.png": png(COLOURS["3"]), "2.jpg": png(COLOURS["2"])})
    refused(study_a / "tar.yaml", "key '2' (member 2.jpg) is also in", "s-00.tar (member 2.png)")


def test_a_missing_shard_and_a_pattern_that_names_none_are_refused(study_a):
    (study_a / "shards" / "s-01.tar").unlink()
    refused(study_a / "tar.yaml", "s-01.tar", "shard not found")
    raw = yaml.safe_load((study_a / "tar.yaml").read_text())
    raw["data"]["shards"] = "shards/gone-{0..3}.tar"
    (study_a / "none.yaml").write_text(yaml.safe_dump(raw))
    refused(study_a / "none.yaml", "names no shard that can be read", "gone-0.tar")


def test_a_description_of_a_key_no_shard_holds_is_refused(study_a):
    with (study_a / "humans.csv").open("a") as fh:
        fh.write("40,4,w9,full,a picture nobody sharded\n")
    refused(study_a / "tar.yaml", "humans.csv", "unknown image_id '4' (not in any shard)")


def test_an_images_table_gives_each_key_its_dataset_and_must_be_held(study_a):
    (study_a / "keyed.csv").write_text("image_id,dataset,place\n1,tiny,here\n2,tiny,there\n3,tiny,here\n")
    raw = yaml.safe_load((study_a / "tar.yaml").read_text())
    raw["data"] = {"shards": raw["data"]["shards"], "images": "keyed.csv", "descriptions": "humans.csv"}
    (study_a / "keyed.yaml").write_text(yaml.safe_dump(raw))
    by_table, by_files = load_a(study_a, "keyed"), load_a(study_a, "files")
    assert by_table.images.select(["image_id", "sha256"]).equals(by_files.images.select(["image_id", "sha256"]))
    assert by_table.metadata.column("place").to_pylist() == ["here", "there", "here"]
    (study_a / "keyed.csv").write_text("image_id,dataset\n1,tiny\n2,tiny\n3,tiny\n9,tiny\n")
    refused(study_a / "keyed.yaml", "keyed.csv", "no shard holds image_id '9'")


# --- Study B from shards ----------------------------------------------------------------------------


@pytest.fixture
def study_b(study_a):
    """Study B's labels beside loose files (`b-files.yaml`) and, without `file`, beside the tar shards."""
    labels = "image_id,dataset,file,label,granularity\n" + "".join(
        f"{k},tiny,{k}.png,{name},prototypical\n" for k, name in zip(COLOURS, ("red", "green", "blue"))
    )
    (study_a / "labels.csv").write_text(labels)
    keyed = "\n".join(",".join(c for j, c in enumerate(line.split(",")) if j != 2) for line in labels.splitlines())
    (study_a / "labels-keyed.csv").write_text(keyed + "\n")
    (study_a / "classes.csv").write_text("dataset,class_name\ntiny,red\ntiny,green\ntiny,blue\n")
    forms = {
        "b-files": {"labels": "labels.csv", "image_dir": "imgs", "classnames": "classes.csv"},
        "b-tar": {"labels": "labels-keyed.csv", "shards": "shards/s-{00..01}.tar", "classnames": "classes.csv"},
    }
    model = {k: v for k, v in IMPORTED.items() if k != "era"}  # Study B's models have no era
    for name, data in forms.items():
        raw = {"study": "openworld", "name": "b", "models": [model], "judge": None, "data": data}
        (study_a / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    return study_a


def load_b(folder: Path, name: str):
    return load_openworld_form(load_study(folder / f"{name}.yaml").data)  # paths resolved as the CLI does


def test_study_b_from_shards_gives_the_loose_files_tables_but_the_paths(study_b):
    by_files, by_shards = load_b(study_b, "b-files"), load_b(study_b, "b-tar")
    others = [c for c in by_files.images.column_names if c != "path"]
    assert by_shards.images.select(others).equals(by_files.images.select(others))
    assert by_shards.labels.equals(by_files.labels)
    assert by_shards.classnames == by_files.classnames == {"tiny": ("red", "green", "blue")}
    done = CliRunner().invoke(app, ["validate", str(study_b / "b-tar.yaml")])
    output = " ".join(done.output.split())
    assert done.exit_code == 0, output
    assert "3 labelled images in 1 dataset" in output and "images read from the shards" in output


def test_study_b_refuses_a_label_of_a_key_no_shard_holds(study_b):
    with (study_b / "labels-keyed.csv").open("a") as fh:
        fh.write("7,tiny,red,prototypical\n")
    refused(study_b / "b-tar.yaml", "labels-keyed.csv", "no shard holds image_id '7'")


# --- shards in a bucket (moto's S3 server on 127.0.0.1, as tests/e2e/test_object_storage.py starts it) ----


def test_shards_in_a_bucket_check_as_the_same_shards_on_disk_and_read_back_by_range(bucket, tmp_path):  # noqa: F811
    members = {f"{k}.png": png(c) for k, c in COLOURS.items()}
    write_tar(tmp_path / "s-0.tar", dict(list(members.items())[:2]))
    write_tar(tmp_path / "s-1.tar", dict(list(members.items())[2:]))
    write_parquet(tmp_path / "p.parquet", list(COLOURS), list(members.values()), True)
    for name in ("s-0.tar", "s-1.tar", "p.parquet"):
        bucket.put_object(Bucket=BUCKET, Key=f"shards/{name}", Body=(tmp_path / name).read_bytes())
    for local, remote in (
        (str(tmp_path / "s-{0..1}.tar"), f"s3://{BUCKET}/shards/s-{{0..1}}.tar"),
        ([str(tmp_path / "p.parquet")], [f"s3://{BUCKET}/shards/p.parquet"]),
    ):
        _, on_disk = check_shard_images(local, None, "d", Problems())
        problems = Problems()
        _, in_bucket = check_shard_images(remote, None, "d", problems)
        assert not problems
        assert in_bucket.drop_columns(["path"]).equals(on_disk.drop_columns(["path"]))
        for path, sha in zip(in_bucket.column("path").to_pylist(), in_bucket.column("sha256").to_pylist()):
            assert path.startswith(f"s3://{BUCKET}/shards/") and storage.file_problem(path) is None
            assert image_bytes({"image_id": "x", "path": path, "sha256": sha}) in members.values()
    problems = Problems()
    assert check_shard_images(f"s3://{BUCKET}/shards/gone.tar", None, "d", problems) is None
    assert "names no shard that can be read" in str(problems.items[0]) and "not found" in str(problems.items[0])


def test_the_viewer_app_serves_images_from_their_shard(tmp_path):
    root = decade_run(tmp_path / "run")
    rows = pq.read_table(root / "images.parquet").to_pylist()
    loose = {row["image_id"]: Path(row["path"]) for row in rows}
    write_tar(tmp_path / "s.tar", {f"{i}.png": p.read_bytes() for i, p in loose.items()})
    where = {key: member.location for key, member, _ in storage.read_shard(str(tmp_path / "s.tar"))}
    write(root, "images", [{**row, "path": where[row["image_id"]]} for row in rows])
    files = {i: p.read_bytes() for i, p in loose.items()}
    for path in loose.values():
        path.unlink()  # only the shard holds them now
    app = TestClient(create_app(open_run(root)), base_url="http://127.0.0.1:8765", raise_server_exceptions=True)
    for image_id in loose:
        answer = app.get(f"/picture/original/{image_id}")
        assert answer.status_code == 200 and answer.content == files[image_id]
        thumb = app.get(f"/picture/thumb/{image_id}")
        assert thumb.status_code == 200 and thumb.headers["content-type"] in ("image/jpeg", "image/png")
    assert app.get(f"/image/{next(iter(loose))}").status_code == 200


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"image_dir": "imgs"}, "give neither `image_dir` nor `captions_json` with it"),
        ({"images": "images.csv"}, "give `dataset` (every image of the shards is of it) or an `images` table"),
        ({"shards": "shards/s-{00..01}.zip"}, "is no shard: a shard is an uncompressed .tar or a .parquet file"),
        ({"shards": "shards/s-{x}.tar"}, "is neither a range {000..009} nor a list {a,b}"),
    ],
)
def test_a_study_file_that_misnames_its_shards_is_refused(study_a, change, expected):
    raw = yaml.safe_load((study_a / "tar.yaml").read_text())
    raw["data"].update(change)
    (study_a / "bad.yaml").write_text(yaml.safe_dump(raw))
    refused(study_a / "bad.yaml", "data", expected)
