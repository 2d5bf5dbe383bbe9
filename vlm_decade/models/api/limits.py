"""Requests- and tokens-per-minute limits for one provider, as an asyncio gate.

Requests are paced evenly (one every window/rpm seconds) rather than sent in a burst at the start of
each minute, and a sliding log of start times makes sure that no window of `window_s` ever holds
more than `rpm` starts. The window is widened by 1% (at least 0.25 s) so that the server, which sees
each request some milliseconds after we let it go (more for the first, which opens a connection),
never counts more than the limit either.

Tokens are reserved before a request at an estimate (input plus the output cap) and the entry is
corrected to the usage the provider reports afterwards, so a run of short answers is not held to
its worst case for long; an attempt the provider refused unworked (a 429) is corrected to 0, as
OpenAI and Gemini count no tokens of it. A correction that frees tokens wakes the head of the
queue at once, so it does not sleep on until the reservation would have left the window.

A limit that is None (an endpoint's rpm or tpm left out) is no limit.

Waiters are served by priority, then first come first served: a retry (`urgent`) goes ahead of
every request not tried yet, so it leaves as soon as its Retry-After and the limits allow instead of
queueing behind the whole backlog.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque


class RateLimiter:
    def __init__(self, rpm: int | None, tpm: int | None, window_s: float = 60.0):
        self.rpm, self.tpm = rpm, tpm
        self.window = window_s + max(0.01 * window_s, 0.25)
        self.interval = self.window / rpm if rpm else 0.0
        self.starts: deque[float] = deque()
        self.spent: deque[list] = deque()  # [start time, tokens], corrected by `reconcile`
        self.next_start = 0.0
        self.queue: list[tuple[int, int]] = []  # (0 urgent | 1 first attempt, arrival number): a heap
        self.order = itertools.count()
        self.changed = asyncio.Condition()
        self.waking: set[asyncio.Task] = set()  # wake-ups after a correction, kept until they run

    def _prune(self, now: float) -> None:
        while self.starts and self.starts[0] <= now - self.window:
            self.starts.popleft()
        while self.spent and self.spent[0][0] <= now - self.window:
            self.spent.popleft()

    def _wait(self, now: float, tokens: int) -> float:
        wait = self.next_start - now
        if self.rpm and len(self.starts) >= self.rpm:
            wait = max(wait, self.starts[-self.rpm] + self.window - now)
        used = sum(n for _, n in self.spent)
        if self.tpm and used + tokens > self.tpm:
            for t, n in self.spent:  # the first moment enough reserved tokens have left the window
                used -= n
                if used + tokens <= self.tpm:
                    wait = max(wait, t + self.window - now)
                    break
        return wait

    async def acquire(self, tokens: int, urgent: bool = False) -> list:
        """Wait for a slot; return the token entry to `reconcile`. The head of the queue (urgent
        first, then by arrival) waits for the limits; the others wait for their turn."""
        tokens = min(tokens, self.tpm or tokens)  # one request larger than the limit still gets its turn
        ticket = (0 if urgent else 1, next(self.order))
        async with self.changed:
            heapq.heappush(self.queue, ticket)
            self.changed.notify_all()  # an urgent arrival takes the head from a sleeping waiter
            try:
                while True:
                    if self.queue[0] != ticket:
                        await self.changed.wait()
                        continue
                    now = time.monotonic()
                    self._prune(now)
                    wait = self._wait(now, tokens)
                    if wait <= 0:
                        break
                    try:
                        await asyncio.wait_for(self.changed.wait(), wait)
                    except TimeoutError:
                        pass
            except BaseException:  # cancelled: leave the queue to the others
                self.queue.remove(ticket)
                heapq.heapify(self.queue)
                self.changed.notify_all()
                raise
            heapq.heappop(self.queue)
            self.starts.append(now)
            self.next_start = now + self.interval
            entry = [now, tokens]
            self.spent.append(entry)
            self.changed.notify_all()
            return entry

    def preload(self, started: list[tuple[float, int]]) -> None:
        """Count requests that started before this limiter did (`time.monotonic()` times, tokens):
        the previous gateway's last window, so a new one does not start with a full allowance."""
        for start, tokens in sorted(started):
            self.starts.append(start)
            self.spent.append([start, tokens])
            self.next_start = max(self.next_start, start + self.interval)

    def reconcile(self, entry: list, tokens: int) -> None:
        """Correct a reservation (`acquire`'s entry) to the tokens the provider counted."""
        freed = tokens < entry[1]
        entry[1] = tokens
        if freed and self.queue:
            task = asyncio.get_running_loop().create_task(self._wake())
            self.waking.add(task)
            task.add_done_callback(self.waking.discard)

    async def _wake(self) -> None:
        async with self.changed:
            self.changed.notify_all()
