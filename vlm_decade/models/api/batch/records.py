"""Where batches are recorded: each batch's record and requests in the cache folder (shared by
runs and machines, read back by a later gateway to collect what an earlier one left pending), a
copy of the record in the run folder, and the readers of those copies (`vlm-decade status`,
`cancel`)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.files import atomic_write_bytes
from vlm_decade.models.api.batch.lines import OPEN, Line


class BatchRecords:
    """A provider's batches: `<label>.json` (what the batch is and where it stands) beside
    `<label>.jsonl` (its requests) in the cache folder, shared by runs and machines, and a copy of
    the record in the run folder (for `vlm-decade status`). Every file is written whole."""

    def __init__(self, cache_root: str | Path, provider: str, run_root: str | Path | None):
        self.folder = Path(cache_root) / "batches" / provider
        self.run_folder = Path(run_root) / "api" / "batches" / provider if run_root else None

    def save(self, record: dict) -> None:
        data = json.dumps(record, sort_keys=True).encode()
        atomic_write_bytes(self.folder / f"{record['label']}.json", data)
        if self.run_folder is not None:
            atomic_write_bytes(self.run_folder / f"{record['label']}.json", data)

    def write_lines(self, label: str, lines: list[Line]) -> None:
        atomic_write_bytes(self.folder / f"{label}.jsonl", b"".join(line.dump() for line in lines))

    def lines(self, label: str) -> dict[str, Line]:
        path = self.folder / f"{label}.jsonl"
        if not path.exists():
            return {}
        return {line.key: line for line in map(Line.load, path.read_bytes().splitlines())}

    def drop_lines(self, label: str) -> None:
        (self.folder / f"{label}.jsonl").unlink(missing_ok=True)

    def open_records(self) -> list[dict]:
        out = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                record = json.loads(path.read_bytes())
            except ValueError:
                continue
            if record.get("state") in OPEN:
                out.append(record)
        return out


def run_records(run_root: str | Path, provider: str = "*"):
    """(provider, record) for each batch record a run folder keeps (`api/batches/<provider>/`). A
    damaged one is an input error naming its file: the cache folder holds the original."""
    for path in sorted((Path(run_root) / "api" / "batches").glob(f"{provider}/*.json")):
        try:
            record = json.loads(path.read_bytes())
            if not isinstance(record, dict) or not {"label", "state", "keys"} <= record.keys():
                raise ValueError("label, state or keys missing")
        except ValueError as exc:
            raise InputError(
                [
                    Problem(
                        str(path),
                        f"damaged batch record ({exc}); copy it back from the cache folder's "
                        f"batches/{path.parent.name}/{path.name}, or remove it",
                    )
                ]
            ) from None
        yield path.parent.name, record


def run_batches(run_root: str | Path) -> dict[str, dict[str, Counter]]:
    """Per provider and kind (chat, embed), the batches recorded in a run folder by state, and in
    `waiting` the requests of those still pending (for `vlm-decade status`)."""
    out: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for provider, record in run_records(run_root):
        tally = out[provider][record.get("kind", "chat")]
        state = "pending" if record["state"] in OPEN else record["state"]
        tally[state] += 1
        if state == "pending":
            tally["waiting"] += len(record["keys"])
    return out


def run_batch_labels(run_root: str | Path, provider: str) -> list[str]:
    """The labels of the batches a run folder has pending with `provider`."""
    return [record["label"] for _, record in run_records(run_root, provider) if record["state"] in OPEN]
