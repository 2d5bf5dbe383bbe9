"""The LI judge: a tiny local Llama answers as a hand-written greedy loop over the chat template
does, whatever the batching; missing weights and keys are reported before any work; text-only chat
requests reach the fake OpenAI and Gemini servers with no image and keep image requests' cache keys
as they were."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil

import pytest
import torch

from tests import hf_tiny
from vlm_decade.core.config import ProviderConfig, ProvidersConfig
from vlm_decade.core.errors import InputError
from vlm_decade.models.api.gateway import Gateway
from vlm_decade.models.api.keys import Secret
from vlm_decade.models.api.providers import ChatRequest, GeminiProvider, OpenAIProvider, chat_key, text_tokens
from vlm_decade.studies.openworld.config import JudgeConfig
from vlm_decade.studies.openworld.judge import JudgeAnswer, LocalJudge, judge_available, judge_settings
from vlm_decade.testing.fake_api import FakeAPIServer, scripted

PROMPTS = [
    "label : bird , prediction : scarlet tanager . reply only 1 or 0",
    "label : cat",
    "what is in the photo ?",
    "a",
    "label : dog , prediction : a red dog on the table with a cup",
    "yes",
    "no no no",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return hf_tiny.save_causal_lm(tmp_path_factory.mktemp("judge") / "lm")


@pytest.fixture(scope="module")
def judge(folder):
    return LocalJudge(JudgeConfig(model_id="tiny/judge", path=folder, batch_size=4))


def greedy_by_hand(folder, prompt: str, max_new_tokens: int = 16) -> tuple[str, int, int]:
    """(text, input tokens, output tokens): the tiny template written out, then argmax one token at
    a time until the end-of-sequence token or the cap."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(folder)
    net = LlamaForCausalLM.from_pretrained(folder).eval()
    ids = tok(f"user : {prompt} assistant :", add_special_tokens=False)["input_ids"]
    new: list[int] = []
    with torch.inference_mode():
        while len(new) < max_new_tokens and (not new or new[-1] != tok.eos_token_id):
            logits = net(torch.tensor([ids + new])).logits[0, -1]
            new.append(int(logits.argmax()))
    return tok.decode(new, skip_special_tokens=True).strip(), len(ids), len(new)


def test_answers_equal_a_greedy_loop_by_hand(folder, judge):
    answers = judge.judge(PROMPTS)
    for prompt, answer in zip(PROMPTS, answers):
        text, n_in, n_out = greedy_by_hand(folder, prompt)
        assert (answer.text, answer.input_tokens, answer.output_tokens) == (text, n_in, n_out), prompt
        assert answer.status == "ok" and answer.model_version == "tiny/judge"
    # The random model must tell prompts apart, and some answers must stop early at the
    # end-of-sequence token while others in the same batch run to the cap.
    assert len({a.text for a in answers}) == len(PROMPTS)
    assert {a.output_tokens for a in answers} > {16} and min(a.output_tokens for a in answers) < 16


def test_a_batch_answers_as_its_prompts_one_by_one_and_repeats(folder, judge):
    batched = judge.judge(PROMPTS)  # batches of 4: left padding inside each
    one_by_one = [judge.judge([p])[0] for p in PROMPTS]
    whole = LocalJudge(JudgeConfig(model_id="tiny/judge", path=folder, batch_size=len(PROMPTS))).judge(PROMPTS[::-1])[
        ::-1
    ]
    assert batched == one_by_one == whole
    assert judge.judge(PROMPTS) == batched  # greedy: the same answers every time


def test_repeated_prompts_are_answered_once_and_in_order(judge, monkeypatch):
    seen: list[list[str]] = []
    run = judge._run
    monkeypatch.setattr(judge, "_run", lambda prompts: seen.append(prompts) or run(prompts))
    answers = judge.judge(["a", "yes", "a", "a"])
    assert sorted(p for batch in seen for p in batch) == ["a", "yes"]
    assert answers[0] == answers[2] == answers[3] != answers[1]


def test_a_failing_prompt_fails_alone(folder, judge, monkeypatch):
    run = judge._run

    def fragile(prompts):
        if "boom" in prompts:
            raise RuntimeError("the model broke")
        return run(prompts)

    monkeypatch.setattr(judge, "_run", fragile)
    answers = judge.judge(["a", "boom", "yes"])
    assert [a.status for a in answers] == ["ok", "error", "ok"]
    assert answers[1] == JudgeAnswer("", "error", "RuntimeError: the model broke", model_version="tiny/judge")
    assert answers[0].text == greedy_by_hand(folder, "a")[0]


def test_an_uncached_hub_id_offline_is_named_before_any_work(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = JudgeConfig(model_id="nobody/no-such-judge")
    reason = judge_available(config, ProvidersConfig())
    assert "LI judge: nobody/no-such-judge is not in the Hugging Face cache and HF_HUB_OFFLINE is set" in reason
    with pytest.raises(InputError, match="nobody/no-such-judge is not in the Hugging Face cache"):
        LocalJudge(config)


def test_a_missing_path_bad_options_and_a_model_without_chat_template_are_refused(folder, tmp_path):
    assert "is not a folder" in judge_available(JudgeConfig(path=tmp_path / "nowhere"), ProvidersConfig())
    with pytest.raises(InputError, match="unknown hf-judge option 'beams'"):
        LocalJudge(JudgeConfig(path=folder, options={"beams": 2}))
    assert judge_available(JudgeConfig(path=folder), ProvidersConfig()) is None
    plain = shutil.copytree(folder, tmp_path / "plain")
    (plain / "chat_template.jinja").unlink()  # a base model's tokenizer: no chat template
    with pytest.raises(InputError, match="no chat template"):
        LocalJudge(JudgeConfig(path=plain))


# API judges: settings, availability, text-only requests -----------------------------------------
@pytest.mark.parametrize(
    "backend,model_id,options,expected",
    [
        ("openai", "gpt-4o-mini", {}, {"max_output_tokens": 16, "temperature": 0.0}),
        ("openai", "o3", {}, {"max_output_tokens": 2000, "reasoning_effort": "low"}),  # reasoning tokens need room
        ("openai", "gpt-4o", {"max_output_tokens": 4}, {"max_output_tokens": 4, "temperature": 0.0}),
        ("gemini", "gemini-2.0-flash", {}, {"max_output_tokens": 16, "temperature": 0.0}),
        (
            "gemini",
            "gemini-2.5-flash",
            {"thinking_budget": 0},
            {"max_output_tokens": 2000, "temperature": 0.0, "thinking_budget": 0},
        ),
        (
            "gemini",
            "gemini-3-pro-preview",
            {},
            {"max_output_tokens": 2000, "temperature": 0.0, "thinking_level": "low"},
        ),
    ],
)
def test_api_judge_settings_cap_output_at_16_unless_the_model_reasons(backend, model_id, options, expected):
    assert judge_settings(JudgeConfig(backend=backend, model_id=model_id, options=options)) == expected


def test_an_api_judge_needs_a_key_and_a_price(monkeypatch):
    for var in ("OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    providers = ProvidersConfig()
    assert "needs an API key: set GEMINI_API_KEY or GOOGLE_API_KEY" in judge_available(
        JudgeConfig(backend="gemini", model_id="gemini-2.0-flash"), providers
    )
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789")
    assert judge_available(JudgeConfig(backend="openai", model_id="gpt-4o-mini"), providers) is None
    assert "has no price; add it under providers.openai.prices" in judge_available(
        JudgeConfig(backend="openai", model_id="llama-3"), providers
    )


def test_image_requests_keep_their_cache_keys_and_text_only_ones_get_their_own():
    png, settings = b"\x89PNG fake bytes", {"max_output_tokens": 16, "temperature": 0.0}
    # The key as it was before text-only requests existed, written out by hand.
    before = {
        "provider": "openai",
        "model": "gpt-4o",
        "prompt": "p",
        "image_sha256": hashlib.sha256(png).hexdigest(),
        "settings": settings,
    }
    assert (
        chat_key("openai", ChatRequest("gpt-4o", "p", png, settings))
        == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    )
    text_only = chat_key("openai", ChatRequest("gpt-4o", "p", settings=settings))
    assert text_only != chat_key("openai", ChatRequest("gpt-4o", "p", png, settings))
    assert text_only != chat_key(
        "openai", ChatRequest("gpt-4o", "p", b"", settings)
    )  # an empty image is still an image
    assert text_only != chat_key("gemini", ChatRequest("gpt-4o", "p", settings=settings))
    prompt = "label : bird , prediction : scarlet tanager"
    for cls in (OpenAIProvider, GeminiProvider):  # no image: the text alone, plus the message overhead
        assert cls.estimate_input(ChatRequest("m", prompt, settings={"detail": "auto"})) == text_tokens(prompt) + 10


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()


@pytest.mark.parametrize(
    "provider,model_id", [("openai", "gpt-4o-mini"), ("openai", "o3"), ("gemini", "gemini-2.0-flash")]
)
def test_text_only_requests_arrive_without_an_image_and_get_the_scripted_answer(loop, tmp_path, provider, model_id):
    received: list[tuple[str, int]] = []
    answer = scripted({"scarlet tanager": "1", "red dog": "0"})

    def record(prompt: str, images: list[bytes]) -> str:
        received.append((prompt, len(images)))
        return answer(prompt, images)

    with FakeAPIServer(answer=record) as server:
        url = server.openai_url if provider == "openai" else server.gemini_url
        gateway = Gateway(
            provider,
            ProviderConfig(rpm=6000, tpm=10**7, timeout_s=2.0, base_url=url),
            Secret("sk-test-x"),
            tmp_path / "cache",
        )
        settings = judge_settings(JudgeConfig(backend=provider, model_id=model_id))
        rows = loop.run_until_complete(
            asyncio.gather(
                *[gateway.chat(ChatRequest(model_id, p, settings=settings)) for p in PROMPTS[:2] + PROMPTS[4:5]]
            )
        )
    assert [r["status"] for r in rows] == ["ok"] * 3, rows
    assert [r["text"] for r in rows[::2]] == ["1", "0"]
    assert rows[1]["text"].startswith("A scene showing no image")  # unscripted: the fake's own answer
    assert sorted(received) == sorted((p, 0) for p in PROMPTS[:2] + PROMPTS[4:5])
    assert all(r["cost_usd"] > 0 and r["input_tokens"] > 0 for r in rows)
