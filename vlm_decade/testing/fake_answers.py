"""What the fake API answers, whatever the wire format: texts and vectors derived from the request.

A chat answer names the sha256 of each image's bytes and of the prompt (`chat_text`), so a test
recomputes it from what it sent; `scripted` answers fixed texts by prompt substring instead (a judge
that must read "1" or "0"), or answers that end early (`ended`: empty, cut off, withheld). An embedding is a seeded normal vector keyed by its text
(`fake_vector`), and `tokens` is the fake's token count: one per four characters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np


def image_sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def chat_text(prompt: str, images: list[bytes]) -> str:
    """The fake's deterministic answer: tests recompute it from what they sent."""
    names = ", ".join(f"image {image_sha(b)}" for b in images) or "no image"
    return f"A scene showing {names}, asked prompt {hashlib.sha256(prompt.encode()).hexdigest()[:8]}."


ChatAnswer = Callable[[str, list[bytes]], str]  # (prompt, images) -> the answer text


def scripted(rules: dict[str, str], otherwise: ChatAnswer = chat_text) -> ChatAnswer:
    """Answers `rules[s]` for the first substring `s` (in the dict's order) found in the prompt, and
    `otherwise(prompt, images)` when none is."""

    def answer(prompt: str, images: list[bytes]) -> str:
        for substring, text in rules.items():
            if substring in prompt:
                return text
        return otherwise(prompt, images)

    return answer


class Ended(str):
    """An answer text that ends otherwise than complete, as `ended` makes it."""

    how = "done"


def ended(how: str, text: str = "") -> Ended:
    """An answer the fake ends `how`: cut (at the output cap: OpenAI's finish_reason length,
    Gemini's finishReason MAX_TOKENS), safety (content_filter, SAFETY) or recitation
    (content_filter, RECITATION), with what it says of `text`; `ended("done")` is an empty answer
    that ends as a complete one does. A knob for `scripted`, e.g. {"Describe": ended("cut")}."""
    answer = Ended(text)
    answer.how = how
    return answer


def fake_vector(text: str, dim: int, unit: bool) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    # Gemini leaves vectors at reduced dims unnormalised; mimic that with a length != 1.
    return v / np.linalg.norm(v) if unit else v * np.float32(0.5)


def tokens(text: str) -> int:
    return max(1, len(text) // 4)
