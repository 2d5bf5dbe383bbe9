"""The adaptive concurrency limit, by hand-worked sequences of answers and against simulated servers
(a clock of events, no sockets) that refuse past their capacity, slow down past it, or both with
noise: it ends at the best fixed limit and gets at least 0.9 of its throughput."""

from __future__ import annotations

import asyncio
import heapq
import random

import pytest

from vlm_decade.models.api.adaptive import AdaptiveLimit, ConcurrencyGate

from .api_clients import loop, run  # noqa: F401 - loop: the per-test event loop fixture


def answer_round(limit: AdaptiveLimit, latency_s: float) -> None:
    """Answers, each `latency_s`, to requests sent with the limit full, until the level changes."""
    epoch = limit.epoch
    while limit.epoch == epoch:
        limit.answered(limit.ticket(limit.allowed), latency_s)


def test_the_limit_grows_by_half_each_round_while_the_throughput_keeps_up():
    limit = AdaptiveLimit(ceiling=100, start=4)
    for latency in (0.1, 0.1, 0.1):
        answer_round(limit, latency)
    assert limit.allowed == 14 and limit.starting  # 4, 6, 9, 14
    limit.answered(limit.ticket(3), 0.5)  # sent before the limit was full: tells nothing of 14
    limit.answered((limit.epoch - 1, 14), 0.5)  # sent at the level before
    assert limit.count == 0


def test_the_start_ends_where_the_throughput_twice_stops_rising_with_the_limit_and_keeps_the_better_level():
    limit = AdaptiveLimit(ceiling=100, start=4)
    answer_round(limit, 0.1)  # 4 at once: 40 answers a second
    answer_round(limit, 0.1)  # 6: 60
    answer_round(limit, 0.2)  # 9 in 0.2 s: 45, less than at 6
    assert limit.starting and limit.allowed == 9  # once may be noise: measured again
    answer_round(limit, 0.2)
    assert not limit.starting and limit.allowed == 6


def test_a_refusal_steps_down_one_level_once_and_the_level_is_tried_again_later():
    limit = AdaptiveLimit(ceiling=100, start=9, memory=4)
    sent = [limit.ticket(9) for _ in range(9)]
    limit.overloaded(sent[0])
    assert limit.allowed == 8 and not limit.starting and limit.rate(9) == 0.0
    for ticket in sent[1:]:  # their refusals tell of the old level: no second step
        limit.overloaded(ticket)
    assert limit.allowed == 8
    seen = []
    for _ in range(12):  # a server that serves 8 at once in 0.1 s and refuses a ninth
        if limit.allowed > 8:
            seen.append(limit.allowed)
            limit.overloaded(limit.ticket(limit.allowed))
        else:
            answer_round(limit, 0.1)
    # tried again every `memory` rounds or so, never higher; between, at or one below the capacity
    assert seen and set(seen) == {9} and len(seen) <= 3 and limit.allowed in (7, 8)


def test_the_limit_never_leaves_one_to_the_ceiling():
    limit = AdaptiveLimit(ceiling=10, start=4)
    for _ in range(30):
        answer_round(limit, 0.1)  # a server that never slows
    assert 9 <= limit.allowed <= 10
    for _ in range(30):
        limit.overloaded(limit.ticket(limit.allowed))
    assert limit.allowed == 1


def serve(fixed: int | None, capacity=8, slowdown=1.0, refuse_at=0, noise=0.0, requests=3000, seed=0):
    """Answers per second of a simulated client sending `requests` through a gate of `fixed` slots
    (or the adaptive limit, ceiling 64) to a server of `capacity` answering in 0.2 s, slower past
    it as (at once / capacity) ** slowdown and refusing past `refuse_at`; a refused request waits
    0.5 to 1 s and is sent again, holding its slot (as the gateway does)."""
    rng = random.Random(seed)
    limit = None if fixed else AdaptiveLimit(64)
    events, order = [], iter(range(10**9))
    waiting, in_use, at_server, now = requests, 0, 0, 0.0

    def send(ticket):
        nonlocal at_server
        at_server += 1
        if refuse_at and at_server > refuse_at:
            heapq.heappush(events, (now + 0.001, next(order), "refused", ticket, 0.0))
            return
        latency = 0.2 * max(1.0, at_server / capacity) ** slowdown * (1 + max(noise, 0.02) * (2 * rng.random() - 1))
        heapq.heappush(events, (now + latency, next(order), "answer", ticket, latency))

    while True:
        while waiting and in_use < (fixed or limit.allowed):
            waiting, in_use = waiting - 1, in_use + 1
            send(limit.ticket(in_use) if limit else None)
        if not events:
            return requests / now
        now, _, kind, ticket, latency = heapq.heappop(events)
        if kind == "answer":
            at_server, in_use = at_server - 1, in_use - 1
            if limit:
                limit.answered(ticket, latency)
        elif kind == "refused":
            at_server -= 1
            if limit:
                limit.overloaded(ticket)
            heapq.heappush(events, (now + 0.5 + 0.5 * rng.random(), next(order), "again", None, 0.0))
        else:
            send(limit.ticket(in_use) if limit else None)


@pytest.mark.parametrize(
    "server",
    [
        {"refuse_at": 8},
        {"slowdown": 1.5},
        {"slowdown": 2.0},
        {"slowdown": 1.5, "refuse_at": 16, "noise": 0.3},
        {"slowdown": 1.0},  # one that queues: more in flight, the same throughput
    ],
    ids=["refuses", "slows", "slows-sharply", "both-noisy", "queues"],
)
def test_adaptive_gets_nine_tenths_of_the_best_fixed_limit(server):
    best = max(serve(n, **server) for n in (4, 6, 8, 10, 12, 16, 32))
    for seed in range(3):
        assert serve(None, seed=seed, **server) >= 0.9 * best


def test_the_gate_holds_requests_to_the_limit_of_the_moment():
    async def scenario():
        gate = ConcurrencyGate(ceiling=8, adaptive=True)
        gate.control.level = 2
        inside, most = 0, 0

        async def one():
            nonlocal inside, most
            async with gate:
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.01)
                inside -= 1

        await asyncio.gather(*(one() for _ in range(10)))
        fixed = ConcurrencyGate(ceiling=3)
        fixed.overloaded(fixed.ticket())  # a fixed gate does not adapt
        return most, fixed.allowed

    assert run(scenario()) == (2, 3)
