"""What a run folder says of itself: the lines of `vlm-decade status` (its stages in pipeline order,
per API provider its batches, spend and rows) and the rows a run left unfinished, read from the
folder's manifest, tables and batch records. The command line prints them; tests call them directly.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vlm_decade.core.config import StudyBase
from vlm_decade.core.runfolder import RunFolder, kept
from vlm_decade.core.smoke import smoke_note
from vlm_decade.models.api.batch import run_batches, run_records
from vlm_decade.models.api.batch.lines import OPEN
from vlm_decade.models.routing import api_provider
from vlm_decade.stages.describe.rows import response_states


def stage_order(manifest: dict) -> list[str]:
    """The manifest's stages in the order the pipeline runs them (as the last run recorded it; for
    a manifest written before that was recorded, in the order they started), then any others."""
    stages = manifest.get("stages", {})
    recorded = [name for name in manifest.get("pipeline", []) if name in stages]
    rest = sorted(
        (name for name in stages if name not in recorded), key=lambda name: (str(stages[name].get("started", "")), name)
    )
    return recorded + rest


def stage_line(name: str, record: dict) -> str:
    """'stage responses          done        12.3 s  64 responses': a stage's state, and its time and
    rows when it finished."""
    line = f"stage {name:<18} {record.get('state', '?'):<11}"
    if record.get("seconds") is not None:
        line += f" {record['seconds']:>8.1f} s"
    if record.get("rows"):
        line += "  " + ", ".join(f"{n} {table}" for table, n in record["rows"].items())
    return line.rstrip()


def batch_counts(kind: str, tally: Counter) -> str:
    """'2 completed, 1 pending (chat, 40 requests waiting)': one kind of a provider's batches."""
    states = ", ".join(f"{n} {state}" for state, n in sorted(tally.items()) if state != "waiting")
    waiting = f", {tally['waiting']} requests waiting" if tally["waiting"] else ""
    return f"{states} ({'embeddings' if kind == 'embed' else kind}{waiting})"


def response_counts(states: Counter, records: list[dict], model_id: str) -> Counter:
    """A model's responses by state, where a `pending` row (its batch was not finished when the row
    was written) is told by where its request stands now: still `pending` in a batch not collected,
    `answered in the cache` by a batch that was cancelled (the next run takes the answer from the
    cache), or `to send` (the next run sends it)."""
    counts = Counter({state: n for state, n in states.items() if state != "pending"})
    pending = states.get("pending", 0)
    if not pending:
        return counts
    chats = [r for r in records if r.get("kind", "chat") == "chat" and r.get("model_id") == model_id]
    waiting = min(pending, sum(len(r["keys"]) for r in chats if r["state"] in OPEN))
    answered = min(pending - waiting, sum(r.get("answered", 0) for r in chats if r["state"] == "cancelled"))
    counts.update({"pending": waiting, "answered in the cache": answered, "to send": pending - waiting - answered})
    return +counts  # states with no row left out


def status_lines(folder: RunFolder, manifest: dict, study: StudyBase) -> list[str]:
    """`vlm-decade status`: a smoke run's banner, each stage in pipeline order with its state, time and rows; per API
    provider its batches by state, its spend and, per model of the `study` (the manifest's), its
    responses by state."""
    stages = manifest.get("stages", {})
    lines = [smoke_note(manifest["limit"])] if manifest.get("limit") else []
    lines += [stage_line(name, stages[name]) for name in stage_order(manifest)]
    batches = run_batches(folder.root)
    records: dict[str, list[dict]] = defaultdict(list)
    for provider, record in run_records(folder.root):
        records[provider].append(record)
    models = {m.name: m for m in study.models}
    rows = response_states(folder)
    for provider in sorted(set(manifest.get("spend_usd", {})) | set(batches)):
        counts = (
            ", ".join(batch_counts(kind, tally) for kind, tally in sorted(batches.get(provider, {}).items())) or "none"
        )
        by_mode = ", ".join(
            f"{mode} ${usd:.4f}" for mode, usd in manifest.get("spend_by_mode_usd", {}).get(provider, {}).items()
        )
        unresolved = manifest.get("spend_unresolved_usd", {}).get(provider, 0.0)
        lines.append(
            f"{provider}: batches {counts}; spent ${manifest.get('spend_usd', {}).get(provider, 0.0):.4f}"
            + (f" ({by_mode})" if by_mode else "")
            + (f", up to ${unresolved:.4f} more in flight or pending" if unresolved else "")
        )
        for subject in sorted(s for s, m in models.items() if api_provider(m.backend) == provider and s in rows):
            states = response_counts(rows[subject], records[provider], models[subject].model_id)
            said = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
            lines.append(f"  responses {subject}: {rows[subject]['ok']} of {sum(rows[subject].values())} done ({said})")
    return lines


def kept_lines(run_dir: str | Path) -> list[str]:
    """What a run that was stopped midway (Ctrl-C) kept: the stages it finished, and per table of
    the stage it was in, the rows saved so far (the next run keeps them and does the rest)."""
    manifest = RunFolder(run_dir).manifest()
    if not manifest.get("started"):
        return ["nothing was kept: the run had not begun"]
    found = kept(run_dir, manifest)
    finished = [name for name in stage_order(manifest) if name in found.stages]
    lines = [f"kept: the stages finished ({', '.join(finished) or 'none'})"]
    for table, parts in found.parts.items():
        rows = sum(pq.read_metadata(part).num_rows for part in parts)
        if rows:
            lines.append(f"kept: {rows} rows of {table}, saved before the stop (not done again)")
    return lines


def unfinished_lines(run_dir: str | Path, left_out: frozenset[str] = frozenset()) -> list[str]:
    """Per table and model, the rows still not ok (error, skipped) and the most common error, read
    from the run folder's tables (the next run retries just those); rows whose status is in
    `left_out` are not counted (a run's failed summary says its errors)."""
    lines = []
    skipped = pa.array(sorted({"ok", *left_out}), pa.string())
    for path in sorted(Path(run_dir).glob("*.parquet")):
        names = pq.read_schema(path).names
        if "status" not in names:
            continue
        counts, errors = defaultdict(Counter), defaultdict(Counter)
        # A batch at a time, and only the unfinished rows as Python: a million images' responses are millions of rows.
        for batch in RunFolder.file_batches(path, [c for c in ("subject", "status", "error") if c in names]):
            unfinished = pc.invert(pc.fill_null(pc.is_in(batch.column("status"), value_set=skipped), False))
            for row in batch.filter(unfinished).to_pylist():
                who = row.get("subject") or "judge"
                counts[who][row["status"]] += 1
                errors[who][row.get("error") or ""] += 1
        for who in sorted(counts):
            said = ", ".join(f"{n} {status}" for status, n in sorted(counts[who].items()))
            lines.append(f"  {path.stem} {who}: {said}; most common: {errors[who].most_common(1)[0][0]}")
    return lines
