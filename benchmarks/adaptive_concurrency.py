"""Adaptive concurrency: the gateway that learns a server's capacity, against the best fixed limit.

The fake OpenAI-compatible server on 127.0.0.1 answers each chat request in `--latency` seconds
while at most `--capacity` (K) requests are in it at once; past K each answer is slower in
proportion (a server that queues), and past `--refuse-at` (K2) a request is refused at once with
429 and no Retry-After (a proxy or a serving engine's full queue). The client is told neither.

One run sends `--requests` distinct chat requests through a plain asyncio `Gateway` (no rate
limit: an endpoint's rpm and tpm left out) at each fixed `max_concurrency` of a sweep, then
through the adaptive gateway (`adaptive: true`, ceiling `--ceiling`). Throughput is requests
answered per second of wall time. Prints JSON: each fixed limit's throughput, the best, the
default's (max_concurrency 32), the adaptive one's, `ratio_vs_best_fixed` (target >= 0.9) and
`ratio_vs_default_fixed`, and the server's most requests at once and 429s under the adaptive gateway.
Each figure is the best of `--repeats` runs (two by default), the adaptive one taken in the
middle of each sweep, so that a shared machine's drifting load weighs on both alike.

    .venv/bin/python benchmarks/adaptive_concurrency.py          # about a minute
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

SWEEP = (4, 6, 8, 12, 16, 24, 32, 64)
DEFAULT = ProviderConfig.model_fields["max_concurrency"].default


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--latency", type=float, default=0.3, help="seconds an answer takes with K or fewer at once")
    ap.add_argument("--capacity", type=int, default=6, help="K: requests at once before answers slow")
    ap.add_argument("--refuse-at", type=int, default=12, help="K2: requests at once past which 429")
    ap.add_argument("--ceiling", type=int, default=64, help="the adaptive gateway's max_concurrency")
    ap.add_argument("--repeats", type=int, default=2, help="sweeps; each figure is the best of its runs")
    args = ap.parse_args()
    faults = FaultConfig(latency_s=args.latency, capacity=args.capacity, overload_at=args.refuse_at)
    started = time.perf_counter()

    async def measure() -> tuple[dict, dict]:
        """Each limit `--repeats` times, the adaptive gateway amid the fixed ones (the machine's
        load drifts alike for both); the best of each is kept."""
        fixed: dict[int, dict] = {}
        adaptive: dict = {}
        best = lambda a, b: a if a and a["requests_per_s"] >= b["requests_per_s"] else b  # noqa: E731
        for round_no in range(args.repeats):
            for n in SWEEP:
                fixed[n] = best(
                    fixed.get(n), await throughput(server, args.requests, f"{round_no}f{n}", max_concurrency=n)
                )
                if n == SWEEP[len(SWEEP) // 2]:
                    limits = {"max_concurrency": args.ceiling, "adaptive": True}
                    adaptive = best(adaptive, await throughput(server, args.requests, f"{round_no}a{n}", **limits))
        return fixed, adaptive

    with FakeAPIServer(faults) as server:
        fixed, adaptive = asyncio.run(measure())
    best_n = max(fixed, key=lambda n: fixed[n]["requests_per_s"])
    best, default = fixed[best_n]["requests_per_s"], fixed[DEFAULT]["requests_per_s"]
    print(
        json.dumps(
            {
                "server": {
                    "latency_s": args.latency,
                    "capacity_K": args.capacity,
                    "refuses_past_K2": args.refuse_at,
                    "ideal_requests_per_s": round(args.capacity / args.latency, 1),
                },
                "requests": args.requests,
                "repeats": args.repeats,
                "fixed": {str(n): r for n, r in fixed.items()},
                "best_fixed": {"max_concurrency": best_n, "requests_per_s": best},
                "default_fixed": {"max_concurrency": DEFAULT, "requests_per_s": default},
                "adaptive": {"ceiling": args.ceiling, **adaptive},
                "ratio_vs_best_fixed": round(adaptive["requests_per_s"] / best, 3),
                "ratio_vs_default_fixed": round(adaptive["requests_per_s"] / default, 3),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "total_s": round(time.perf_counter() - started, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
