"""Named endpoints (`providers.endpoints`): their section, their prices, their own cache entries,
their keys kept out of what is written, and `validate`'s look at what each one serves; and an adaptive
gateway against a server that refuses past its capacity (the limit itself: test_adaptive.py)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from pydantic import ValidationError

from vlm_decade.core.config import EndpointConfig, Price, ProvidersConfig
from vlm_decade.models.api.endpoints import endpoint_problems, sending_problems
from vlm_decade.models.api.gateway import Gateway
from vlm_decade.models.api.keys import api_key
from vlm_decade.models.api.limits import RateLimiter
from vlm_decade.models.api.providers import ChatRequest, OpenAIProvider
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig, chat_text

from .api_clients import loop, png, run  # noqa: F401 - loop: the per-test event loop fixture
from .config_only import config_only_study

KEY = "sk-endpoint-SECRET0123456789"


def providers(**endpoints) -> ProvidersConfig:
    return ProvidersConfig.model_validate({"endpoints": endpoints})


def endpoint_gateway(name: str, cfg: EndpointConfig, tmp_path, key: str = "no-key") -> Gateway:
    from vlm_decade.models.api.keys import Secret

    return Gateway(name, cfg, Secret(key), tmp_path / "cache", spend_log=tmp_path / "spend.jsonl")


def ask(gw: Gateway, model: str, prompt: str, image: bytes | None = None) -> dict:
    return run(gw.chat(ChatRequest(model, prompt, image, OpenAIProvider.settings(model, {}))))


# the section ------------------------------------------------------------------------------------
def test_an_endpoint_needs_only_its_url_and_a_cloud_base_url_alone_keeps_the_default_limits():
    p = ProvidersConfig.model_validate(
        {"openai": {"base_url": "http://127.0.0.1:1/v1"}, "endpoints": {"vllm": {"base_url": "http://h:8000/v1"}}}
    )
    assert (p.openai.rpm, p.openai.tpm, p.openai.base_url) == (500, 30_000, "http://127.0.0.1:1/v1")
    assert (p.gemini.rpm, p.gemini.tpm) == (150, 1_000_000)
    vllm = p.of("vllm")
    assert (vllm.rpm, vllm.tpm, vllm.budget_usd, vllm.key_env, p.api("vllm")) == (None, None, None, None, "openai")
    assert p.names() == ["openai", "gemini", "vllm"]
    assert ProvidersConfig.model_validate({"openai": {"rpm": None}}).openai.rpm is None  # said: no limit
    with pytest.raises(KeyError, match="known: openai, gemini, vllm"):
        p.of("vlm")


@pytest.mark.parametrize(
    "endpoints, message",
    [
        ({"openai": {"base_url": "http://h/v1"}}, "cloud provider's name"),
        ({"my server": {"base_url": "http://h/v1"}}, "letters, digits"),
        ({"e": {}}, "base_url"),
        ({"e": {"base_url": "http://h/v1", "mode": "batch"}}, "mode"),
    ],
)
def test_an_endpoint_section_that_cannot_work_is_refused(endpoints, message):
    with pytest.raises(ValidationError, match=message):
        providers(**endpoints)


@pytest.mark.parametrize(
    "section, entry",
    [
        ("ModelConfig", {"name": "m", "backend": "openai", "model_id": "q"}),
        ("EncoderConfig", {"name": "E-SI", "backend": "openai", "model_id": "e"}),
        ("JudgeMetricConfig", {"name": "J", "kind": "rating", "backend": "openai", "model_id": "j"}),
        ("JudgeConfig", {"backend": "openai", "model_id": "j"}),
    ],
)
def test_a_model_encoder_or_judge_on_an_endpoint_cannot_ask_for_batches(section, entry):
    from vlm_decade.core import config
    from vlm_decade.studies.decade import config as decade
    from vlm_decade.studies.openworld import config as openworld

    cls = next(getattr(m, section) for m in (config, decade, openworld) if hasattr(m, section))
    assert cls.model_validate({**entry, "endpoint": "e", "mode": "sync"}).endpoint == "e"
    assert cls.model_validate({**entry, "mode": "batch"}).mode == "batch"  # a cloud provider's batches
    with pytest.raises(ValidationError, match="an endpoint has no batch interface"):
        cls.model_validate({**entry, "endpoint": "e", "mode": "batch"})


def test_an_endpoint_model_is_free_only_when_declared_so():
    p = providers(
        paid={"base_url": "http://h/v1", "prices": {"qwen": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}}},
        zero={"base_url": "http://h/v1", "prices": {"qwen": {"input_per_mtok": 0}}},
        free={"base_url": "http://h/v1", "free": True},
        unpriced={"base_url": "http://h/v1"},
    )
    assert p.of("paid").price("paid", "qwen-7b") == Price(input_per_mtok=0.1, output_per_mtok=0.2)
    assert p.of("zero").price("zero", "qwen") == Price(input_per_mtok=0.0)
    assert p.of("free").price("free", "anything") == Price(input_per_mtok=0.0)
    # No built-in table for an endpoint: a cloud model id served there is not priced silently.
    assert p.of("unpriced").price("unpriced", "gpt-4o") is None
    assert p.openai.price("openai", "gpt-4o") is not None and p.openai.price("openai", "qwen") is None
    (problem,) = sending_problems(p, "openai", "unpriced", "qwen", ("models", 0))
    assert problem.field == "models[0].model_id"
    assert "providers.endpoints.unpriced.prices" in problem.message and "free: true" in problem.message
    (typo,) = sending_problems(p, "openai", "fre", "qwen", ("models", 0))
    assert typo.field == "models[0].endpoint" and "did you mean 'free'" in typo.message
    (other_api,) = sending_problems(p, "gemini", "free", "qwen", ("judge",))
    assert "speaks the openai API" in other_api.message


def test_the_estimate_says_a_zero_priced_endpoint_is_free():
    from vlm_decade.studies.estimate import Line, render

    study = config_only_study(
        providers={
            "endpoints": {
                "local": {"base_url": "http://127.0.0.1:8000/v1", "free": True},
                "zero": {"base_url": "http://127.0.0.1:8001/v1", "prices": {"Qwen2-VL": {"input_per_mtok": 0}}},
                "paid": {"base_url": "http://127.0.0.1:8002/v1", "prices": {"Qwen2-VL": {"input_per_mtok": 1}}},
            }
        },
    )
    lines = [Line(name, "qwen", 10, 0, 1000, 3000, usd=0.001, model_id="Qwen2-VL") for name in ("local", "zero")]
    lines += [Line("paid", "qwen", 10, 0, 1000, 3000, usd=0.001, model_id="Qwen2-VL"), Line("openai", "gpt", 2)]
    text = render(study, lines)
    assert "local (endpoint http://127.0.0.1:8000/v1): free: every model it serves is priced at zero" in text
    assert "zero (endpoint http://127.0.0.1:8001/v1): free: every model it serves is priced at zero" in text
    assert "paid (sync mode): between $0.0000 and $0.0010" in text and "paid (endpoint" not in text
    assert "openai (sync mode): between" in text


# the gateway ------------------------------------------------------------------------------------
def test_two_endpoints_never_share_an_answer_and_one_endpoint_asked_again_is_cached(tmp_path):
    with FakeAPIServer() as a, FakeAPIServer() as b:
        gw_a = endpoint_gateway("vllm-a", EndpointConfig(base_url=a.openai_url, free=True), tmp_path)
        gw_b = endpoint_gateway("vllm-b", EndpointConfig(base_url=b.openai_url, free=True), tmp_path)
        image = png(4)
        first = ask(gw_a, "Qwen2-VL-2B", "Describe.", image)
        other = ask(gw_b, "Qwen2-VL-2B", "Describe.", image)
        again = ask(gw_a, "Qwen2-VL-2B", "Describe.", image)
        assert first["status"] == other["status"] == "ok" and first["text"] == chat_text("Describe.", [image])
        assert not other["cached"] and again["cached"] and again["text"] == first["text"]
        assert a.counts()["openai.chat"] == 1 and b.counts()["openai.chat"] == 1
        assert len(list((tmp_path / "cache" / "chat").rglob("*.json"))) == 2
        assert first["cost_usd"] == 0.0 and first["model_version"] == "Qwen2-VL-2B-2025-01-01+fp_fake"
        # A new revision of what the endpoint serves is asked anew.
        gw_new = endpoint_gateway("vllm-a", EndpointConfig(base_url=a.openai_url, free=True, revision="r2"), tmp_path)
        assert not ask(gw_new, "Qwen2-VL-2B", "Describe.", image)["cached"]
        assert a.counts()["openai.chat"] == 2


def test_an_endpoint_key_comes_from_its_variable_and_is_written_nowhere(tmp_path, monkeypatch):
    cfg = EndpointConfig(base_url="http://127.0.0.1:1/v1", key_env="MY_VLLM_KEY", free=True)
    monkeypatch.delenv("MY_VLLM_KEY", raising=False)
    assert api_key("vllm", cfg) is None
    monkeypatch.setenv("MY_VLLM_KEY", KEY)
    assert api_key("vllm", cfg).reveal() == KEY
    assert api_key("vllm", EndpointConfig(base_url="http://h/v1")).reveal() == "no-key"  # a server with no key
    with FakeAPIServer(key=KEY) as server:
        cfg = cfg.model_copy(update={"base_url": server.openai_url})
        ok = ask(endpoint_gateway("vllm", cfg, tmp_path, KEY), "qwen", "a judge's question")
        wrong = ask(endpoint_gateway("vllm", cfg, tmp_path, "sk-wrong-0123456789abc"), "qwen", "another")
    assert ok["status"] == "ok" and wrong["status"] == "error" and "401" in wrong["error"]
    assert "sk-wrong" not in wrong["error"]
    written = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert written and KEY.encode() not in written and b"sk-wrong" not in written


def test_an_endpoints_embeddings_keep_the_models_width_and_are_unit_length(tmp_path):
    import numpy as np

    with FakeAPIServer() as server:
        gw = endpoint_gateway("tei", EndpointConfig(base_url=server.openai_url, free=True), tmp_path)
        out = run(gw.embed("bge-small", ["a cat", "a dog"]))
    # No `dimensions` asked: the fake answers a "small" model at its own 1,536 (else 3,072 was asked).
    assert out["ok"] == [True, True] and out["vectors"].shape == (2, 1536)
    np.testing.assert_allclose(np.linalg.norm(out["vectors"], axis=1), 1.0, rtol=1e-5)


def test_a_judge_on_an_endpoint_that_does_not_serve_its_model_is_skipped_saying_where():
    from vlm_decade.studies.openworld.config import JudgeConfig
    from vlm_decade.studies.openworld.judge import judge_available

    with FakeAPIServer(models=("Llama-3.2-3B-Instruct",)) as server:
        p = providers(judge={"base_url": server.openai_url, "free": True})
        served = JudgeConfig(backend="openai", model_id="Llama-3.2-3B-Instruct", endpoint="judge")
        other = JudgeConfig(backend="openai", model_id="Llama-3.1-8B", endpoint="judge")
        assert judge_available(served, p) is None
        assert judge_available(other, p) == (
            f"LI judge (judge Llama-3.1-8B): endpoint 'judge' at {server.openai_url} does not serve "
            "'Llama-3.1-8B'; it serves: Llama-3.2-3B-Instruct"
        )
    with pytest.raises(ValidationError, match="`endpoint` is for an API judge"):
        JudgeConfig(backend="hf-judge", endpoint="judge")


def test_an_endpoint_without_limits_lets_every_request_go_at_once():
    limiter = RateLimiter(None, None, window_s=60.0)

    async def many():
        return await asyncio.wait_for(asyncio.gather(*(limiter.acquire(10**9) for _ in range(200))), 1.0)

    assert len(run(many())) == 200


# validate ---------------------------------------------------------------------------------------
def test_validate_finds_what_each_endpoint_serves_and_names_endpoint_and_url(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # nothing listens there
    with FakeAPIServer(models=("Qwen2-VL-2B", "bge-m3"), key=KEY) as server:
        monkeypatch.setenv("VLLM_KEY", KEY)
        p = providers(
            up={"base_url": server.openai_url, "key_env": "VLLM_KEY"},
            down={"base_url": closed},
            nokey={"base_url": server.openai_url, "key_env": "UNSET_KEY_VAR"},
            refused={"base_url": server.openai_url},
        )
        monkeypatch.delenv("UNSET_KEY_VAR", raising=False)
        assert (
            endpoint_problems(p, {"up": {"Qwen2-VL-2B": "models[0].model_id", "bge-m3": "encoders[0].model_id"}}) == []
        )
        (missing,) = endpoint_problems(p, {"up": {"llava": "models[1].model_id"}})
        assert missing.field == "models[1].model_id"
        assert missing.message == (
            f"endpoint 'up' at {server.openai_url} does not serve 'llava'; it serves: Qwen2-VL-2B, bge-m3"
        )
        (down,) = endpoint_problems(p, {"down": {"x": "models[0].model_id"}})
        assert down.message.startswith(f"endpoint 'down' at {closed} does not answer")
        (nokey,) = endpoint_problems(p, {"nokey": {"x": "judge.model_id"}})
        assert nokey.file == "environment" and "set UNSET_KEY_VAR" in nokey.message
        (refused,) = endpoint_problems(p, {"refused": {"x": "models[0].model_id"}})
        assert "answered GET /models with HTTP 401" in refused.message


# adaptive concurrency ---------------------------------------------------------------------------
def test_an_adaptive_gateway_backs_off_a_server_that_refuses_past_its_capacity(tmp_path):
    faults = FaultConfig(latency_s=0.02, capacity=4, overload_at=6)
    with FakeAPIServer(faults) as server:
        cfg = EndpointConfig(base_url=server.openai_url, free=True, adaptive=True, max_concurrency=64, timeout_s=5)
        gw = endpoint_gateway("e", cfg, tmp_path)

        async def many():
            reqs = [ChatRequest("m", f"p{i}", None, OpenAIProvider.settings("m", {})) for i in range(60)]
            return await asyncio.gather(*(gw.chat(r) for r in reqs))

        rows = run(many())
    assert all(r["status"] == "ok" for r in rows)
    refused = sum(r.outcome == "429" for r in server.received())
    # It started low and stayed near the edge: a fixed 64 would have sent 64 at once and had 58 refused.
    assert refused < 20 and server.most_in_flight < 16 and gw.slots.allowed < 16
