"""The spend log: what each attempt cost, written by the gateway as it happens, crash-safe.

One JSON line per event in `<run folder>/api/<provider>.spend.jsonl`, appended with a single
`write` on a file opened `O_APPEND` (a killed process leaves whole lines, at most a torn last one,
which readers skip):

    {"a": ATTEMPT, "e": "sent", "worst": US$, "t": TIME, "tok": TOKENS}
                                                 before an attempt leaves: its worst-case cost, when
                                                 (Unix time) and the tokens it reserved
    {"a": ATTEMPT, "e": "paid", "usd": US$, "tok": TOKENS}
                                                 its answer arrived: what it cost, the tokens used
    {"a": ATTEMPT, "e": "failed"}                it failed (429, 5xx, timeout, dropped): nothing billed
    {"e": "carried", "usd": US$}                 spend recorded before this log existed (older manifests)

`sent` and `paid` lines of batch requests carry `"m": "batch"` (the attempt is `<batch id>:<key>`).
A batch downloaded twice (a run killed after downloading it) resolves its attempts twice: only the
first resolution of an attempt counts.

So the run folder's spend is the sum of what was paid, including answers that reached the gateway
after its driver died; an attempt `sent` and never resolved was in flight when the run was killed:
it may or may not have been billed, and counts at its worst case in `unresolved`. The `sent` times
also let the next gateway of the folder (the next stage, or a rerun) start with the requests of the
last minute already counted against its rate limits.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path


def spend_log_path(run_root: str | Path, provider: str) -> Path:
    return Path(run_root) / "api" / f"{provider}.spend.jsonl"


class SpendLog:
    """The writer: one per gateway."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **event) -> None:
        os.write(self.fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class Spend:
    paid: float = 0.0  # US$ for answers that arrived (and carried-over spend)
    unresolved: float = 0.0  # worst case of attempts sent whose outcome was never recorded
    attempts: int = 0
    sent: tuple[tuple[float, int], ...] = ()  # (Unix time, tokens) of every attempt, in log order
    by_mode: dict = field(default_factory=dict)  # sync / batch -> US$ paid
    open: dict = field(default_factory=dict)  # attempt -> worst case, for the attempts not resolved


class SpendTally:
    """The reader: reads what was appended since its last call (a run reads the log every few
    seconds while it grows)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self.paid = 0.0
        self.open: dict[str, float] = {}  # attempt -> worst case, until it is resolved
        self.sent: list[tuple[float, int]] = []
        self.index: dict[str, int] = {}  # attempt -> its place in `sent`
        self.resolved: set[str] = set()
        self.by_mode: dict[str, float] = {}

    def read(self) -> Spend:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            data = b""
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        for line in data[:end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn line from a killed writer
            kind = event.get("e")
            if kind == "sent":
                self.open[event["a"]] = float(event["worst"])
                self.index[event["a"]] = len(self.sent)
                self.sent.append((float(event.get("t", 0.0)), int(event.get("tok", 0))))
            elif kind in ("paid", "failed"):
                if event["a"] in self.resolved:
                    continue
                self.resolved.add(event["a"])
                self.open.pop(event["a"], None)
                self.paid += float(event.get("usd", 0.0))
                mode = event.get("m", "sync")
                self.by_mode[mode] = self.by_mode.get(mode, 0.0) + float(event.get("usd", 0.0))
                if "tok" in event and event["a"] in self.index:  # the usage reported replaces the reservation
                    i = self.index[event["a"]]
                    self.sent[i] = (self.sent[i][0], int(event["tok"]))
            elif kind == "carried":
                self.paid += float(event["usd"])
                self.by_mode["sync"] = self.by_mode.get("sync", 0.0) + float(event["usd"])
        return Spend(
            self.paid, sum(self.open.values()), len(self.sent), tuple(self.sent), dict(self.by_mode), dict(self.open)
        )


def read_spend(path: str | Path) -> Spend:
    return SpendTally(path).read()
