"""What a refusal (429) tells the gateway: how long to wait, read from wherever the provider puts it
(Retry-After headers, Gemini's RetryInfo in the error body, OpenAI's x-ratelimit-reset-* headers),
and that a refused attempt gives its token reservation back to the tokens-per-minute limit."""

from __future__ import annotations

import asyncio
import time

import httpx2
import openai
import pytest
from google.genai import errors as genai_errors

from vlm_decade.core.config import ProviderConfig
from vlm_decade.models.api.gateway import Gateway
from vlm_decade.models.api.keys import Secret
from vlm_decade.models.api.limits import RateLimiter
from vlm_decade.models.api.providers import ChatRequest, GeminiProvider, OpenAIProvider
from vlm_decade.models.api.retries import duration_s, refused, retry_delay
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig

from .api_clients import loop, png, run  # noqa: F401 - loop: the per-test event loop fixture

URL = "https://api.openai.com/v1/chat/completions"


def openai_429(headers: dict, body: dict | None = None) -> openai.RateLimitError:
    """A 429 as the openai client raises it from an answer with these headers."""
    response = httpx2.Response(429, headers=headers, json=body or {}, request=httpx2.Request("POST", URL))
    return openai.RateLimitError("Error code: 429", response=response, body=(body or {}).get("error"))


def gemini_429(details: list[dict]) -> genai_errors.ClientError:
    """A 429 as google-genai raises it: the whole error JSON as `details`."""
    body = {"error": {"code": 429, "message": "Resource exhausted.", "status": "RESOURCE_EXHAUSTED"}}
    body["error"]["details"] = details
    return genai_errors.ClientError(429, body)


@pytest.mark.parametrize(
    "text,seconds",
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1m30.5s", 90.5), ("2h0m0s", 7200.0), ("0.25s", 0.25)],
)
def test_durations_are_read_as_the_providers_write_them(text, seconds):
    assert duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5 s", "soon", "1s2", None, 5])
def test_what_is_no_duration_gives_none(text):
    assert duration_s(text) is None


def test_retry_after_headers_in_seconds_or_milliseconds():
    assert retry_delay(openai_429({"retry-after": "1.5"})) == 1.5
    assert retry_delay(openai_429({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    assert retry_delay(openai_429({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) is None  # a date: backoff


def test_gemini_retry_info_in_the_error_body():
    exc = gemini_429(
        [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": "PerMinute"}]},
            {"@type": "type.googleapis.com/google.rpc.Help", "links": [{"url": "https://ai.google.dev"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "5s"},
        ]
    )
    assert retry_delay(exc) == 5.0
    assert retry_delay(gemini_429([{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37.2s"}])) == (
        pytest.approx(37.2)
    )
    assert retry_delay(gemini_429([{"@type": "type.googleapis.com/google.rpc.QuotaFailure"}])) is None


def test_openai_ratelimit_reset_of_the_limit_used_up():
    limits = {"x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "30000"}
    requests_out = {
        **limits,
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "6m0s",
        "x-ratelimit-remaining-tokens": "29000",
        "x-ratelimit-reset-tokens": "20ms",
    }
    tokens_out = {
        **limits,
        "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-reset-requests": "120ms",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "1.5s",
    }
    too_large = {**tokens_out, "x-ratelimit-remaining-tokens": "800"}  # requests left: a refusal for tokens
    body = {"error": {"message": "Rate limit reached for gpt-4o", "type": "requests", "code": "rate_limit_exceeded"}}
    assert retry_delay(openai_429(requests_out, body)) == 360.0
    assert retry_delay(openai_429(tokens_out, body)) == 1.5
    assert retry_delay(openai_429(too_large, body)) == 1.5
    assert retry_delay(openai_429({**requests_out, "retry-after": "2"}, body)) == 2.0  # Retry-After first


def test_failures_that_name_no_wait_and_which_are_refusals():
    assert retry_delay(ValueError("broken JSON")) is None and retry_delay(openai_429({})) is None
    assert refused(openai_429({})) and refused(gemini_429([]))
    assert not refused(TimeoutError()) and not refused(genai_errors.ServerError(500, {"error": {"code": 500}}))


@pytest.mark.parametrize(
    "provider,model,hint",
    [("gemini", "gemini-2.0-flash", "retry-info"), ("openai", "gpt-4o", "ratelimit-reset")],
)
def test_a_retry_waits_as_long_as_the_provider_says_wherever_it_says_it(tmp_path, provider, model, hint):
    with FakeAPIServer(FaultConfig(first_429=1, retry_after_s=1.6, retry_hint=hint)) as server:
        row = run(gateway(server, provider, tmp_path).chat(request(provider, model, "p")))
        times = [r.time for r in server.received()]
    assert row["status"] == "ok" and len(times) == 2
    assert times[1] - times[0] >= 1.6  # the backoff alone would wait at most 1 s


def gateway(server, provider: str, tmp_path, **limits) -> Gateway:
    url = server.openai_url if provider == "openai" else server.gemini_url
    cfg = ProviderConfig(**{"rpm": 6000, "tpm": 10**7, "timeout_s": 2.0, "base_url": url, **limits})
    return Gateway(provider, cfg, Secret("sk-test"), tmp_path / "cache")


def request(provider: str, model: str, prompt: str) -> ChatRequest:
    cls = OpenAIProvider if provider == "openai" else GeminiProvider
    return ChatRequest(model, prompt, png(1), cls.settings(model, {}))


def test_a_correction_that_frees_tokens_lets_the_next_request_go_at_once():
    async def limited():
        limiter = RateLimiter(rpm=None, tpm=100, window_s=30.0)
        first = await limiter.acquire(80)
        second = asyncio.ensure_future(limiter.acquire(80))  # waits: 80 + 80 > 100
        await asyncio.sleep(0.05)
        assert not second.done()
        limiter.reconcile(first, 0)  # refused: none of its tokens counted
        start = time.monotonic()
        await asyncio.wait_for(second, 2.0)
        return time.monotonic() - start

    assert run(limited()) < 0.5  # woken at once, not when the first reservation leaves the window


def test_a_refused_attempt_gives_its_tokens_back(tmp_path):
    # A tpm that holds one request's worst case but not two: were the refused attempt's reservation
    # kept, its retry would wait out the 60 s window.
    with FakeAPIServer(FaultConfig(first_429=1, retry_after_s=0.2)) as server:
        req = request("openai", "gpt-4o-mini", "p")
        gw = gateway(server, "openai", tmp_path)
        worst = gw.provider.estimate_input(req) + req.settings["max_output_tokens"]
        gw = gateway(server, "openai", tmp_path, tpm=int(worst * 1.5))
        row = run(asyncio.wait_for(gw.chat(req), 10.0))
        outcomes = [r.outcome for r in server.received()]
    assert row["status"] == "ok" and outcomes == ["429", "ok"]
    assert [n for _, n in gw.limiter.spent] == [0, row["input_tokens"] + row["output_tokens"]]
