"""The answers a gateway gives, in sync and batch mode alike, that no provider answered just now:
one the cache holds, one that failed, and one bought that is no answer (the fields of a
`responses` row); and what a row says
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


def unfinished_answer(entry: dict, error: str, paid: float, queued: float | None) -> dict:
    """The row of an answer bought but no answer (empty, cut off at the output cap, withheld: `error`
    says which): an error row, sent again by the next run as any failed row (it is not cached),
    with what it cost."""
    return {
        **entry,
        "text": "",
        "status": "error",
        "error": error,
        "queued_s": queued,
        "paid_usd": paid,
        "cached": False,
    }


def gateway_call_failed(exc: BaseException) -> str:
    """The error of a request whose call to the gateway actor failed (a lost task or actor; the
    gateway retries the provider itself): the exception as `error_text` says it."""
    return f"gateway call failed: {error_text(exc)}"
