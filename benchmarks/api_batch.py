"""Batch mode against sync mode: the same requests through the gateway, what each costs, and that no
line is answered twice.

N chat requests (a short prompt and a small PNG each, gpt-4o-mini) go through one gateway in batch
mode against the fake server, at most `--per-batch` lines a batch; the fake expires the first batch
with half its lines done and fails `--fail` of the lines. The gateway submits what the expired batch
did not reach again at once; a second gateway (a rerun) submits the failed lines again. Then the
same requests go through a gateway in sync mode against a fresh fake server. Prints JSON lines; the
last is the summary: requests, batches, lines_submitted, duplicate_lines (lines answered ok more
than once: must be 0), cost_sync_usd and cost_batch_usd as the fake server billed them, cost_ratio,
and the same figures under `embeddings` for `--texts` texts embedded (text-embedding-3-large) the
way the embed stage does it (queue every text, then collect chunks of 64), with the same faults.

    .venv/bin/python benchmarks/api_batch.py              # 5,000 requests and 5,000 texts: about two minutes
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vlm_decade.core.config import ProviderConfig
from vlm_decade.models.api.gateway import Gateway
from vlm_decade.models.api.keys import Secret
from vlm_decade.models.api.providers import ChatRequest, OpenAIProvider
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig

MODEL = "gpt-4o-mini"
ENCODER = "text-embedding-3-large"
CHUNK = 64  # texts per embed call, as an encoder's batch_size


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def price(model: str) -> tuple[float, float]:
    p = ProviderConfig(rpm=1, tpm=1).price("openai", model)
    return p.input_per_mtok, p.output_per_mtok


def gateway(server: FakeAPIServer, root: Path, mode: str, per_batch: int) -> Gateway:
    cfg = ProviderConfig(
        rpm=100_000,
        tpm=10**10,
        max_concurrency=64,
        timeout_s=10,
        base_url=server.openai_url,
        budget_usd=None,
        mode=mode,
        batch_max_requests=per_batch,
        batch_poll_s=0.2,
    )
    return Gateway(
        "openai",
        cfg,
        Secret("sk-bench"),
        root / "cache",
        spend_log=root / "run" / "api" / "openai.spend.jsonl",
        run_root=root / "run",
    )


async def ask(gw: Gateway, requests: list[ChatRequest]) -> list[dict]:
    return await asyncio.gather(*[gw.chat(r) for r in requests])


async def phases(requests: list[ChatRequest], args) -> dict:
    """Both modes in one event loop (the clients' connections belong to it)."""
    out: dict = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        FakeAPIServer(
            FaultConfig(batch_delay_s=0.5, batch_expire_first=1, batch_line_fail_rate=args.fail, seed=1)
        ) as server,
    ):
        start = time.perf_counter()
        first = await ask(gateway(server, Path(tmp), "batch", args.per_batch), requests)
        server.faults = FaultConfig(batch_delay_s=0.5)
        again = await ask(gateway(server, Path(tmp), "batch", args.per_batch), requests)  # the rerun
        batch_s = time.perf_counter() - start
        lines = server.batch_lines()
        out["submitted"] = sum(len(b.lines) for b in server.batches.batches.values())
        out["answered"] = Counter(r.key for r in lines if r.outcome == "ok")
        out["lines"] = len(lines)
        out["cost_batch"] = server.billed_usd(price)
        out["batches"] = server.counts()["openai.batches.create"]
    print(
        json.dumps(
            {
                "phase": "batch",
                "first_run_errors": sum(r["status"] != "ok" for r in first),
                "rerun_ok": sum(r["status"] == "ok" for r in again),
                "batches": out["batches"],
                "seconds": round(batch_s, 1),
            }
        )
    )
    with tempfile.TemporaryDirectory() as tmp, FakeAPIServer() as server:
        start = time.perf_counter()
        sync = await ask(gateway(server, Path(tmp), "sync", args.per_batch), requests)
        print(
            json.dumps(
                {
                    "phase": "sync",
                    "ok": sum(r["status"] == "ok" for r in sync),
                    "seconds": round(time.perf_counter() - start, 1),
                }
            )
        )
        out["cost_sync"] = server.billed_usd(price)
    out["identical"] = all(
        a["text"] == b["text"] and a["input_tokens"] == b["input_tokens"] for a, b in zip(again, sync)
    )
    out["batch_s"] = batch_s
    return out


async def embed_phases(texts: list[str], args) -> dict:
    """The texts in batch mode (first run and rerun), then in sync mode on a fresh server."""
    chunks = [texts[i : i + CHUNK] for i in range(0, len(texts), CHUNK)]

    async def embed(gw: Gateway) -> list[dict]:
        if gw.cfg.mode == "batch":
            for chunk in chunks:
                await gw.submit_embeds(ENCODER, chunk)
            await gw.flush()
        return await asyncio.gather(*[gw.embed(ENCODER, chunk) for chunk in chunks])

    out: dict = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        FakeAPIServer(
            FaultConfig(batch_delay_s=0.5, batch_expire_first=1, batch_line_fail_rate=args.fail, seed=2)
        ) as server,
    ):
        await embed(gateway(server, Path(tmp), "batch", args.per_batch))
        server.faults = FaultConfig(batch_delay_s=0.5)
        again = await embed(gateway(server, Path(tmp), "batch", args.per_batch))
        lines = server.batch_lines()
        out.update(
            submitted=sum(len(b.lines) for b in server.batches.batches.values()),
            lines=len(lines),
            answered=Counter(r.key for r in lines if r.outcome == "ok"),
            batches=server.counts()["openai.batches.create"],
            cost_batch=server.billed_usd(price),
        )
    with tempfile.TemporaryDirectory() as tmp, FakeAPIServer() as server:
        sync = await embed(gateway(server, Path(tmp), "sync", args.per_batch))
        out["cost_sync"] = server.billed_usd(price)
    out["identical"] = all(all(a["ok"]) and np.array_equal(a["vectors"], b["vectors"]) for a, b in zip(again, sync))
    return out


def summary(n: int, out: dict) -> dict:
    return {
        "requests": n,
        "batches": out["batches"],
        "lines_submitted": out["submitted"],
        "lines_resubmitted": out["submitted"] - n,
        "lines_answered": out["lines"],
        "duplicate_lines": sum(k > 1 for k in out["answered"].values()),
        "answers_identical_to_sync": out["identical"],
        "cost_sync_usd": round(out["cost_sync"], 6),
        "cost_batch_usd": round(out["cost_batch"], 6),
        "cost_ratio": round(out["cost_batch"] / out["cost_sync"], 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--per-batch", type=int, default=1000)
    ap.add_argument("--texts", type=int, default=5000, help="texts to embed")
    ap.add_argument("--fail", type=float, default=0.02, help="share of batch lines that fail")
    args = ap.parse_args()
    images = [png(i % 50) for i in range(50)]
    settings = OpenAIProvider.settings(MODEL, {})
    requests = [
        ChatRequest(MODEL, f"batch benchmark question {i}", images[i % 50], settings) for i in range(args.requests)
    ]

    texts = [f"a benchmark description number {i} of a photo" for i in range(args.texts)]

    async def both():  # one event loop: the clients' connections belong to it
        return await phases(requests, args), await embed_phases(texts, args)

    out, embedded = asyncio.run(both())
    print(
        json.dumps(
            {
                **summary(args.requests, out),
                "batch_seconds": round(out["batch_s"], 1),
                "faults": {"expired_batches": 1, "line_fail_rate": args.fail},
                "embeddings": summary(args.texts, embedded),
            }
        )
    )


if __name__ == "__main__":
    main()
