"""Every backend's options are checked when a study is read, before any work, by one mechanism:
an unknown name is refused with the closest known one, a value out of its declared range with the
range, each naming its field; the whole registry is walked, so a backend added later is covered."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from vlm_decade.cli import app
from vlm_decade.core.config import range_text
from vlm_decade.core.errors import InputError
from vlm_decade.models.backends import BACKENDS, backend_class
from vlm_decade.models.backends.hf_locator import HFLocator
from vlm_decade.models.encoders import ENCODERS
from vlm_decade.studies import load_study
from vlm_decade.studies.openworld.config import JUDGE_OPTIONS

STUDY_A = {
    "name": "s",
    "data": {"images": "images.csv", "image_dir": "imgs", "descriptions": "d.csv"},
    "models": [
        {"name": "first", "backend": "imported", "model_id": "x", "era": "pre-mllm", "options": {"file": "caps.csv"}}
    ],
}
STUDY_B = {
    "study": "openworld",
    "name": "s",
    "data": {"labels": "labels.csv", "image_dir": "imgs", "classnames": "classes.csv"},
    "models": [{"name": "first", "backend": "imported", "model_id": "x", "options": {"file": "caps.csv"}}],
}


def with_options(options: dict) -> list[tuple[str, dict, str, type]]:
    """(case, study, the options' field path, the declared options) for every entry of either study
    that runs a backend, each given `options`."""
    cases = []
    for name in BACKENDS.names():
        study = yaml.safe_load(yaml.safe_dump(STUDY_A))
        study["models"].append({"name": "m", "backend": name, "model_id": "x", "era": "mllm", "options": options})
        cases.append((f"models:{name}", study, "models[1].options", backend_class(name).Options))
    for name in ("ssd-template", "hf-detector"):
        study = {**STUDY_A, "taxonomy": {"detector": {"backend": name, "options": options}}}
        cases.append((f"detector:{name}", study, "taxonomy.detector.options", backend_class(name).Options))
    cases.append(
        (
            "locator",
            {**STUDY_A, "taxonomy": {"locator": {"options": options}}},
            "taxonomy.locator.options",
            HFLocator.Options,
        )
    )
    for name in ("openai", "gemini"):
        verifier = {"kind": "model", "backend": name, "model_id": "v", "options": options}
        cases.append(
            (
                f"verifier:{name}",
                {**STUDY_A, "taxonomy": {"verifier": verifier}},
                "taxonomy.verifier.options",
                backend_class(name).Options,
            )
        )
    for name, declared in JUDGE_OPTIONS.items():
        cases.append(
            (
                f"judge:{name}",
                {**STUDY_B, "judge": {"backend": name, "model_id": "j", "options": options}},
                "judge.options",
                declared,
            )
        )
    return cases


def problems(tmp_path, study: dict) -> list:
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    with pytest.raises(InputError) as info:
        load_study(tmp_path / "study.yaml", output=tmp_path / "run")
    return info.value.problems


def out_of_range(field) -> object | None:
    """A value just outside a numeric option's declared bounds, or None for an option without."""
    for bound in field.metadata:
        for attr, step in (("ge", -1), ("gt", -1), ("le", 1), ("lt", 1)):
            if hasattr(bound, attr):
                value = getattr(bound, attr) + step
                return int(value) if field.annotation in (int, "int") else float(value)
    return None


CASES = with_options({"zz_not_an_option": 1})


@pytest.mark.parametrize("case, study, where, declared", CASES, ids=[c[0] for c in CASES])
def test_an_unknown_option_is_refused_naming_its_field(tmp_path, case, study, where, declared):
    (problem,) = problems(tmp_path, study)
    assert problem.field == f"{where}.zz_not_an_option" and problem.file == str(tmp_path / "study.yaml")
    assert "unknown" in problem.message and "zz_not_an_option" in problem.message


def numeric_cases():
    for case, _, where, declared in CASES:
        for name, field in declared.model_fields.items():
            value = out_of_range(field)
            if value is not None:
                (study,) = [s for c, s, _, _ in with_options({name: value}) if c == case]
                yield pytest.param(study, f"{where}.{name}", value, range_text(field), id=f"{case}:{name}")


NUMERIC = list(numeric_cases())


def test_the_registry_walk_covers_every_backend_and_its_numeric_options():
    covered = {c[0].split(":", 1)[1] for c in CASES if c[0].startswith("models:")}
    assert covered == set(BACKENDS.names()) and "cased" in covered
    ids = {p.id for p in NUMERIC}
    assert {
        "models:ssd-label:score_threshold",
        "models:cased:alpha",
        "models:cased:k",
        "models:hf-vlm:max_new_tokens",
        "models:openai:temperature",
        "judge:hf-judge:max_new_tokens",
        "detector:hf-detector:score_threshold",
    } <= ids


@pytest.mark.parametrize("study, field, value, allowed", NUMERIC)
def test_a_value_out_of_range_is_refused_with_the_range(tmp_path, study, field, value, allowed):
    (problem,) = problems(tmp_path, study)
    assert problem.field == field and problem.message == f"must be {allowed}, got {value!r}"


@pytest.mark.parametrize(
    "backend, options, field, said",
    [
        ("ssd-label", {"score_threshold": 5}, "score_threshold", "must be in 0..1, got 5"),
        (
            "ssd-label",
            {"threshold": 0.3},
            "threshold",
            "unknown ssd-label option 'threshold' (did you mean 'score_threshold'?); known: score_threshold",
        ),
        ("imported", {"fiel": "x"}, "fiel", "unknown imported option 'fiel' (did you mean 'file'?)"),
        ("cased", {"k": 2.5}, "k", "Input should be a valid integer (got 2.5)"),
        (
            "litert-classifier",
            {"labels": "imagenet"},
            "labels",
            "Input should be 'wordnet' or 'clip-benchmark' (got 'imagenet')",
        ),
        ("openai", {"detial": "low"}, "detial", "unknown openai option 'detial' (did you mean 'detail'?)"),
    ],
)
def test_the_mistakes_a_new_user_makes_are_named(tmp_path, backend, options, field, said):
    study = yaml.safe_load(yaml.safe_dump(STUDY_A))
    study["models"].append({"name": "m", "backend": backend, "model_id": "x", "era": "mllm", "options": options})
    (problem,) = problems(tmp_path, study)
    assert problem.field == f"models[1].options.{field}" and said in problem.message


@pytest.mark.parametrize("name", ENCODERS.names())
def test_encoders_take_no_options_and_say_so(tmp_path, name):
    (problem,) = problems(tmp_path, {**STUDY_A, "encoders": [{"name": "e", "backend": name, "options": {"x": 1}}]})
    assert problem.field == "encoders[0].options" and problem.message.startswith("unknown field 'options'")


def test_unknown_backends_fields_and_keys_get_a_did_you_mean(tmp_path):
    study = yaml.safe_load(yaml.safe_dump(STUDY_A))
    study["models"][0]["backend"] = "ssd-lable"
    study["encoders"] = [{"name": "e", "backend": "sentence-transformer"}]
    said = {p.field: p.message for p in problems(tmp_path, study)}
    assert said["models[0].backend"].startswith(
        "unknown backend 'ssd-lable' (did you mean 'ssd-label'?); known: cased,"
    )
    assert said["encoders[0].backend"].startswith(
        "unknown encoder backend 'sentence-transformer' (did you mean 'sentence-transformers'?)"
    )
    study = yaml.safe_load(yaml.safe_dump(STUDY_A))
    study["models"][0]["modle_id"] = study["models"][0].pop("model_id")
    study["statistic"] = {"n_resamples": 200}
    said = {p.field: p.message for p in problems(tmp_path, study)}
    assert said["statistic"].startswith(
        "unknown field 'statistic' (did you mean 'statistics'?); known: name, demo, models,"
    )
    assert said["models[0].modle_id"].startswith("unknown field 'modle_id' (did you mean 'model_id'?)")
    study = {**STUDY_B, "judge": {"backend": "hf-judge", "model_id": "j", "batchsize": 2}}
    (problem,) = problems(tmp_path, study)
    assert problem.field == "judge.batchsize" and "(did you mean 'batch_size'?)" in problem.message


def test_validate_refuses_bad_options_before_reading_any_data(tmp_path):
    study = yaml.safe_load(yaml.safe_dump(STUDY_A))
    study["models"].append(
        {"name": "m", "backend": "ssd-label", "model_id": "x", "era": "mllm", "options": {"score_threshold": 5}}
    )
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    done = CliRunner().invoke(app, ["validate", str(tmp_path / "study.yaml")])
    assert done.exit_code == 2 and "field 'models[1].options.score_threshold': must be in 0..1, got 5" in " ".join(
        done.output.split()
    )
