"""The stage runner: run a stage only when its inputs or settings changed, and record it.

A stage's fingerprint hashes its settings and the content fingerprints of the tables it reads, so
a change anywhere upstream flows down, and an unchanged stage is skipped. Incremental stages keep
their finished rows across crashes (see `runfolder`), so the skip-or-run decision is per stage and
the resume is per row.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import pyarrow as pa

from .progress import Reporter
from .runfolder import RunFolder


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def fingerprint(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Stage:
    """`compute` returns one table per name in `outputs` (by default the stage's own name) and
    writes any `files` itself (the report)."""

    name: str
    inputs: tuple[str, ...]
    settings: Any
    compute: Callable[[], dict[str, pa.Table]]
    outputs: tuple[str, ...] | None = None
    files: tuple[str, ...] = ()

    @property
    def tables(self) -> tuple[str, ...]:
        return (self.name,) if self.outputs is None else self.outputs


class StageRunner:
    def __init__(self, run: RunFolder, reporter: Reporter):
        self.run = run
        self.reporter = reporter

    def _fingerprint(self, stage: Stage) -> str:
        tables = self.run.manifest().get("tables", {})
        return fingerprint({"settings": stage.settings, "inputs": {n: tables.get(n) for n in stage.inputs}})

    def is_current(self, stage: Stage) -> bool:
        record = self.run.manifest().get("stages", {}).get(stage.name, {})
        return (
            record.get("state") == "done"
            and record.get("fingerprint") == self._fingerprint(stage)
            and all(self.run.has(t) for t in stage.tables)
            and all((self.run.root / f).exists() for f in stage.files)
        )

    def __call__(self, stage: Stage) -> bool:
        """Run the stage unless it is current; return whether it ran."""
        if self.is_current(stage):
            self.reporter.stage(stage.name, "skip", "unchanged inputs and settings")
            return False
        fp = self._fingerprint(stage)
        manifest = self.run.manifest()
        manifest.setdefault("stages", {})[stage.name] = {"state": "running", "fingerprint": fp, "started": now()}
        self.run.save_manifest(manifest)
        self.reporter.stage(stage.name, "run")
        start = time.monotonic()
        outputs = stage.compute()
        missing = set(stage.tables) - set(outputs)
        if missing:
            raise RuntimeError(f"stage {stage.name} did not produce {sorted(missing)}")
        written = {name: self.run.write(name, outputs[name]) for name in stage.tables}
        for name in stage.tables:
            self.run.clear_parts(name)  # folded into the table just written
        manifest = self.run.manifest()
        manifest.setdefault("tables", {}).update(written)
        manifest["stages"][stage.name] = {
            "state": "done",
            "fingerprint": fp,
            "started": manifest["stages"][stage.name]["started"],
            "finished": now(),
            "seconds": round(time.monotonic() - start, 3),
            "rows": {name: outputs[name].num_rows for name in stage.tables},
        }
        self.run.save_manifest(manifest)
        rows = ", ".join([f"{outputs[n].num_rows} {n}" for n in stage.tables] + list(stage.files))
        self.reporter.stage(stage.name, "done", f"{rows} in {time.monotonic() - start:.1f}s")
        return True


class Tables:
    """The run's tables for the stages of one run: what a stage produced, else read from the run
    folder (once) when the stage that makes it was skipped."""

    def __init__(self, run: RunFolder):
        self.run = run
        self._loaded: dict[str, pa.Table] = {}

    def read(self, name: str) -> pa.Table:
        if name not in self._loaded:
            self._loaded[name] = self.run.read(name)
        return self._loaded[name]

    def produced(self, **outputs: pa.Table) -> dict[str, pa.Table]:
        """Keep a stage's outputs for the stages after it; returns them for the stage runner."""
        self._loaded.update(outputs)
        return outputs
