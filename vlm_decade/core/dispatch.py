"""The one loop that sends work to Ray: a bounded number of calls in flight, results as they finish.

Every stage that hands batches to Ray actors or tasks (describe, embed, detections, the judge,
probes) goes through `bounded` (or `pool_map`, for a pool of actors that may be lost): it submits
work while fewer than `limit` calls are pending, and yields each call's outcome as it finishes, so
memory stays flat whatever the amount of work and a stage can save each result at once. A call
that fails yields its exception instead of a value: the exception the work itself raised, not Ray's
wrapper around it (`original`), so that rows and messages say the real cause; the stage decides
what a failure means for its rows. Neither waits forever: when nothing finishes for the stall
timeout, `Stalled` says why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vlm_decade.core.errors import RemoteError, plain

W = TypeVar("W")
_END = object()
# Calls in flight to each actor of a pool (`pool_map`): the next batch is ready while the last is saved.
IN_FLIGHT_PER_ACTOR = 2


@dataclass(frozen=True)
class Finished(Generic[W]):
    """One finished call: the work it was given, and its value or the exception it raised."""

    work: W
    value: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class LostActor:
    """An actor of a pool that was lost (its process or its node died) and replaced: the pool's
    `what`, the node's address where Ray said it, and how many of its batches went to the others."""

    what: str
    node: str | None
    batches_redone: int


class Stalled(RuntimeError):
    """No call finished for the stall timeout: the work waits for something the cluster lacks."""


def original(exc: BaseException) -> BaseException:
    """The exception a worker raised, under Ray's wrappers: a failed task's cause (and its cause,
    when the task failed on an argument that failed), with the worker's traceback as a note; for an
    actor whose constructor raised, the type and message its traceback ends with (Ray brings that
    error back only as text). Any other exception (an actor lost with its node, say) is itself."""
    from ray.exceptions import RayActorError, RayTaskError

    while isinstance(exc, RayTaskError) and exc.cause is not None and exc.cause is not exc:
        cause = exc.cause
        if isinstance(cause, Exception):
            cause.add_note(plain(str(exc)).rstrip())  # where in the worker it was raised
        exc = cause
    if isinstance(exc, RayActorError) and exc.actor_init_failed:
        return raised_in(str(exc)) or exc
    return exc


_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::[ ]?(.*))?")


def raised_in(traceback_text: str) -> RemoteError | None:
    """The exception a Python traceback's text ends with: the first line at the margin after its
    last frame (a qualified type is named by its class alone, as `type(exc).__name__` does)."""
    lines = plain(traceback_text).splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    if not frames:
        return None
    tail = lines[frames[-1] + 1 :]
    for i, line in enumerate(tail):
        if line and not line[0].isspace() and (found := _EXCEPTION_LINE.fullmatch(line)):
            message = "\n".join([found[2] or "", *tail[i + 1 :]]).strip()
            return RemoteError(found[1].rsplit(".", 1)[-1], message)
    return None


_NODE_IP = re.compile(r"^\s*ip: (\S+)$", re.MULTILINE)


def lost_node(exc: BaseException) -> str | None:
    """The address of the node an actor died on, where Ray's message names it."""
    found = _NODE_IP.search(str(exc))
    return found[1] if found else None


def batches(items: list[W], size: int) -> list[list[W]]:
    """`items` in consecutive batches of `size` (the last one shorter), in order."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def stalled(ray, what: str, needs: dict[str, float], seconds: float) -> Stalled:
    """The message of a stage that stopped moving, naming what it waits for and what is free."""
    free = ray.available_resources()
    wants = ", ".join(f"{v:g} {k}" for k, v in needs.items() if v) or "nothing but a worker"
    short = [k for k, v in needs.items() if v and free.get(k, 0) < v]
    why = (
        f"the cluster has {', '.join(f'{free.get(k, 0):g} {k}' for k in short)} free"
        if short
        else "nothing is short: a worker may be stuck"
    )
    return Stalled(
        f"{what}: no call finished in {seconds:g}s (runtime.stall_timeout_s); each waits for {wants}, and {why}. "
        "What finished is kept: run again when the cluster has room (or lower the resources each actor asks for)"
    )


def bounded(
    ray,
    work: Iterable[W],
    submit: Callable[[W, int], Any],
    limit: int,
    *,
    stall_timeout_s: float | None = None,
    what: str = "work",
    needs: dict[str, float] | None = None,
) -> Iterator[Finished[W]]:
    """Submit `work` items with `submit(item, slot)` while fewer than `limit` calls are in flight;
    yield each `Finished` call in the order they finish.

    `slot` (0 .. limit-1) is the place the call takes, freed when it finishes: with an actor pool,
    `actors[slot % len(actors)]` keeps the same number of calls on every actor. When no call
    finishes for `stall_timeout_s` (an actor that lost its node waiting for room to restart, say),
    `Stalled` is raised naming `what` and the resources each call `needs`, instead of waiting forever.
    """
    items = iter(work)
    pending: dict[Any, tuple[W, int]] = {}
    free = list(range(limit - 1, -1, -1))

    def fill() -> None:
        while free:
            item = next(items, _END)
            if item is _END:
                return
            slot = free.pop()
            pending[submit(item, slot)] = (item, slot)

    fill()
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=stall_timeout_s)
        if not ready:
            raise stalled(ray, what, needs or {}, stall_timeout_s)
        ref = ready[0]
        item, slot = pending.pop(ref)
        free.append(slot)
        try:
            done = Finished(item, ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - handed to the stage, which records it per row
            done = Finished(item, error=original(exc))
        fill()  # keep the cluster busy while the caller saves this result
        yield done


def pool_map(
    ray,
    make_actor: Callable[[], Any],
    n_actors: int,
    work: Iterable[W],
    call: Callable[[Any, W], Any],
    *,
    in_flight_per_actor: int = IN_FLIGHT_PER_ACTOR,
    max_lost: int = 3,
    stall_timeout_s: float | None = None,
    what: str = "work",
    needs: dict[str, float] | None = None,
    ready: Callable[[Any], Any] = lambda actor: actor.__ray_ready__.remote(),
    on_lost: Callable[[LostActor], None] = lambda lost: None,
) -> Iterator[Finished[W]]:
    """`bounded` over a pool of `n_actors` actors made by `make_actor`, that survives losing them.

    Work goes only to actors that have started (`ready`: a call that returns once the actor is up),
    so an actor that never finds room (the cluster counts a node that is gone, say) holds no work
    while the others finish it. A call whose actor died (its process or its node lost) is not an
    outcome: its work goes back to the queue and the actor leaves the pool, so the others take it
    over; when none is left, a new actor is made (it waits for room on the cluster, within the stall
    timeout). After `max_lost` actors are lost, or at once when an actor's constructor raised (a
    model that cannot load: every new actor would raise the same), the rest of the work is handed
    back failed with that cause, to become error rows that a later run tries again. Other failures
    are handed back as usual. Each actor lost (not one whose constructor raised) is told to
    `on_lost` once all its calls have come back, with the batches it had that others redo. The
    actors are killed when the work is done.
    """
    from ray.exceptions import RayActorError

    actors = {i: make_actor() for i in range(n_actors)}
    starting = {ready(actors[i]): i for i in actors}  # actors not known to be up yet
    load: dict[int, int] = {}  # calls in flight, per actor that is up
    queue = iter(work)
    retry: list[W] = []
    pending: dict[Any, tuple[W, int]] = {}
    made, lost, last_loss, broken, exhausted = n_actors, 0, None, False, False
    losing: dict[int, LostActor] = {}  # lost actors whose calls have not all come back yet

    def lose(slot: int, exc: RayActorError, item: Any = _END) -> bool:
        """The actor in `slot` leaves the pool; its call's `item` goes back to the queue while more
        actors may be made (said by the return)."""
        nonlocal lost, last_loss, broken
        if slot in actors:
            ray.kill(actors.pop(slot))
            load.pop(slot, None)
            lost += 1
            if not exc.actor_init_failed:
                losing[slot] = LostActor(what, None, 0)
        if not broken:  # the constructor's error stays the cause said for the rest
            last_loss = original(exc)
        broken = broken or exc.actor_init_failed
        requeued = item is not _END and makes_more()
        if requeued:
            retry.append(item)
        if slot in losing:
            was = losing[slot]
            losing[slot] = LostActor(what, was.node or lost_node(exc), was.batches_redone + requeued)
            settle(slot)
        return requeued

    def settle(slot: int) -> None:
        """A lost actor is told once none of its calls is still out."""
        if slot in losing and all(s != slot for _, s in pending.values()):
            on_lost(losing.pop(slot))

    def makes_more() -> bool:
        return lost <= max_lost and not broken

    def fill() -> None:
        nonlocal made, exhausted
        while makes_more():
            if not actors:
                actors[made] = make_actor()
                starting[ready(actors[made])] = made
                made += 1
            if not load:
                return  # no actor is up yet
            slot = min(load, key=lambda i: load[i])
            if load[slot] >= in_flight_per_actor:
                return
            item = retry.pop() if retry else next(queue, _END)
            if item is _END:
                exhausted = True
                return
            pending[call(actors[slot], item)] = (item, slot)
            load[slot] += 1

    try:
        fill()
        while pending or (starting and makes_more() and (retry or not exhausted)):
            ready_refs, _ = ray.wait([*pending, *starting], num_returns=1, timeout=stall_timeout_s)
            if not ready_refs:
                raise stalled(ray, what, needs or {}, stall_timeout_s)
            ref = ready_refs[0]
            if ref in starting:
                slot = starting.pop(ref)
                try:
                    ray.get(ref)
                    if slot in actors:
                        load[slot] = 0
                except RayActorError as exc:  # it died starting
                    lose(slot, exc)
                fill()
                continue
            item, slot = pending.pop(ref)
            if slot in load:
                load[slot] -= 1
            try:
                done = Finished(item, ray.get(ref))
            except RayActorError as exc:
                if lose(slot, exc, item):
                    fill()
                    continue
                done = Finished(item, error=original(exc))
            except Exception as exc:  # noqa: BLE001 - handed to the stage, which records it per row
                done = Finished(item, error=original(exc))
            settle(slot)  # a call its lost actor finished after all
            fill()
            yield done
        for item in [*retry, *queue]:  # left when too many actors were lost, or they cannot start
            yield Finished(item, error=last_loss)
    finally:
        for actor in actors.values():
            ray.kill(actor)
