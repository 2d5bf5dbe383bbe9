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


# What an endpoint without a key is sent: the OpenAI client needs some key, and servers without one ignore it.
NO_KEY = "no-key"


def key_names(provider: str, cfg=None) -> tuple[str, ...]:
    """The environment variables that may hold `provider`'s key: an endpoint's `key_env` (none for
    an endpoint without one), else the cloud provider's own."""
    if provider in KEY_ENV:
        return KEY_ENV[provider]
    key_env = getattr(cfg, "key_env", None)
    return (key_env,) if key_env else ()


def api_key(provider: str, cfg=None) -> Secret | None:
    """`provider`'s key from the environment (`cfg`: its section, for an endpoint's `key_env`); an
    endpoint that names no variable gets `NO_KEY`; None when the variable is not set."""
    names = key_names(provider, cfg)
    if not names:
        return Secret(NO_KEY)
    for name in names:
        value = os.environ.get(name)
        if value:
            return Secret(value)
    return None


def key_hint(provider: str, cfg=None) -> str:
    return " or ".join(key_names(provider, cfg))


def scrub(text: str, *secrets: Secret | None) -> str:
    """`text` with every given key, and anything shaped like one, replaced by ***."""
    for secret in secrets:
        if secret is not None and secret.reveal():
            text = text.replace(secret.reveal(), "***")
    return _KEYLIKE.sub(lambda m: (m.group(2) or "") + "***", text)
