"""API keys: read from the environment, carried as `Secret`, scrubbed from every message we keep.

A key never goes into a table, the manifest, a cache file, a log line or an error text: exception
messages from the clients are passed through `scrub` before they are recorded.
"""

from __future__ import annotations

import os
import re

# provider -> environment variables tried in order
KEY_ENV = {"openai": ("OPENAI_API_KEY",), "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
# Key-like tokens in text we did not produce (echoed headers, URLs with ?key=...).
_KEYLIKE = re.compile(r"(sk-[A-Za-z0-9_\-]{8,}|AIza[0-9A-Za-z_\-]{20,}|([?&]key=)[^&\s]+)")


class Secret:
    """A string that does not show itself in repr, str, logs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__


def api_key(provider: str) -> Secret | None:
    for name in KEY_ENV[provider]:
        value = os.environ.get(name)
        if value:
            return Secret(value)
    return None


def key_hint(provider: str) -> str:
    return " or ".join(KEY_ENV[provider])


def scrub(text: str, *secrets: Secret | None) -> str:
    """`text` with every given key, and anything shaped like one, replaced by ***."""
    for secret in secrets:
        if secret is not None and secret.reveal():
            text = text.replace(secret.reveal(), "***")
    return _KEYLIKE.sub(lambda m: (m.group(2) or "") + "***", text)
