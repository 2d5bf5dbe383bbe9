"""How many requests a gateway lets be in flight at once: a fixed number, or one that adapts.

A server's capacity is seldom known in advance (a vLLM server's depends on the GPU, the model and
the prompts), so `AdaptiveLimit` learns it from the answers. What it maximises is throughput,
answers per second, which it estimates by Little's law at each level (a whole number of requests
in flight): the requests in flight when each was sent over how long each took, summed over a round
of answers. Latency alone says little: past its capacity one server queues (more in flight, the
same throughput), another slows down (fewer answers a second), another refuses.

- start: from `start`, the limit grows by half each round (an answer per request allowed, of
  requests sent with the limit full) while the throughput grows nearly in proportion (at least
  0.85 times as much; a level that falls behind is measured once more before it counts), then goes
  back to the better of its last two levels;
- then a climb, one level at a time, each round two answers per request allowed: up to a
  neighbouring level clearly faster (by `tolerance`), else down to one not clearly slower (as many
  answers with fewer in flight), else a neighbour not measured yet (or not for `memory` rounds) is
  tried, the one below first unless the throughput still rises from there; else it stays;
- a 429, a 503 or a timeout marks its level as giving nothing and steps the limit down one level
  at once (that level is tried again `memory` rounds later);
- answers and refusals of requests sent at an earlier level tell of that level and are not counted
  (`ticket`).

The limit never leaves [1, ceiling]. `ConcurrencyGate` holds the requests to it (an asyncio gate);
the gateway's rate limits and Retry-After waits are not its business.
"""

from __future__ import annotations

import asyncio
import math


class AdaptiveLimit:
    """The limit on requests in flight, from what their answers say (pure: no clock, no I/O)."""

    def __init__(self, ceiling: int, start: int = 4, tolerance: float = 0.04, memory: int = 30):
        self.ceiling = ceiling
        self.level = max(1, min(start, ceiling))
        self.tolerance, self.memory = tolerance, memory
        self.epoch = 0  # changes of level so far
        self.starting = True
        self.rates: dict[int, tuple[float, int]] = {}  # level -> (answers per second, round measured)
        self.rounds = 0
        self.previous: int | None = None  # the level of the round before, while starting
        self.doubted = False  # while starting, this level fell behind once: it is measured again
        self.count = self.in_flight = 0
        self.latency = 0.0

    @property
    def allowed(self) -> int:
        return self.level

    def ticket(self, in_flight: int) -> tuple[int, int]:
        """Taken as a request is sent, with `in_flight` requests (itself included) then in flight."""
        return self.epoch, in_flight

    def answered(self, ticket: tuple[int, int], latency_s: float) -> None:
        """A request sent with `ticket` was answered in `latency_s`."""
        epoch, in_flight = ticket
        if epoch != self.epoch or (self.starting and in_flight < self.level):
            return  # of another level (while starting, of the way up to this one)
        self.count += 1
        self.in_flight += in_flight
        self.latency += max(latency_s, 1e-6)
        if self.count >= (1 if self.starting else 2) * max(self.level, 2):
            self._measured(self.in_flight / self.latency)

    def overloaded(self, ticket: tuple[int, int]) -> None:
        """A request sent with `ticket` got a 429, a 503 or no answer in time."""
        if ticket[0] != self.epoch:
            return
        self.rounds += 1
        self.rates[self.level] = (0.0, self.rounds)
        self.starting = False
        self._move(self.level - 1)

    def rate(self, level: int) -> float | None:
        """The throughput measured at `level`, unless never or over `memory` rounds ago."""
        if level < 1 or level > self.ceiling:
            return 0.0  # never a choice
        found = self.rates.get(level)
        return found[0] if found is not None and self.rounds - found[1] <= self.memory else None

    def _measured(self, rate: float) -> None:
        self.rounds += 1
        known = self.rate(self.level)
        self.rates[self.level] = (rate if not known else (known + rate) / 2, self.rounds)
        if self.starting:
            self._start()
        else:
            self._climb()

    def _start(self) -> None:
        level, before = self.level, self.previous
        # the server keeps up: the throughput grew nearly in proportion to the limit
        keeps_up = before is None or self.rate(level) >= self.rate(before) * 0.85 * level / before
        if keeps_up and level < self.ceiling:
            self.previous, self.doubted = level, False
            self._move(max(level + 1, math.ceil(level * 1.5)))
            return
        if not keeps_up and not self.doubted:  # once may be noise (a busy client, a slow answer)
            self.doubted = True
            self._move(level)
            return
        self.starting = False
        self._move(max((lv for lv in (level, before) if lv is not None), key=self.rate))

    def _climb(self) -> None:
        level, tol = self.level, self.tolerance
        here, up, down = self.rate(level), self.rate(level + 1), self.rate(level - 1)
        if up is not None and up > here * (1 + tol):
            self._move(level + 1)
        elif down is not None and down >= here * (1 - tol):
            self._move(level - 1)  # as fast with fewer in flight
        elif down is None:
            self._move(level - 1)  # try one fewer
        elif up is None and here > down * (1 + tol):
            self._move(level + 1)  # still rising: try one more
        else:
            self._move(level)

    def _move(self, level: int) -> None:
        """A new round at `level` (bounded to [1, ceiling]); answers sent before it no longer count."""
        self.level = max(1, min(level, self.ceiling))
        self.epoch += 1
        self.count = self.in_flight = 0
        self.latency = 0.0


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

    def ticket(self) -> tuple[int, int]:
        return self.control.ticket(self.in_use) if self.control else (0, self.in_use)

    async def answered(self, ticket: tuple[int, int], latency_s: float) -> None:
        if self.control:
            self.control.answered(ticket, latency_s)
            async with self.changed:
                self.changed.notify_all()  # the limit may have grown

    def overloaded(self, ticket: tuple[int, int]) -> None:
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
