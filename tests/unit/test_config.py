"""The study file: paths resolve against its folder, and every problem names the field."""

import pytest

from vlm_decade.config import load_study
from vlm_decade.errors import InputError

MINIMAL = """
name: s
data: {images: images.csv, image_dir: imgs, descriptions: d.csv}
models:
  - {name: m, backend: imported, model_id: x, era: pre-mllm, options: {file: caps.csv}}
"""


def test_paths_resolve_against_the_study_file(tmp_path):
    (tmp_path / "study.yaml").write_text(MINIMAL)
    study = load_study(tmp_path / "study.yaml", output=tmp_path / "out")
    assert study.data.images == tmp_path / "images.csv"
    assert study.data.image_dir == tmp_path / "imgs"
    assert study.models[0].options["file"] == str(tmp_path / "caps.csv")
    assert study.output == tmp_path / "out"
    assert study.statistics.n_resamples == 10_000


def test_hash_ignores_output_and_runtime_but_not_models(tmp_path):
    (tmp_path / "study.yaml").write_text(MINIMAL)
    a = load_study(tmp_path / "study.yaml", output=tmp_path / "a")
    b = load_study(tmp_path / "study.yaml", output=tmp_path / "b")
    assert a.hash() == b.hash()
    (tmp_path / "study.yaml").write_text(MINIMAL.replace("era: pre-mllm", "era: mllm"))
    assert load_study(tmp_path / "study.yaml").hash() != a.hash()


def test_every_config_problem_is_reported_with_its_field(tmp_path):
    bad = MINIMAL.replace("era: pre-mllm", "era: ancient").replace("name: s\n", "name: s\nstatistics: {n_resamples: 5}\ntypo_key: 1\n")
    bad += "  - {name: m, backend: imported, model_id: y, era: mllm}\n"
    (tmp_path / "study.yaml").write_text(bad)
    with pytest.raises(InputError) as info:
        load_study(tmp_path / "study.yaml")
    fields = {p.field for p in info.value.problems}
    assert {"models.0.era", "statistics.n_resamples", "typo_key"} <= fields
    assert all(p.file.endswith("study.yaml") for p in info.value.problems)


def test_repeated_model_names_and_reserved_prefix(tmp_path):
    text = MINIMAL + "  - {name: m, backend: imported, model_id: y, era: mllm}\n  - {name: 'human:top', backend: imported, model_id: y, era: mllm}\n"
    (tmp_path / "study.yaml").write_text(text)
    with pytest.raises(InputError) as info:
        load_study(tmp_path / "study.yaml")
    messages = " ".join(p.message for p in info.value.problems)
    assert "reserved" in messages


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_study(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_study(tmp_path / "bad.yaml")
