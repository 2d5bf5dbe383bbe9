"""What answers and what encodes, and the way to the APIs behind some of them.

- `backends/`: the models that describe images (local, imported files, API models), one registry.
- `encoders/`: the text encoders (Sentence-BERT, the embedding APIs), one registry.
- `metrics.py`: the pairwise text similarity metrics, one registry.
- `routing.py`: which API gateway a model's or an encoder's requests go through.
- `api/`: the transport to the OpenAI and Gemini APIs and to endpoints that speak one of them.
"""
