"""Which API gateway an entry's requests go through, for models and encoders alike: a remote
backend's or encoder's own provider, or the named endpoint the entry sends to instead; a local one
goes through none. The two registries share no name, so a name says which it is."""

from __future__ import annotations

from vlm_decade.models.backends import BACKENDS, backend_class
from vlm_decade.models.encoders import encoder_class


def api_provider(backend: str, endpoint: str | None = None) -> str | None:
    """The API provider whose gateway a model backend's or an encoder's requests go through (the
    entry's `endpoint`, else the class's provider); None for a local one. A name in neither
    registry raises the encoder registry's KeyError (a model's backend is looked up before this)."""
    cls = backend_class(backend) if backend in BACKENDS.entries else encoder_class(backend)
    return (endpoint or getattr(cls, "provider", None)) if cls.remote else None
