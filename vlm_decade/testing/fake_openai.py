"""The OpenAI wire format of the fake API: a request body in, the answer body out, and its usage.

`openai_chat_answer` reads a chat completions body (images as data-URL parts) and answers a chat
completion with the usage OpenAI reports (85 tokens an image; reasoning models, which refuse
`temperature` and `max_tokens`, add 64 reasoning tokens; an `ended` answer ends as it says); `openai_embed_answer` answers an
embeddings body (base64 float32 or floats). Both are pure, so the HTTP handler and the batch store
answer a request alike.
"""

from __future__ import annotations

import base64

from vlm_decade.testing.fake_answers import ChatAnswer, fake_vector, tokens

REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")


def openai_chat_answer(answer: ChatAnswer, p: dict) -> dict:
    """The chat completion the fake answers to an OpenAI request body, its text made by `answer`."""
    model, prompt, images = p["model"], [], []
    for message in p["messages"]:
        content = message["content"]
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            if part["type"] == "text":
                prompt.append(part["text"])
            elif part["type"] == "image_url":
                url = part["image_url"]["url"]
                head, data = url.split(",", 1)
                if head != "data:image/png;base64":
                    raise ValueError(f"unexpected image url header {head}")
                images.append(base64.b64decode(data))
    reasoning = model.startswith(REASONING_PREFIXES)
    if reasoning and ("temperature" in p or "max_tokens" in p):
        raise ValueError("reasoning models take max_completion_tokens and no temperature")
    text = answer("\n".join(prompt), images)
    thought = 64 if reasoning else 0
    finish = {"cut": "length", "safety": "content_filter", "recitation": "content_filter"}.get(
        getattr(text, "how", "done"), "stop"
    )
    prompt_tokens = tokens("\n".join(prompt)) + 85 * len(images)
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": f"{model}-2025-01-01",
        "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": text}}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": tokens(text) + thought,
            "total_tokens": prompt_tokens + tokens(text) + thought,
            "completion_tokens_details": {"reasoning_tokens": thought},
        },
    }


def openai_embed_answer(p: dict) -> dict:
    texts = [p["input"]] if isinstance(p["input"], str) else p["input"]
    dim = p.get("dimensions") or (1536 if "small" in p["model"] else 3072)
    data = []
    for i, text in enumerate(texts):
        v = fake_vector(text, dim, unit=True)
        emb = (
            base64.b64encode(v.astype("<f4").tobytes()).decode() if p.get("encoding_format") == "base64" else v.tolist()
        )
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = sum(tokens(t) for t in texts)
    return {"object": "list", "model": p["model"], "data": data, "usage": {"prompt_tokens": n, "total_tokens": n}}


def openai_usage(endpoint: str, answer: dict, request: dict) -> tuple[str, int, int]:
    """(model, input tokens, output tokens) an ok answer of `openai.chat` or `openai.embeddings`
    reports, as billed."""
    if endpoint == "openai.chat":
        usage = answer["usage"]
        return request["model"], usage["prompt_tokens"], usage["completion_tokens"]
    return request["model"], answer["usage"]["prompt_tokens"], 0
