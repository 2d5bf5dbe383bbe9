"""The demo runs offline: API models and encoders whose key is missing are left out, each with a
note; with the key they stay."""

from vlm_decade.core.config import EncoderConfig, ModelConfig
from vlm_decade.demo import decade_demo, drop_unkeyed

KEYS = ("OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")


def _with_api_parts(tmp_path):
    study = decade_demo(tmp_path / "demo")
    gpt = ModelConfig(name="gpt", backend="openai", model_id="gpt-4o-mini", era="mllm")
    gemini_si = EncoderConfig(name="Gemini-SI", backend="gemini-embedding", model_id="gemini-embedding-001")
    return study.model_copy(update={"models": (*study.models, gpt), "encoders": (*study.encoders, gemini_si)})


def test_parts_without_a_key_are_left_out_with_a_note(tmp_path, monkeypatch):
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    study, notes = drop_unkeyed(_with_api_parts(tmp_path))
    assert [m.name for m in study.models] == ["ssd-template", "demo-imported"]
    assert [e.name for e in study.encoders] == ["SBERT-SI"]
    assert len(notes) == 2
    assert "skipping model gpt" in notes[0] and "OPENAI_API_KEY" in notes[0]
    assert "skipping encoder Gemini-SI" in notes[1] and "GEMINI_API_KEY" in notes[1]


def test_parts_with_a_key_stay(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")
    monkeypatch.setenv("GEMINI_API_KEY", "test-not-real")
    study, notes = drop_unkeyed(_with_api_parts(tmp_path))
    assert [m.name for m in study.models][-1] == "gpt" and [e.name for e in study.encoders][-1] == "Gemini-SI"
    assert notes == []
