"""The house keeps its shape: the import layers hold, the docs list every config field the code
has, and a section's fingerprint leaves out exactly its operational fields."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vlm_decade.core.config import EncoderConfig, ModelConfig
from vlm_decade.studies import STUDIES, schema_markdown
from vlm_decade.studies.decade.config import TaxonomyConfig

ROOT = Path(__file__).resolve().parents[2]


def test_import_layers_hold():
    linter = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert linter, "import-linter is a test requirement: pip install -e '.[test]'"
    done = subprocess.run([linter], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "3 kept, 0 broken" in done.stdout


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
    assert model.fingerprint() == {k: v for k, v in model.model_dump(mode="json").items() if k not in ("batch_size", "mode")}
    # How an API model's answers are bought (sync or batch) never changes what they are.
    assert ModelConfig(name="x", backend="openai", model_id="y", mode="batch").fingerprint() == ModelConfig(name="x", backend="openai", model_id="y").fingerprint()


def test_the_docs_show_every_backends_options_as_declared():
    from vlm_decade.models.backends import BACKENDS
    from vlm_decade.studies import declared_options, options_reference

    text = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- options -->\n(.*?)<!-- /options -->", text, re.S)
    assert found and found.group(1) == options_reference(), "docs/models.md is out of date: paste options_reference()"
    assert set(BACKENDS.names()) <= set(declared_options())
