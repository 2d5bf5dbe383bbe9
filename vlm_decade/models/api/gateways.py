"""What the API stages (describe, embed) share: one gateway session (`session.RemoteSession`) per
provider for the whole stage, and one stop that says what each of its models or encoders left.

One session per provider, not per model: the stage's models (or encoders) of a provider share its
gateway's budget and rate limits, and in batch mode every one of them hands its requests over
before `flush` has each gateway submit the batches it grouped; only then is any batch waited on. A
study in batch mode thus waits one batch turnaround per stage, not one per model, and a run that
does not wait submits every batch of the stage before it stops.
"""

from __future__ import annotations

from contextlib import ExitStack

from vlm_decade.core.config import ProvidersConfig
from vlm_decade.core.runner import StudyRun
from vlm_decade.models.api.session import APIStopped, BatchesPending, BudgetReached, RemoteSession


class Gateways:
    """The gateway sessions of one stage, by provider (none started for a stage with no API work),
    ended with the stage."""

    def __init__(self, run: StudyRun, config: ProvidersConfig, providers: list[str]):
        self.ray = run.ray() if providers else None
        self.sessions: dict[str, RemoteSession] = {}
        self._stack = ExitStack()
        try:
            for provider in providers:
                session = RemoteSession(self.ray, config, run.folder, provider)
                self.sessions[provider] = self._stack.enter_context(session)
        except BaseException:
            self._stack.close()
            raise

    def __getitem__(self, provider: str) -> RemoteSession:
        return self.sessions[provider]

    def flush(self) -> None:
        """Every gateway submits the requests it has grouped, as batches."""
        if self.sessions:
            self.ray.get([session.actor.flush.remote() for session in self.sessions.values()])

    def record(self) -> None:
        """Copy every provider's spend into the manifest."""
        for session in self.sessions.values():
            session.record()

    def __enter__(self) -> Gateways:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()


def raise_stops(stops: list[APIStopped]) -> None:
    """One exception for what several models or encoders of a stage left undone, naming each: only
    batches still pending is `BatchesPending` (a run that does not wait ends there); anything else
    stops the run, as a budget (`BudgetReached`) when every other stop is one."""
    if not stops:
        return
    others = [s for s in stops if not isinstance(s, BatchesPending)]
    if not others:
        kind = BatchesPending
    else:
        kind = BudgetReached if all(isinstance(s, BudgetReached) for s in others) else APIStopped
    raise kind("; ".join(map(str, stops)))
