"""A provider's budget for one run folder, held by its gateway and that gateway's batcher alike.

It covers what the gateways before this one paid (the folder's spend log: earlier stages, models
and runs) and left unresolved at their worst case, what this gateway paid, and the worst-case
reservations of the attempts in flight (a sync attempt, or a line of a batch not collected yet).
An attempt reserves its worst case before it leaves and releases it with what it cost; one whose
worst case would pass the budget waits while attempts in flight may still release theirs, and is
stopped only when nothing is in flight and it still would not fit.
"""

from __future__ import annotations

import asyncio

from vlm_decade.models.api.spend import Spend


class BudgetStop(Exception):
    """The next attempt would pass the budget and nothing in flight can make room."""


class Budget:
    def __init__(self, provider: str, limit_usd: float | None, before: Spend | None = None):
        """`limit_usd` none: no budget. `before`: the folder's spend log as this gateway found it."""
        self.provider, self.limit = provider, limit_usd
        # Earlier gateways of this folder: what they paid, and their unanswered attempts at worst case.
        self.spent_before = before.paid + before.unresolved if before else 0.0
        self.open_before = dict(before.open) if before else {}  # those attempts, until one is collected here
        self.spent = 0.0  # US$ paid through this gateway
        self.reserved = 0.0  # worst-case cost of the attempts in flight
        self.in_flight = 0
        self.released = asyncio.Event()  # replaced at each release; waiters wake on it

    @property
    def total_spent(self) -> float:
        """What the run folder has spent with this provider, earlier runs included."""
        return self.spent_before + self.spent

    def message(self, worst: float) -> str:
        return (
            f"budget ${self.limit:g} for {self.provider} reached (spent ${self.total_spent:.4f}; the next request "
            f"may cost up to ${worst:.4f}); raise providers.{self.provider}.budget_usd to go on"
        )

    async def reserve(self, worst: float) -> None:
        """Hold `worst` for one attempt; wait while attempts in flight may still make room;
        `BudgetStop` when nothing is in flight and it does not fit."""
        while self.limit is not None and self.total_spent + self.reserved + worst > self.limit:
            if self.in_flight == 0:
                raise BudgetStop(self.message(worst))
            await self.released.wait()
        self.reserved += worst
        self.in_flight += 1

    def release(self, worst: float, paid: float) -> None:
        """An attempt that reserved `worst` is resolved: it cost `paid` (0 when nothing was billed)."""
        self.reserved -= worst
        self.in_flight -= 1
        if self.in_flight == 0:
            self.reserved = 0.0  # no float dust left behind
        self._spend(paid)

    def collect(self, attempt: str, paid: float) -> None:
        """An attempt an earlier gateway left unresolved (a batch collected here) is resolved: its
        worst case gives way to what it cost."""
        self.spent_before -= self.open_before.pop(attempt, 0.0)
        self._spend(paid)

    def hand_over(self, attempt: str, worst: float) -> None:
        """An attempt that reserved `worst` stays unresolved past this gateway (a batch this run does
        not wait for): it leaves the reservations, so no attempt waits on it, and counts at its
        worst case as an earlier gateway's does until it is collected."""
        self.release(worst, 0.0)
        self.spent_before += worst
        self.open_before[attempt] = worst

    def _spend(self, paid: float) -> None:
        self.spent += paid
        self.released.set()
        self.released = asyncio.Event()
