"""The answers a gateway gives, in sync and batch mode alike, that no provider answered just now:
one the cache holds, and one that failed (the fields of a `responses` row); and what a row says
when the call to the gateway itself failed."""

from __future__ import annotations

from vlm_decade.core.errors import error_text


def cached_answer(hit: dict) -> dict:
    """The row of an answer the cache holds: as it was bought (its cost, the provider's latency
    then, its mode); nothing paid now."""
    return {
        "latency_s": 0.0,
        "mode": "sync",
        **hit,
        "status": "ok",
        "error": "",
        "queued_s": 0.0,
        "paid_usd": 0.0,
        "cached": True,
    }


def failed_answer(status: str, error: str) -> dict:
    """A chat answer with no text: `status` error (`error` says why), skipped (a budget) or pending
    (in a batch not finished)."""
    return {
        "text": "",
        "status": status,
        "error": error,
        "latency_s": 0.0,
        "queued_s": 0.0,
        "input_tokens": None,
        "output_tokens": None,
        "cost_usd": 0.0,
        "paid_usd": 0.0,
        "model_version": "",
        "cached": False,
        "mode": "",
    }


def gateway_call_failed(exc: BaseException) -> str:
    """The error of a request whose call to the gateway actor failed (a lost task or actor; the
    gateway retries the provider itself): the exception as `error_text` says it."""
    return f"gateway call failed: {error_text(exc)}"
