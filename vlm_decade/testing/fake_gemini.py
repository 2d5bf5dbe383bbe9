"""The Gemini wire format of the fake API: a request body in, the answer body out, and its usage.

`gemini_answer` reads a generateContent body (images as inlineData, in either proto JSON spelling)
and answers a GenerateContentResponse with the usage Gemini reports (258 tokens an image; 2.5
models add 32 thought tokens; an `ended` answer ends as it says); `gemini_embed_answer` answers embedContent and batchEmbedContents
(vectors left unnormalised at reduced dimensions, as Gemini leaves them). Both are pure, so the
HTTP handler and the batch store answer a request alike.
"""

from __future__ import annotations

import base64

from vlm_decade.testing.fake_answers import ChatAnswer, fake_vector, tokens


def gemini_answer(answer: ChatAnswer, p: dict, model: str) -> dict:
    """The GenerateContentResponse the fake answers to a Gemini request body, its text made by `answer`."""
    prompt, images = [], []
    for content in p["contents"]:
        for part in content["parts"]:
            if "text" in part:
                prompt.append(part["text"])
            elif "inlineData" in part or "inline_data" in part:  # proto JSON takes either spelling
                inline = part.get("inlineData") or part["inline_data"]
                if inline.get("mimeType", inline.get("mime_type")) != "image/png":
                    raise ValueError("expected image/png")
                images.append(base64.urlsafe_b64decode(inline["data"]))
    text = answer("\n".join(prompt), images)
    thoughts = 32 if "2.5" in model else 0
    finish = {"cut": "MAX_TOKENS", "safety": "SAFETY", "recitation": "RECITATION"}.get(
        getattr(text, "how", "done"), "STOP"
    )
    content = {"role": "model", **({"parts": [{"text": text}]} if text else {})}  # no text: no parts
    prompt_tokens = tokens("\n".join(prompt)) + 258 * len(images)
    return {
        "candidates": [{"content": content, "finishReason": finish, "index": 0}],
        "usageMetadata": {
            "promptTokenCount": prompt_tokens,
            "candidatesTokenCount": tokens(text),
            "thoughtsTokenCount": thoughts,
            "totalTokenCount": prompt_tokens + tokens(text) + thoughts,
        },
        "modelVersion": f"{model}-001",
        "responseId": "fake",
    }


def gemini_embed_answer(p: dict, method: str) -> dict:
    requests = p["requests"] if method == "batchEmbedContents" else [p]
    out = []
    for r in requests:
        text = "".join(part["text"] for part in r["content"]["parts"])
        dim = r.get("outputDimensionality") or 3072
        out.append({"values": fake_vector(text, dim, unit=dim == 3072).tolist()})
    return {"embeddings": out} if method == "batchEmbedContents" else {"embedding": out[0]}


def gemini_usage(endpoint: str, answer: dict, request: dict, model: str) -> tuple[str, int, int]:
    """(model, input tokens, output tokens) an ok answer of `gemini.generate` or `gemini.embed`
    reports, as billed."""
    if endpoint == "gemini.generate":
        usage = answer["usageMetadata"]
        return model, usage["promptTokenCount"], usage["candidatesTokenCount"] + usage["thoughtsTokenCount"]
    # Gemini reports no usage for embeddings; the gateway bills them at 4 characters a token.
    requests = request["requests"] if "requests" in request else [request]
    return (
        model,
        sum(max(1, -(-len("".join(p["text"] for p in r["content"]["parts"])) // 4)) for r in requests),
        0,
    )
