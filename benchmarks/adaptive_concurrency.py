"""Adaptive concurrency: the gateway that learns a server's capacity, against the best fixed limit.

The fake OpenAI-compatible server on 127.0.0.1 answers each chat request in `--latency` seconds
while at most `--capacity` (K) requests are in it at once, and is run as three servers the client
is told nothing of (`profiles`): one that refuses past K (429 at once, no Retry-After: a proxy or a
serving engine's full queue), one that slows down past K (latency growing as (at once / K) **
`--slowdown`: more in flight, fewer answers per second), and one that does both (refusing past 2K)
with each answer's latency drawn within +-`--noise` of its mean.

For each server, one run sends `--requests` distinct chat requests through a plain asyncio
`Gateway` (no rate limit: an endpoint's rpm and tpm left out) at each fixed `max_concurrency` of a
sweep, then through the adaptive gateway (`adaptive: true`, ceiling `--ceiling`). Throughput is
requests answered per second of wall time. Prints one JSON line: per server, each fixed limit's
throughput, the best, the default's (max_concurrency 32), the adaptive one's (with the server's
most requests at once, its 429s and the limit it ended at), `ratio_vs_best_fixed` (target >= 0.9)
and `ratio_vs_default_fixed`. Each figure is the best of `--repeats` runs (one by default), the
adaptive one taken in the middle of each sweep, so that a shared machine's drifting load weighs on
both alike.

    .venv/bin/python benchmarks/adaptive_concurrency.py          # about four minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vlm_decade.core.config import EndpointConfig, ProviderConfig
from vlm_decade.models.api.gateway import Gateway
from vlm_decade.models.api.keys import Secret
from vlm_decade.models.api.providers import ChatRequest, OpenAIProvider
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig

SWEEP = (6, 8, 10, 12, 32)
DEFAULT = ProviderConfig.model_fields["max_concurrency"].default


def profiles(args) -> dict[str, FaultConfig]:
    """The three servers, each of capacity K = `--capacity`."""
    k, common = args.capacity, {"latency_s": args.latency, "capacity": args.capacity}
    return {
        "refuses": FaultConfig(**common, overload_at=k),
        "slows": FaultConfig(**common, slowdown=args.slowdown),
        "both_noisy": FaultConfig(**common, slowdown=args.slowdown, overload_at=2 * k, latency_noise=args.noise),
    }


async def throughput(server: FakeAPIServer, requests: int, tag: str, **limits) -> dict:
    """Send `requests` distinct requests through a fresh gateway (an empty cache): answered per second."""
    cfg = EndpointConfig(base_url=server.openai_url, free=True, timeout_s=10.0, max_attempts=20, **limits)
    settings = OpenAIProvider.settings("served-model", {})
    server.reset()
    server.most_in_flight = 0
    with tempfile.TemporaryDirectory() as cache:
        gateway = Gateway("bench", cfg, Secret("no-key"), cache)
        reqs = [ChatRequest("served-model", f"{tag} request {i}", None, settings) for i in range(requests)]
        start = time.perf_counter()
        rows = await asyncio.gather(*(gateway.chat(r) for r in reqs))
        seconds = time.perf_counter() - start
        await gateway.provider.client.close()
    ok = sum(r["status"] == "ok" for r in rows)
    refused = sum(r.outcome == "429" for r in server.received())
    return {
        "requests_per_s": round(ok / seconds, 2),
        "seconds": round(seconds, 3),
        "ok": ok,
        "refused_429": refused,
        "most_at_once": server.most_in_flight,
        "final_limit": gateway.slots.allowed,
    }


async def measure(server: FakeAPIServer, args) -> tuple[dict, dict]:
    """Each limit `--repeats` times, the adaptive gateway amid the fixed ones (the machine's load
    drifts alike for both); the best of each is kept."""
    fixed: dict[int, dict] = {}
    adaptive: dict = {}
    best = lambda a, b: a if a and a["requests_per_s"] >= b["requests_per_s"] else b  # noqa: E731
    for round_no in range(args.repeats):
        for n in SWEEP:
            fixed[n] = best(fixed.get(n), await throughput(server, args.requests, f"{round_no}f{n}", max_concurrency=n))
            if n == SWEEP[len(SWEEP) // 2]:
                limits = {"max_concurrency": args.ceiling, "adaptive": True}
                adaptive = best(adaptive, await throughput(server, args.requests, f"{round_no}a{n}", **limits))
    return fixed, adaptive


def summary(fixed: dict, adaptive: dict, args) -> dict:
    best_n = max(fixed, key=lambda n: fixed[n]["requests_per_s"])
    best, default = fixed[best_n]["requests_per_s"], fixed[DEFAULT]["requests_per_s"]
    return {
        "fixed": {str(n): r for n, r in fixed.items()},
        "best_fixed": {"max_concurrency": best_n, "requests_per_s": best},
        "default_fixed": {"max_concurrency": DEFAULT, "requests_per_s": default},
        "adaptive": {"ceiling": args.ceiling, **adaptive},
        "ratio_vs_best_fixed": round(adaptive["requests_per_s"] / best, 3),
        "ratio_vs_default_fixed": round(adaptive["requests_per_s"] / default, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--latency", type=float, default=0.25, help="seconds an answer takes with K or fewer at once")
    ap.add_argument("--capacity", type=int, default=8, help="K: requests at once before the server refuses or slows")
    ap.add_argument("--slowdown", type=float, default=1.5, help="past K, latency grows as (at once / K) ** this")
    ap.add_argument("--noise", type=float, default=0.3, help="the noisy server's latency within +- this share")
    ap.add_argument("--ceiling", type=int, default=64, help="the adaptive gateway's max_concurrency")
    ap.add_argument("--repeats", type=int, default=1, help="sweeps; each figure is the best of its runs")
    args = ap.parse_args()
    started = time.perf_counter()
    servers = {}
    for name, faults in profiles(args).items():
        with FakeAPIServer(faults) as server:
            servers[name] = summary(*asyncio.run(measure(server, args)), args)
    print(
        json.dumps(
            {
                "server": {"latency_s": args.latency, "capacity_K": args.capacity, "slowdown": args.slowdown},
                "requests": args.requests,
                "repeats": args.repeats,
                **{
                    key: {name: s[key] for name, s in servers.items()}
                    for key in ("fixed", "best_fixed", "default_fixed", "adaptive")
                    + ("ratio_vs_best_fixed", "ratio_vs_default_fixed")
                },
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "total_s": round(time.perf_counter() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
