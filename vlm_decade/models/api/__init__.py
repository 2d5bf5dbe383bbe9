"""The transport to the OpenAI and Gemini APIs, for the models, encoders and judges behind them.

The layers, as in lm-evaluation-harness's API models: a *provider* (`providers.py`) only builds a
request with the official client and parses the answer; one *gateway* (`gateway.py`) per provider
owns everything else: the rate limits (`limits.py`), the concurrency cap, timeouts, retries, the
content-addressed cache (`cache.py`), costs and the budget. The gateway runs as one async Ray
actor per provider, so its limits hold for the whole cluster; `session.py` gets it for a stage and
records the money spent. `keys.py` reads API keys and keeps them out of everything written. What a
study would spend is counted by the stages that send requests (`vlm_decade.stages.estimate`).
"""
