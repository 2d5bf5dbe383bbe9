"""The one loop that sends work to Ray: a bounded number of calls in flight, results as they finish.

Every stage that hands batches to Ray actors or tasks (describe, embed, detections, the judge,
probes) goes through `bounded`: it submits work while fewer than `limit` calls are pending, and
yields each call's outcome as it finishes, so memory stays flat whatever the amount of work and a
stage can save each result at once. A call that fails yields its exception instead of a value: the
stage decides what a failure means for its rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

W = TypeVar("W")
_END = object()


@dataclass(frozen=True)
class Finished(Generic[W]):
    """One finished call: the work it was given, and its value or the exception it raised."""

    work: W
    value: Any = None
    error: BaseException | None = None


def bounded(ray, work: Iterable[W], submit: Callable[[W, int], Any], limit: int) -> Iterator[Finished[W]]:
    """Submit `work` items with `submit(item, slot)` while fewer than `limit` calls are in flight;
    yield each `Finished` call in the order they finish.

    `slot` (0 .. limit-1) is the place the call takes, freed when it finishes: with an actor pool,
    `actors[slot % len(actors)]` keeps the same number of calls on every actor.
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
        (ref,), _ = ray.wait(list(pending), num_returns=1)
        item, slot = pending.pop(ref)
        free.append(slot)
        try:
            done = Finished(item, ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - handed to the stage, which records it per row
            done = Finished(item, error=exc)
        fill()  # keep the cluster busy while the caller saves this result
        yield done
