"""The budget a gateway and its batcher share, on hand-worked sums: what earlier gateways left, what
this one reserves, waits for, hands over and collects."""

from __future__ import annotations

import asyncio

import pytest

from vlm_decade.models.api.budget import Budget, BudgetStop
from vlm_decade.models.api.spend import Spend


def test_an_attempt_that_does_not_fit_waits_for_one_in_flight_and_goes_when_it_makes_room():
    async def go():
        budget = Budget("openai", 1.0)
        await budget.reserve(0.6)
        second = asyncio.create_task(budget.reserve(0.6))  # 0.6 + 0.6 > 1: waits
        await asyncio.sleep(0.01)
        waited = not second.done()
        budget.release(0.6, 0.1)  # the first cost $0.1: 0.1 + 0.6 fits
        await second
        return budget, waited

    budget, waited = asyncio.run(go())
    assert waited and (budget.spent, budget.reserved, budget.in_flight) == (pytest.approx(0.1), pytest.approx(0.6), 1)


def test_a_batch_left_pending_counts_at_its_worst_case_until_it_is_collected():
    # An earlier gateway paid $0.2 and left one batch line open at its worst case, $0.1.
    budget = Budget("openai", 1.0, Spend(paid=0.2, unresolved=0.1, open={"batch_a:k1": 0.1}))
    assert budget.total_spent == pytest.approx(0.3)
    asyncio.run(budget.reserve(0.5))
    budget.hand_over("batch_b:k2", 0.5)  # this run does not wait for its batch
    assert (budget.reserved, budget.in_flight, budget.total_spent) == (0.0, 0, pytest.approx(0.8))
    stop = r"budget \$1 for openai reached \(spent \$0.8000; the next request may cost up to \$0.2500\)"
    with pytest.raises(BudgetStop, match=stop):
        asyncio.run(budget.reserve(0.25))  # 0.8 + 0.25 > 1 with nothing in flight
    budget.collect("batch_b:k2", 0.2)  # $0.5 at worst, $0.2 billed
    budget.collect("batch_a:k1", 0.05)
    assert budget.total_spent == pytest.approx(0.2 + 0.2 + 0.05)
    asyncio.run(budget.reserve(0.5))  # 0.45 + 0.5 fits
