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
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from vlm_decade.core.errors import RemoteError, plain

if TYPE_CHECKING:
    from ray.exceptions import RayActorError

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


def _ready(actor) -> Any:
    """Ray's own call that returns once `actor` is up."""
    return actor.__ray_ready__.remote()


def _untold(lost: LostActor) -> None:
    """No one is told of a lost actor."""


@dataclass(frozen=True)
class _PoolOptions:
    """How `pool_map` runs its pool (its keywords, which it documents)."""

    in_flight_per_actor: int
    max_lost: int
    stall_timeout_s: float | None
    what: str
    needs: dict[str, float] | None
    ready: Callable[[Any], Any]
    on_lost: Callable[[LostActor], None]


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
    ready: Callable[[Any], Any] = _ready,
    on_lost: Callable[[LostActor], None] = _untold,
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
    options = _PoolOptions(in_flight_per_actor, max_lost, stall_timeout_s, what, needs, ready, on_lost)
    yield from _Pool(ray, make_actor, call, options).run(n_actors, work)


class _Pool(Generic[W]):
    """`pool_map`'s actors and the calls it has out, step by step: an actor started or lost, a call
    finished, the free places filled with work."""

    def __init__(self, ray, make_actor: Callable[[], Any], call: Callable[[Any, W], Any], options: _PoolOptions):
        self.ray, self.make_actor, self.call, self.options = ray, make_actor, call, options
        self.actors: dict[int, Any] = {}
        self.starting: dict[Any, int] = {}  # actors not known to be up yet, by their `ready` call
        self.load: dict[int, int] = {}  # calls in flight, per actor that is up
        self.queue: Iterator[W] = iter(())
        self.retry: list[W] = []
        self.pending: dict[Any, tuple[W, int]] = {}
        self.made, self.lost, self.last_loss, self.broken, self.exhausted = 0, 0, None, False, False
        self.losing: dict[int, LostActor] = {}  # lost actors whose calls have not all come back yet

    def run(self, n_actors: int, work: Iterable[W]) -> Iterator[Finished[W]]:
        self.actors = {i: self.make_actor() for i in range(n_actors)}
        self.starting = {self.options.ready(self.actors[i]): i for i in self.actors}
        self.queue, self.made = iter(work), n_actors
        try:
            self.fill()
            while self.pending or (self.starting and self.makes_more() and (self.retry or not self.exhausted)):
                ref = self.next_ready()
                done = self.started(ref) if ref in self.starting else self.finished(ref)
                self.fill()  # keep the cluster busy while the caller saves this result
                if done is not None:
                    yield done
            for item in [*self.retry, *self.queue]:  # left when too many actors were lost, or they cannot start
                yield Finished(item, error=self.last_loss)
        finally:
            for actor in self.actors.values():
                self.ray.kill(actor)

    def next_ready(self) -> Any:
        """The next call to return, an actor's start or a piece of work; `Stalled` when none does
        within the stall timeout."""
        o = self.options
        ready, _ = self.ray.wait([*self.pending, *self.starting], num_returns=1, timeout=o.stall_timeout_s)
        if not ready:
            raise stalled(self.ray, o.what, o.needs or {}, o.stall_timeout_s)
        return ready[0]

    def started(self, ref: Any) -> None:
        """An actor's start came back: it takes work from now on, or it died starting and leaves."""
        from ray.exceptions import RayActorError

        slot = self.starting.pop(ref)
        try:
            self.ray.get(ref)
            if slot in self.actors:
                self.load[slot] = 0
        except RayActorError as exc:  # it died starting
            self.lose(slot, exc)

    def finished(self, ref: Any) -> Finished[W] | None:
        """A call came back: its outcome, or None when its actor died and its work went back to the queue."""
        from ray.exceptions import RayActorError

        item, slot = self.pending.pop(ref)
        if slot in self.load:
            self.load[slot] -= 1
        try:
            done = Finished(item, self.ray.get(ref))
        except RayActorError as exc:
            if self.lose(slot, exc, item):
                return None
            done = Finished(item, error=original(exc))
        except Exception as exc:  # noqa: BLE001 - handed to the stage, which records it per row
            done = Finished(item, error=original(exc))
        self.settle(slot)  # a call its lost actor finished after all
        return done

    def lose(self, slot: int, exc: RayActorError, item: Any = _END) -> bool:
        """The actor in `slot` leaves the pool; its call's `item` goes back to the queue while more
        actors may be made (said by the return)."""
        if slot in self.actors:
            self.ray.kill(self.actors.pop(slot))
            self.load.pop(slot, None)
            self.lost += 1
            if not exc.actor_init_failed:
                self.losing[slot] = LostActor(self.options.what, None, 0)
        if not self.broken:  # the constructor's error stays the cause said for the rest
            self.last_loss = original(exc)
        self.broken = self.broken or exc.actor_init_failed
        requeued = item is not _END and self.makes_more()
        if requeued:
            self.retry.append(item)
        if slot in self.losing:
            was = self.losing[slot]
            self.losing[slot] = LostActor(was.what, was.node or lost_node(exc), was.batches_redone + requeued)
            self.settle(slot)
        return requeued

    def settle(self, slot: int) -> None:
        """A lost actor is told once none of its calls is still out."""
        if slot in self.losing and all(s != slot for _, s in self.pending.values()):
            self.options.on_lost(self.losing.pop(slot))

    def makes_more(self) -> bool:
        return self.lost <= self.options.max_lost and not self.broken

    def fill(self) -> None:
        """Hand out work while an actor that is up has room (the least loaded first), making a new
        actor when none is left."""
        while self.makes_more():
            if not self.actors:
                self.actors[self.made] = self.make_actor()
                self.starting[self.options.ready(self.actors[self.made])] = self.made
                self.made += 1
            if not self.load:
                return  # no actor is up yet
            slot = min(self.load, key=lambda i: self.load[i])
            if self.load[slot] >= self.options.in_flight_per_actor:
                return
            item = self.retry.pop() if self.retry else next(self.queue, _END)
            if item is _END:
                self.exhausted = True
                return
            self.pending[self.call(self.actors[slot], item)] = (item, slot)
            self.load[slot] += 1
