"""Providers: build one request with the official client, parse one answer, and say the settings a
request carries (which models think, what a judge sends). Nothing else.

Retries, limits, concurrency, caching and costs belong to the gateway; the clients' own retries are
switched off so that exactly one layer decides when to try again: `max_retries=0` for openai (its
httpx transport makes no retries of its own), and `HttpRetryOptions(attempts=1)` for google-genai,
which otherwise re-sends a request after a dropped connection on its aiohttp transport. `retryable` and `overload` tell the gateway what a failure was (`retries`: how long the provider asks it to wait).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from vlm_decade.core.config import APIConfig, EndpointConfig, Price
from vlm_decade.models.api.keys import Secret
from vlm_decade.models.api.retries import status_code


@dataclass(frozen=True)
class Thinks:
    """How a family of models that think is told how much to: the option that says it (sent in the
    API's spelling: OpenAI's `reasoning_effort`; Gemini's `thinkingConfig.thinkingBudget` or
    `.thinkingLevel`) and what is sent when the model's options do not say; None: it takes none."""

    option: str | None
    default: str | int | None


# The model families that think (reason) before they answer, by API and model id prefix (the longest
# that matches decides), as the price table lists them: OpenAI's o-series and GPT-5, Gemini 2.5 and 3.
# Their hidden thinking is output: it counts against the output cap, so they get a larger one
# (THINKING_CAP), and they are told to think little by default, so the cap leaves the answer room.
# o1-mini takes no effort; gpt-5-pro only "high"; Gemini 2.5 Flash-Lite does not think unless told to
# (0 says so), Gemini 3 takes a level (its Pro: low or high) in place of a budget.
THINKING = {
    "openai": {
        "o1": Thinks("reasoning_effort", "low"),
        "o1-mini": Thinks(None, None),
        "o3": Thinks("reasoning_effort", "low"),
        "o4": Thinks("reasoning_effort", "low"),
        "gpt-5": Thinks("reasoning_effort", "low"),
        "gpt-5-pro": Thinks("reasoning_effort", "high"),
    },
    "gemini": {
        "gemini-2.5": Thinks("thinking_budget", 1024),
        "gemini-2.5-flash-lite": Thinks("thinking_budget", 0),
        "gemini-3": Thinks("thinking_level", "low"),
    },
}
THINKING_CAP = 2000  # output tokens of a thinking model: its thinking (about 1,000 at most by default) and the answer
ANSWER_CAP = 300  # output tokens of a model that does not think
EMBED_DIM = 3072  # text-embedding-3-large natively; gemini-embedding-001 through output_dimensionality


@dataclass(frozen=True)
class ChatRequest:
    """A prompt, with one image or none (a text-only request, e.g. an LLM judge), to one model, with
    the generation settings that decide the answer."""

    model_id: str
    prompt: str
    image_png: bytes | None = None
    settings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    text: str
    input_tokens: int
    output_tokens: int  # as billed: reasoning / thinking tokens included
    model_version: str
    unfinished: str = ""  # why a bought answer is no answer (empty, cut off, withheld): `unfinished`


def unfinished(text: str, said: str, ended: str) -> str:
    """Why an answer is none, as its row's error says ("" when it is one): the provider says (`said`,
    e.g. "finish_reason length") it ended `cut` (at the output cap, which thinking counts against) or
    `withheld` (a safety or recitation filter), or it ended `done` with an empty text."""
    if ended == "cut":
        return f"no complete answer: {said} (the output cap was reached, thinking included)"
    if ended == "withheld":
        return f"no answer: {said} (withheld by the provider)"
    return "" if text else f"empty answer ({said})"


def thinks(api: str, model_id: str) -> Thinks | None:
    """How a model of an API (openai or gemini; an endpoint's `api`) is told how much to think, by
    the longest family prefix of its id; None when it does not think."""
    families = [f for f in THINKING.get(api, {}) if model_id.startswith(f)]
    return THINKING[api][max(families, key=len)] if families else None


def thinking(api: str, model_id: str) -> bool:
    """Whether a model of an API (openai or gemini; an endpoint's `api`) thinks before it answers."""
    return thinks(api, model_id) is not None


def thinking_settings(api: str, model_id: str, options: dict) -> dict:
    """The thinking settings a model's requests carry: those its options give, else its family's
    default (nothing for a model that does not think, or whose family takes none)."""
    given = {k: options[k] for k in ("reasoning_effort", "thinking_budget", "thinking_level") if k in options}
    family = thinks(api, model_id)
    if given or family is None or family.option is None:
        return given
    return {family.option: family.default}


def chat_key(provider: str, req: ChatRequest, revision: str | None = None) -> str:
    """The cache key: provider (a cloud provider's or an endpoint's name), model, prompt, the exact
    image bytes sent, the settings, and what an endpoint says it serves (`revision`). A text-only
    request has no image field, and a cloud request no revision field, so their keys stay as they were."""
    payload = {"provider": provider, "model": req.model_id, "prompt": req.prompt, "settings": req.settings}
    if req.image_png is not None:
        payload["image_sha256"] = hashlib.sha256(req.image_png).hexdigest()
    if revision is not None:
        payload["revision"] = revision
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def embed_key(provider: str, model_id: str, text: str, revision: str | None = None) -> str:
    payload = {"provider": provider, "model": model_id, "dim": EMBED_DIM, "text": text}
    if revision is not None:
        payload["revision"] = revision
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def cost(price: Price, input_tokens: int, output_tokens: int) -> float:
    return (input_tokens * price.input_per_mtok + output_tokens * price.output_per_mtok) / 1e6


def text_tokens(text: str) -> int:
    """A rough count (4 characters a token) for estimates; the provider's reported usage is billed."""
    return max(1, math.ceil(len(text) / 4))


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    return struct.unpack(">II", png[16:24])


class Provider:
    name: str

    def __init__(self, cfg: APIConfig, key: Secret):
        self.cfg = cfg
        self.key = key

    @classmethod
    def settings(cls, model_id: str, options: dict) -> dict:
        raise NotImplementedError

    @classmethod
    def estimate_input(cls, req: ChatRequest) -> int:
        """Input tokens of a request before it is sent: its text, the image by the provider's rule,
        and a few tokens of message framing."""
        image = 0 if req.image_png is None else cls.image_tokens(req.image_png, req.settings)
        return text_tokens(req.prompt) + image + 10

    @classmethod
    def image_tokens(cls, png: bytes, settings: dict) -> int:
        return cls.image_tokens_of_size(*png_size(png), settings)

    @classmethod
    def image_tokens_of_size(cls, width: int, height: int, settings: dict) -> int:
        raise NotImplementedError

    async def chat(self, req: ChatRequest) -> Reply:
        raise NotImplementedError

    async def embed(self, model_id: str, texts: list[str]) -> tuple[np.ndarray, int, str]:
        """(unit-length float32 vectors, input tokens, model version)."""
        raise NotImplementedError

    @staticmethod
    def retryable(exc: BaseException) -> bool:
        """Rate limits, server errors, timeouts, dropped connections and broken bodies are worth
        another try; other 4xx answers (bad request, auth, not found) would fail again."""
        status = status_code(exc)
        if status is not None:
            return status in (408, 409, 429) or status >= 500
        return isinstance(exc, (TimeoutError, asyncio.TimeoutError, ConnectionError, ValueError)) or _transport(exc)

    @staticmethod
    def overload(exc: BaseException) -> bool:
        """Whether a failure says the server has too much to do: 429, 503, or no answer in time."""
        status = status_code(exc)
        if status is not None:
            return status in (429, 503)
        names = {c.__name__ for c in type(exc).__mro__}
        return isinstance(exc, (TimeoutError, asyncio.TimeoutError)) or bool(
            names & {"APITimeoutError", "TimeoutException"}
        )


def _transport(exc: BaseException) -> bool:
    """httpx / httpx2 / openai / aiohttp connection failures, without importing any of them here."""
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(
        names
        & {
            "TransportError",
            "TimeoutException",
            "APIConnectionError",
            "APITimeoutError",
            "NetworkError",
            "ClientConnectionError",
            "ClientPayloadError",
        }
    )


class OpenAIProvider(Provider):
    name = "openai"

    def __init__(self, cfg: APIConfig, key: Secret):
        super().__init__(cfg, key)
        import openai

        self.client = openai.AsyncOpenAI(
            api_key=key.reveal(), base_url=cfg.base_url, max_retries=0, timeout=cfg.timeout_s
        )

    @classmethod
    def settings(cls, model_id: str, options: dict) -> dict:
        # Reasoning models take no temperature, and their hidden reasoning tokens count against
        # max_completion_tokens, so they get a larger cap.
        if thinking(cls.name, model_id):
            out = {"max_output_tokens": int(options.get("max_output_tokens", THINKING_CAP))}
            out.update({k: str(v) for k, v in thinking_settings(cls.name, model_id, options).items()})
        else:
            out = {
                "max_output_tokens": int(options.get("max_output_tokens", ANSWER_CAP)),
                "temperature": float(options.get("temperature", 0.0)),
            }
        out["detail"] = str(options.get("detail", "auto"))
        return out

    @classmethod
    def image_tokens_of_size(cls, w: int, h: int, settings: dict) -> int:
        # OpenAI's published image rule: fit in 2048x2048, shortest side to 768, 170 per 512 tile + 85.
        if settings.get("detail") == "low":
            return 85
        s = min(1.0, 2048 / max(w, h))
        w, h = w * s, h * s
        s = min(1.0, 768 / min(w, h))
        return 85 + 170 * math.ceil(w * s / 512) * math.ceil(h * s / 512)

    @staticmethod
    def chat_body(req: ChatRequest) -> dict:
        """The request body, as sent (sync) or as a batch line's `body`."""
        s = req.settings
        content = [{"type": "text", "text": req.prompt}]
        if req.image_png is not None:
            url = "data:image/png;base64," + base64.b64encode(req.image_png).decode()
            content.append({"type": "image_url", "image_url": {"url": url, "detail": s["detail"]}})
        body = {
            "model": req.model_id,
            "messages": [{"role": "user", "content": content}],
            "max_completion_tokens": s["max_output_tokens"],
        }
        if "temperature" in s:
            body["temperature"] = s["temperature"]
        if "reasoning_effort" in s:
            body["reasoning_effort"] = s["reasoning_effort"]
        return body

    @staticmethod
    def reply_from(r) -> Reply:
        """A chat completion (the client's object, or a batch line's body) as a `Reply`."""
        if isinstance(r, dict):
            from openai.types.chat import ChatCompletion

            r = ChatCompletion.model_validate(r)
        usage = r.usage
        choice = r.choices[0] if r.choices else None
        text = ((choice.message.content if choice else None) or "").strip()
        # An OpenAI-compatible server may end otherwise (eos, null): only a cap or a filter is no answer.
        reason = choice.finish_reason if choice else None
        why = unfinished(
            text, f"finish_reason {reason}", {"length": "cut", "content_filter": "withheld"}.get(reason, "done")
        )
        if not why and choice is not None and getattr(choice.message, "refusal", None):
            why = f"refused: {choice.message.refusal}"
        # completion_tokens already includes reasoning tokens, which are billed as output.
        return Reply(
            text,
            usage.prompt_tokens if usage else 0,
            usage.completion_tokens if usage else 0,
            r.model + (f"+{r.system_fingerprint}" if r.system_fingerprint else ""),
            why,
        )

    async def chat(self, req: ChatRequest) -> Reply:
        return self.reply_from(await self.client.chat.completions.create(**self.chat_body(req)))

    async def embed(self, model_id: str, texts: list[str]) -> tuple[np.ndarray, int, str]:
        # The client asks for base64 float32 and decodes it; 3,072 is the native width of -large. An
        # endpoint's model has a width of its own (most refuse `dimensions`): its vectors are made unit-length.
        own = isinstance(self.cfg, EndpointConfig)
        extra = {} if own else {"dimensions": EMBED_DIM}
        r = await self.client.embeddings.create(model=model_id, input=texts, **extra)
        vectors = np.asarray([d.embedding for d in sorted(r.data, key=lambda d: d.index)], dtype=np.float32)
        if own:
            vectors = GeminiProvider.unit_rows(vectors)
        return vectors, (r.usage.prompt_tokens if r.usage else sum(map(text_tokens, texts))), r.model


class GeminiProvider(Provider):
    name = "gemini"

    def __init__(self, cfg: APIConfig, key: Secret):
        super().__init__(cfg, key)
        from google import genai
        from google.genai import types

        self.types = types
        # Without retry_options the client still re-sends once, 1-10 s later, after a dropped
        # connection on its aiohttp transport; one attempt, stated, is the only way to have none.
        http = {
            "timeout": int(cfg.timeout_s * 1000),
            "retry_options": types.HttpRetryOptions(attempts=1),
        }  # timeout in ms
        if cfg.base_url:
            http.update(base_url=cfg.base_url, api_version="v1beta")
        self.client = genai.Client(api_key=key.reveal(), http_options=types.HttpOptions(**http))

    @classmethod
    def settings(cls, model_id: str, options: dict) -> dict:
        # Thinking models think by default and count thinking against max_output_tokens.
        out = {
            "max_output_tokens": int(
                options.get("max_output_tokens", THINKING_CAP if thinking(cls.name, model_id) else ANSWER_CAP)
            ),
            "temperature": float(options.get("temperature", 0.0)),
        }
        for k, v in thinking_settings(cls.name, model_id, options).items():
            out[k] = int(v) if k == "thinking_budget" else str(v).lower()
        return out

    @classmethod
    def image_tokens_of_size(cls, w: int, h: int, settings: dict) -> int:
        # Gemini's published rule: 258 tokens for an image up to 384 px a side, else per 768 px tile.
        return 258 if max(w, h) <= 384 else 258 * math.ceil(w / 768) * math.ceil(h / 768)

    def request_parts(self, req: ChatRequest):
        """(contents, config) of a request, as sent (sync) or in a batch: one user turn, the image
        (if any) before the prompt, spelled out as the REST API takes it (a batch's input file)."""
        t, s = self.types, req.settings
        config = t.GenerateContentConfig(temperature=s["temperature"], max_output_tokens=s["max_output_tokens"])
        thought = {k: s[k] for k in ("thinking_budget", "thinking_level") if k in s}
        if thought:  # sent as REST spells it by `as_sent`
            config.thinking_config = t.ThinkingConfig(**thought)
        parts = [t.Part.from_text(text=req.prompt)]
        if req.image_png is not None:
            parts.insert(0, t.Part.from_bytes(data=req.image_png, mime_type="image/png"))
        return [t.Content(role="user", parts=parts)], config

    @staticmethod
    def reply_from(r, model_id: str) -> Reply:
        """A GenerateContentResponse (sync, or a batch's inlined response) as a `Reply`."""
        u = r.usage_metadata
        out = ((u.candidates_token_count or 0) + (u.thoughts_token_count or 0)) if u else 0
        text = (r.text or "").strip() if r.candidates else ""
        if r.candidates:
            reason = getattr(r.candidates[0].finish_reason, "name", r.candidates[0].finish_reason)
            ended = {None: "done", "STOP": "done", "FINISH_REASON_UNSPECIFIED": "done", "MAX_TOKENS": "cut"}
            why = unfinished(text, f"finishReason {reason}", ended.get(reason, "withheld"))
        else:  # the prompt itself was blocked
            blocked = r.prompt_feedback.block_reason if r.prompt_feedback else None
            why = unfinished(
                text, f"blockReason {getattr(blocked, 'name', blocked)}", "withheld" if blocked else "done"
            )
        return Reply(text, (u.prompt_token_count or 0) if u else 0, out, r.model_version or model_id, why)

    @staticmethod
    def as_sent(config):
        """A request's config as it is handed to the client: google-genai sends a `ThinkingConfig`
        with its Python names (`thinking_budget`), so it goes as the documented REST fields
        (`thinkingBudget`, `thinkingLevel`), which the client passes on as they are."""
        if config is None or config.thinking_config is None:
            return config
        spelled = config.thinking_config.model_dump(mode="json", by_alias=True, exclude_none=True)
        return config.model_copy(update={"thinking_config": spelled})

    async def chat(self, req: ChatRequest) -> Reply:
        contents, config = self.request_parts(req)
        r = await self.client.aio.models.generate_content(
            model=req.model_id, contents=contents, config=self.as_sent(config)
        )
        return self.reply_from(r, req.model_id)

    async def embed(self, model_id: str, texts: list[str]) -> tuple[np.ndarray, int, str]:
        r = await self.client.aio.models.embed_content(
            model=model_id, contents=texts, config=self.types.EmbedContentConfig(output_dimensionality=EMBED_DIM)
        )
        return (
            self.unit_rows([e.values for e in r.embeddings]),
            sum(map(text_tokens, texts)),
            model_id,
        )  # no usage reported for embeddings

    @staticmethod
    def unit_rows(values) -> np.ndarray:
        """Vectors as the API returns them, made unit-length: it returns them unnormalised below
        its native width, so they are normalised always (row by row, the same in batch mode)."""
        vectors = np.asarray(values, dtype=np.float32)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def provider_class(api: str) -> type[Provider]:
    """The provider class of an API (openai or gemini; an endpoint's `api`)."""
    return {"openai": OpenAIProvider, "gemini": GeminiProvider}[api]


def judge_settings(api: str, model_id: str, options: dict, cap: int, image: bool, room_to_think: bool) -> dict:
    """The generation settings a judge's request sends (part of the cache key): the provider's for
    the model, with `cap` output tokens unless the options set a cap or, with `room_to_think`, the
    model thinks (its hidden thinking counts against the cap, so it keeps the provider's larger
    one); a request with no image sends no image detail."""
    capped = not (room_to_think and thinking(api, model_id))
    settings = provider_class(api).settings(model_id, {**({"max_output_tokens": cap} if capped else {}), **options})
    if not image:
        settings.pop("detail", None)
    return settings
