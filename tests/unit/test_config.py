"""The study file: paths resolve against its folder, and every problem names the field."""

import pytest

from vlm_decade.core.errors import InputError
from vlm_decade.studies import load_study, study_from_dict
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig

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


# -- Study B, the dispatch on `study:`, and Study A's taxonomy section ---------------------------------

OPEN_WORLD = """
name: b
study: openworld
data: {labels: labels.csv, image_dir: imgs, classnames: classes.csv}
models:
  - {name: vlm, backend: hf-vlm, model_id: x}
  - {name: clip, backend: hf-zero-shot, model_id: y}
"""


def load_text(tmp_path, text):
    (tmp_path / "study.yaml").write_text(text)
    return load_study(tmp_path / "study.yaml")


def problems_of(tmp_path, text):
    with pytest.raises(InputError) as info:
        load_text(tmp_path, text)
    return info.value.problems


def test_study_kind_follows_the_study_field(tmp_path):
    b = load_text(tmp_path, OPEN_WORLD + "judge: {path: weights/judge}\nscoring: {encoder: {name: SBERT, path: weights/minilm}}\n")
    assert isinstance(b, OpenWorldStudyConfig) and b.study == "openworld"
    assert b.data.labels == tmp_path / "labels.csv" and b.data.classnames == tmp_path / "classes.csv"
    assert b.judge.path == tmp_path / "weights" / "judge"
    assert b.scoring.encoder.path == tmp_path / "weights" / "minilm"
    assert [p.id for p in b.prompts] == ["default"]
    a = load_text(tmp_path, MINIMAL)
    assert isinstance(a, StudyConfig) and a.study == "decade"
    assert a.taxonomy is None


def test_unknown_study_kind_names_the_study_field(tmp_path):
    problems = problems_of(tmp_path, OPEN_WORLD.replace("study: openworld", "study: closedworld"))
    assert [p.field for p in problems] == ["study"]
    assert "openworld" in problems[0].message and problems[0].file.endswith("study.yaml")


def test_study_a_needs_every_models_era(tmp_path):
    text = MINIMAL + "  - {name: late, backend: imported, model_id: y}\n"
    (problem,) = problems_of(tmp_path, text)
    assert "era" in problem.message and "late" in problem.message


@pytest.mark.parametrize("extra", ["era: mllm", "prompt: Describe it.", "variants: all"])
def test_study_b_models_take_no_era_prompt_or_variants(tmp_path, extra):
    (problem,) = problems_of(tmp_path, OPEN_WORLD.replace("model_id: x}", f"model_id: x, {extra}}}"))
    assert "vlm" in problem.message and "Study B" in problem.message


def test_repeated_prompt_ids_are_rejected(tmp_path):
    prompts = "prompts:\n  - {id: p1, text: 'What is it?'}\n  - {id: p1, text: Name the object.}\n"
    (problem,) = problems_of(tmp_path, OPEN_WORLD + prompts)
    assert "prompt id" in problem.message and "p1" in problem.message


TAXONOMY = MINIMAL + "encoders: [{name: SBERT-SI}, {name: GPT-SI, backend: openai-embedding, model_id: text-embedding-3-large}]\n"


def test_taxonomy_similarity_defaults_to_the_first_encoder_and_must_name_one(tmp_path):
    assert load_text(tmp_path, TAXONOMY + "taxonomy: {}\n").taxonomy_metric == "SBERT-SI"
    assert load_text(tmp_path, TAXONOMY + "taxonomy: {similarity: GPT-SI}\n").taxonomy_metric == "GPT-SI"
    (problem,) = problems_of(tmp_path, TAXONOMY + "taxonomy: {similarity: Gemini-SI}\n")
    assert "Gemini-SI" in problem.message and "encoders" in problem.message


def test_confusable_threshold_may_not_exceed_the_match_threshold(tmp_path):
    study = load_text(tmp_path, MINIMAL + "taxonomy: {match_threshold: 0.6, confusable_threshold: 0.6}\n")
    assert (study.taxonomy.match_threshold, study.taxonomy.confusable_threshold) == (0.6, 0.6)
    (problem,) = problems_of(tmp_path, MINIMAL + "taxonomy: {match_threshold: 0.6, confusable_threshold: 0.61}\n")
    assert problem.field == "taxonomy" and "confusable_threshold" in problem.message


@pytest.mark.parametrize(
    ("template", "text", "says"),
    [
        ("recognition", "What is the {object} near the {anchor}?", "must not use ['object']"),
        ("presence", "Is there {article} {thing} here?", "unknown field(s) ['thing']"),
        ("detection", "Is there {article} {object} here?", "needs ['anchor']"),
    ],
)
def test_a_bad_probe_template_is_named(tmp_path, template, text, says):
    (problem,) = problems_of(tmp_path, MINIMAL + f'taxonomy: {{probes: {{{template}: "{text}"}}}}\n')
    assert problem.field == "taxonomy.probes"
    assert f"probe template '{template}'" in problem.message and says in problem.message


def test_probe_templates_fill_in_the_built_in_wording():
    from vlm_decade.studies.decade.taxonomy.probes import ProbeTemplates

    study = study_from_dict({
        "name": "s", "data": {"images": "i.csv", "image_dir": "x", "descriptions": "d.csv"},
        "models": [{"name": "m", "backend": "imported", "model_id": "x", "era": "mllm"}],
        "taxonomy": {"probes": {"presence": "Do you see {article} {object}?"}},
    })
    templates = study.taxonomy.probes.templates()
    assert templates == ProbeTemplates(presence="Do you see {article} {object}?")
    assert templates.detection == ProbeTemplates().detection


def test_taxonomy_weights_resolve_against_the_study_file(tmp_path):
    text = MINIMAL + (
        "taxonomy:\n"
        "  detector: {backend: hf-detector, model_id: d, path: weights/detr, options: {threshold: 0.3}}\n"
        f"  matcher: {{name: objects, path: {tmp_path / 'abs' / 'minilm'}}}\n"
    )
    taxonomy = load_text(tmp_path, text).taxonomy
    assert taxonomy.detector.path == tmp_path / "weights" / "detr"
    assert taxonomy.matcher.path == tmp_path / "abs" / "minilm"  # absolute: as given
    model = taxonomy.detector.as_model()
    assert (model.name, model.backend, model.model_id, model.path, model.options) == (
        "detector", "hf-detector", "d", tmp_path / "weights" / "detr", {"threshold": 0.3})


def test_cosine_metric_encoder_path_resolves_against_the_study_file(tmp_path):
    study = load_text(tmp_path, MINIMAL + "metrics: [{name: C, kind: cosine, encoder: {name: E, path: weights/enc}}]\n")
    assert study.metrics[0].encoder.path == tmp_path / "weights" / "enc"
