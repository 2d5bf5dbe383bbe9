"""The study file: paths resolve against its folder, and every problem names the field."""

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

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
    bad = MINIMAL.replace("era: pre-mllm", "era: ancient").replace(
        "name: s\n", "name: s\nstatistics: {n_resamples: 5}\ntypo_key: 1\n"
    )
    bad += "  - {name: m, backend: imported, model_id: y, era: mllm}\n"
    (tmp_path / "study.yaml").write_text(bad)
    with pytest.raises(InputError) as info:
        load_study(tmp_path / "study.yaml")
    fields = {p.field for p in info.value.problems}
    assert {"models[0].era", "statistics.n_resamples", "typo_key"} <= fields
    assert all(p.file.endswith("study.yaml") for p in info.value.problems)


def test_repeated_model_names_and_reserved_prefix(tmp_path):
    text = (
        MINIMAL
        + "  - {name: m, backend: imported, model_id: y, era: mllm}\n  - {name: 'human:top', backend: imported, model_id: y, era: mllm}\n"
    )
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
    b = load_text(
        tmp_path, OPEN_WORLD + "judge: {path: weights/judge}\nscoring: {encoder: {name: SBERT, path: weights/minilm}}\n"
    )
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


TAXONOMY = (
    MINIMAL
    + "encoders: [{name: SBERT-SI}, {name: GPT-SI, backend: openai-embedding, model_id: text-embedding-3-large}]\n"
)


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

    study = study_from_dict(
        {
            "name": "s",
            "data": {"images": "i.csv", "image_dir": "x", "descriptions": "d.csv"},
            "models": [{"name": "m", "backend": "imported", "model_id": "x", "era": "mllm"}],
            "taxonomy": {"probes": {"presence": "Do you see {article} {object}?"}},
        }
    )
    templates = study.taxonomy.probes.templates()
    assert templates == ProbeTemplates(presence="Do you see {article} {object}?")
    assert templates.detection == ProbeTemplates().detection


def test_taxonomy_weights_resolve_against_the_study_file(tmp_path):
    text = MINIMAL + (
        "taxonomy:\n"
        "  detector: {backend: hf-detector, model_id: d, path: weights/detr, options: {score_threshold: 0.3}}\n"
        f"  matcher: {{name: objects, path: {tmp_path / 'abs' / 'minilm'}}}\n"
    )
    taxonomy = load_text(tmp_path, text).taxonomy
    assert taxonomy.detector.path == tmp_path / "weights" / "detr"
    assert taxonomy.matcher.path == tmp_path / "abs" / "minilm"  # absolute: as given
    model = taxonomy.detector.as_model()
    assert (model.name, model.backend, model.model_id, model.path, model.options) == (
        "detector",
        "hf-detector",
        "d",
        tmp_path / "weights" / "detr",
        {"score_threshold": 0.3},
    )


def test_cosine_metric_encoder_path_resolves_against_the_study_file(tmp_path):
    study = load_text(tmp_path, MINIMAL + "metrics: [{name: C, kind: cosine, encoder: {name: E, path: weights/enc}}]\n")
    assert study.metrics[0].encoder.path == tmp_path / "weights" / "enc"


# -- fields of the wrong type, ranges, repeated keys, blank names (each named, never a crash) ----------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda t: t.split("models:")[0] + "models: 5\n", "models"),
        (lambda t: t + "metrics: 7\n", "metrics"),
        (lambda t: t + "encoders: {name: x}\n", "encoders"),
        (lambda t: t.replace("images: images.csv", "images: 5"), "data.images"),
        (lambda t: t.replace("image_dir: imgs", "image_dir: [a, b]"), "data.image_dir"),
        (lambda t: t + "output: 5\n", "output"),
        (lambda t: t + "providers: {cache_dir: 5}\n", "providers.cache_dir"),
        (lambda t: t.replace("data: {images: images.csv, image_dir: imgs, descriptions: d.csv}", "data: 3"), "data"),
        (lambda t: t + "taxonomy: 5\n", "taxonomy"),
        (lambda t: t + "statistics: {seed: -1}\n", "statistics.seed"),
        (lambda t: t + "statistics: {seed: 1208925819614629174706176}\n", "statistics.seed"),  # 2**80
        (lambda t: t + "statistics: {n_resamples: 1.0e+10}\n", "statistics.n_resamples"),
        (lambda t: t + "statistics: {n_resamples: 1e10}\n", "statistics.n_resamples"),  # YAML reads this as text
        (lambda t: t.replace("name: m,", "name: '   ',"), "models[0].name"),
        (lambda t: t.replace("name: s\n", 'name: "\\t"\n'), "name"),
        (lambda t: t.replace("model_id: x,", "model_id: ' ',"), "models[0].model_id"),
    ],
)
def test_a_field_of_the_wrong_type_or_range_is_named(tmp_path, change, field):
    problems = problems_of(tmp_path, change(MINIMAL))
    assert [p.field for p in problems] == [field], problems
    assert problems[0].file.endswith("study.yaml")


def test_a_bad_type_says_what_it_got(tmp_path):
    (problem,) = problems_of(tmp_path, MINIMAL.split("models:")[0] + "models: 5\n")
    assert "must be a list" in problem.message and "got 5" in problem.message


def test_an_imported_file_option_that_is_no_path_is_a_problem_not_a_crash():
    from vlm_decade.models.backends import entry_problems

    (problem,) = entry_problems("imported", {"file": 5}, ("models", 0))
    assert problem.file == "study file" and problem.field == "models[0].options.file" and "got 5" in problem.message


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        (MINIMAL + "name: t\n", "name", (2, 6)),
        (MINIMAL + "statistics:\n  seed: 1\n  seed: 2\n", "seed", (7, 8)),
        (MINIMAL.replace("era: pre-mllm,", "era: pre-mllm, era: mllm,"), "era", (5, 5)),
    ],
)
def test_a_key_given_twice_is_refused_not_last_wins(tmp_path, text, key, lines):
    (problem,) = problems_of(tmp_path, text)
    assert f"key '{key}' appears twice (lines {lines[0]} and {lines[1]})" in problem.message


def test_yaml_merge_keys_may_still_override(tmp_path):
    text = MINIMAL + "defaults: &stats {seed: 1, n_resamples: 200}\n"
    text = text.replace("name: s\n", "")  # keep `name` once, below
    text = "name: s\n" + text.replace("defaults: &stats", "x-defaults: &stats")
    problems = problems_of(tmp_path, text + "statistics: {<<: *stats, seed: 3}\n")
    assert [p.field for p in problems] == ["x-defaults"]  # the anchor's key is unknown; the merge itself is fine


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs here")
def test_a_study_file_that_is_a_fifo_or_a_folder_is_refused(tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe.yaml")
    with pytest.raises(InputError, match="FIFO"):
        load_study(tmp_path / "pipe.yaml")  # reading it would block
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(InputError, match="folder"):
        load_study(tmp_path / "folder.yaml")


def test_problems_about_the_study_file_in_general_are_located_at_its_path(tmp_path):
    from vlm_decade.core.errors import STUDY_FILE, Problem

    located = InputError([Problem(STUDY_FILE, "x", field="models.0.backend"), Problem("data.csv", "y", row=2)]).located(
        tmp_path / "s.yaml"
    )
    assert [(p.file, p.field) for p in located.problems] == [
        (str(tmp_path / "s.yaml"), "models.0.backend"),
        ("data.csv", None),
    ]


# Any YAML value in any field: a named problem or a study, never a crash (hypothesis).
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

YAML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
FIELD_PATHS = [
    ("name",),
    ("models",),
    ("models", 0),
    ("models", 0, "name"),
    ("models", 0, "options"),
    ("models", 0, "options", "file"),
    ("models", 0, "path"),
    ("metrics",),
    ("encoders",),
    ("data",),
    ("data", "images"),
    ("data", "image_dir"),
    ("output",),
    ("statistics",),
    ("statistics", "seed"),
    ("statistics", "n_resamples"),
    ("masks",),
    ("masks", "windows"),
    ("taxonomy",),
    ("providers",),
    ("providers", "cache_dir"),
    ("runtime", "num_cpus"),
    ("prompt",),
    ("study",),
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FIELD_PATHS), YAML_VALUES)
def test_any_value_in_any_field_is_a_named_problem_or_a_study(path, value):
    import tempfile

    import yaml

    raw = yaml.safe_load(MINIMAL)
    raw["statistics"], raw["masks"], raw["providers"], raw["runtime"] = {}, {}, {}, {}
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "study.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
        try:
            load_study(Path(folder) / "study.yaml")
        except InputError as exc:
            # Each names the study file, but a run folder that cannot be written, which names itself.
            assert exc.problems and all(p.file.endswith("study.yaml") or p.field == "output" for p in exc.problems)


def test_every_path_in_the_study_file_is_relative_to_its_folder_output_too(tmp_path, monkeypatch):
    folder, elsewhere = tmp_path / "studies" / "a", tmp_path / "elsewhere"
    folder.mkdir(parents=True), elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    text = MINIMAL + (
        "  - {name: c, backend: cased, model_id: clip, era: mllm, path: w/clip, options: {database: db.parquet}}\n"
        "output: runs/x\nproviders: {cache_dir: cache}\n"
        "taxonomy: {locator: {path: w/owl}, detector: {path: w/ssd}, matcher: {name: mt, path: w/mini}}\n"
    )
    (folder / "study.yaml").write_text(text)
    study = load_study(folder / "study.yaml")
    assert study.output == folder / "runs" / "x"
    assert study.models[1].path == folder / "w" / "clip" and study.models[1].options["database"] == str(
        folder / "db.parquet"
    )
    assert study.providers.cache_dir == folder / "cache"
    assert (study.taxonomy.locator.path, study.taxonomy.detector.path, study.taxonomy.matcher.path) == (
        folder / "w" / "owl",
        folder / "w" / "ssd",
        folder / "w" / "mini",
    )
    # A path on the command line is the command line's: relative to the current folder.
    assert load_study(folder / "study.yaml", output="runs/y").output == elsewhere / "runs" / "y"


@pytest.mark.parametrize("output", ["a-file", "a-file/run", "s3:/bucket/run", "ftp://host/run", "s3://"])
def test_run_out_refuses_exactly_what_the_study_files_output_is_refused_for(tmp_path, monkeypatch, output):
    monkeypatch.chdir(tmp_path)  # the study file's folder and the current folder are one, so both read `output` alike
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "study.yaml").write_text(MINIMAL + f"output: {output}\n")
    with pytest.raises(InputError) as in_file:
        load_study(tmp_path / "study.yaml")
    (tmp_path / "study.yaml").write_text(MINIMAL)
    with pytest.raises(InputError) as on_command_line:
        load_study(tmp_path / "study.yaml", output=output)
    (said,), (given,) = in_file.value.problems, on_command_line.value.problems
    assert said.message == given.message and (said.field, given.field) == ("output", "--out")


def test_validate_checks_the_run_folder_as_run_does(tmp_path):
    from typer.testing import CliRunner

    from vlm_decade.cli import app

    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "study.yaml").write_text(MINIMAL + "output: a-file/run\n")
    for command in (["validate", str(tmp_path / "study.yaml")], ["run", str(tmp_path / "study.yaml")]):
        done = CliRunner().invoke(app, command)
        assert done.exit_code == 2 and "is a file, not a folder: the run folder cannot be made under it" in " ".join(
            done.output.split()
        )


# A valid value for each field of a model entry, to set one at a time.
MODEL_FIELDS = {
    "era": "mllm",
    "prompt": "Say it.",
    "variants": "all",
    "batch_size": 2,
    "path": "w",
    "options": {},
    "mode": "sync",
    "endpoint": "vllm",
}


@pytest.mark.parametrize("kind", ["decade", "openworld"])
def test_the_schema_lists_exactly_what_each_study_accepts(tmp_path, kind):
    from vlm_decade.core.config import ModelConfig
    from vlm_decade.models.backends import BACKENDS
    from vlm_decade.studies import backend_problems, schema_json, schema_markdown

    base = yaml.safe_load(MINIMAL if kind == "decade" else OPEN_WORLD)
    base["models"] = [
        {"name": "m", "backend": "imported", "model_id": "x", **({"era": "pre-mllm"} if kind == "decade" else {})}
    ]
    listed = {line.split("`")[1] for line in schema_markdown(kind).splitlines()[2:]}
    assert set(MODEL_FIELDS) | {"name", "backend", "model_id"} == set(ModelConfig.model_fields)
    for field, value in MODEL_FIELDS.items():
        raw = yaml.safe_load(yaml.safe_dump(base))
        raw["models"][0][field] = value
        try:
            study_from_dict(raw)
            accepted = True
        except ValidationError:
            accepted = False
        assert accepted == (f"models[].{field}" in listed), f"{kind}: models[].{field}"
    properties = schema_json(kind)["$defs"]["ModelConfig"]["properties"]
    assert {f"models[].{p}" for p in properties} == {k for k in listed if k.startswith("models[].")}
    # Every backend the schema names is taken, and only those.
    assert properties["backend"]["enum"] == BACKENDS.names()
    row = next(line for line in schema_markdown(kind).splitlines() if line.startswith("| `models[].backend`"))
    assert row.split(" | ")[1] == "one of " + ", ".join(BACKENDS.names())
    for backend in [*BACKENDS.names(), "hf-judge"]:
        raw = yaml.safe_load(yaml.safe_dump(base))
        raw["models"][0]["backend"] = backend
        unknown = [p for p in backend_problems(study_from_dict(raw)) if p.field == "models[0].backend"]
        assert bool(unknown) == (backend not in properties["backend"]["enum"])


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    from typer.testing import CliRunner

    from vlm_decade.cli import app

    done = CliRunner().invoke(app, ["--version"])
    assert done.exit_code == 0 and done.output == f"vlm-decade {version('vlm-decade')}\n"


@pytest.mark.parametrize("kind", ["decade", "openworld"])
def test_a_study_reads_back_from_what_its_manifest_records(kind):
    """A run folder's manifest records every field, defaults included (Study B's models' `variants:
    full`): reading it back must give the same study, so report, view and status open the run."""
    raw = yaml.safe_load(MINIMAL if kind == "decade" else OPEN_WORLD)
    study = study_from_dict(raw)
    recorded = json.loads(json.dumps(study.model_dump(mode="json")))
    assert recorded["models"][0]["variants"] == "full"
    assert study_from_dict(recorded) == study


def test_an_endpoint_refuses_the_batch_fields_a_cloud_provider_takes(tmp_path):
    providers = (
        "providers:\n"
        "  openai: {mode: batch, batch_poll_s: 5, batch_max_requests: 100}\n"
        "  endpoints:\n"
        "    vllm: {base_url: 'http://127.0.0.1:8000/v1', batch_poll_s: 5, max_concurency: 8}\n"
    )
    problems = {p.field: p.message for p in problems_of(tmp_path, MINIMAL + providers)}
    assert set(problems) == {"providers.endpoints.vllm.batch_poll_s", "providers.endpoints.vllm.max_concurency"}
    known = (
        "known: rpm, tpm, max_concurrency, adaptive, timeout_s, max_attempts, base_url, budget_usd, prices, "
        "api, key_env, free, revision"
    )
    assert problems["providers.endpoints.vllm.batch_poll_s"] == f"unknown field 'batch_poll_s'; {known}"
    assert problems["providers.endpoints.vllm.max_concurency"] == (
        f"unknown field 'max_concurency' (did you mean 'max_concurrency'?); {known}"
    )
    # The cloud provider keeps its batch fields, and an endpoint reads as sync.
    study = load_text(tmp_path, MINIMAL + providers.replace(", batch_poll_s: 5, max_concurency: 8", ""))
    assert (study.providers.openai.mode, study.providers.openai.batch_poll_s) == ("batch", 5.0)
    assert study.providers.openai.batch_max_requests == 100 and study.providers.of("vllm").mode == "sync"
