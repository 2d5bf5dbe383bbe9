"""Vision-language models and text encoders behind the OpenAI and Gemini APIs.

The layers, as in lm-evaluation-harness's API models: a *provider* (`providers.py`) only builds a
request with the official client and parses the answer; one *gateway* (`gateway.py`) per provider
owns everything else: the rate limits (`limits.py`), the concurrency cap, timeouts, retries, the
content-addressed cache (`cache.py`), costs and the budget. The gateway runs as one async Ray
actor per provider, so its limits hold for the whole cluster. `keys.py` reads API keys and keeps
them out of everything written; `estimate.py` prices a study before anything is spent.
"""

PROVIDERS = ("openai", "gemini")
