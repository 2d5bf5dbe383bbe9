"""The `openai-embedding` and `gemini-embedding` encoders (GPT-SI and Gemini-SI in the papers).

`remote` encoders are not loaded in an actor: the embed stage sends batches of texts through the
provider's gateway actor, which caches each vector, counts costs and holds the limits. Vectors are
3,072-d (text-embedding-3-large natively; gemini-embedding-001 through output_dimensionality) and
L2-normalised, as the cosine metrics expect.
"""

from __future__ import annotations

from vlm_decade.models.encoders import Encoder


class APIEncoder(Encoder):
    remote = True
    provider: str

    def encode(self, texts: list[str]):
        raise RuntimeError("API encoders run through their provider's gateway actor (stages.embed)")


class OpenAIEmbedding(APIEncoder):
    provider = "openai"


class GeminiEmbedding(APIEncoder):
    provider = "gemini"
