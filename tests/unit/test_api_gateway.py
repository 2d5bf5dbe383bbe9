"""The real OpenAI and Gemini clients, through the gateway, against the fake server on 127.0.0.1:
what arrives, retries, limits, budget, cache, and keys kept out of what is written."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from vlm_decade.core.config import DEFAULT_PRICES, ProviderConfig
from vlm_decade.core.errors import error_text
from vlm_decade.models.api.gateway import Gateway
from vlm_decade.models.api.keys import Secret, scrub
from vlm_decade.models.api.limits import RateLimiter
from vlm_decade.models.api.providers import ChatRequest, GeminiProvider, OpenAIProvider, thinking
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig, chat_text, fake_vector, max_in_window

from .api_clients import loop, png, run  # noqa: F401 - loop: the per-test event loop fixture
from .config_only import config_only_study

KEY = "sk-test-SECRETKEY0123456789"


@pytest.fixture
def server():
    with FakeAPIServer(FaultConfig()) as s:
        yield s


def gateway(server, provider, tmp_path, window_s=60.0, spend_log=None, driver_pid=None, **limits) -> Gateway:
    url = server.openai_url if provider == "openai" else server.gemini_url
    cfg = ProviderConfig(**{"rpm": 6000, "tpm": 10**7, "timeout_s": 2.0, "base_url": url, **limits})
    return Gateway(
        provider, cfg, Secret(KEY), tmp_path / "cache", window_s=window_s, spend_log=spend_log, driver_pid=driver_pid
    )


def chat(gw: Gateway, model: str, prompt: str, image: bytes, **options) -> dict:
    cls = OpenAIProvider if gw.name == "openai" else GeminiProvider
    return run(gw.chat(ChatRequest(model, prompt, image, cls.settings(model, options))))


@pytest.mark.parametrize(
    "provider,model,thinking",
    [
        ("openai", "gpt-4o", 0),
        ("openai", "o3", 64),
        ("openai", "gpt-5-mini", 64),
        ("gemini", "gemini-2.0-flash", 0),
        ("gemini", "gemini-2.5-flash", 32),
    ],
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


def thinks_low(budget: int | None = None, level: str | None = None) -> dict:
    """A Gemini thinking model's generationConfig: the larger cap, and how much it thinks."""
    said = {"thinkingBudget": budget} if level is None else {"thinkingLevel": level}
    return {"maxOutputTokens": 2000, "temperature": 0.0, "thinkingConfig": said}


@pytest.mark.parametrize(
    "provider,model,options,sent",
    [
        ("openai", "gpt-4o", {}, {"max_completion_tokens": 300, "temperature": 0.0}),
        ("openai", "o1", {}, {"max_completion_tokens": 2000, "reasoning_effort": "low"}),
        ("openai", "o1-mini", {}, {"max_completion_tokens": 2000}),  # takes no effort
        ("openai", "o3", {}, {"max_completion_tokens": 2000, "reasoning_effort": "low"}),
        ("openai", "o4-mini", {}, {"max_completion_tokens": 2000, "reasoning_effort": "low"}),
        ("openai", "gpt-5-mini", {}, {"max_completion_tokens": 2000, "reasoning_effort": "low"}),
        ("openai", "gpt-5.1", {}, {"max_completion_tokens": 2000, "reasoning_effort": "low"}),
        ("openai", "gpt-5-pro", {}, {"max_completion_tokens": 2000, "reasoning_effort": "high"}),  # only high
        ("openai", "o3", {"reasoning_effort": "high"}, {"max_completion_tokens": 2000, "reasoning_effort": "high"}),
        ("gemini", "gemini-2.0-flash", {}, {"maxOutputTokens": 300, "temperature": 0.0}),
        ("gemini", "gemini-2.5-flash", {}, thinks_low(budget=1024)),
        ("gemini", "gemini-2.5-pro", {}, thinks_low(budget=1024)),
        ("gemini", "gemini-2.5-flash-lite", {}, thinks_low(budget=0)),  # thinks only when told to
        ("gemini", "gemini-2.5-flash", {"thinking_budget": 0}, thinks_low(budget=0)),
        ("gemini", "gemini-3-pro-preview", {}, thinks_low(level="LOW")),
        ("gemini", "gemini-3-pro-preview", {"thinking_level": "high"}, thinks_low(level="HIGH")),
    ],
)
def test_a_thinking_model_is_sent_its_own_settings_and_room_to_answer(server, tmp_path, provider, model, options, sent):
    # A description request's settings as the body carries them, in the API's spelling: a thinking
    # model's hidden output counts against the cap, so it gets the larger one and is told to think
    # little (Gemini 2.5: a budget, Gemini 3: a level, OpenAI: an effort), whichever family it is of.
    row = chat(gateway(server, provider, tmp_path), model, "Describe the image.", png(4), **options)
    (body,) = [json.loads(r.body) for r in server.received()]
    assert row["status"] == "ok", row
    if provider == "gemini":
        assert body["generationConfig"] == sent
    else:
        assert {k: v for k, v in body.items() if k != "messages"} == {"model": model, **sent}


def test_thinking_is_decided_by_the_families_the_price_table_lists():
    listed = {(api, m) for api, table in DEFAULT_PRICES.items() for m in table if thinking(api, m)}
    o_series = ("o1", "o1-mini", "o3", "o3-mini", "o4-mini")
    openai = o_series + ("gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-5-pro", "gpt-5.1", "gpt-5.4")
    gemini = ("gemini-2.5-pro", "gemini-2.5-flash", "gemini-2.5-flash-lite", "gemini-3-pro-preview")
    assert listed == {("openai", m) for m in openai} | {("gemini", m) for m in gemini}


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
    assert out["ok"] == [True, True] and not out["failures"] and out["vectors"].shape == (2, 3072)
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


@pytest.mark.parametrize("provider, model", [("openai", "gpt-4o"), ("gemini", "gemini-2.0-flash")])
def test_408_and_409_are_retried(tmp_path, provider, model):
    with FakeAPIServer(FaultConfig(first_status=(408, 409))) as server:
        row = chat(gateway(server, provider, tmp_path), model, "p", png(6))
        outcomes = [r.outcome for r in server.received()]
    assert row["status"] == "ok" and outcomes == ["408", "409", "ok"]


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
        rows = run(
            asyncio.gather(
                *[
                    gw.chat(ChatRequest("gpt-4o", f"p{i}", png(6), OpenAIProvider.settings("gpt-4o", {})))
                    for i in range(20)
                ]
            )
        )
        outcomes = {r.outcome for r in server.received()}
    assert [r["error"] for r in rows if r["status"] != "ok"] == []
    assert {"500", "timeout", "broken"} <= outcomes


def test_an_error_is_said_as_everywhere_else_without_the_key(server, tmp_path):
    gw = gateway(server, "openai", tmp_path)
    exc = ValueError(f"\n  \x1b[31mrefused: Bearer {KEY}\x1b[0m\nthe rest")
    assert gw.error_text(exc) == scrub(error_text(exc), Secret(KEY)) == "ValueError: refused: Bearer ***"


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


class FakeClock:
    """The limiter's time, moved by hand: a wait of w seconds moves it by w at once, so limits are
    checked on the clock's own arithmetic, not on how fast this machine is."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    async def wait_for(self, waiter, timeout):
        waiter.close()  # never awaited: the time passes at once
        self.now += timeout
        raise TimeoutError


def test_token_limit_holds_with_reconciled_usage(monkeypatch):
    from vlm_decade.models.api import limits

    clock = FakeClock()
    monkeypatch.setattr(limits.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(limits.asyncio, "wait_for", clock.wait_for)

    async def limited():
        limiter = RateLimiter(rpm=1000, tpm=100, window_s=0.25)  # widened to 0.5 s
        first = await limiter.acquire(80)
        limiter.reconcile(first, 10)  # the answer was short: most of the reservation comes back
        start = clock.now
        await limiter.acquire(80)
        fast = clock.now - start
        await limiter.acquire(80)  # 10 + 80 + 80 > 100, and 80 + 80 too: waits for the second to leave the window
        return fast, clock.now - start

    fast, slow = run(limited())
    assert fast == pytest.approx(0.5 / 1000)  # only the even pacing: window / rpm
    assert slow == pytest.approx(fast + 0.5)  # the second reservation leaves the 0.5 s window


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


# -- what the gateway promises (docs/api.md, "What is guaranteed") -------------------------------
def price_of(provider: str):
    cfg = ProviderConfig(rpm=1, tpm=1)

    def price(model: str) -> tuple[float, float]:
        p = cfg.price(provider, model)
        return p.input_per_mtok, p.output_per_mtok

    return price


def many(gw: Gateway, model: str, prompts: list[str], image: bytes | None = None) -> list[dict]:
    settings = (OpenAIProvider if gw.name == "openai" else GeminiProvider).settings(model, {})

    async def go():
        return await asyncio.gather(*[gw.chat(ChatRequest(model, p, image, settings)) for p in prompts])

    return run(go())


def worst_case(gw: Gateway, model: str, prompt: str, image: bytes | None) -> float:
    from vlm_decade.models.api.providers import cost

    req = ChatRequest(model, prompt, image, OpenAIProvider.settings(model, {}))
    return cost(gw.cfg.price("openai", model), gw.provider.estimate_input(req), req.settings["max_output_tokens"])


def test_a_budget_reserves_only_for_requests_in_flight_and_waits_before_it_skips(tmp_path):
    # 64 requests wait for 4 slots. Reserving the worst case of every queued request would stop
    # after a handful; reserving for the 4 in flight, and waiting for them before skipping, spends
    # up to the last request that fits.
    with FakeAPIServer(FaultConfig(latency_s=0.02)) as server:
        # Each request may cost up to $0.00022 and costs about $0.000026: the whole run about $0.0017.
        gw = gateway(server, "openai", tmp_path, max_concurrency=4, budget_usd=0.001)
        image = png(20)
        rows = many(gw, "gpt-4o-mini", [f"question {i:02d}" for i in range(64)], image)
        billed = server.billed_usd(price_of("openai"))
    ok = [r for r in rows if r["status"] == "ok"]
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert ok and skipped and len(ok) + len(skipped) == 64
    worst = worst_case(gw, "gpt-4o-mini", "question 00", image)
    assert gw.spent <= 0.001 and gw.spent > 0.001 - worst  # skipped only when even one more would not fit
    assert gw.spent == pytest.approx(billed, abs=1e-12) == pytest.approx(sum(r["paid_usd"] for r in ok), abs=1e-12)
    assert f"spent ${gw.spent:.4f}" in skipped[-1]["error"]  # the message gives the real spend


def test_the_budget_holds_across_models_and_runs_of_one_run_folder(tmp_path):
    # Two models of one provider, then a rerun of the same run folder: one budget for all of it.
    log = tmp_path / "run" / "api" / "openai.spend.jsonl"
    # gpt-4o-mini answers cost about $0.00001 each; a gpt-4o request may cost up to $0.003.
    with FakeAPIServer() as server:
        first = gateway(server, "openai", tmp_path, spend_log=log, budget_usd=0.0035)
        a = many(first, "gpt-4o-mini", [f"a{i}" for i in range(20)])
        b = many(first, "gpt-4o", [f"b{i}" for i in range(20)])
        rerun = gateway(server, "openai", tmp_path, spend_log=log, budget_usd=0.0035)
        c = many(rerun, "gpt-4o", [f"c{i}" for i in range(20)])
        billed = server.billed_usd(price_of("openai"))
    from vlm_decade.models.api.spend import read_spend

    assert {r["status"] for r in a} == {"ok"} and {r["status"] for r in b} == {"ok", "skipped"}
    assert rerun.spent_before == pytest.approx(first.spent)
    assert {r["status"] for r in c} == {"skipped"}  # the rerun starts where the first run stopped
    assert billed <= 0.0035 and read_spend(log).paid == pytest.approx(billed, abs=1e-12)


@pytest.mark.parametrize(
    "provider,model,transport",
    [("openai", "gpt-4o", "httpx"), ("gemini", "gemini-2.0-flash", "aiohttp"), ("gemini", "gemini-2.0-flash", "httpx")],
)
def test_a_dropped_connection_is_retried_by_the_gateway_alone(tmp_path, monkeypatch, provider, model, transport):
    # google-genai re-sends once after a dropped connection on aiohttp unless told not to retry.
    import google.genai._api_client as genai_client

    assert genai_client.has_aiohttp  # the transport google-genai picks when it can
    if transport == "httpx":
        monkeypatch.setattr(genai_client, "has_aiohttp", False)
    endpoint = "openai.chat" if provider == "openai" else "gemini.generate"
    with FakeAPIServer(FaultConfig(first_drop=1)) as server:
        # A timeout longer than a client's own re-send (1-10 s later) would take.
        once = chat(gateway(server, provider, tmp_path, max_attempts=1, timeout_s=15), model, "p", png(21))
        assert server.counts()[endpoint] == 1
        twice = chat(gateway(server, provider, tmp_path, max_attempts=2, timeout_s=15), model, "q", png(21))
        assert [r.outcome for r in server.received()] == ["dropped", "dropped", "ok"]
    assert once["status"] == "error" and twice["status"] == "ok"


def test_a_retry_leaves_as_soon_as_retry_after_and_the_limit_allow(tmp_path):
    # 40 requests at 20 a (1.25 s) window, each refused once with Retry-After 1 s: a retry that
    # queued behind the untried requests would wait for most of the backlog.
    with FakeAPIServer(FaultConfig(first_429=1, retry_after_s=1.0)) as server:
        gw = gateway(server, "openai", tmp_path, window_s=1.0, rpm=20, max_concurrency=40, max_attempts=3)
        rows = many(gw, "gpt-4o-mini", [f"r{i}" for i in range(40)])
        log = server.received()
    assert {r["status"] for r in rows} == {"ok"}
    waits = [retry_waits(log)[h] for h in retry_waits(log)]
    assert len(waits) == 40 and min(waits) >= 1.0  # never sooner than Retry-After
    assert float(np.median(waits)) / 1.0 <= 1.5


def retry_waits(log) -> dict[str, float]:
    """Per payload: from its 429 answer to its next arrival."""
    refused, waits = {}, {}
    for r in sorted(log, key=lambda r: r.time):
        if r.outcome == "429":
            refused[r.payload_sha256] = r.answered
        elif r.payload_sha256 in refused and r.payload_sha256 not in waits:
            waits[r.payload_sha256] = r.time - refused[r.payload_sha256]
    return waits


def test_queueing_is_recorded_apart_from_the_providers_latency_and_cached_rows_say_so(tmp_path):
    with FakeAPIServer(FaultConfig(latency_s=0.15)) as server:
        gw = gateway(server, "openai", tmp_path, window_s=1.0, rpm=4, max_concurrency=8)
        rows = many(gw, "gpt-4o-mini", [f"q{i}" for i in range(8)])
        again = many(gateway(server, "openai", tmp_path), "gpt-4o-mini", [f"q{i}" for i in range(8)])
    assert all(0.15 <= r["latency_s"] < 0.6 for r in rows)  # the answering attempt alone
    assert max(r["queued_s"] for r in rows) >= 1.0  # eight at four a (1.25 s) window: the last ones waited
    assert not any(r["cached"] for r in rows) and all(r["paid_usd"] == r["cost_usd"] > 0 for r in rows)
    assert all(r["cached"] and r["paid_usd"] == 0.0 for r in again)
    assert [r["cost_usd"] for r in again] == [r["cost_usd"] for r in rows]  # the original cost, kept apart


def test_nothing_new_is_sent_once_the_driver_is_gone(tmp_path):
    import subprocess

    driver = subprocess.Popen(["sleep", "60"])
    with FakeAPIServer(FaultConfig(latency_s=0.05)) as server:
        gw = gateway(server, "openai", tmp_path, driver_pid=driver.pid)
        assert chat(gw, "gpt-4o-mini", "before", png(22))["status"] == "ok"
        driver.kill()
        driver.wait()
        after = many(gw, "gpt-4o-mini", [f"after {i}" for i in range(5)])
        assert server.counts()["openai.chat"] == 1
    assert {r["status"] for r in after} == {"error"} and "driver has ended" in after[0]["error"]


def test_the_estimate_prints_each_line_and_each_provider_as_a_range():
    from vlm_decade.studies.estimate import Line, render

    study = config_only_study()
    lines = [
        Line("openai", "gpt", 10, 2, 1000, 3000, usd=0.02, usd_low=0.005),
        Line("openai", "probes gpt", 50, 0, 9000, 15000, usd=0.2),
    ]
    text = render(study, lines)
    assert text.splitlines()[2].split()[-3:] == ["0.0000", "0.2000", "0.1000"]  # at least, at most, in batch mode
    assert (
        "openai (sync mode): between $0.0050 and $0.2200 (all sync at most $0.2200, all batch at most $0.1100); budget $10\n"
        in text
    )
    # The probes alone in batch mode: their half-price share and the rest at the full price.
    lines[1].mode = "batch"
    text = render(study, lines)
    assert (
        "openai (sync mode, probes gpt: batch): between $0.0050 and $0.1200 (all sync at most $0.2200, all batch at most $0.1100)"
        in text
    )


@pytest.mark.parametrize("mode, requests", [("sync", 2), ("batch", 128)])
def test_an_api_encoder_is_estimated_in_its_own_mode(tmp_path, mode, requests):
    """Sync mode sends `batch_size` texts a request; batch mode a line a text, at half the price."""
    from vlm_decade.models.api.cache import ResponseCache
    from vlm_decade.studies.estimate import embed_lines

    study = config_only_study(
        encoders=[
            {
                "name": "GPT-SI",
                "backend": "openai-embedding",
                "model_id": "text-embedding-3-large",
                "batch_size": 64,
                "mode": mode,
            }
        ],
    )
    (line,) = embed_lines(study, [f"human text {i:03d}" for i in range(100)], 28, 28 * 300, ResponseCache(tmp_path))
    price = study.providers.openai.price("openai", "text-embedding-3-large")
    tokens = 100 * 4 + 28 * 300  # "human text 000" is 14 characters: 4 tokens
    assert (line.requests, line.input_tokens) == (requests, tokens) and line.usd == pytest.approx(
        tokens * price.input_per_mtok / 1e6
    )
    assert line.planned("sync") == pytest.approx(
        (line.usd_low, line.usd) if mode == "sync" else (line.usd_low / 2, line.usd / 2)
    )


def test_a_responses_table_written_before_the_new_columns_is_still_read(tmp_path):
    import pyarrow as pa

    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.stages.describe.rows import RESPONSES_SCHEMA, RowsSoFar, collect_rows

    old_columns = [
        "subject",
        "image_id",
        "variant",
        "prompt_id",
        "text",
        "status",
        "error",
        "latency_s",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "model_version",
        "cache_key",
    ]
    old = pa.table(
        {name: [None] for name in old_columns}, schema=pa.schema([RESPONSES_SCHEMA.field(n) for n in old_columns])
    )
    row = {
        "subject": "gpt",
        "image_id": "i1",
        "variant": "full",
        "prompt_id": "p",
        "text": "a cat",
        "status": "ok",
        "error": "",
        "latency_s": 1.5,
        "input_tokens": 10,
        "output_tokens": 3,
        "cost_usd": 0.001,
        "model_version": "v",
        "cache_key": "k",
    }
    folder = RunFolder(tmp_path)
    fingerprint, record = folder.write("responses", pa.Table.from_pylist([row], schema=old.schema))
    folder.save_manifest({"tables": {"responses": fingerprint}, "files": {"responses": record}})
    jobs = pa.table(
        {"subject": ["gpt"], "image_id": ["i1"], "variant": ["full"], "prompt_id": ["p"], "cache_key": ["k"]}
    )
    with RowsSoFar(folder, ["gpt"], jobs.column("image_id")) as so_far:
        so_far.add_jobs(jobs)
        collect_rows(folder, so_far)
    (kept,) = folder.read("responses").to_pylist()
    assert kept == {**row, "queued_s": None, "paid_usd": None, "cached": None, "mode": None}


def test_the_next_gateway_of_a_run_folder_counts_the_last_window_against_its_rate_limit(tmp_path):
    # One stage sends 5 requests at 5 a (1.25 s) window; the next stage's gateway starts at once:
    # without the first one's starts it would send 5 more inside the same window.
    log = tmp_path / "run" / "api" / "openai.spend.jsonl"
    with FakeAPIServer() as server:
        many(
            gateway(server, "openai", tmp_path, window_s=1.0, rpm=5, spend_log=log),
            "gpt-4o-mini",
            [f"a{i}" for i in range(5)],
        )
        many(
            gateway(server, "openai", tmp_path, window_s=1.0, rpm=5, spend_log=log),
            "gpt-4o-mini",
            [f"b{i}" for i in range(5)],
        )
        times = [r.time for r in server.received()]
    assert len(times) == 10 and max_in_window(times, 1.0) <= 5
