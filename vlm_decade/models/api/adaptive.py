"""How many requests a gateway lets be in flight at once: a fixed number, or one that adapts.

A server's capacity is seldom known in advance (a vLLM server's depends on the GPU, the model and
the prompts), so `AdaptiveLimit` learns it from the answers, as TCP's congestion control does:

- slow start: from `start`, one more per answer (the limit doubles every round trip) until the
  first sign of overload;
- then additive increase: one more per round trip (1/limit per answer) while answers come as fast
  as the fastest seen (within `slow` times it);
- multiplicative decrease: an answer slower than that takes the limit down by `ease` (the server
  queues: more in flight only adds waiting), and a 429, a 503 or a timeout halves it (`backoff`);
- one decrease per round trip: the answers to requests sent before the last decrease tell of the
  old limit and do not lower it again (`ticket`).

The limit never leaves [1, ceiling]. `ConcurrencyGate` holds the requests to it (an asyncio gate);
the gateway's rate limits and Retry-After waits are not its business.
"""

from __future__ import annotations

import asyncio


class AdaptiveLimit:
    """The limit on requests in flight, from what their answers say (pure: no clock, no I/O)."""

    def __init__(self, ceiling: int, start: int = 4, slow: float = 2.0, ease: float = 0.9, backoff: float = 0.5):
        self.ceiling = ceiling
        self.limit = float(min(start, ceiling))
        self.slow, self.ease, self.backoff = slow, ease, backoff
        self.fastest: float | None = None  # the quickest answer seen: the server unloaded
        self.epoch = 0  # decreases so far
        self.starting = True  # slow start, until the first decrease

    @property
    def allowed(self) -> int:
        return max(1, int(self.limit))

    def ticket(self) -> int:
        """Taken as a request is sent: which decrease it was sent after."""
        return self.epoch

    def answered(self, ticket: int, latency_s: float) -> None:
        """A request sent with `ticket` was answered in `latency_s`."""
        if self.fastest is None or latency_s < self.fastest:
            self.fastest = latency_s
        if latency_s > self.slow * self.fastest:
            self._decrease(ticket, self.ease)
        else:
            self.limit = min(float(self.ceiling), self.limit + (1.0 if self.starting else 1.0 / self.limit))

    def overloaded(self, ticket: int) -> None:
        """A request sent with `ticket` got a 429, a 503 or no answer in time."""
        self._decrease(ticket, self.backoff)

    def _decrease(self, ticket: int, factor: float) -> None:
        if ticket < self.epoch:
            return
        self.limit = max(1.0, self.limit * factor)
        self.epoch += 1
        self.starting = False


class ConcurrencyGate:
    """`async with gate:` waits for one of the slots: `ceiling` of them, or (`adaptive`) as many as
    its `AdaptiveLimit` allows now."""

    def __init__(self, ceiling: int, adaptive: bool = False):
        self.control = AdaptiveLimit(ceiling) if adaptive else None
        self.ceiling = ceiling
        self.in_use = 0
        self.changed = asyncio.Condition()

    @property
    def allowed(self) -> int:
        return self.control.allowed if self.control else self.ceiling

    def ticket(self) -> int:
        return self.control.ticket() if self.control else 0

    async def answered(self, ticket: int, latency_s: float) -> None:
        if self.control:
            self.control.answered(ticket, latency_s)
            async with self.changed:
                self.changed.notify_all()  # the limit may have grown

    def overloaded(self, ticket: int) -> None:
        if self.control:
            self.control.overloaded(ticket)

    async def __aenter__(self) -> ConcurrencyGate:
        async with self.changed:
            await self.changed.wait_for(lambda: self.in_use < self.allowed)
            self.in_use += 1
        return self

    async def __aexit__(self, *exc) -> None:
        async with self.changed:
            self.in_use -= 1
            self.changed.notify_all()
