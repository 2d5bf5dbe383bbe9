"""Images added to a finished run, through the command line: the run does only what is new (its
added texts encoded, the earlier segment of vectors kept file for file, the earlier images' scores
kept) and ends with the tables a fresh run of all the images writes."""

from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.hf_tiny import save_sentence_encoder
from vlm_decade.core.runfolder import RunFolder

from .conftest import vlm_decade

pytestmark = pytest.mark.e2e

WORDS = "a man woman dog cat red blue car tree sits runs near under beach street old young".split()
VARIANTS = ("full", "m1", "m2", "m3")


def _study(folder, n: int, encoder) -> str:
    """A study of the first `n` of 24 images (random photos in `folder`, five human descriptions
    each, one imported model of every variant): the same files and texts whatever `n`."""
    rng = np.random.default_rng(7)
    images, descriptions, answers = [], [], []
    for i in range(24):
        image_id = f"img{i:02d}"
        photo = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        said = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 9)))) for _ in range(5 + len(VARIANTS))]
        (folder / "images").mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo).save(folder / "images" / f"{image_id}.png")
        if i < n:
            images.append([image_id, "everyday" if i % 2 else "specialist", f"{image_id}.png"])
            descriptions += [[f"{image_id}-d{k}", image_id, f"w{k}", "full", said[k]] for k in range(5)]
            answers += [[image_id, v, said[5 + j]] for j, v in enumerate(VARIANTS)]
    for name, header, rows in (
        ("images.csv", ["image_id", "dataset", "file"], images),
        ("descriptions.csv", ["description_id", "image_id", "worker_id", "condition", "text"], descriptions),
        ("model.csv", ["image_id", "variant", "text"], answers),
    ):
        with open(folder / name, "w", newline="") as f:
            csv.writer(f).writerows([header, *rows])
    study = {
        "name": "added",
        "data": {"images": "images.csv", "image_dir": "images", "descriptions": "descriptions.csv"},
        "ranking": {"top_k": 1, "bottom_k": 1},
        "models": [
            {
                "name": "old-captioner",
                "backend": "imported",
                "model_id": "old",
                "era": "pre-mllm",
                "variants": "all",
                "options": {"file": "model.csv"},
            }
        ],
        "encoders": [{"name": "SBERT-SI", "path": str(encoder)}],
        "statistics": {"n_resamples": 200},
    }
    (folder / "study.json").write_text(json.dumps(study))
    return str(folder / "study.json")


def _same(a: pa.Table, b: pa.Table) -> None:
    """Equal rows, whatever their order; floats (and vectors) within 1e-6, the rest exactly."""
    plain = [c for c in a.column_names if not pa.types.is_list(a.schema.field(c).type)]
    keys = [(c, "ascending") for c in plain if not pa.types.is_floating(a.schema.field(c).type)]
    a, b = (t.sort_by(keys) for t in (a, b))
    assert a.schema == b.schema and a.num_rows == b.num_rows
    for c in a.column_names:
        kind = a.schema.field(c).type
        if pa.types.is_floating(kind) or pa.types.is_list(kind):
            x, y = (
                np.asarray(t.column(c).combine_chunks().flatten() if pa.types.is_list(kind) else t.column(c), float)
                for t in (a, b)
            )
            assert np.allclose(x, y, rtol=0, atol=1e-6, equal_nan=True), c
        else:
            assert a.column(c).equals(b.column(c)), c


def test_images_added_to_a_finished_run_do_only_what_is_new_and_end_as_a_fresh_run(tmp_path):
    encoder = save_sentence_encoder(tmp_path / "encoder")
    run, folder = tmp_path / "run", RunFolder(tmp_path / "run")
    first = vlm_decade("run", _study(tmp_path / "study", 21, encoder), "--out", str(run))
    assert first.returncode == 0, first.stderr[-3000:]
    (segment,) = folder.segments("embeddings")
    written = (segment.stat().st_ino, segment.stat().st_mtime_ns)
    before = folder.read("embeddings").num_rows

    study = _study(tmp_path / "study", 24, encoder)  # three images more
    added = vlm_decade("run", study, "--out", str(run))
    assert added.returncode == 0, added.stderr[-3000:]
    said = " ".join(added.stderr.split())
    assert "responses 84 of 96 already done, kept" in said, said  # 21 images x 4 variants
    assert f"embeddings {before} already encoded, kept" in said, said
    first_segment, new_segment = folder.segments("embeddings")
    assert (first_segment.stat().st_ino, first_segment.stat().st_mtime_ns) == written  # not written again
    assert pq.ParquetFile(new_segment).metadata.num_rows == folder.num_rows("embeddings") - before

    fresh = vlm_decade("run", study, "--out", str(tmp_path / "fresh"))
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    for name in ("images", "references", "responses", "embeddings", "scores", "stats", "comparisons"):
        a, b = RunFolder(tmp_path / "fresh").read(name), folder.read(name)
        drop = [c for c in ("latency_s",) if c in a.column_names]  # the wall clock
        _same(a.drop_columns(drop), b.drop_columns(drop))
    assert pc.count_distinct(folder.read("scores").column("image_id")).as_py() == 24

    # An image changed and a descriptions row naming no image: Ray and the encoder actors start
    # ahead while the descriptions are checked, and the refused run leaves the folder as it was.
    kept = {name: (run / name).read_bytes() for name in ("manifest.json", "logs/ray.log")}
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "study" / "images" / "img00.png")
    with open(tmp_path / "study" / "descriptions.csv", "a", newline="") as f:
        csv.writer(f).writerow(["img99-d0", "img99", "w0", "full", "a dog"])
    refused = vlm_decade("run", study, "--out", str(run))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "descriptions.csv" in refused.stderr and "img99" in refused.stderr, refused.stderr[-3000:]
    assert {name: (run / name).read_bytes() for name in kept} == kept
