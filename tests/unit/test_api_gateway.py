"""The real OpenAI and Gemini clients, through the gateway, against the fake server on 127.0.0.1:
what arrives, retries, limits, budget, cache, and keys kept out of what is written."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from vlm_decade.core.config import ProviderConfig
from vlm_decade.models.api.gateway import Gateway
from vlm_decade.models.api.keys import Secret, scrub
from vlm_decade.models.api.limits import RateLimiter
from vlm_decade.models.api.providers import ChatRequest, GeminiProvider, OpenAIProvider
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig, chat_text, fake_vector, max_in_window

KEY = "sk-test-SECRETKEY0123456789"


def png(seed: int, size=(48, 64)) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(autouse=True)
def loop():
    """One event loop per test: a client's connection pool belongs to the loop that opened it."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()


def run(coro):
    return asyncio.get_event_loop().run_until_complete(coro)


@pytest.fixture
def server():
    with FakeAPIServer(FaultConfig()) as s:
        yield s


def gateway(server, provider, tmp_path, window_s=60.0, **limits) -> Gateway:
    url = server.openai_url if provider == "openai" else server.gemini_url
    cfg = ProviderConfig(**{"rpm": 6000, "tpm": 10**7, "timeout_s": 2.0, "base_url": url, **limits})
    return Gateway(provider, cfg, Secret(KEY), tmp_path / "cache", window_s=window_s)


def chat(gw: Gateway, model: str, prompt: str, image: bytes, **options) -> dict:
    cls = OpenAIProvider if gw.name == "openai" else GeminiProvider
    return run(gw.chat(ChatRequest(model, prompt, image, cls.settings(model, options))))


@pytest.mark.parametrize(
    "provider,model,thinking",
    [("openai", "gpt-4o", 0), ("openai", "o3", 64), ("openai", "gpt-5-mini", 64), ("gemini", "gemini-2.0-flash", 0), ("gemini", "gemini-2.5-flash", 32)],
)
def test_image_and_prompt_arrive_and_usage_is_billed(server, tmp_path, provider, model, thinking):
    image = png(1)
    row = chat(gateway(server, provider, tmp_path), model, "What happens here?", image)
    # The fake answers with hashes of the PNG bytes and the prompt it decoded from the wire format;
    # a reasoning model given a temperature would have been refused with 400.
    assert row["status"] == "ok", row
    assert row["text"] == chat_text("What happens here?", [image])
    assert row["output_tokens"] == len(row["text"]) // 4 + thinking  # reasoning tokens are billed output
    assert row["model_version"].startswith(model) and row["cost_usd"] > 0


def test_a_cached_answer_is_not_bought_again(server, tmp_path):
    gw = gateway(server, "openai", tmp_path)
    first = chat(gw, "gpt-4o", "p", png(2))
    again = chat(gateway(server, "openai", tmp_path), "gpt-4o", "p", png(2))  # a new run, same cache
    masked = chat(gw, "gpt-4o", "p", png(3))  # other bytes, another key
    assert again["cached"] and again["text"] == first["text"] and not masked["cached"]
    assert server.counts()["openai.chat"] == 2
    assert chat(gw, "gpt-4o", "p", png(2), temperature=0.7)["cached"] is False  # settings are in the key


@pytest.mark.parametrize("provider,model", [("openai", "text-embedding-3-large"), ("gemini", "gemini-embedding-001")])
def test_embeddings_are_3072_unit_vectors_and_cached(server, tmp_path, provider, model):
    gw = gateway(server, provider, tmp_path)
    out = run(gw.embed(model, ["a cat on a mat", "a dog"]))
    assert out["status"] == "ok" and out["vectors"].shape == (2, 3072)
    np.testing.assert_allclose(np.linalg.norm(out["vectors"], axis=1), 1.0, rtol=1e-5)
    expected = fake_vector("a dog", 3072, unit=True)
    np.testing.assert_allclose(out["vectors"][1], expected / np.linalg.norm(expected), rtol=1e-5, atol=1e-6)
    again = run(gw.embed(model, ["a dog", "a bird"]))  # only "a bird" is sent
    np.testing.assert_array_equal(again["vectors"][0], out["vectors"][1])
    assert sum(server.counts().values()) == 2


def test_retry_after_is_honoured(tmp_path):
    with FakeAPIServer(FaultConfig(first_429=1, retry_after_s=1.6)) as server:
        row = chat(gateway(server, "openai", tmp_path), "gpt-4o", "p", png(4))
        times = [r.time for r in server.received()]
    assert row["status"] == "ok" and len(times) == 2
    assert times[1] - times[0] >= 1.6  # never sooner than Retry-After (the backoff alone waits at most 1 s)


def test_a_400_is_not_retried_and_becomes_an_error_row(tmp_path):
    with FakeAPIServer(FaultConfig(rate_400=1.0)) as server:
        row = chat(gateway(server, "gemini", tmp_path), "gemini-2.0-flash", "p", png(5))
        assert server.counts()["gemini.generate"] == 1
    assert row["status"] == "error" and "400" in row["error"] and KEY not in row["error"]
    assert not list((tmp_path / "cache").rglob("*.json"))  # errors are not cached: tried again next run


def test_500s_and_timeouts_and_broken_json_are_retried(tmp_path):
    faults = FaultConfig(rate_500=0.2, rate_timeout=0.1, timeout_sleep_s=1.5, rate_broken_json=0.1, seed=3)
    with FakeAPIServer(faults) as server:
        gw = gateway(server, "openai", tmp_path, timeout_s=0.5, max_attempts=10)
        gw.backoff = lambda state: 0.01  # the retry policy under test, not its waits
        rows = run(asyncio.gather(*[gw.chat(ChatRequest("gpt-4o", f"p{i}", png(6), OpenAIProvider.settings("gpt-4o", {}))) for i in range(20)]))
        outcomes = {r.outcome for r in server.received()}
    assert [r["error"] for r in rows if r["status"] != "ok"] == []
    assert {"500", "timeout", "broken"} <= outcomes


def test_requests_per_window_never_exceed_the_limit(server, tmp_path):
    gw = gateway(server, "openai", tmp_path, window_s=1.0, rpm=5, max_concurrency=8)
    settings = OpenAIProvider.settings("gpt-4o", {})

    async def many():
        return await asyncio.gather(*[gw.chat(ChatRequest("gpt-4o", f"p{i}", png(7), settings)) for i in range(16)])

    rows = run(many())
    times = [r.time for r in server.received()]
    assert all(r["status"] == "ok" for r in rows) and len(times) == 16
    assert max_in_window(times, 1.0) <= 5
    assert times[-1] - times[0] >= 3.0  # 16 requests at 5 a window take three windows at least


def test_token_limit_holds_with_reconciled_usage():
    async def limited():
        limiter = RateLimiter(rpm=1000, tpm=100, window_s=0.25)  # widened to 0.5 s
        first = await limiter.acquire(80)
        limiter.reconcile(first, 10)  # the answer was short: most of the reservation comes back
        t = asyncio.get_running_loop().time()
        await limiter.acquire(80)
        fast = asyncio.get_running_loop().time() - t
        await limiter.acquire(80)  # 10 + 80 + 80 > 100: waits for the window
        return fast, asyncio.get_running_loop().time() - t

    fast, slow = run(limited())
    assert fast < 0.1 and slow >= 0.4


def test_budget_stops_new_requests_before_it_is_passed(server, tmp_path):
    gw = gateway(server, "openai", tmp_path, budget_usd=0.006)
    rows = [chat(gw, "gpt-4o", f"p{i}", png(8)) for i in range(20)]
    ok = [r for r in rows if r["status"] == "ok"]
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert ok and skipped and len(ok) + len(skipped) == 20
    assert "budget $0.006 for openai reached" in skipped[0]["error"]
    assert gw.spent <= 0.006 and abs(gw.spent - sum(r["cost_usd"] for r in ok)) < 1e-12
    assert server.counts()["openai.chat"] == len(ok)


def test_keys_are_scrubbed_from_messages():
    secret = Secret(KEY)
    assert KEY not in repr(secret) and KEY not in f"{secret}"
    text = f"401 bad key {KEY} at https://x/v1beta/models/m:generate?key=AIzaSyABCDEFGHIJKLMNOPQRSTUVW"
    clean = scrub(text, secret)
    assert KEY not in clean and "AIza" not in clean and "?key=***" in clean
