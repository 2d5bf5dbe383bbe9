"""API throughput: the gateway against the fake server under a fault mix, versus a plain client.

The gateway (the same async Ray actor the describe stage uses) sends N chat requests at a limit of
`--rpm` with the fake server answering in `--latency` seconds and failing 20% of attempts with 429
(Retry-After 1 s), 5% with 500 and 2% by timing out. It reports the achieved rate as a share of the
limit, the most requests the *server* saw in any 60 s window (never above the limit), requests
lost (never answered after retries; must be 0), and how long a refused request waited before the
server saw it again: `median_wait_after_429_s` and its ratio to Retry-After (target <= 1.5; a retry
goes ahead of requests not tried yet). The sequential baseline is a plain AsyncOpenAI
client with its default retries, one request at a time, timed on `--sequential` requests and
extrapolated to N (said so in the output).

The budget phase sends `--budget-requests` requests for each of two models of one provider
(gpt-4o-mini and gpt-4o, all at once) through one gateway actor with `--budget` US$:
`budget_overshoot` is what the server billed over the budget (must be <= 1.0; close to it, since
only requests that could not fit are skipped).

The tokens-per-minute phase measures the share of a tpm limit used with and without refusals: a
plain `Gateway` (the minute scaled down to `--tpm-window` seconds, a tpm of `--tpm` tokens a
window) sends more requests than the limit lets through, each reserving far more than it uses (an
output cap of 1,000 tokens against answers of a few dozen, as a thinking model's cap is), to a fake
server answering in 50 ms; once with no refusals, once with 3% of attempts answered 429
(Retry-After 1 s). `share_of_tpm` is the tokens of the answers the server gave over
`--tpm-windows` windows from the first arrival, as a share of the limit; `tpm_share_ratio` is the
refused profile's share over the other's (target >= 0.95). Prints JSON lines; the last one is the
summary.

    .venv/bin/python benchmarks/api_throughput.py              # 2,000 requests at 600/min: ~5 min
    .venv/bin/python benchmarks/api_throughput.py --quick      # 300 requests: ~2 min
    .venv/bin/python benchmarks/api_throughput.py --tpm-only   # the tokens-per-minute phase: ~1.5 min
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vlm_decade.core.config import ProviderConfig
from vlm_decade.core.runtime import start_ray
from vlm_decade.models.api.gateway import Gateway, gateway_actor
from vlm_decade.models.api.keys import Secret
from vlm_decade.models.api.providers import ChatRequest, OpenAIProvider
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig, max_in_window


def png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def faults(latency: float, seed: int) -> FaultConfig:
    return FaultConfig(
        latency_s=latency,
        rate_429=0.20,
        retry_after_s=1.0,
        rate_500=0.05,
        rate_timeout=0.02,
        timeout_sleep_s=4.0,
        seed=seed,
    )


def sequential(url: str, requests: list[ChatRequest]) -> tuple[float, int]:
    """A plain synchronous client with its own default retries (2, honouring Retry-After), one
    request at a time: how a simple script would do it."""
    import base64

    import openai

    client = openai.OpenAI(base_url=url, api_key="sk-bench", timeout=2.0)
    lost, start = 0, time.perf_counter()
    for req in requests:
        url_ = "data:image/png;base64," + base64.b64encode(req.image_png).decode()
        content = [{"type": "text", "text": req.prompt}, {"type": "image_url", "image_url": {"url": url_}}]
        try:
            client.chat.completions.create(
                model=req.model_id, messages=[{"role": "user", "content": content}], max_completion_tokens=300
            )
        except Exception:  # noqa: BLE001 - counted
            lost += 1
    return time.perf_counter() - start, lost


def retry_waits(received) -> list[float]:
    """For each 429 answer: seconds from it to the next arrival of the same payload."""
    waits, refused = [], {}
    for r in sorted(received, key=lambda r: r.time):
        if r.payload_sha256 in refused:
            waits.append(r.time - refused.pop(r.payload_sha256))
        if r.outcome == "429":
            refused[r.payload_sha256] = r.answered
    return waits


def budget_phase(ray, n: int, budget: float) -> dict:
    """Two models of one provider share one gateway and one budget; how close to it, never past it."""
    prices = ProviderConfig(rpm=1, tpm=1)
    with FakeAPIServer(FaultConfig(latency_s=0.05, seed=3)) as server, tempfile.TemporaryDirectory() as cache:
        cfg = ProviderConfig(
            rpm=60_000, tpm=10**9, max_concurrency=32, timeout_s=2.0, base_url=server.openai_url, budget_usd=budget
        )
        actor = gateway_actor(ray, "openai", cfg, Secret("sk-bench"), Path(cache), "benchmark-budget")
        image = png()
        requests = [
            ChatRequest(m, f"budget prompt {m} {i}", image, OpenAIProvider.settings(m, {}))
            for i in range(n)
            for m in ("gpt-4o-mini", "gpt-4o")
        ]
        rows = ray.get([actor.chat.remote(r) for r in requests], timeout=3600)
        ray.kill(actor)

        def price(model):
            p = prices.price("openai", model)
            return p.input_per_mtok, p.output_per_mtok

        billed = server.billed_usd(price)
    status = {s: sum(r["status"] == s for r in rows) for s in ("ok", "skipped", "error")}
    return {
        "budget_usd": budget,
        "billed_usd": round(billed, 6),
        "budget_overshoot": round(billed / budget, 4),
        "status": status,
    }


def tpm_phase(refusals: float, tpm: int, window_s: float, windows: int) -> dict:
    """The share of a tokens-per-minute limit the gateway uses when `refusals` of the attempts are
    answered 429: the tokens the server answered with in `windows` windows from its first arrival."""
    settings = OpenAIProvider.settings("gpt-4o-mini", {"max_output_tokens": 1000, "detail": "low"})
    image = png()
    fault = FaultConfig(latency_s=0.05, rate_429=refusals, retry_after_s=1.0, seed=4)
    with FakeAPIServer(fault) as server, tempfile.TemporaryDirectory() as cache:
        cfg = ProviderConfig(
            rpm=None,
            tpm=tpm,
            max_concurrency=32,
            timeout_s=2.0,
            max_attempts=10,
            base_url=server.openai_url,
            budget_usd=None,
        )
        gateway = Gateway("openai", cfg, Secret("sk-bench"), Path(cache), window_s=window_s)
        more_than_fit = 2 * windows * tpm // 100  # an answer uses over 100 tokens

        async def drive() -> None:
            tasks = [
                asyncio.ensure_future(gateway.chat(ChatRequest("gpt-4o-mini", f"tpm prompt {i}", image, settings)))
                for i in range(more_than_fit)
            ]
            await asyncio.sleep(windows * window_s + 2.0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await gateway.provider.client.close()

        asyncio.run(drive())
        received = sorted(server.received(), key=lambda r: r.time)
    start, span = received[0].time, windows * window_s
    answered = [(r.time, r.input_tokens + r.output_tokens) for r in received if r.outcome == "ok"]
    used = sum(n for t, n in answered if t < start + span)
    most = max(sum(n for t, n in answered if t0 <= t < t0 + window_s) for t0, _ in answered)
    times = [r.time for r in received if r.time < start + span]
    return {
        "refusals": refusals,
        "tpm_per_window": tpm,
        "window_s": window_s,
        "windows": windows,
        "attempts": len(times),
        "refused": sum(r.outcome == "429" for r in received if r.time < start + span),
        "share_of_tpm": round(used / (tpm * windows), 4),
        "most_in_any_window": round(most / tpm, 4),
        "longest_gap_s": round(max(b - a for a, b in zip(times, times[1:])), 3),
    }


def tpm_shares(args) -> dict:
    """Both profiles of the tokens-per-minute phase, each printed, and their ratio."""
    shares = {}
    for refusals in (0.0, 0.03):
        profile = tpm_phase(refusals, args.tpm, args.tpm_window, args.tpm_windows)
        print(json.dumps({"phase": "tpm", **profile}))
        shares[refusals] = profile["share_of_tpm"]
    return {
        "tpm_share": shares[0.0],
        "tpm_share_refused_3pct": shares[0.03],
        "tpm_share_ratio": round(shares[0.03] / shares[0.0], 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rpm", type=int, default=600)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--sequential", type=int, default=100, help="requests the sequential client is timed on")
    ap.add_argument("--budget", type=float, default=0.05, help="US$ the two models of the budget phase share")
    ap.add_argument("--budget-requests", type=int, default=300, help="requests per model in the budget phase")
    ap.add_argument("--quick", action="store_true", help="300 requests, 40 sequential")
    ap.add_argument("--tpm", type=int, default=15_000, help="the tpm phase's limit: tokens per window")
    ap.add_argument("--tpm-window", type=float, default=10.0, help="the tpm phase's minute, in seconds")
    ap.add_argument("--tpm-windows", type=int, default=4, help="windows each tpm profile is measured over")
    ap.add_argument("--tpm-only", action="store_true", help="only the tokens-per-minute phase")
    args = ap.parse_args()
    if args.tpm_only:
        print(json.dumps(tpm_shares(args)))
        return
    if args.quick:
        args.requests, args.sequential = 300, 40
    settings = OpenAIProvider.settings("gpt-4o-mini", {})
    image = png()
    requests = [ChatRequest("gpt-4o-mini", f"bench prompt {i}", image, settings) for i in range(args.requests)]

    ray = start_ray(num_cpus=2)
    with FakeAPIServer(faults(args.latency, seed=1)) as server, tempfile.TemporaryDirectory() as cache:
        cfg = ProviderConfig(
            rpm=args.rpm,
            tpm=10**9,
            max_concurrency=64,
            timeout_s=2.0,
            max_attempts=10,
            base_url=server.openai_url,
            budget_usd=None,
        )
        actor = gateway_actor(ray, "openai", cfg, Secret("sk-bench"), Path(cache), "benchmark")
        start = time.perf_counter()
        rows = ray.get([actor.chat.remote(r) for r in requests], timeout=3600)
        elapsed = time.perf_counter() - start
        report = ray.get(actor.report.remote())
        ray.kill(actor)
        times = sorted(r.time for r in server.received())
        outcomes = {o: sum(r.outcome == o for r in server.received()) for o in ("ok", "429", "500", "timeout")}
        waits = retry_waits(server.received())
    lost = sum(r["status"] != "ok" for r in rows)
    span = times[-1] - times[0] + 60 / args.rpm  # the last request's slot counts too
    achieved = len(times) / span * 60  # attempts per minute as the server saw them (retries use the limit too)
    print(
        json.dumps(
            {
                "phase": "gateway",
                "requests": args.requests,
                "attempts": len(times),
                "outcomes": outcomes,
                "seconds": round(elapsed, 1),
                "report": report,
            }
        )
    )

    with FakeAPIServer(faults(args.latency, seed=2)) as server:
        seq_s, seq_lost = sequential(server.openai_url, requests[: args.sequential])
    seq_total = seq_s * args.requests / args.sequential
    print(
        json.dumps(
            {
                "phase": "sequential",
                "timed_on": args.sequential,
                "seconds": round(seq_s, 1),
                "lost": seq_lost,
                "extrapolated_seconds": round(seq_total, 1),
            }
        )
    )
    budget = budget_phase(ray, args.budget_requests, args.budget)
    print(json.dumps({"phase": "budget", **budget}))
    tpm = tpm_shares(args)
    wait = float(np.median(waits))
    print(
        json.dumps(
            {
                "requests": args.requests,
                "limit_per_min": args.rpm,
                "achieved_per_min": round(achieved, 1),
                "share_of_limit": round(achieved / args.rpm, 4),
                "max_in_any_60s": max_in_window(times, 60.0),
                "lost": lost,
                "seconds": round(elapsed, 1),
                "sequential_seconds_extrapolated": round(seq_total, 1),
                "sequential_timed_on": args.sequential,
                "speedup_vs_sequential": round(seq_total / elapsed, 2),
                "median_wait_after_429_s": round(wait, 3),
                "retry_after_s": 1.0,
                "wait_over_retry_after": round(wait / 1.0, 3),
                "max_wait_after_429_s": round(max(waits), 3),
                "budget_overshoot": budget["budget_overshoot"],
                "latency_s": args.latency,
                "faults": {"429": 0.20, "500": 0.05, "timeout": 0.02},
                **tpm,
            }
        )
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
