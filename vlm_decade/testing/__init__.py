"""Test helpers that users may want too: a local fake of the OpenAI and Gemini APIs (`fake_api`, built
from the `fake_*` modules beside it)."""
