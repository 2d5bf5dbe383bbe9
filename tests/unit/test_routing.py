"""Which gateway a model's or an encoder's requests go through, by one rule for both."""

from __future__ import annotations

import pytest

from vlm_decade.models.backends import BACKENDS
from vlm_decade.models.encoders import ENCODERS
from vlm_decade.models.routing import api_provider


def test_models_and_encoders_share_no_name():
    assert not set(BACKENDS.names()) & set(ENCODERS.names())


@pytest.mark.parametrize(
    "backend,endpoint,provider",
    [
        ("openai", None, "openai"),
        ("gemini", None, "gemini"),
        ("openai", "vllm", "vllm"),
        ("imported", None, None),
        ("imported", "vllm", None),  # a local backend sends nothing, whatever its entry says
        ("openai-embedding", None, "openai"),
        ("gemini-embedding", None, "gemini"),
        ("openai-embedding", "tei", "tei"),
        ("sentence-transformers", None, None),
    ],
)
def test_a_remote_entry_goes_through_its_endpoint_else_its_provider(backend, endpoint, provider):
    assert api_provider(backend, endpoint) == provider


def test_an_unknown_encoder_is_said_as_the_encoder_check_says_it():
    with pytest.raises(KeyError, match="unknown encoder backend 'sentence-transformer' \\(did you mean"):
        api_provider("sentence-transformer")
