"""What a batch is made of: the requests as written to disk (`Line`), an embedding answer
(`Embedding`), the batch price, and the states a batch goes through."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

BATCH_DISCOUNT = 0.5  # both providers bill batch requests at half the standard price
EMBED_LINES = 10_000  # our bound on an embedding batch: its answers are downloaded whole
FINISHED = {"completed", "expired", "cancelled", "failed"}
OPEN = ("creating", "submitted")  # a recorded batch not collected yet (its id may not be recorded)


@dataclass(frozen=True)
class Limits:
    """A provider's bounds on one batch: requests and bytes."""

    requests: int
    bytes: int


@dataclass
class Line:
    """One request of a batch, as written to disk: its key, model, worst-case cost (at the batch
    price), tokens for the limits and the bill, the provider's payload, and its kind (chat or
    embed)."""

    key: str
    model_id: str
    worst: float
    tokens: int
    payload: dict
    kind: str = "chat"

    def dump(self) -> bytes:
        return (
            json.dumps(
                {
                    "key": self.key,
                    "model_id": self.model_id,
                    "worst": self.worst,
                    "tokens": self.tokens,
                    "payload": self.payload,
                    "kind": self.kind,
                },
                separators=(",", ":"),
            )
            + "\n"
        ).encode()

    @staticmethod
    def load(raw: bytes) -> Line:
        d = json.loads(raw)
        return Line(d["key"], d["model_id"], d["worst"], d["tokens"], d["payload"], d.get("kind", "chat"))


@dataclass(frozen=True)
class Embedding:
    """One text's vector from an embedding batch; `tokens` None when the provider reports none."""

    vector: np.ndarray
    tokens: int | None
    model_version: str
