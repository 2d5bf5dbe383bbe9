"""What a failed attempt says about the next one: how long the provider asks us to wait, and
whether it refused the attempt before doing any work (so the attempt used none of the limits'
tokens).

Providers put the wait in different places, read in this order: the `Retry-After-Ms` and
`Retry-After` headers (seconds; an HTTP date is not read), Gemini's `google.rpc.RetryInfo` in the
error body (`{"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
"retryDelay": "5s"}]}}`), and OpenAI's `x-ratelimit-reset-requests` / `x-ratelimit-reset-tokens`
headers (durations such as "1s", "6m0s", "20ms"): of these, the reset of each limit the headers say
is used up (`x-ratelimit-remaining-*` 0), else the tokens' reset, since a refusal with requests
left is one for tokens. None when the failure names no wait: the gateway backs off on its own.

Exceptions are read by their attributes, so no client is imported here: `status_code` (openai) or
`code` (google-genai), `response.headers`, and the error body as `details` (google-genai: the
whole JSON) or `body` (openai: its `error` object).
"""

from __future__ import annotations

import re

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def status_code(exc: BaseException) -> int | None:
    """The HTTP status of a failure, when it had one."""
    code = getattr(exc, "status_code", None) or getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def refused(exc: BaseException) -> bool:
    """Whether the server turned the attempt away (a 4xx answer: a rate limit, a bad request)
    rather than failing while working on it: OpenAI and Gemini count no tokens of such an attempt
    against tokens per minute."""
    status = status_code(exc)
    return status is not None and 400 <= status < 500


def duration_s(text) -> float | None:
    """Seconds in a Go-style duration ("1s", "6m0s", "20ms", "1h2m3.5s") or a protobuf JSON one
    ("5s", "0.25s"); None when `text` is none of these."""
    if not isinstance(text, str) or not text.strip():
        return None
    text = text.strip()
    parts = _DURATION.findall(text)
    if "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def retry_delay(exc: BaseException) -> float | None:
    """The seconds the provider asks before the next attempt, wherever it says so; None when it
    does not."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    for delay in (_retry_after(headers), _retry_info(exc), _ratelimit_reset(headers)):
        if delay is not None:
            return max(0.0, delay)
    return None


def _retry_after(headers) -> float | None:
    if headers is None:
        return None
    for header, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            value = headers.get(header)
            if value is not None:
                return float(value) * scale
        except (TypeError, ValueError):
            continue  # an HTTP date: left to the other sources, then to backoff
    return None


def _retry_info(exc: BaseException) -> float | None:
    """Gemini's `RetryInfo.retryDelay` in the error body's details."""
    for body in (getattr(exc, "details", None), getattr(exc, "body", None)):
        if isinstance(body, list) and body:
            body = body[0]
        if not isinstance(body, dict):
            continue
        error = body.get("error", body)
        details = error.get("details") if isinstance(error, dict) else None
        for detail in details if isinstance(details, list) else ():
            if isinstance(detail, dict) and detail.get("@type") == RETRY_INFO:
                return duration_s(detail.get("retryDelay"))
    return None


def _ratelimit_reset(headers) -> float | None:
    """OpenAI's resets: the longest of the limits used up, else the tokens' reset."""
    if headers is None:
        return None
    resets = {kind: duration_s(headers.get(f"x-ratelimit-reset-{kind}")) for kind in ("requests", "tokens")}
    used_up = [
        resets[kind]
        for kind in ("requests", "tokens")
        if resets[kind] is not None and _number(headers.get(f"x-ratelimit-remaining-{kind}")) == 0
    ]
    if used_up:
        return max(used_up)
    return resets["tokens"] if resets["tokens"] is not None else resets["requests"]


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
