"""Answers that are none: empty, cut off at the output cap (a thinking model that spent it
thinking), withheld by a safety or recitation filter. Through the real clients against the fake
server they are failed rows that say why, paid for and not cached, so the next run asks again; and
both studies score what they have, an ok answer with no text (from any backend) counted, not a crash."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from tests import required
from vlm_decade.core.config import ProviderConfig
from vlm_decade.models.api.gateway import Gateway
from vlm_decade.models.api.keys import Secret
from vlm_decade.models.api.providers import ChatRequest, GeminiProvider, OpenAIProvider
from vlm_decade.models.api.spend import read_spend
from vlm_decade.models.encoders import text_key
from vlm_decade.stages.embed import EMBEDDINGS_SCHEMA
from vlm_decade.studies.decade.score import similarity_scores
from vlm_decade.testing.fake_api import FakeAPIServer, FaultConfig, ended, scripted

from .api_clients import loop, png, run  # noqa: F401 - loop: the per-test event loop fixture

MODELS = {"openai": "gpt-5-mini", "gemini": "gemini-2.5-flash"}
# (how the fake ends, what it says) -> what the row's error says, by provider
ENDINGS = {
    ("done", ""): {"openai": "empty answer (finish_reason stop)", "gemini": "empty answer (finishReason STOP)"},
    ("cut", ""): {"openai": "finish_reason length", "gemini": "finishReason MAX_TOKENS"},
    ("cut", "A dog on a"): {"openai": "finish_reason length", "gemini": "finishReason MAX_TOKENS"},
    ("safety", ""): {"openai": "finish_reason content_filter", "gemini": "finishReason SAFETY"},
    ("recitation", ""): {"openai": "finish_reason content_filter", "gemini": "finishReason RECITATION"},
}


def gateway(server, provider, root, mode="sync") -> Gateway:
    url = server.openai_url if provider == "openai" else server.gemini_url
    cfg = ProviderConfig(rpm=6000, tpm=10**7, timeout_s=5.0, base_url=url, mode=mode, batch_poll_s=0.1)
    return Gateway(
        provider,
        cfg,
        Secret("sk-test-unfinished0123456789"),
        root / "cache",
        spend_log=root / "run" / "api" / f"{provider}.spend.jsonl",
        run_root=root / "run",
    )


def describe(gw: Gateway, prompts: list[str]) -> list[dict]:
    cls = OpenAIProvider if gw.name == "openai" else GeminiProvider
    model = MODELS[gw.name]
    reqs = [ChatRequest(model, p, png(i), cls.settings(model, {})) for i, p in enumerate(prompts)]

    async def go():
        return await asyncio.gather(*[gw.chat(r) for r in reqs])

    return run(go())


@pytest.mark.parametrize("mode", ["sync", "batch"])
@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_an_unfinished_answer_is_a_failed_row_that_says_why_and_the_next_run_asks_again(tmp_path, provider, mode):
    rules = {f"Describe {i}": ended(how, text) for i, (how, text) in enumerate(ENDINGS)}
    prompts = [*rules, "Describe fully"]
    with FakeAPIServer(FaultConfig(batch_delay_s=0.1), answer=scripted(rules)) as server:
        rows = describe(gateway(server, provider, tmp_path, mode), prompts)
        again = describe(gateway(server, provider, tmp_path, mode), prompts)
        asked = [r for r in server.received() if r.body]
    *failed, answered = rows
    assert answered["status"] == "ok" and answered["text"].startswith("A scene showing")
    for row, reason in zip(failed, ENDINGS.values()):
        assert (row["status"], row["text"]) == ("error", ""), row
        assert reason[provider] in row["error"], row["error"]
        # Bought all the same: what it cost is on the row, as the spend log has it.
        assert row["paid_usd"] == row["cost_usd"] > 0 and row["output_tokens"] > 0
    spend = read_spend(tmp_path / "run" / "api" / f"{provider}.spend.jsonl").paid
    assert sum(r["paid_usd"] for r in rows + again) == pytest.approx(spend)
    # The next run takes the answer from the cache and asks again for each failed one.
    assert again[-1]["cached"] and [r["status"] for r in again[:-1]] == ["error"] * len(ENDINGS)
    assert len(asked) == len(prompts) + len(ENDINGS)


@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize(
    "model,thinking",
    [("gemini-2.5-flash", {"thinkingBudget": 1024}), ("gemini-3-pro-preview", {"thinkingLevel": "LOW"})],
)
def test_a_gemini_batch_sends_the_thinking_settings_as_a_sync_request_does(
    tmp_path, monkeypatch, model, thinking, inline
):
    # The client sends a ThinkingConfig with its Python names (thinking_budget) unless told the REST
    # ones; an uploaded batch file is written by hand. Both now read as the API documents them.
    from vlm_decade.models.api.batch import gemini_batches

    if not inline:
        monkeypatch.setattr(gemini_batches, "GEMINI_INLINE_BYTES", 100)
    monkeypatch.setitem(MODELS, "gemini", model)
    with FakeAPIServer(FaultConfig(batch_delay_s=0.1)) as server:
        rows = describe(gateway(server, "gemini", tmp_path / "batch", "batch"), ["Describe"])
        describe(gateway(server, "gemini", tmp_path / "sync"), ["Describe"])
        counts = server.counts()
        batch_line, sync = [json.loads(r.body) for r in server.received() if r.body]
    assert rows[0]["status"] == "ok" and counts["gemini.files.upload"] == (0 if inline else 1)
    config = {"maxOutputTokens": 2000, "temperature": 0.0, "thinkingConfig": thinking}
    assert batch_line["generationConfig"] == sync["generationConfig"] == config


TEXTS = {  # text -> vector: every cosine to the gold standard is 1, -1 or 0
    "gold one": [1.0, 0.0],
    "top a": [1.0, 0.0],
    "model says": [-1.0, 0.0],
    "gold two": [0.0, 1.0],
    "other says": [0.0, 2.0],
}


def study_a_tables(responses: list[tuple[str, str, str, str]]):
    images = pa.table({"image_id": ["i1", "i2"], "dataset": ["d", "d"]})
    refs = pa.table(
        {
            "image_id": ["i1", "i1", "i2", "i2"],
            "condition": ["full"] * 4,
            "role": ["gold", "top", "gold", "top"],
            "text": ["gold one", "top a", "gold two", "  "],  # a blank human description too
        }
    )
    subject, image_id, status, text = zip(*responses)
    table = pa.table(
        {"subject": subject, "image_id": image_id, "variant": ["full"] * len(text), "status": status, "text": text}
    )
    emb = pa.Table.from_pylist(
        [
            {"text_sha256": text_key(t), "encoder": "E", "encoder_key": "k", "dim": 2, "vector": np.float32(v)}
            for t, v in TEXTS.items()
        ],
        schema=EMBEDDINGS_SCHEMA,
    )
    return images, refs, table, emb


def test_study_a_scores_what_it_has_and_counts_the_ok_answers_with_no_text():
    # A failed row (its reason said), an ok answer of no text (an imported file, a local model) and
    # one of blanks: none has a vector; the scores are those of the answers that say something.
    responses = [
        ("m", "i1", "ok", "model says"),
        ("m", "i2", "error", ""),
        ("n", "i1", "ok", ""),
        ("n", "i2", "ok", "other says"),
        ("o", "i1", "ok", " \n"),
    ]
    unscored: Counter = Counter()
    scores = similarity_scores(*study_a_tables(responses), ["E"], unscored=unscored)
    got = {(r["subject"], r["image_id"]): r["value"] for r in scores.to_pylist()}
    assert got == pytest.approx({("m", "i1"): -1.0, ("n", "i2"): 1.0, ("human:top", "i1"): 1.0})
    assert unscored == {"n": 1, "o": 1}


def test_study_b_scores_what_it_has_judges_nothing_empty_and_counts_the_ok_answers_with_no_text():
    required.module("spacy")
    from vlm_decade.studies.openworld.judging import pairs_to_judge
    from vlm_decade.studies.openworld.metrics import load_nlp
    from vlm_decade.studies.openworld.scoring import blank_answers, score_predictions

    from .test_openworld_scoring import CS_HIGH, LABELS, LI_HIGH, HandEncoder, response

    responses = pa.Table.from_pylist(
        [
            response("m", "i1", "p1", "a red bird"),
            response("m", "i2", "p1", "", status="error"),  # cut off, say: its reason is the row's error
            response("n", "i1", "p1", ""),  # ok, and nothing said
            response("n", "i2", "p1", "  "),
        ]
    )
    encoder = HandEncoder()
    _, predictions = score_predictions(LABELS, responses, None, encoder, load_nlp(), CS_HIGH, LI_HIGH)
    assert [(p["subject"], p["image_id"]) for p in predictions.to_pylist()] == [("m", "i1")]
    assert "" not in {t for call in encoder.calls for t in call}
    assert pairs_to_judge(LABELS, responses) == [("scarlet tanager", "a red bird", ())]
    assert blank_answers(responses) == {"n": 2}
