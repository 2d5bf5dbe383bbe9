"""The same tables whatever the data form: one small Study A and one small Study B, each written in
every form the project reads, run end to end on the session Ray, and every table of each run
compared with the CSV + files run's by its content fingerprint (`core.fingerprints`).

The models look at the pixels (the demo's SSD detector, as a template captioner and as a labeller),
so an image decoded differently in some form would change the answers. Columns that must differ are
left out by name before the fingerprint is taken, and nowhere else:

- Study A, COCO captions JSON: none (the JSON's ids and file names are the tables').
- Both studies, WebDataset tar and Parquet shards (Study A's tar shards also in a moto S3 bucket,
  run by the command line in a process of its own): `path` (an image's member of its shard, not a
  file); the keys are the ids (Study B's `<class>/<name>`: a tar member `cat/000000.png`).
- Study B, image folder: none (the CSV's ids and files are the folder's: `<class>/<name>`).
- Study B, Hugging Face dataset: `image_id` and `path` (its ids are `<split>/<row>`, its images
  members of the dataset's Arrow files), in every table that has them. Its rows are in the
  folder's order, so sorting by id orders both runs alike.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from tests.hf_tiny import save_sentence_encoder
from vlm_decade.core.fingerprints import table_fingerprint
from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.pipeline import run as run_decade
from vlm_decade.studies.openworld.pipeline import run as run_openworld

pytestmark = pytest.mark.ray

MODEL = "ssd_mobilenet_v2_coco_2018_03_29"
CLASSES = ("cat", "dog")
STATISTICS = {"n_resamples": 100, "seed": 7}


def photos(n: int) -> list[bytes]:
    """`n` small PNG photos of coloured blocks, from one seeded stream."""
    rng = np.random.default_rng(np.random.SeedSequence([65, n]))
    out = []
    for _ in range(n):
        pixels = np.kron(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), np.ones((16, 16, 1), np.uint8))
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def fingerprints(root: Path, without: tuple[str, ...]) -> dict[str, str]:
    """Every table of the run folder's manifest by its content fingerprint, the columns `without`
    left out of those that have them (the manifest's own fingerprint where none is left out)."""
    folder = RunFolder(root)
    out = {}
    for name, recorded in folder.manifest()["tables"].items():
        names = folder.schema(name).names
        dropped = [c for c in without if c in names]
        if len(dropped) == len(names):  # nothing left to hash (`metadata` without further columns)
            out[name] = f"{folder.num_rows(name)} rows"
        else:
            out[name] = table_fingerprint(folder.read(name).drop_columns(dropped)) if dropped else recorded
    return out


# --- Study A ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def study_a(tmp_path_factory) -> Path:
    """Study A's input in every form: `<form>.yaml` beside the shared images and tables."""
    root = tmp_path_factory.mktemp("forms_a")
    (root / "imgs").mkdir()
    words = "a red blue block square grid of colours small".split()
    rng = np.random.default_rng(np.random.SeedSequence([65, 1]))
    images, descriptions, coco_images, annotations = [], [], [], []
    for i, data in enumerate(photos(4)):
        image_id, file = str(i + 1), f"{i + 1:012d}.png"
        (root / "imgs" / file).write_bytes(data)
        images.append([image_id, "tiny", file])
        coco_images.append({"id": i + 1, "file_name": file, "coco_url": f"http://example.org/{file}"})
        for k in range(5):
            caption_id, text = 100 * (i + 1) + k, " ".join(rng.choice(words, size=5))
            descriptions.append([str(caption_id), image_id, str(caption_id), "full", text])
            annotations.append({"id": caption_id, "image_id": i + 1, "caption": text})
    write_csv(root / "images.csv", ["image_id", "dataset", "file"], images)
    write_shards(root / "shards", {row[0]: (root / "imgs" / row[2]).read_bytes() for row in images})
    write_csv(root / "descriptions.csv", ["description_id", "image_id", "worker_id", "condition", "text"], descriptions)
    (root / "captions.json").write_text(json.dumps({"images": coco_images, "annotations": annotations}))
    encoder = save_sentence_encoder(root / "encoder")
    base = {
        "name": "forms-a",
        "ranking": {"top_k": 1, "bottom_k": 1},
        "models": [{"name": "ssd", "backend": "ssd-template", "model_id": MODEL, "era": "pre-mllm"}],
        "encoders": [{"name": "SBERT-SI", "path": str(encoder)}],
        "statistics": STATISTICS,
        "runtime": {"num_cpus": 2},
    }
    forms = {
        "csv": {"images": "images.csv", "image_dir": "imgs", "descriptions": "descriptions.csv"},
        "coco": {"captions_json": "captions.json", "image_dir": "imgs", "dataset": "tiny"},
        "tar": {"shards": "shards/part-{0..1}.tar", "dataset": "tiny", "descriptions": "descriptions.csv"},
        "parquet": {"shards": ["shards/part-0.parquet", "shards/part-1.parquet"], "images": "keys.csv"}
        | {"descriptions": "descriptions.csv"},
    }
    write_csv(root / "keys.csv", ["image_id", "dataset"], [row[:2] for row in images])
    for form, data in forms.items():
        (root / f"{form}.yaml").write_text(yaml.safe_dump({**base, "data": data, "output": f"run_{form}"}))
    return root


def write_shards(folder: Path, images: dict[str, bytes]) -> None:
    """The images in two WebDataset tar shards (`<key>.png` beside a `<key>.txt` the reader leaves
    alone) and two Parquet shards (`__key__`, `image` as a Hugging Face struct), the first half in
    the first of each."""
    folder.mkdir()
    keys = sorted(images)
    for n, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        with tarfile.open(folder / f"part-{n}.tar", "w") as tar:
            for key in part:
                for name, data in ((f"{key}.png", images[key]), (f"{key}.txt", b"not an image")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        rows = {"__key__": part, "image": pa.array([{"bytes": images[k], "path": f"{k}.png"} for k in part], image)}
        pq.write_table(pa.table(rows), folder / f"part-{n}.parquet")


FORMS_A = ("csv", "coco", "tar", "parquet")


def run_from_bucket(study: Path) -> Path:
    """Study A with its tar shards in a moto S3 bucket on 127.0.0.1, run by the command line in a
    process of its own: its Ray workers, which read the images, are started with the emulator's
    endpoint and credentials in their environment (the session Ray's were started without them)."""
    boto3 = pytest.importorskip("boto3")
    server = pytest.importorskip("moto.server").ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = "http://{}:{}".format(*server.get_host_and_port())
        client = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
        )
        client.create_bucket(Bucket="forms")
        for n in (0, 1):
            client.put_object(
                Bucket="forms", Key=f"shards/part-{n}.tar", Body=(study / f"shards/part-{n}.tar").read_bytes()
            )
        raw = yaml.safe_load((study / "tar.yaml").read_text())
        raw["data"]["shards"], raw["output"] = "s3://forms/shards/part-{0..1}.tar", "run_bucket"
        (study / "bucket.yaml").write_text(yaml.safe_dump(raw))
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
        env |= {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1"}
        env |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": endpoint, "HF_HUB_OFFLINE": "1"}
        cli = Path(sys.executable).parent / "vlm-decade"
        done = subprocess.run([str(cli), "run", str(study / "bucket.yaml")], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        server.stop()
    return study / "run_bucket"


@pytest.fixture(scope="module")
def runs_a(study_a) -> dict[str, Path]:
    runs = {form: run_decade(load_study(study_a / f"{form}.yaml"), Reporter(quiet=True)).root for form in FORMS_A}
    return runs | {"bucket": run_from_bucket(study_a)}


@pytest.mark.parametrize(
    ("form", "without"), [("coco", ()), ("tar", ("path",)), ("parquet", ("path",)), ("bucket", ("path",))]
)
def test_study_a_gives_the_csv_forms_tables_from_every_form(runs_a, form, without):
    by_csv, by_form = fingerprints(runs_a["csv"], without), fingerprints(runs_a[form], without)
    assert {"images", "references", "responses"} <= set(by_csv)
    assert by_form == by_csv


# --- Study B ------------------------------------------------------------------------------------------


def hf_dataset(root: Path, blobs: list[bytes], labels: list[int]) -> None:
    """A dataset as `save_to_disk` writes it: one split, an Arrow stream, its features in JSON."""
    folder = root / "train"
    folder.mkdir(parents=True)
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = pa.table(
        {
            "image": pa.array([{"bytes": b, "path": f"{i}.png"} for i, b in enumerate(blobs)], image),
            "label": pa.array(labels, pa.int64()),
        }
    )
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, rows.schema) as w:
        w.write_table(rows)
    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": list(CLASSES)}}
    (folder / "dataset_info.json").write_text(json.dumps({"features": features}))
    (folder / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": "train"})
    )
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))


@pytest.fixture(scope="module")
def study_b(tmp_path_factory) -> Path:
    """Study B's input in every form: `<form>.yaml` beside the shared images and tables."""
    root = tmp_path_factory.mktemp("forms_b")
    blobs = photos(4)
    labels = [0, 0, 1, 1]
    rows = []
    for i, (data, label) in enumerate(zip(blobs, labels)):
        file = f"{CLASSES[label]}/{i:06d}.png"
        (root / "pics" / CLASSES[label]).mkdir(parents=True, exist_ok=True)
        (root / "pics" / file).write_bytes(data)
        rows.append([file.removesuffix(".png"), "pets", file, CLASSES[label], "prototypical"])
    write_csv(root / "labels.csv", ["image_id", "dataset", "file", "label", "granularity"], rows)
    write_csv(root / "classnames.csv", ["dataset", "class_name"], [["pets", c] for c in CLASSES])
    write_csv(root / "keys.csv", ["image_id", "dataset", "label", "granularity"], [r[:2] + r[3:] for r in rows])
    write_shards(root / "shards", {row[0]: (root / "pics" / row[2]).read_bytes() for row in rows})
    hf_dataset(root / "saved", blobs, labels)
    base = {
        "name": "forms-b",
        "study": "openworld",
        "prompts": [{"id": "default", "text": "What type of object is in this image?"}],
        "models": [{"name": "ssd", "backend": "ssd-label", "model_id": MODEL}],
        "judge": None,
        "statistics": STATISTICS,
        "runtime": {"num_cpus": 2},
    }
    named = {"dataset": "pets", "granularity": "prototypical"}
    forms = {
        "csv": {"labels": "labels.csv", "image_dir": "pics", "classnames": "classnames.csv"},
        "folder": {"image_folder": "pics", **named},
        "hf": {"hf_dataset": "saved", "split": "train", **named},
        "tar": {"shards": "shards/part-{0..1}.tar", "labels": "keys.csv", "classnames": "classnames.csv"},
        "parquet": {"shards": ["shards/part-0.parquet", "shards/part-1.parquet"], "labels": "keys.csv"}
        | {"classnames": "classnames.csv"},
    }
    for form, data in forms.items():
        (root / f"{form}.yaml").write_text(yaml.safe_dump({**base, "data": data, "output": f"run_{form}"}))
    return root


@pytest.fixture(scope="module")
def runs_b(study_b) -> dict[str, Path]:
    return {
        form: run_openworld(load_study(study_b / f"{form}.yaml"), Reporter(quiet=True)).root
        for form in ("csv", "folder", "hf", "tar", "parquet")
    }


@pytest.mark.parametrize(
    ("form", "without"),
    [("folder", ()), ("hf", ("image_id", "path")), ("tar", ("path",)), ("parquet", ("path",))],
)
def test_study_b_gives_the_csv_forms_tables_from_every_form(runs_b, form, without):
    by_csv, by_form = fingerprints(runs_b["csv"], without), fingerprints(runs_b[form], without)
    assert {"images", "labels", "responses"} <= set(by_csv)
    assert by_form == by_csv
