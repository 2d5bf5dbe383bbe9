"""The fake API's behaviour knobs (`FaultConfig`) and the draw that decides each attempt's fault.

Faults are deterministic: whether an attempt fails is drawn from a RNG seeded by (seed, payload
hash, how many times this payload came before), so the same requests meet the same faults in any
order. `rate_400` is drawn from the payload alone: a request refused once is refused again, as a
real 4xx is. The first attempts of every payload may be told to fail whatever the rates
(`first_drop`, `first_429`, `first_status`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class FaultConfig:
    """Rates are per attempt, in [0, 1]. A timeout holds the connection `timeout_sleep_s` before answering."""

    latency_s: float = 0.0
    rate_429: float = 0.0
    retry_after_s: float = 1.0
    # Where a 429 says to wait `retry_after_s`: "retry-after" (the header), "retry-info" (Gemini's
    # google.rpc.RetryInfo in the error body), "ratelimit-reset" (OpenAI's x-ratelimit-* headers,
    # requests used up), or "" (nowhere).
    retry_hint: str = "retry-after"
    rate_500: float = 0.0
    rate_timeout: float = 0.0
    timeout_sleep_s: float = 5.0
    rate_broken_json: float = 0.0
    rate_400: float = 0.0
    first_429: int = 0  # the first n attempts of every distinct payload answer 429, whatever the rates
    first_drop: int = 0  # the first n attempts of every distinct payload: the connection is closed, no answer
    first_status: tuple[
        int, ...
    ] = ()  # the first attempts of every distinct payload answer these statuses, in order (e.g. 408, 409)
    only_if: str = ""  # faults strike only requests whose body holds this text (e.g. the judge's prompt)
    batch_delay_s: float = 0.5  # a batch is worked through this long after it was created
    batch_line_fail_rate: float = 0.0  # lines of a batch that fail (500), per line
    batch_expire_first: int = 0  # the first n batches created expire with half their lines done
    batch_fail_first: int = (
        0  # the first n batches created (after those that expire) fail validation: status failed, no line run
    )
    capacity: int = 0  # past this many chat or embeddings requests at once, each is slower in proportion
    overload_at: int = 0  # past this many at once, a request is refused at once: 429, no Retry-After
    slowdown: float = 1.0  # past `capacity`, latency grows as (at once / capacity) ** slowdown
    latency_noise: float = 0.0  # each answer's latency times a draw from [1 - noise, 1 + noise], seeded by its body
    seed: int = 0

    def answer_delay(self, at_once: int, digest: str) -> float:
        """Seconds an answer takes with `at_once` requests in the server (this one's body hashing to
        `digest`): `latency_s`, slower past `capacity`, with its noise."""
        load = max(1.0, at_once / (self.capacity or at_once)) ** self.slowdown
        draw = np.random.default_rng([self.seed, int(digest[:15], 16), 0]).random()
        return self.latency_s * load * (1.0 + self.latency_noise * (2 * draw - 1))


def fault_outcome(f: FaultConfig, digest: str, attempt: int) -> str:
    """The outcome of attempt `attempt` (0: the first) of the payload whose sha256 is `digest`: ok,
    dropped, a status (429, 400, one of `first_status`), 500, timeout or broken."""
    if attempt < f.first_drop:
        return "dropped"
    if attempt < f.first_drop + f.first_429:
        return "429"
    if attempt < f.first_drop + f.first_429 + len(f.first_status):
        return str(f.first_status[attempt - f.first_drop - f.first_429])
    fixed = np.random.default_rng([f.seed, int(digest[:15], 16)])
    if fixed.random() < f.rate_400:
        return "400"
    draw = np.random.default_rng([f.seed, int(digest[:15], 16), attempt + 1]).random()
    for outcome, rate in (
        ("429", f.rate_429),
        ("500", f.rate_500),
        ("timeout", f.rate_timeout),
        ("broken", f.rate_broken_json),
    ):
        if draw < rate:
            return outcome
        draw -= rate
    return "ok"
