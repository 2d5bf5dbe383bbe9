"""The answers a gateway gives, in sync and batch mode alike, that no provider answered just now:
one the cache holds, and one that failed (the fields of a `responses` row)."""

from __future__ import annotations


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
