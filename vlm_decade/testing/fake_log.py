"""What the fake API keeps of each request (`Received`) and a question tests ask of those records.

Every request is logged with its time, endpoint, payload sha256 and outcome, and for an ok answer
the model and the usage it reported, when it was written and whether the client was still there to
read it; a batch's lines are logged alike with `mode` batch. `max_in_window` says how many requests
fell in the busiest window, so a test can prove that no 60 s window held more than a limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Received:
    """One request as the server saw it. `input_tokens` / `output_tokens` are the usage an ok
    answer reported (what a provider bills); `delivered` says whether that answer went to a client
    still connected (False: the client had gone, e.g. killed, before the answer was ready)."""

    time: float  # when the request had arrived whole
    endpoint: str
    payload_sha256: str
    outcome: str  # ok, 429, 500, timeout, broken, 400, dropped; control: a files or batches request
    model: str = ""
    inputs: int = 1  # texts in an embeddings request
    input_tokens: int = 0
    output_tokens: int = 0
    answered: float | None = None  # when the answer (or the error) was written
    delivered: bool | None = None
    mode: str = "sync"  # batch: a line of a batch (endpoint `<provider>.batch_line`)
    key: str = ""  # a batch line's custom id
    batch: str = ""  # a batch line's batch
    body: bytes = field(default=b"", repr=False)  # the request body, as it arrived (a batch line: its request)


def max_in_window(times: list[float], window_s: float = 60.0) -> int:
    """The most requests whose arrival times fall in any half-open window of `window_s`."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
