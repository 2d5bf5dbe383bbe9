"""Stages and the spine every study runs on: a stage runs only when its inputs or settings changed.

A `Stage` names the tables it reads, its settings (what decides its results) and a compute function;
its fingerprint hashes the settings and the content fingerprints of its input tables (recorded in
the manifest), so a change anywhere upstream flows down and an unchanged stage is skipped.
Incremental stages keep their finished rows across crashes (`runfolder`), so the skip-or-run decision
is per stage and the resume is per row. A stage whose table has rows it could not finish (`status`
error or skipped) is recorded `incomplete`, never skipped: the next run redoes just those rows. Its
failed rows (`status` error), per model with their most common error, are recorded with it
(`StatusTally`): a run that leaves any is a failed run (`run_failures`, exit status 3).

`open_run` begins a run (the run folder and the manifest's record of it) and returns a `StudyRun`:
what every compute function is given (the tables stages hand on, the run folder, the reporter, and
Ray, started the first time a stage needs it, or ahead of a stage's actors: `Stage.warm`).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import platform
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.config import RuntimeConfig, StudyBase
from vlm_decade.core.dispatch import Finished, LostActor, pool_map
from vlm_decade.core.errors import InputError, Problem, plain
from vlm_decade.core.fingerprints import table_fingerprint
from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runtime import LazyRay
from vlm_decade.core.smoke import resume_problem, smoke_note
from vlm_decade.core.spill import SPILL_FOLDER

REPORTED_PACKAGES = ("vlm-decade", "ray", "torch", "transformers", "sentence-transformers", "numpy", "scipy", "pyarrow")


def release_memory() -> None:
    """Give the memory a stage (or the input checks) freed back to the system, so the driver's
    footprint is what it holds, not its high-water mark: Arrow's pool keeps freed blocks, and glibc
    keeps a freed heap until trimmed."""
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def fingerprint(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Stage:
    """`compute` gets the run and returns one table (or `Written` record) per name in `outputs` (by
    default the stage's own name); it writes any `files` itself (the report)."""

    name: str
    inputs: tuple[str, ...]
    settings: Any
    compute: Callable[[StudyRun], dict[str, pa.Table | Written]]
    outputs: tuple[str, ...] | None = None
    files: tuple[str, ...] = ()
    before_s: float = 0.0  # its work done before the run began (the image checks): counted in its time
    finished: Callable[[], None] | None = None  # called once the stage has run or was found current
    # The Ray actors (or task workers) the stage will work with, started ahead (`LazyRay.start_soon`)
    # when an earlier stage runs, so that Ray and the actors start while the stages before work (a
    # core idles there); `compute` takes them with `run.warmed()`, and those it does not take are
    # killed after it.
    warm: Callable[[StudyRun], Future] | None = None
    # Whether `compute` leaves the cluster's CPUs and GPUs free (no actors of its own take them): only
    # then are a later stage's actors started ahead beside it (`StudyRun._warm_next`). Actors started
    # beside a stage's own could take the cluster first, and the stage's would wait for them for ever.
    frees_cluster: bool = False
    # Whether `compute` may call for Ray: once no stage left does, Ray is shut down beside them.
    needs_ray: bool = True

    @property
    def tables(self) -> tuple[str, ...]:
        return (self.name,) if self.outputs is None else self.outputs


@dataclass(frozen=True)
class Failed:
    """One model's failed rows (`status` error) in one table: how many of its rows, and its most
    common error with how many rows say it. `subject` is None in a table without one (the judge's)."""

    table: str
    subject: str | None
    failed: int
    rows: int
    error: str
    count: int

    @property
    def who(self) -> str:
        """The model, or the table when its rows have none (the judge's)."""
        return self.subject if self.subject is not None else self.table

    def line(self) -> str:
        """'ssd-template: 12 of 12 responses failed (every one); most common (12): ValueError: ...'"""
        who = f"{self.subject}: " if self.subject is not None else ""
        every = " (every one)" if self.failed == self.rows else ""
        return f"{who}{self.failed} of {self.rows} {self.table} failed{every}; most common ({self.count}): {self.error}"


class StatusTally:
    """The rows of table `name` a stage could not finish, counted as its rows are written, in
    batches or whole: by `status` (other than ok: error, skipped), and per subject its rows and its
    error rows' errors. A stage that leaves any is `incomplete`: the next run runs it again, and it
    redoes just those."""

    def __init__(self, name: str):
        self.name = name
        self.by_status: Counter = Counter()
        self.rows: Counter = Counter()  # per subject (None: a table without one, the judge's)
        self.errors: dict[str | None, Counter] = {}

    def add(self, table: pa.Table | pa.RecordBatch) -> None:
        if "status" not in table.column_names:
            return
        n = table.num_rows
        columns = {
            c: table.column(c) if c in table.column_names else pa.nulls(n, pa.string()) for c in ("subject", "error")
        }
        rows = pa.table({**columns, "error": pc.fill_null(columns["error"], ""), "status": table.column("status")})
        for c in pc.value_counts(rows.column("status")).to_pylist():
            if c["values"] != "ok":
                self.by_status[c["values"]] += c["counts"]
        for r in rows.group_by("subject").aggregate([("status", "count")]).to_pylist():
            self.rows[r["subject"]] += r["status_count"]
        errors = rows.filter(pc.equal(rows.column("status"), "error"))
        for r in errors.group_by(["subject", "error"]).aggregate([("status", "count")]).to_pylist():
            self.errors.setdefault(r["subject"], Counter())[plain(r["error"])] += r["status_count"]

    def unfinished(self) -> dict[str, int]:
        """The rows not finished, by status."""
        return {status: n for status, n in self.by_status.items() if n}

    def failed(self) -> list[Failed]:
        """Per subject (in order of name), its rows whose `status` is error, out of its rows, and
        their most common error (ties: the first in order of text)."""
        out = []
        for subject in sorted(self.errors, key=lambda s: (s is not None, s or "")):
            said = self.errors[subject]
            error, count = min(said.items(), key=lambda text_count: (-text_count[1], text_count[0]))
            out.append(Failed(self.name, subject, sum(said.values()), self.rows[subject], error, count))
        return out


def tallied(name: str, table: pa.Table) -> StatusTally:
    """A whole table's `StatusTally`."""
    tally = StatusTally(name)
    tally.add(table)
    return tally


@dataclass(frozen=True)
class Written:
    """A table a stage wrote itself, batch by batch (`RunFolder.write_batches`), because it is too
    big to hand over whole; later stages read it with `RunFolder.batches`. `status`: its rows'
    tally, for a table with a `status` column."""

    fingerprint: str
    file: dict
    rows: int
    status: StatusTally | None = None


def run_failures(manifest: dict) -> list[Failed]:
    """The failed rows the manifest's stages record, in pipeline order: a run that leaves any failed."""
    stages = manifest.get("stages", {})
    order = [n for n in manifest.get("pipeline", []) if n in stages] or sorted(stages)
    return [Failed(**f) for name in order for f in stages[name].get("failed", [])]


def given(name: str, table: pa.Table, before_s: float = 0.0) -> Stage:
    """A stage whose table was read and checked before the run began (images, references, labels),
    which took `before_s` seconds. It holds the table only until the table is written (or found
    written already): the stages after it read the run folder's."""
    held = [table]
    return Stage(
        name,
        (),
        table_fingerprint(table),
        lambda run: {name: held.pop()},
        before_s=before_s,
        finished=held.clear,
        frees_cluster=True,  # writing the table needs nothing of the cluster
        needs_ray=False,
    )


class StudyRun:
    """One run of a study: runs stages in order, and hands each the tables the stages before it made."""

    def __init__(
        self, folder: RunFolder, reporter: Reporter, ray: LazyRay, lock=None, warm: dict[str, Future] | None = None
    ):
        self.folder = folder
        self.reporter = reporter
        self.ray = ray  # call it for the `ray` module, started or joined on first use
        self._lock = lock  # the folder's lock, held until the run ends
        self._tables: dict = {}  # the tables the running stage has read, by name (and columns)
        self._stage: str | None = None  # the stage running now
        self._lost: list[dict] = []  # its actors lost and replaced
        self._pipeline: tuple[Stage, ...] = ()
        self._warm: dict[str, Future] = dict(warm or {})  # by stage, the actors started ahead for it (`Stage.warm`)

    def actor_lost(self, lost: LostActor) -> None:
        """Said, and kept in the running stage's manifest record (`lost_actors`) as it happens, so
        that a stage that fails later still shows it."""
        where = f"on node {lost.node}" if lost.node else "on an unnamed node"
        self.reporter.say(
            f"     [yellow]{self._stage}: an actor of {lost.what} was lost {where} and replaced; "
            f"{lost.batches_redone} of its batches done again[/yellow]"
        )
        self._lost.append({"actor": lost.what, "node": lost.node, "batches_redone": lost.batches_redone, "at": now()})
        manifest = self.folder.manifest()
        manifest["stages"][self._stage]["lost_actors"] = self._lost
        self.folder.save_manifest(manifest)

    def actor_pool(
        self,
        runtime: RuntimeConfig,
        make_actor: Callable[[], Any],
        n_actors: int,
        work: Iterable,
        call: Callable[[Any, Any], Any],
        what: str,
    ) -> Iterator[Finished]:
        """`pool_map` on this run's Ray with the study's runtime settings: the actors lost that it
        replaces, the stall timeout, each actor's CPUs and GPUs; every actor lost is told to
        `actor_lost`."""
        return pool_map(
            self.ray(),
            make_actor,
            n_actors,
            work,
            call,
            max_lost=runtime.max_restarts,
            stall_timeout_s=runtime.stall_timeout_s,
            what=what,
            needs={"CPU": runtime.cpus_per_actor, "GPU": runtime.gpus_per_actor},
            on_lost=self.actor_lost,
        )

    def table(self, name: str, columns: tuple[str, ...] | None = None) -> pa.Table:
        """A table of the run folder (those of its `columns`), read once per stage (the stage that
        wrote it was checked before this one ran, so it verified). Let go as the stage ends, so that
        the driver holds what the running stage reads, not every table of the run."""
        key = name if columns is None else (name, columns)
        if key not in self._tables:
            self._tables[key] = self.folder.read(name, None if columns is None else list(columns))
        return self._tables[key]

    def _fingerprint(self, stage: Stage) -> str:
        tables = self.folder.manifest().get("tables", {})
        return fingerprint({"settings": stage.settings, "inputs": {n: tables.get(n) for n in stage.inputs}})

    def is_current(self, stage: Stage) -> bool:
        """Done, with the same settings and inputs, and every table it wrote still as written."""
        manifest = self.folder.manifest()
        record = manifest.get("stages", {}).get(stage.name, {})
        if record.get("state") != "done" or record.get("fingerprint") != self._fingerprint(stage):
            return False
        for table in stage.tables:
            problem = self.folder.verified(table, manifest.get("files", {}).get(table))
            if problem is not None:
                self.reporter.say(f"     [yellow]{stage.name}: {problem}; done again[/yellow]")
                return False
        return all((self.folder.root / f).exists() for f in stage.files)

    def __call__(self, *stages: Stage) -> None:
        self.folder.update_manifest(pipeline=[stage.name for stage in stages])  # the order `status` shows
        self._pipeline = stages
        for stage in stages:
            self.run_stage(stage)

    def warmed(self) -> list:
        """The actors started ahead for the running stage (`Stage.warm`), now its own; none when
        nothing was started ahead or the start failed (the stage starts them itself, and says why
        when it cannot)."""
        return self._take_warm(self._stage)

    def _take_warm(self, name: str) -> list:
        future = self._warm.pop(name, None)
        try:
            return list(future.result()) if future is not None else []
        except Exception:  # noqa: BLE001 - the stage starts its own and says why if that fails too
            return []

    def cluster_freed(self) -> None:
        """Said by the running stage once its actors are done, with work of its own left that needs
        none of the cluster (the embed stage's writing of its table): the next stage's `Stage.warm`
        begins now, beside that work, as beside a stage that leaves the cluster free, rather than
        beside the stages between (whose threads want the CPUs it would take)."""
        current = [s for s in self._pipeline if s.name == self._stage]
        if current:
            self._warm_next(current[0], freed=True)

    def _warm_next(self, stage: Stage, freed: bool = False) -> None:
        """Begin `Stage.warm` of the first stage after `stage`, which is about to run, that has one
        (only then: a run that stops earlier, on an error, starts nothing), and only when `stage`
        (or what is left of it: `freed`) and every stage between leave the cluster free: the tables
        given to a run and a stage of imported answers take a second, the start of Ray and the
        actors many."""
        if not (stage.frees_cluster or freed):
            return
        for later in self._after(stage):
            if later.warm is not None:
                if later.name not in self._warm:
                    self._warm[later.name] = later.warm(self)
                return
            if not later.frees_cluster:
                return

    def _after(self, stage: Stage) -> tuple[Stage, ...]:
        """The stages of the run's pipeline after `stage` (none for a stage run on its own)."""
        names = [s.name for s in self._pipeline]
        return self._pipeline[names.index(stage.name) + 1 :] if stage.name in names else ()

    def _let_go(self, stage: Stage) -> None:
        """Kill the actors started ahead for `stage` that it did not take (it was found current)."""
        for actor in self._take_warm(stage.name):
            self.ray().kill(actor)

    def _close_ray_after(self, stage: Stage) -> None:
        """Shut Ray down beside the stages after `stage` when none of them needs it (the report):
        its processes take a second or more to end, which the run no longer waits for at its end."""
        later = self._after(stage)
        if later and not any(s.needs_ray for s in later):
            self.ray.close_soon()

    def run_stage(self, stage: Stage) -> bool:
        """Run the stage unless it is current; return whether it ran."""
        try:
            return self._run_stage(stage)
        finally:
            self._let_go(stage)
            self._close_ray_after(stage)
            self._tables.clear()
            if stage.finished is not None:
                stage.finished()
            release_memory()  # what the stage read and made, now let go

    def _run_stage(self, stage: Stage) -> bool:
        if self.is_current(stage):
            self.reporter.stage(stage.name, "skip", "unchanged inputs and settings")
            return False
        fp = self._fingerprint(stage)
        self._warm_next(stage)
        for name in stage.tables:  # what a run killed before recording its table left of it
            self.folder.prune_segments(name)
        manifest = self.folder.manifest()
        manifest.setdefault("stages", {})[stage.name] = {"state": "running", "fingerprint": fp, "started": now()}
        self.folder.save_manifest(manifest)
        self.reporter.stage(stage.name, "run")
        self._stage, self._lost = stage.name, []
        start = time.monotonic() - stage.before_s
        outputs = stage.compute(self)
        missing = set(stage.tables) - set(outputs)
        if missing:
            raise RuntimeError(f"stage {stage.name} did not produce {sorted(missing)}")
        tables = {name: out for name, out in outputs.items() if isinstance(out, pa.Table)}
        written = {
            name: self.folder.write(name, tables[name])
            if name in tables
            else (outputs[name].fingerprint, outputs[name].file)
            for name in stage.tables
        }
        rows = {name: tables[name].num_rows if name in tables else outputs[name].rows for name in stage.tables}
        for name in stage.tables:
            self.folder.clear_parts(name)  # folded into the table just written
        tallies = [tallied(name, tables[name]) if name in tables else outputs[name].status for name in stage.tables]
        unfinished = {t.name: counts for t in tallies if t is not None and (counts := t.unfinished())}
        failed = [asdict(f) for t in tallies if t is not None and t.name in unfinished for f in t.failed()]
        manifest = self.folder.manifest()
        manifest.setdefault("tables", {}).update({name: fp for name, (fp, _) in written.items()})
        manifest.setdefault("files", {}).update({name: record for name, (_, record) in written.items()})
        manifest["stages"][stage.name] = {
            "state": "incomplete" if unfinished else "done",
            "fingerprint": fp,
            "started": manifest["stages"][stage.name]["started"],
            "finished": now(),
            "seconds": round(time.monotonic() - start, 3),
            "rows": rows,
            **({"unfinished": unfinished} if unfinished else {}),
            **({"failed": failed} if failed else {}),
            **({"lost_actors": self._lost} if self._lost else {}),
        }
        self.folder.save_manifest(manifest)
        for name in stage.tables:  # the segments (or the one file) the table just recorded replaced
            self.folder.prune_segments(name)
        said = ", ".join([f"{rows[n]} {n}" for n in stage.tables] + list(stage.files))
        self.reporter.stage(stage.name, "done", f"{said} in {time.monotonic() - start:.1f}s")
        for name, counts in unfinished.items():
            said = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
            self.reporter.say(f"     [yellow]{name}: {said} rows[/yellow], tried again on the next run")
        return True

    def __enter__(self) -> StudyRun:
        return self

    def __exit__(self, exc_type, *_) -> None:
        try:
            self.ray.close()
            if exc_type is None:
                self.folder.update_manifest(finished=now())
                self.reporter.say(f"report: {self.folder.location}/report.html")
        finally:
            # The stages' scratch: each clears its own, but a killed run's is left; none outlives a run.
            shutil.rmtree(self.folder.root / SPILL_FOLDER, ignore_errors=True)
            if self._lock is not None:
                self._lock.__exit__(None, None, None)


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in REPORTED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def open_run(
    study: StudyBase,
    reporter: Reporter | None,
    summary: str,
    ray: LazyRay | None = None,
    warm: dict[str, Future] | None = None,
    **manifest: Any,
) -> StudyRun:
    """Begin a run: the run folder, with the manifest's record of this run (the config and its
    hash, package versions, the start); `manifest` adds what the study kind records. `ray` and
    `warm`: a Ray and stages' actors started before the folder was opened (`StudyRun`'s from then on;
    the caller closes `ray` if the folder cannot be opened)."""
    reporter = reporter or Reporter()
    release_memory()  # what checking the input freed
    folder = RunFolder(study.output, say=reporter.say, rehash=study.runtime.rehash)
    if folder.mirror is not None:
        folder.mirror.check()  # a store without the bucket stops the run before it takes the folder
    lock = folder.lock()
    lock.__enter__()  # RunFolderBusy when another run holds the folder; released by StudyRun.__exit__
    try:
        refused = resume_problem(folder.manifest(), study.limit, folder.location)
        if refused is not None:
            raise InputError([Problem(folder.location, refused, field="--limit")])
        folder.update_manifest(
            study=study.name,
            demo=study.demo,
            config=study.model_dump(mode="json"),
            config_hash=study.hash(),
            versions=package_versions(),
            started=now(),
            finished=None,
            limit=study.limit,  # a smoke run (`core.smoke`), or None
            spend_usd=folder.manifest().get("spend_usd", {}),  # the run folder's total across resumed runs
            **manifest,
        )
    except BaseException:
        lock.__exit__(*sys.exc_info())  # released now, not when the lock is collected
        raise
    reporter.say(f"[bold]{study.name}[/bold]{summary} -> {folder.location}")
    if study.limit is not None:
        reporter.say(f"     [yellow]{smoke_note(study.limit)}[/yellow]")
    ray = ray or LazyRay(study.runtime)
    ray.keep_logs_in(folder.root / "logs")
    return StudyRun(folder, reporter, ray, lock, warm)


def run_study(
    study: StudyBase,
    reporter: Reporter | None,
    summary: str,
    stages: list[Stage],
    notes: list[str] = (),
    opened: Callable[[Path], None] | None = None,
    ray: LazyRay | None = None,
    warm: dict[str, Future] | None = None,
    **manifest: Any,
) -> RunFolder:
    """A study's run: `open_run` (with what was started ahead of it: `ray`, `warm`), then its `notes`
    said (what the run leaves out), `opened` given the folder's root (the image cache keeps its
    record there), and the stages run in order. Returns the folder."""
    with open_run(study, reporter, summary, ray, warm, **manifest) as spine:
        for note in notes:
            spine.reporter.say(f"     [yellow]{note}[/yellow]")
        if opened is not None:
            opened(spine.folder.root)
            release_memory()  # what writing the image cache's record took
        spine(*stages)
    return spine.folder
