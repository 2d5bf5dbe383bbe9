"""The transport to the OpenAI and Gemini APIs, and to named endpoints that speak one of them
(`endpoints.py`: any OpenAI-compatible server), for the models, encoders and judges behind them.

The layers, as in lm-evaluation-harness's API models: a *provider* (`providers.py`) only builds a
request with the official client and parses the answer; one *gateway* (`gateway.py`) per provider
owns everything else: the rate limits (`limits.py`), the concurrency cap (fixed, or adaptive:
`adaptive.py`), timeouts, retries, the
content-addressed cache (`cache.py`), costs and the budget (`budget.py`, which its batcher holds
too), and in batch mode the batches (`batch/`: the providers' batch interfaces, the batch records
on disk, the batcher). The rows it answers without a provider (cached, failed) are `answers.py`.
The gateway runs as an async Ray actor, so its limits hold for the whole cluster; `session.py`
gets one for a stage and copies the money spent into the manifest from the run
folder's spend log (`spend.py`), which also carries the budget and the rate limits from one
gateway of a run folder to the next; `gateways.py` holds a stage's sessions, one per provider.
`keys.py` reads API keys and keeps them out of everything written. What a study would spend is
counted beside the studies (`vlm_decade.studies.estimate`).
"""
