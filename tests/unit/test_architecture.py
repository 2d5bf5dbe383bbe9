"""The house keeps its shape: the import layers hold, each study's pipeline offers the functions
the command line calls, the docs list every config field the code has, and a section's fingerprint
leaves out exactly its operational fields."""

import importlib
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import vlm_decade.studies
from vlm_decade.core.config import EncoderConfig, ModelConfig
from vlm_decade.studies import STUDIES, Pipeline, schema_markdown
from vlm_decade.studies.decade.config import TaxonomyConfig

ROOT = Path(__file__).resolve().parents[2]


def test_import_layers_hold():
    linter = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert linter, "import-linter is a test requirement: pip install -e '.[test]'"
    done = subprocess.run([linter], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "5 kept, 0 broken" in done.stdout


@pytest.mark.parametrize("kind", sorted(STUDIES))
def test_each_pipeline_offers_the_pipeline_protocol_and_the_docs_name_only_its_functions(kind):
    module = importlib.import_module(f"vlm_decade.studies.{kind}.pipeline")
    members = {name: f for name, f in vars(Pipeline).items() if inspect.isfunction(f) and not name.startswith("_")}
    assert sorted(members) == ["check", "estimate", "export", "redraw_report", "run", "summary"]
    for name, protocol in members.items():
        function = getattr(module, name, None)
        assert inspect.isfunction(function) and function.__module__ == module.__name__, f"{kind} pipeline lacks {name}"
        assert list(inspect.signature(function).parameters) == list(inspect.signature(protocol).parameters)[1:], name
    # A name the docs give that the module has is one of the protocol's (`describe` once named the stage module).
    for doc in (vlm_decade.studies.__doc__, module.__doc__):
        named = set(re.findall(r"`(\w+)`", doc))
        assert set(members) <= named and {n for n in named if hasattr(module, n)} <= set(members)


@pytest.mark.parametrize("kind, doc", [("decade", "docs/study-file.md"), ("openworld", "docs/openworld.md")])
def test_the_docs_show_every_field_as_the_code_defines_it(kind, doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    found = re.search(rf"<!-- fields:{kind} -->\n(.*?)<!-- /fields -->", text, re.S)
    assert found, f"{doc} lacks its field table"
    assert found.group(1) == schema_markdown(kind), f"{doc} is out of date: paste `vlm-decade schema {kind}`"


def test_every_field_is_described():
    for kind in STUDIES:
        table = schema_markdown(kind).splitlines()[2:]
        blank = [line for line in table if line.rstrip().endswith("|  |")]
        assert not blank, f"{kind}: fields without a description: {blank}"


def test_fingerprint_leaves_out_operational_fields_at_every_depth():
    a = TaxonomyConfig(matcher=EncoderConfig(name="m", batch_size=3), detector={"batch_size": 2})
    b = TaxonomyConfig(matcher=EncoderConfig(name="m", batch_size=99), detector={"batch_size": 7})
    assert a.fingerprint() == b.fingerprint() and a != b
    assert "batch_size" not in a.fingerprint()["matcher"] and "batch_size" not in a.fingerprint()["detector"]
    c = TaxonomyConfig(matcher=EncoderConfig(name="m", model_id="other"))
    assert c.fingerprint() != a.fingerprint()
    model = ModelConfig(name="x", backend="imported", model_id="y", batch_size=5)
    assert model.fingerprint() == {
        k: v for k, v in model.model_dump(mode="json").items() if k not in ("batch_size", "mode")
    }
    # How an API model's answers are bought (sync or batch) never changes what they are.
    assert (
        ModelConfig(name="x", backend="openai", model_id="y", mode="batch").fingerprint()
        == ModelConfig(name="x", backend="openai", model_id="y").fingerprint()
    )


def test_the_docs_show_every_backends_options_as_declared():
    from vlm_decade.models.backends import BACKENDS
    from vlm_decade.studies import declared_options, options_reference

    text = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- options -->\n(.*?)<!-- /options -->", text, re.S)
    assert found and found.group(1) == options_reference(), "docs/models.md is out of date: paste options_reference()"
    assert set(BACKENDS.names()) <= set(declared_options())
