"""The responses stage keeps the cache keys of the jobs whose inputs are as the previous table's keys
were made from (`.cache/responses-keys.parquet`), and makes every other key: after images are
added, an image changed, a file's answer changed or its background set, the table is a fresh run's,
key for key, and only the jobs of what changed (and what is new) are hashed."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import vlm_decade.stages.describe.plan as plan_module
import vlm_decade.stages.describe.rows as rows_module
from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import StudyRun, given
from vlm_decade.core.runtime import LazyRay
from vlm_decade.imaging.masks import MaskSpec
from vlm_decade.models.backends.imported import files_held
from vlm_decade.stages.describe import stage
from vlm_decade.stages.describe.keyed import KEYED_FILE
from vlm_decade.stages.describe.plan import Plan
from vlm_decade.studies import study_from_dict

VARIANTS = ("full", "m1")
PROMPTS = (("p1", "say"), ("p2", "say more"))


def _study(folder: Path):
    models = [
        {"name": name, "backend": "imported", "model_id": name, "era": "pre-mllm", "variants": "all"}
        | {"options": {"file": str(folder / f"{name}.csv")}}
        for name in ("a", "b")
    ]
    data = {"images": "x.csv", "image_dir": str(folder), "descriptions": "d.csv"}
    return study_from_dict({"name": "keyed", "data": data, "models": models})


def _answers(folder: Path, n: int, changed: dict | None = None) -> None:
    """Each model's file: a row per image and variant (for every prompt) of the first `n` images."""
    for name in ("a", "b"):
        with open(folder / f"{name}.csv", "w", newline="") as f:
            said = changed or {}
            rows = [
                [f"i{i}", v, said.get((name, f"i{i}", v), f"{name} says {i} {v}")] for i in range(n) for v in VARIANTS
            ]
            csv.writer(f).writerows([["image_id", "variant", "text"], *rows])


def _images(n: int, sha: dict | None = None, background: dict | None = None) -> pa.Table:
    ids = [f"i{i}" for i in range(n)]
    return pa.table(
        {
            "image_id": ids,
            "dataset": ["everyday" if i % 2 else "specialist" for i in range(n)],
            "path": [f"/nowhere/{i}.png" for i in ids],
            "sha256": [(sha or {}).get(i, i[-1] * 64) for i in ids],
            "background": pa.array([(background or {}).get(i) for i in ids], pa.string()),
        }
    )


def _plan(mask_box=(0.25, 0.25, 0.75, 0.75), classnames=("dog", "cat")) -> Plan:
    """Model `a` is given the class names (closed-world), `b` is not."""
    return Plan(
        {"a": PROMPTS, "b": PROMPTS},
        masks=(MaskSpec("m1", mask_box, 0.0),),
        classnames={"everyday": classnames},
        closed={"a": True},
    )


def _run(folder: Path, study, plan: Plan, images: pa.Table) -> pa.Table:
    run = StudyRun(RunFolder(folder), Reporter(quiet=True), LazyRay(study.runtime))
    with files_held():
        run.run_stage(given("images", images))
        run.run_stage(stage(study, plan))
    return run.folder.read("responses")


@pytest.fixture
def hashed(monkeypatch):
    """How many jobs' keys were made (hashed), since it was last cleared."""
    made = []
    keys = plan_module.KeyTemplate.keys

    def counted(self, *args, **kwargs):
        out = keys(self, *args, **kwargs)
        made.append(len(out))
        return out

    monkeypatch.setattr(plan_module.KeyTemplate, "keys", counted)
    return made


def _same_as_fresh(tmp_path: Path, table: pa.Table, study, plan: Plan, images: pa.Table) -> None:
    fresh = _run(tmp_path / f"fresh-{len(list(tmp_path.glob('fresh-*')))}", study, plan, images)
    assert table.drop_columns(["latency_s"]).equals(fresh.drop_columns(["latency_s"]))


def test_only_the_jobs_of_what_changed_get_keys_made_and_the_table_is_a_fresh_runs(tmp_path, hashed):
    study, run = _study(tmp_path), tmp_path / "run"
    jobs_per_image = 2 * len(PROMPTS) * len(VARIANTS)  # two models
    _answers(tmp_path, 6)
    _run(run, study, _plan(), _images(4))
    assert sum(hashed) == 4 * jobs_per_image and (run / KEYED_FILE).is_file()

    # Two images added; i1's file changed, i2's answer for m1 (model b), i3 now has a background.
    hashed.clear()
    _answers(tmp_path, 6, changed={("b", "i2", "m1"): "b says something else"})
    images = _images(6, sha={"i1": "f" * 64}, background={"i3": "#808080"})
    table = _run(run, study, _plan(), images)
    assert sum(hashed) == 2 * jobs_per_image + jobs_per_image + len(PROMPTS) + jobs_per_image  # i4, i5; i1; i2; i3
    assert pc.equal(table.column("status"), "ok").to_pylist() == [True] * 6 * jobs_per_image
    assert "b says something else" in table.column("text").to_pylist()
    _same_as_fresh(tmp_path, table, study, _plan(), images)


@pytest.mark.parametrize(
    "changed",
    [
        {"mask_box": (0.0, 0.0, 0.5, 0.5)},  # a mask: every job of the models with masks
        {"classnames": ("dog", "cat", "bird")},  # the class names given to model `a`
    ],
)
def test_a_model_whose_settings_changed_gets_every_key_made(tmp_path, hashed, changed, monkeypatch):
    """The other model's keys are kept, and its rows (two images a bucket here) written as they
    were, without being chosen again; the table is still a fresh run's, row for row."""
    monkeypatch.setattr(rows_module, "COLLECT_IMAGES", 2)
    chosen = []
    best_rows = rows_module._best_rows
    monkeypatch.setattr(rows_module, "_best_rows", lambda rows, jobs: chosen.append(1) or best_rows(rows, jobs))
    study, run = _study(tmp_path), tmp_path / "run"
    _answers(tmp_path, 3)
    _run(run, study, _plan(), _images(3))
    hashed.clear()
    chosen.clear()
    table = _run(run, study, _plan(**changed), _images(3))
    per_model = 3 * len(PROMPTS) * len(VARIANTS)
    both = "mask_box" in changed
    assert sum(hashed) == (2 * per_model if both else per_model)
    assert len(chosen) == (4 if both else 2)  # two buckets (of images i0 and i1, and i2) a model
    _same_as_fresh(tmp_path, table, study, _plan(**changed), _images(3))


def test_a_record_of_another_table_is_not_used(tmp_path, hashed):
    """A record that does not describe the table there (here: the table written again since by
    hand) keeps no key."""
    study, run = _study(tmp_path), tmp_path / "run"
    _answers(tmp_path, 3)
    first = _run(run, study, _plan(), _images(3))
    kept = (run / KEYED_FILE).read_bytes()
    _run(run, study, _plan(mask_box=(0.0, 0.0, 0.5, 0.5)), _images(3))
    (run / KEYED_FILE).write_bytes(kept)  # the first run's record, beside the second run's table
    hashed.clear()
    table = _run(run, study, _plan(), _images(3))
    assert sum(hashed) == first.num_rows
    assert table.drop_columns(["latency_s"]).equals(first.drop_columns(["latency_s"]))


def test_an_image_taken_out_of_the_study_takes_its_rows_with_it(tmp_path, hashed, monkeypatch):
    """Every job left keeps its key, but the bucket that held the image's rows is chosen again: the
    table is a fresh run's of the images left."""
    monkeypatch.setattr(rows_module, "COLLECT_IMAGES", 2)
    study, run = _study(tmp_path), tmp_path / "run"
    _answers(tmp_path, 3)
    _run(run, study, _plan(), _images(3))
    hashed.clear()
    left = _images(3).filter(pc.not_equal(_images(3).column("image_id"), "i1"))
    table = _run(run, study, _plan(), left)
    assert sum(hashed) == 0 and "i1" not in table.column("image_id").to_pylist()
    _same_as_fresh(tmp_path, table, study, _plan(), left)


def test_a_part_a_killed_run_left_beside_kept_rows_is_chosen_against(tmp_path, hashed, monkeypatch):
    """A row a killed run saved (here: for another mask) of a job whose key is kept is not written
    beside the table's: the table is a fresh run's."""
    from vlm_decade.stages.describe.rows import RESPONSES_SCHEMA

    monkeypatch.setattr(rows_module, "COLLECT_IMAGES", 2)
    study, run = _study(tmp_path), tmp_path / "run"
    _answers(tmp_path, 4)
    first = _run(run, study, _plan(), _images(3))
    stale = first.filter(pc.equal(first.column("image_id"), "i0")).slice(0, 1)
    stale = stale.set_column(stale.schema.get_field_index("cache_key"), "cache_key", pa.array(["0" * 64]))
    with RunFolder(run).parts("responses", RESPONSES_SCHEMA, 1, 0.0) as parts:
        parts.add(stale.cast(RESPONSES_SCHEMA))
    hashed.clear()
    table = _run(run, study, _plan(), _images(4))  # an image added: the stage runs
    assert sum(hashed) == 2 * len(PROMPTS) * len(VARIANTS)  # the new image's jobs alone
    _same_as_fresh(tmp_path, table, study, _plan(), _images(4))
