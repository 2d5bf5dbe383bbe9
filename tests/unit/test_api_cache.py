"""Two runs sharing one API cache folder at once leave only whole files: each answer file is one of
the two runs' answers, entire, and no temporary file is left behind. Identical requests in flight at
once are bought once: the others wait for its answer and are recorded as reuses, as cache hits are."""

import asyncio
import json
import multiprocessing

from vlm_decade.core.config import ProviderConfig
from vlm_decade.models.api.cache import ResponseCache
from vlm_decade.models.api.gateway import Gateway
from vlm_decade.models.api.keys import Secret
from vlm_decade.models.api.providers import ChatRequest, OpenAIProvider
from vlm_decade.models.api.spend import read_spend
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig

from .api_clients import loop, png  # noqa: F401 - loop: the per-test event loop fixture
from .api_clients import run as drive

KEYS = [f"{i:064x}" for i in range(300)]


def _writer(root: str, who: str, start) -> None:
    start.wait()
    cache = ResponseCache(root)
    for key in KEYS:
        cache.put("chat", key, {"text": f"answer of {who} " + "x" * 2000, "who": who})


def test_two_runs_writing_the_same_answers_at_once_leave_whole_files(tmp_path):
    context = multiprocessing.get_context("fork")
    start = context.Event()
    runs = [context.Process(target=_writer, args=(str(tmp_path), who, start)) for who in ("a", "b")]
    for run in runs:
        run.start()
    start.set()
    for run in runs:
        run.join(timeout=120)
        assert run.exitcode == 0
    cache = ResponseCache(tmp_path)
    for key in KEYS:
        entry = json.loads(cache.path("chat", key).read_bytes())
        assert entry["text"] == f"answer of {entry['who']} " + "x" * 2000
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == len(KEYS) and all(p.suffix == ".json" for p in files)


def gateway(server, tmp_path) -> Gateway:
    cfg = ProviderConfig(rpm=6000, tpm=10**7, timeout_s=5.0, base_url=server.openai_url)
    return Gateway("openai", cfg, Secret("sk-test"), tmp_path / "cache", spend_log=tmp_path / "spend.jsonl")


def request(prompt: str) -> ChatRequest:
    return ChatRequest("gpt-4o-mini", prompt, png(7), OpenAIProvider.settings("gpt-4o-mini", {}))


def test_identical_requests_in_flight_at_once_reach_the_server_once_and_are_paid_once(tmp_path):
    with FakeAPIServer(FaultConfig(latency_s=0.3)) as server:
        gw = gateway(server, tmp_path)
        rows = drive(asyncio.gather(*(gw.chat(request("same")) for _ in range(8)), gw.chat(request("other"))))
        assert server.counts()["openai.chat"] == 2  # "same" once, "other" once
    same = rows[:8]
    bought = [r for r in same if not r["cached"]]
    assert len(bought) == 1 and bought[0]["paid_usd"] == bought[0]["cost_usd"] > 0
    assert all(r["status"] == "ok" and r["text"] == bought[0]["text"] for r in same)
    shared = [r for r in same if r["cached"]]
    assert all(r["paid_usd"] == 0.0 and r["cost_usd"] == bought[0]["cost_usd"] for r in shared)
    assert all(r["queued_s"] >= 0.0 and r["latency_s"] == bought[0]["latency_s"] for r in shared)
    # The rows' payments are what the spend log charged.
    assert sum(r["paid_usd"] for r in rows) == read_spend(tmp_path / "spend.jsonl").paid
    assert gw.report()["shared"] == 7


def test_a_cancelled_sender_leaves_an_identical_request_to_send_itself(tmp_path):
    async def cancel_the_first(gw):
        first = asyncio.ensure_future(gw.chat(request("same")))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(gw.chat(request("same")))
        await asyncio.sleep(0.05)
        first.cancel()
        return await second

    with FakeAPIServer(FaultConfig(latency_s=0.3)) as server:
        row = drive(cancel_the_first(gateway(server, tmp_path)))
        assert server.counts()["openai.chat"] == 2  # the cancelled attempt, then the second's own
    assert row["status"] == "ok" and not row["cached"] and row["paid_usd"] > 0
