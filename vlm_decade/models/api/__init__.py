"""The transport to the OpenAI and Gemini APIs, and to named endpoints that speak one of them (any
OpenAI-compatible server), for the models, encoders and judges behind them.

The layers, as in lm-evaluation-harness's API models: a provider only builds a request with the
official client and parses the answer; one gateway per provider owns everything else, as an async
Ray actor, so that its limits hold for the whole cluster. What a study would spend is counted
beside the studies (`vlm_decade.studies.estimate`).

- `providers.py`: one request built with the official client, one answer parsed; which models think.
- `gateway.py`: the only sender: cache, limits, concurrency, timeouts, retries, costs and budget.
- `limits.py`: the requests- and tokens-per-minute limits.
- `adaptive.py`: the concurrency cap, fixed or learnt from the answers.
- `cache.py`: the content-addressed response cache, shared by every run pointed at it.
- `budget.py`: a provider's budget for one run folder, held by the gateway and its batcher.
- `spend.py`: the run folder's spend log, which carries budget and limits to the next gateway.
- `answers.py`: the rows given without a provider answering (cached, failed).
- `batch/`: batch mode: the providers' batch interfaces, the batch records on disk, the batcher.
- `session.py`: a stage's gateway actor, and the money spent copied into the manifest.
- `gateways.py`: a stage's sessions, one per provider, and the stop that says what each left.
- `endpoints.py`: named endpoints, whether they answer and serve the model, and every API entry's check.
- `keys.py`: API keys, read from the environment and kept out of everything written.
"""
