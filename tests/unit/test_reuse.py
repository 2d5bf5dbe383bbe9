"""Per-row reuse: adding units computes only the new ones (and the changed or unfinished ones), and
the table equals the one computed fresh over every unit, row for row."""

import hashlib

import pyarrow as pa
import pytest

from vlm_decade.core.reuse import INPUTS, reuse, unit_inputs

SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("image_id", pa.string()),
        ("status", pa.string()),
        ("value", pa.float64()),
        ("boxes", pa.list_(pa.float64())),
        (INPUTS, pa.string()),
    ]
)
SUBJECTS = ("a", "b")


def texts(n: int, changed: dict[int, str] | None = None) -> dict[str, str]:
    return {f"img{i:04d}": (changed or {}).get(i, f"text of {i}") for i in range(n)}


class Counted:
    """Rows per image from its text alone (float arithmetic, a list column), counting the images it was given."""

    def __init__(self, texts, failing=()):
        self.texts, self.failing, self.images = texts, set(failing), []

    def __call__(self, todo: pa.Table) -> pa.Table:
        self.images += todo.column("image_id").to_pylist()
        rows = []
        for image_id in todo.column("image_id").to_pylist():
            seed = int(hashlib.sha256(self.texts[image_id].encode()).hexdigest()[:8], 16) / 2**32
            for k, subject in enumerate(SUBJECTS):
                ok = image_id not in self.failing
                rows.append(
                    {
                        "subject": subject,
                        "image_id": image_id,
                        "status": "ok" if ok else "error",
                        "value": (seed * 0.1 + k) / 3.0 if ok else None,
                        "boxes": [seed, seed / 7.0],
                    }
                )
        return pa.Table.from_pylist(rows, schema=pa.schema([f for f in SCHEMA if f.name != INPUTS]))


def run(previous, texts, settings=("detector", 1), failing=()):
    ids = sorted(texts)
    wanted = pa.table({"image_id": ids, INPUTS: unit_inputs(settings, [texts[i] for i in ids])})
    compute = Counted(texts, failing)
    table, computed = reuse(previous, wanted, ["image_id"], compute, SCHEMA, ["image_id", "subject"])
    assert computed == len(compute.images)
    return table, compute.images


def test_added_images_are_the_only_ones_computed_and_the_table_equals_a_fresh_one():
    old, first = run(None, texts(200))
    assert len(first) == 200 and old.num_rows == 400
    grown = texts(220)
    table, computed = run(old, grown)
    assert computed == [f"img{i:04d}" for i in range(200, 220)]
    fresh, _ = run(None, grown)
    assert table.equals(fresh)  # exactly: each row's floats came from the same arithmetic on the same inputs
    assert table.column("image_id").to_pylist()[:4] == ["img0000", "img0000", "img0001", "img0001"]


def test_a_changed_input_or_an_unfinished_row_is_computed_again_and_a_dropped_image_leaves():
    old, _ = run(None, texts(10), failing={"img0003"})
    changed = texts(10, {5: "another text"})
    del changed["img0007"]
    table, computed = run(old, changed)
    assert computed == ["img0003", "img0005"]
    assert table.equals(run(None, changed)[0])
    assert "img0007" not in table.column("image_id").to_pylist()


@pytest.mark.parametrize(
    "previous",
    [
        lambda old: old.drop_columns(["boxes"]),  # a table of another schema (an earlier version's)
        lambda old: old.set_column(5, INPUTS, pa.nulls(old.num_rows, pa.string())),  # rows without a key
    ],
)
def test_nothing_is_reused_from_a_table_it_cannot_vouch_for(previous):
    old, _ = run(None, texts(5))
    table, computed = run(previous(old), texts(5))
    assert len(computed) == 5 and table.equals(old)


def test_changed_settings_compute_every_image_and_nothing_to_do_calls_nothing():
    old, _ = run(None, texts(5))
    assert run(old, texts(5), settings=("detector", 2))[1] == [f"img{i:04d}" for i in range(5)]
    table, computed = run(old, texts(5))
    assert computed == [] and table.equals(old)


def test_a_stage_run_again_with_an_image_added_detects_only_that_one(tmp_path):
    """Through the run folder: the detections stage's glue (`per_image`) reads back the last table it
    wrote, verified, and hands only the added image to the detector."""
    from vlm_decade.core.config import RuntimeConfig
    from vlm_decade.core.progress import Reporter
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.core.runner import Stage, StudyRun, given
    from vlm_decade.core.runtime import LazyRay
    from vlm_decade.studies.decade.taxonomy.detect import DETECTIONS_SCHEMA, per_image

    seen = []

    def detector(images: pa.Table) -> list[dict]:
        seen.append(images.column("image_id").to_pylist())
        return [
            {"image_id": i, "status": "ok", "error": "", "detections": [{"label": s[:3], "score": 0.5}]}
            for i, s in zip(images.column("image_id").to_pylist(), images.column("sha256").to_pylist())
        ]

    def run(folder, n):
        images = pa.table({"image_id": [f"i{k}" for k in range(n)], "sha256": [f"sha{k}" for k in range(n)]})
        spine = StudyRun(RunFolder(folder), Reporter(quiet=True), LazyRay(RuntimeConfig()))
        stage = Stage(
            "detections",
            ("images",),
            "d",
            lambda r: {"detections": per_image(r, "detections", DETECTIONS_SCHEMA, "d", detector)},
        )
        spine(given("images", images), stage)
        return RunFolder(folder).read("detections")

    run(tmp_path / "a", 3)
    grown = run(tmp_path / "a", 4)
    assert seen == [["i0", "i1", "i2"], ["i3"]]
    assert grown.equals(run(tmp_path / "fresh", 4)) and grown.num_rows == 4
