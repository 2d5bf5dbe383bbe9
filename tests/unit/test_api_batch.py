"""Batch mode through the gateway with the real clients against the fake server's batch protocols
(OpenAI Files + Batches, Gemini batch mode): the same answers as sync mode at half the price, the
same cache, failed lines and expired batches resubmitted alone, and pending batches collected by a
later gateway instead of being submitted again."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from vlm_decade.core.config import ProviderConfig
from vlm_decade.models.api.batch import BATCH_DISCOUNT
from vlm_decade.models.api.gateway import Gateway
from vlm_decade.models.api.keys import Secret
from vlm_decade.models.api.providers import ChatRequest, GeminiProvider, OpenAIProvider
from vlm_decade.models.api.spend import read_spend
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig, chat_text

from .api_clients import loop, png, run  # noqa: F401 - loop: the per-test event loop fixture

MODELS = {"openai": "gpt-4o-mini", "gemini": "gemini-2.0-flash"}


def gateway(server, provider, root, mode="batch", wait=True, cache=None, **limits) -> Gateway:
    """A gateway for the run folder `root/run` with the cache folder `root/cache` (or `cache`)."""
    url = server.openai_url if provider == "openai" else server.gemini_url
    cfg = ProviderConfig(
        **{"rpm": 6000, "tpm": 10**8, "timeout_s": 5.0, "base_url": url, "mode": mode, "batch_poll_s": 0.1, **limits}
    )
    return Gateway(
        provider,
        cfg,
        Secret("sk-test-batch0123456789"),
        cache or root / "cache",
        spend_log=root / "run" / "api" / f"{provider}.spend.jsonl",
        run_root=root / "run",
        batch_wait=wait,
    )


def requests(provider: str, n: int, tag: str = "q") -> list[ChatRequest]:
    cls = OpenAIProvider if provider == "openai" else GeminiProvider
    model = MODELS[provider]
    return [ChatRequest(model, f"{tag} {i}", png(i, (32, 40)), cls.settings(model, {})) for i in range(n)]


def ask(gw: Gateway, reqs: list[ChatRequest]) -> list[dict]:
    async def go():
        return await asyncio.gather(*[gw.chat(r) for r in reqs])

    return run(go())


def price(provider: str):
    def of(model: str):
        p = ProviderConfig(rpm=1, tpm=1).price(provider, model)
        return p.input_per_mtok, p.output_per_mtok

    return of


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_batch_answers_are_the_sync_answers_at_half_the_price_and_share_the_cache(tmp_path, provider):
    reqs = requests(provider, 6)
    with FakeAPIServer(FaultConfig(batch_delay_s=0.2)) as server:
        batch = ask(gateway(server, provider, tmp_path / "b"), reqs)
        sync = ask(gateway(server, provider, tmp_path / "s", mode="sync"), reqs)
        lines = server.batch_lines()
        assert server.counts()[f"{provider}.batches.create"] == 1 and len(lines) == 6  # one batch, one line each
        # Bought in batch, a sync run of the same cache answers from it, and the reverse.
        again_sync = ask(gateway(server, provider, tmp_path / "b", mode="sync"), reqs)
        again_batch = ask(gateway(server, provider, tmp_path / "s"), reqs)
        assert len(server.batch_lines()) == 6 and server.counts()[f"{provider}.batches.create"] == 1
        billed = server.billed_usd(price(provider), provider=provider)
    assert [r["text"] for r in batch] == [chat_text(r.prompt, [r.image_png]) for r in reqs] == [r["text"] for r in sync]
    assert [(r["input_tokens"], r["output_tokens"]) for r in batch] == [
        (r["input_tokens"], r["output_tokens"]) for r in sync
    ]
    assert [r["cost_usd"] for r in batch] == pytest.approx([BATCH_DISCOUNT * r["cost_usd"] for r in sync])
    assert {r["mode"] for r in batch} == {"batch"} and {r["mode"] for r in sync} == {"sync"}
    assert all(r["cached"] for r in again_sync + again_batch)
    assert [r["mode"] for r in again_sync] == ["batch"] * 6 and [r["mode"] for r in again_batch] == ["sync"] * 6
    spent = read_spend(tmp_path / "b" / "run" / "api" / f"{provider}.spend.jsonl")
    assert spent.paid == pytest.approx(sum(r["cost_usd"] for r in batch)) and spent.unresolved == 0
    assert billed == pytest.approx(sum(r["cost_usd"] for r in batch + sync))


def test_failed_lines_are_error_rows_and_a_later_run_resubmits_only_them(tmp_path):
    reqs = requests("openai", 12)
    with FakeAPIServer(FaultConfig(batch_delay_s=0.1, batch_line_fail_rate=0.4, seed=5)) as server:
        first = ask(gateway(server, "openai", tmp_path), reqs)
        failed = {r.prompt for r, a in zip(reqs, first) if a["status"] == "error"}
        assert (
            failed and len(failed) < 12 and all("batch line 500" in a["error"] for a in first if a["status"] == "error")
        )
        server.faults = FaultConfig(batch_delay_s=0.1)
        second = ask(gateway(server, "openai", tmp_path), reqs)
        lines = server.batch_lines()
    assert {r["status"] for r in second} == {"ok"}
    assert len(lines) == 12 + len(failed) and server.counts()["openai.batches.create"] == 2
    resent = [r.key for r in lines[12:]]
    keys_failed = {r.key for r in lines[:12] if r.outcome != "ok"}
    assert set(resent) == keys_failed  # the second batch holds the failed lines and nothing else


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_an_expired_batch_resubmits_only_what_it_did_not_reach(tmp_path, provider):
    reqs = requests(provider, 8)
    with FakeAPIServer(FaultConfig(batch_delay_s=0.1, batch_expire_first=1)) as server:
        rows = ask(gateway(server, provider, tmp_path), reqs)
        lines = server.batch_lines()
        batches = server.counts()[f"{provider}.batches.create"]
    assert {r["status"] for r in rows} == {"ok"} and batches == 2
    first = [r for r in lines if r.batch == lines[0].batch]
    second = [r for r in lines if r.batch != lines[0].batch]
    assert len(first) == 4 and len(second) == 4 and {r.key for r in first}.isdisjoint(r.key for r in second)


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_a_batch_that_fails_validation_gives_error_rows_and_a_later_run_submits_it_again(tmp_path, provider):
    """A failed batch ran no line and would fail again if resubmitted at once: its requests are
    error rows saying why, and the next run sends them (here in a batch that succeeds)."""
    reqs = requests(provider, 4)
    with FakeAPIServer(FaultConfig(batch_delay_s=0.4, batch_fail_first=1)) as server:
        first = ask(gateway(server, provider, tmp_path), reqs)
        assert server.counts()[f"{provider}.batches.create"] == 1 and not server.batch_lines()
        again = ask(gateway(server, provider, tmp_path), reqs)
        assert server.counts()[f"{provider}.batches.create"] == 2 and len(server.batch_lines()) == 4
    # google-genai passes on no reason for a failed Gemini batch
    why = (
        "failed (invalid_request: the input file failed validation)"
        if provider == "openai"
        else "failed (no reason given)"
    )
    assert {r["status"] for r in first} == {"error"} and f"{why}; a later run sends it again" in first[0]["error"]
    assert {r["status"] for r in again} == {"ok"}
    assert read_spend(tmp_path / "run" / "api" / f"{provider}.spend.jsonl").unresolved == 0


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_a_later_gateway_collects_pending_batches_instead_of_submitting_again(tmp_path, provider):
    reqs = requests(provider, 5)
    with FakeAPIServer(FaultConfig(batch_delay_s=1.0)) as server:
        first = ask(gateway(server, provider, tmp_path, wait=False), reqs)
        assert {r["status"] for r in first} == {"pending"} and "a later run collects it" in first[0]["error"]
        log = tmp_path / "run" / "api" / f"{provider}.spend.jsonl"
        assert read_spend(log).unresolved > 0  # sent, not yet paid: counted at worst against the budget
        rows = ask(gateway(server, provider, tmp_path), reqs)  # the same run folder, again
        assert server.counts()[f"{provider}.batches.create"] == 1 and len(server.batch_lines()) == 5
        elsewhere = ask(
            gateway(server, provider, tmp_path / "other", cache=tmp_path / "cache"), reqs
        )  # another run folder
        assert server.counts()[f"{provider}.batches.create"] == 1 and all(r["cached"] for r in elsewhere)
    assert {r["status"] for r in rows} == {"ok"} and [r["text"] for r in rows] == [
        chat_text(r.prompt, [r.image_png]) for r in reqs
    ]
    spend = read_spend(log)
    assert spend.unresolved == 0 and spend.paid == pytest.approx(sum(r["cost_usd"] for r in rows))


def describe_in_waves(gw: Gateway, reqs: list[ChatRequest], pause_s: float, wave: int = 3) -> list[dict]:
    """The describe stage's two steps: a few requests submitted at a time (its Ray tasks in turn, a
    pause apart), then the answers of those that wait."""

    async def go():
        answers = []
        for i in range(0, len(reqs), wave):
            answers += await asyncio.gather(*[gw.submit(r, True) for r in reqs[i : i + wave]])
            await asyncio.sleep(pause_s)
        await gw.flush()
        return [await gw.result(a["key"]) if a["status"] == "queued" else a for a in answers]

    return run(go())


def killed_waiting(gw: Gateway, reqs: list[ChatRequest]) -> None:
    """A run that dies once its batch is submitted, waiting for it: nothing after is recorded."""

    async def go():
        for r in reqs:
            await gw.submit(r, True)
        await gw.flush()
        for poller in gw.batch.pollers.values():
            poller.cancel()

    run(go())


@pytest.mark.parametrize("provider", ["openai", "gemini"])
@pytest.mark.parametrize(
    "batch_s, before_s, kill",
    [(0.3, 0.6, False), (0.8, 0.0, False), (2.5, 0.0, False), (0.3, 0.6, True), (1.2, 0.0, True)],
    ids=["done-before-the-rerun", "done-while-it-asks", "done-after-it-asked", "killed-done-before", "killed"],
)
def test_rows_say_what_was_paid_whenever_their_batch_is_collected(tmp_path, provider, batch_s, before_s, kill):
    """Batches a run left (it did not wait, or it was killed waiting) are collected by the next run
    of the folder, done before its requests come, while they come or after: every answer is a row
    that paid for it (not cached), a request asked twice pays once, and the rows sum to the spend
    log."""
    reqs = requests(provider, 10)
    asked = reqs + reqs[:1]  # the same request twice
    with FakeAPIServer(FaultConfig(batch_delay_s=batch_s)) as server:
        if kill:
            killed_waiting(gateway(server, provider, tmp_path), reqs)
        else:
            first = describe_in_waves(gateway(server, provider, tmp_path, wait=False), reqs, pause_s=0.0)
            assert {r["status"] for r in first} == {"pending"}
        time.sleep(before_s)
        rows = describe_in_waves(gateway(server, provider, tmp_path), asked, pause_s=0.15)
        assert server.counts()[f"{provider}.batches.create"] == 1 and len(server.batch_lines()) == 10
    assert {r["status"] for r in rows} == {"ok"}
    assert [r["cached"] for r in rows] == [False] * 10 + [True] and all(r["paid_usd"] > 0 for r in rows[:10])
    spend = read_spend(tmp_path / "run" / "api" / f"{provider}.spend.jsonl")
    assert spend.unresolved == 0 and sum(r["paid_usd"] for r in rows) == pytest.approx(spend.paid)


def test_pending_batches_are_picked_up_by_a_run_folder_elsewhere_that_shares_the_cache(tmp_path):
    reqs = requests("openai", 4)
    with FakeAPIServer(FaultConfig(batch_delay_s=1.0)) as server:
        ask(gateway(server, "openai", tmp_path / "a", cache=tmp_path / "cache", wait=False), reqs)
        rows = ask(gateway(server, "openai", tmp_path / "b", cache=tmp_path / "cache"), reqs)
        assert server.counts()["openai.batches.create"] == 1 and len(server.batch_lines()) == 4
    assert {r["status"] for r in rows} == {"ok"}


def test_a_submission_cut_off_before_its_id_was_recorded_is_found_by_its_label(tmp_path):
    reqs = requests("openai", 3)
    # The batch stays unfinished while the first gateway looks at it (one that found it done would
    # collect it then, and the second would have nothing to look for); the second waits for it.
    with FakeAPIServer(FaultConfig(batch_delay_s=600.0)) as server:
        gw = gateway(server, "openai", tmp_path, wait=False)
        saved = gw.batch.records.save

        def forget_the_id(record):  # the process dies right after the provider accepted the batch
            saved({**record, "id": None, "state": "creating"} if record["state"] == "submitted" else record)

        gw.batch.records.save = forget_the_id
        ask(gw, reqs)
        server.faults = FaultConfig(batch_delay_s=0.1)
        rows = ask(gateway(server, "openai", tmp_path), reqs)
        assert server.counts()["openai.batches.create"] == 1 and server.counts()["openai.batches.list"] == 1
    assert {r["status"] for r in rows} == {"ok"}


# embeddings ------------------------------------------------------------------------------------
EMBED_MODELS = {"openai": "text-embedding-3-large", "gemini": "gemini-embedding-001"}


def texts(n: int, tag: str = "a photo of") -> list[str]:
    return [f"{tag} thing {i}" for i in range(n)]


def embed(gw: Gateway, provider: str, chunks: list[list[str]], batch: bool | None = None) -> list[dict]:
    """The embed stage's two steps: queue every text, then collect each chunk's vectors."""

    async def go():
        if batch is not False and (batch or gw.cfg.mode == "batch"):
            for chunk in chunks:
                await gw.submit_embeds(EMBED_MODELS[provider], chunk)
            await gw.flush()
        return await asyncio.gather(*[gw.embed(EMBED_MODELS[provider], chunk, batch) for chunk in chunks])

    return run(go())


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_batch_vectors_are_the_sync_vectors_at_half_the_price_and_share_the_cache(tmp_path, provider):
    chunks = [texts(5), texts(4, "a drawing of")]
    with FakeAPIServer(FaultConfig(batch_delay_s=0.2)) as server:
        batch = embed(gateway(server, provider, tmp_path / "b"), provider, chunks)
        sync = embed(gateway(server, provider, tmp_path / "s", mode="sync"), provider, chunks)
        lines = server.batch_lines()
        assert (
            server.counts()[f"{provider}.batches.create"] == 1 and len(lines) == 9
        )  # one embedding batch, a line a text
        assert sorted(r.endpoint for r in lines) == [f"{provider}.batch_line"] * 9
        again = embed(
            gateway(server, provider, tmp_path / "b", mode="sync"), provider, chunks
        )  # bought in batch: cached
        assert (
            len(server.batch_lines()) == 9
            and sum(server.counts()[e] for e in ("openai.embeddings", "gemini.embed")) == 2
        )
    for b, s, a in zip(batch, sync, again):
        assert all(b["ok"]) and not b["failures"] and a["paid_usd"] == 0.0
        np.testing.assert_array_equal(b["vectors"], s["vectors"])
        np.testing.assert_array_equal(a["vectors"], s["vectors"])
    assert sum(b["paid_usd"] for b in batch) == pytest.approx(BATCH_DISCOUNT * sum(s["paid_usd"] for s in sync))
    spent = read_spend(tmp_path / "b" / "run" / "api" / f"{provider}.spend.jsonl")
    assert spent.paid == pytest.approx(sum(b["paid_usd"] for b in batch)) and spent.by_mode == {
        "batch": pytest.approx(spent.paid)
    }


def test_a_failed_embedding_line_fails_its_text_alone_and_a_later_run_resubmits_only_it(tmp_path):
    chunk = texts(12)
    with FakeAPIServer(FaultConfig(batch_delay_s=0.1, batch_line_fail_rate=0.4, seed=3)) as server:
        first = embed(gateway(server, "openai", tmp_path), "openai", [chunk])[0]
        n_failed = len(first["failures"])
        assert 0 < n_failed < 12 and first["vectors"].shape == (12 - n_failed, 3072)
        assert {status for status, _ in first["failures"]} == {"error"} and "batch line 500" in first["failures"][0][1]
        server.faults = FaultConfig(batch_delay_s=0.1)
        second = embed(gateway(server, "openai", tmp_path), "openai", [chunk])[0]
        lines = server.batch_lines()
    assert all(second["ok"]) and len(lines) == 12 + n_failed
    assert {r.key for r in lines[12:]} == {r.key for r in lines[:12] if r.outcome != "ok"}
    ok = [i for i, good in enumerate(first["ok"]) if good]
    np.testing.assert_array_equal(first["vectors"], second["vectors"][ok])


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_an_expired_embedding_batch_resubmits_only_the_texts_it_did_not_reach(tmp_path, provider):
    """Gemini answers an embedding batch in the order of its requests: the vectors of the half it
    reached must land on their own texts."""
    chunk = texts(8)
    with FakeAPIServer(FaultConfig(batch_delay_s=0.1, batch_expire_first=1)) as server:
        out = embed(gateway(server, provider, tmp_path), provider, [chunk])[0]
        sync = embed(gateway(server, provider, tmp_path / "sync", mode="sync"), provider, [chunk])[0]
        lines = server.batch_lines()
    first = [r for r in lines if r.batch == lines[0].batch]
    assert all(out["ok"]) and len(first) == 4 and len(lines) == 8
    np.testing.assert_array_equal(out["vectors"], sync["vectors"])


def test_texts_left_in_a_pending_embedding_batch_are_collected_in_sync_mode(tmp_path):
    chunk = texts(6)
    with FakeAPIServer(FaultConfig(batch_delay_s=1.0)) as server:
        first = embed(gateway(server, "gemini", tmp_path, wait=False), "gemini", [chunk])[0]
        assert first["vectors"] is None and {s for s, _ in first["failures"]} == {"pending"}
        rows = embed(gateway(server, "gemini", tmp_path, mode="sync"), "gemini", [chunk + ["one more text"]])[0]
        assert server.counts()["gemini.batches.create"] == 1 and len(server.batch_lines()) == 6
        assert server.counts()["gemini.embed"] == 1  # only the new text is sent one by one
    assert all(rows["ok"]) and rows["vectors"].shape == (7, 3072)


# cancelling ------------------------------------------------------------------------------------
@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_a_cancelled_batch_keeps_what_it_answered_and_leaves_the_rest_to_a_later_run(tmp_path, provider):
    """Cancelled halfway through its time, a batch has about half its lines answered: those are
    cached and paid; the rest is resubmitted by no one, and a later gateway in sync mode sends
    exactly those."""

    from vlm_decade.models.api.batch import run_batch_labels

    reqs = requests(provider, 10)
    with FakeAPIServer(FaultConfig(batch_delay_s=4.0)) as server:
        first = ask(gateway(server, provider, tmp_path, wait=False), reqs)
        assert {r["status"] for r in first} == {"pending"}
        time.sleep(2.0)
        labels = run_batch_labels(tmp_path / "run", provider)
        done = run(gateway(server, provider, tmp_path).batch.cancel(labels))
        answered = {r.key for r in server.batch_lines()}
        assert (
            done == {"batches": 1, "answered": len(answered), "dropped": 10 - len(answered), "unknown": 0}
            and 0 < len(answered) < 10
        )
        assert run_batch_labels(tmp_path / "run", provider) == []  # nothing pending: no run collects it again
        later = ask(gateway(server, provider, tmp_path, mode="sync"), reqs)
        sent_one_by_one = server.counts()["openai.chat" if provider == "openai" else "gemini.generate"]
        assert server.counts()[f"{provider}.batches.create"] == 1 and len(server.batch_lines()) == len(answered)
    assert sent_one_by_one == 10 - len(answered) and {r["status"] for r in later} == {"ok"}
    assert sorted(r["mode"] for r in later) == sorted(["batch"] * len(answered) + ["sync"] * (10 - len(answered)))
    spend = read_spend(tmp_path / "run" / "api" / f"{provider}.spend.jsonl")
    assert spend.unresolved == 0 and spend.by_mode["batch"] == pytest.approx(
        sum(r["cost_usd"] for r in later if r["mode"] == "batch")
    )


def test_a_gemini_batch_too_large_to_inline_goes_as_an_uploaded_file(tmp_path, monkeypatch):
    """Over the inline limit (made small here) the requests go as a JSONL file through the Files
    API, and the answers come back as a file: the same answers as sync mode, an expired file batch
    resubmitting only what it did not reach."""
    from vlm_decade.models.api.batch import gemini_batches

    monkeypatch.setattr(gemini_batches, "GEMINI_INLINE_BYTES", 2_000)  # a request with its PNG is about 4 KB
    reqs = requests("gemini", 6)
    with FakeAPIServer(FaultConfig(batch_delay_s=0.2, batch_expire_first=1)) as server:
        rows = ask(gateway(server, "gemini", tmp_path), reqs)
        sync = ask(gateway(server, "gemini", tmp_path / "sync", mode="sync"), reqs)
        counts, lines = server.counts(), server.batch_lines()
    assert (
        counts["gemini.files.upload"] == 2
        and counts["gemini.files.download"] == 2
        and counts["gemini.batches.create"] == 2
    )
    assert (
        len(lines) == 6 and len({r.key for r in lines}) == 6
    )  # three reached before the expiry, three in the second batch
    assert [r["text"] for r in rows] == [r["text"] for r in sync] == [chat_text(r.prompt, [r.image_png]) for r in reqs]
    assert [(r["input_tokens"], r["output_tokens"]) for r in rows] == [
        (r["input_tokens"], r["output_tokens"]) for r in sync
    ]
    assert [r["cost_usd"] for r in rows] == pytest.approx([BATCH_DISCOUNT * r["cost_usd"] for r in sync])


@pytest.mark.parametrize("damage", [b'{"label": "vlm_decade-ab", "state": "subm', b'{"label": "vlm_decade-ab"}'])
def test_a_damaged_batch_record_in_the_run_folder_is_named_not_a_traceback(tmp_path, damage):
    """`status` and `cancel` read the run folder's batch records: a truncated or incomplete one is
    an input error that names the file."""
    from vlm_decade.core.errors import InputError
    from vlm_decade.models.api.batch import run_batch_labels, run_batches

    record = tmp_path / "api" / "batches" / "openai" / "vlm_decade-ab.json"
    record.parent.mkdir(parents=True)
    record.write_bytes(damage)
    for read in (lambda: run_batches(tmp_path), lambda: run_batch_labels(tmp_path, "openai")):
        with pytest.raises(InputError) as caught:
            read()
        (problem,) = caught.value.problems
        assert problem.file == str(record) and "damaged batch record" in problem.message
