"""`validate` knows what a local model's workers would meet: it reads the config and builds the
processor on the driver, no weights, and refuses a missing package (with the pip line), an
architecture transformers does not know, a hub id it cannot reach, and remote code without an
explicit trust_remote_code and a pinned revision; each in seconds, naming the model and its field."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from typer.testing import CliRunner

from tests import hf_families, hf_tiny
from vlm_decade.cli import app
from vlm_decade.core.config import ModelConfig
from vlm_decade.core.errors import STUDY_FILE
from vlm_decade.models.backends import backend_class


def model(backend="hf-vlm", **fields) -> ModelConfig:
    return ModelConfig(**{"name": "m", "backend": backend, "model_id": "org/some-model", "era": "mllm", **fields})


def check(m: ModelConfig):
    started = time.monotonic()
    problems = backend_class(m.backend).check(m, set(), ["full"])
    assert time.monotonic() - started < 10
    return problems


def saved_config(folder, config: dict):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")  # no weights are read
    return folder


@pytest.fixture(scope="module")
def smolvlm(tmp_path_factory):
    return hf_families.save_smolvlm(tmp_path_factory.mktemp("smolvlm") / "m")


def test_a_model_that_loads_has_no_problem(tmp_path, smolvlm):
    assert check(model(path=smolvlm)) == []
    assert check(model("hf-captioner", path=hf_tiny.save_captioner(tmp_path / "c"))) == []
    assert check(model("hf-detector", path=hf_tiny.save_detector(tmp_path / "d"))) == []
    assert check(model("hf-zero-shot", path=hf_tiny.save_clip(tmp_path / "z"))) == []
    assert check(model("hf-zero-shot", path=hf_families.save_siglip2(tmp_path / "s2"))) == []


def test_a_missing_package_is_named_with_its_pip_line(monkeypatch, smolvlm):
    from transformers.models.smolvlm import processing_smolvlm

    monkeypatch.setattr(processing_smolvlm, "num2words", None)
    (problem,) = check(model(path=smolvlm))
    assert (problem.file, problem.field) == (STUDY_FILE, "path")
    assert "m: a package its processor needs is missing" in problem.message
    assert "pip install num2words" in problem.message


@pytest.mark.parametrize(
    "model_type, processor_class, image_processor",
    [("llama4", "Llama4Processor", "Llama4ImageProcessor"), ("mistral3", "PixtralProcessor", "PixtralImageProcessor")],
)
def test_a_family_whose_processor_needs_torchvision_names_it(tmp_path, model_type, processor_class, image_processor):
    """Llama 4's image processor exists only in torchvision form, and Pixtral's processor (Mistral 3)
    requires torchvision itself; without torchvision, validate says so."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    folder = saved_config(tmp_path / "m", {"model_type": model_type})
    hf_tiny._tokenizer(("<|image|>", "[IMG]")).save_pretrained(folder)
    processor = {"processor_class": processor_class, "image_processor": {"image_processor_type": image_processor}}
    (folder / "processor_config.json").write_text(json.dumps(processor))
    (problem,) = check(model(path=folder))
    assert (
        "a package its processor needs is missing" in problem.message and "pip install torchvision" in problem.message
    )


def test_an_architecture_transformers_does_not_know_is_refused(tmp_path):
    folder = saved_config(tmp_path / "m", {"model_type": "no_such_architecture"})
    (problem,) = check(model(path=folder))
    assert problem.field == "path" and "does not know this model's architecture" in problem.message


def test_a_hub_id_neither_cached_nor_reachable_is_refused_in_seconds(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # online, but the hub does not answer
        monkeypatch.delenv(offline, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: refused at once
    (problem,) = check(model(model_id="nobody/not-cached"))
    assert problem.field == "model_id"
    assert "neither a local folder nor in the Hugging Face cache, and the hub cannot be reached" in problem.message
    (problem,) = check(model("hf-zero-shot", model_id="nobody/not-cached"))
    assert "hub cannot be reached" in problem.message


def test_remote_code_needs_trust_and_a_pinned_revision(tmp_path):
    remote = {
        "model_type": "internvl_chat",
        "auto_map": {"AutoConfig": "configuration_internvl_chat.InternVLChatConfig"},
    }
    folder = saved_config(tmp_path / "m", remote)
    for options in ({}, {"trust_remote_code": True}, {"revision": "abc123"}):
        (problem,) = check(model(path=folder, options=options))
        assert "runs its own code" in problem.message and "trust_remote_code: true and revision" in problem.message
        assert "InternVL3-2B-hf" in problem.message


def test_remote_code_that_keeps_the_contract_loads_with_trust_and_a_revision(tmp_path):
    from tests.hf_remote import save_remote_code_vlm

    folder = save_remote_code_vlm(tmp_path / "m")
    pinned = {"trust_remote_code": True, "revision": "0123456789abcdef0123456789abcdef01234567"}
    assert check(model(path=folder, options=pinned)) == []
    for options in ({}, {"trust_remote_code": True}, {"revision": "abc123"}):
        (problem,) = check(model(path=folder, options=options))
        assert "runs its own code" in problem.message and problem.field == "path"


def test_remote_code_driven_by_its_own_chat_is_refused_naming_the_native_form(tmp_path):
    """InternVL2's code answers through model.chat (no AutoModelForImageTextToText in its auto_map):
    even trusted at a pinned revision, hf-vlm cannot drive it, and validate names InternVL-hf."""
    from tests.hf_remote import REMOTE_CHAT_AUTO_MAP

    folder = saved_config(tmp_path / "m", {"model_type": "internvl_chat", "auto_map": REMOTE_CHAT_AUTO_MAP})
    (problem,) = check(model(path=folder, options={"trust_remote_code": True, "revision": "abc123"}))
    assert "has no AutoModelForImageTextToText" in problem.message and "model.chat" in problem.message
    assert "InternVL3-8B-hf" in problem.message
    folder = saved_config(tmp_path / "p", {"model_type": "phi3_v", "auto_map": REMOTE_CHAT_AUTO_MAP})
    (problem,) = check(model(path=folder, options={"trust_remote_code": True, "revision": "abc123"}))
    assert "Phi-3.5-vision through an endpoint" in problem.message


def test_validate_exits_2_naming_the_model_and_its_field(tmp_path):
    from PIL import Image

    folder = saved_config(tmp_path / "m", {"model_type": "no_such_architecture"})
    (tmp_path / "imgs").mkdir()
    Image.new("RGB", (12, 8), "red").save(tmp_path / "imgs" / "a.png")
    (tmp_path / "labels.csv").write_text("image_id,dataset,file,label,granularity\na,toys,a.png,cat,prototypical\n")
    (tmp_path / "classes.csv").write_text("dataset,class_name\ntoys,cat\ntoys,dog\n")
    study = {
        "study": "openworld",
        "name": "s",
        "data": {"labels": "labels.csv", "image_dir": "imgs", "classnames": "classes.csv"},
        "models": [{"name": "tiny-vlm", "backend": "hf-vlm", "model_id": "x/y", "path": str(folder)}],
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    done = CliRunner().invoke(app, ["validate", str(tmp_path / "study.yaml")])
    said = " ".join(done.output.split())
    assert done.exit_code == 2 and "Traceback" not in said
    assert "field 'models[0].path': tiny-vlm: transformers" in said and "does not know" in said


def test_a_local_encoder_that_cannot_load_is_refused(monkeypatch, tmp_path):
    from vlm_decade.core.config import EncoderConfig
    from vlm_decade.models.encoders.sbert import entry_problems

    (problem,) = entry_problems(EncoderConfig(name="SIM", path=tmp_path / "nowhere"), ("encoders", 0))
    assert problem.field == "encoders[0].path" and "is not a folder" in problem.message
    (problem,) = entry_problems(EncoderConfig(name="SIM", path=tmp_path), ("encoders", 0))
    assert "no saved encoder" in problem.message
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    (problem,) = entry_problems(EncoderConfig(name="SIM", model_id="nobody/not-cached"), ("encoders", 1))
    assert problem.field == "encoders[1].model_id" and "hub cannot be reached" in problem.message
    assert entry_problems(EncoderConfig(name="SIM"), ("encoders", 0)) == []  # the packaged MiniLM
