"""The one registry mechanism: a name maps to "module:Class", imported only when first asked for,
so a study pulls in only the optional dependencies of what it uses (backends, encoders, metrics).

A registry and a registration, as the text encoders' (`vlm_decade.models.encoders`):

    ENCODERS = Registry(
        "encoder backend",
        {
            "sentence-transformers": "vlm_decade.models.encoders.sbert:SentenceTransformerEncoder",
            ...
        },
    )
    ENCODERS.load("sentence-transformers")  # the class, its module imported now

An unknown name is a KeyError that says the registry's `kind`, the closest known name and every
name (`core.names.did_you_mean`); docs/extending.md says what each registry's classes offer.
"""

from __future__ import annotations

import importlib

from vlm_decade.core.names import did_you_mean


class Registry:
    def __init__(self, kind: str, entries: dict[str, str]):
        self.kind = kind  # how an unknown name is described, e.g. "backend"
        self.entries = entries

    def names(self) -> list[str]:
        return sorted(self.entries)

    def load(self, name: str) -> type:
        try:
            target = self.entries[name]
        except KeyError:
            near = did_you_mean(name, self.names())
            raise KeyError(f"unknown {self.kind} '{name}'{near}; known: {', '.join(self.names())}") from None
        module, cls = target.split(":")
        return getattr(importlib.import_module(module), cls)
