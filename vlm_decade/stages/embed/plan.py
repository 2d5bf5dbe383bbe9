"""What the embed stage is asked to do, checked before any work: the encoders' checks, and the plan
of the texts to encode, worked out bucket by bucket on disk (`EmbedPlan`): every distinct text of the
references and the ok responses, and where each encoder's vector of it is already (a file of the
previous table, the parts) or that it is still to encode.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import first_per_key, stripped
from vlm_decade.core.config import EncoderConfig, StudyBase, field_path
from vlm_decade.core.errors import STUDY_FILE, Problem
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.spill import HOLD_FILES_BYTES, Spill, key_buckets
from vlm_decade.models.api.endpoints import APIEntry, api_entry_problems
from vlm_decade.models.encoders import text_keys
from vlm_decade.models.encoders.sbert import entry_problems as local_encoder_problems
from vlm_decade.models.routing import api_provider
from vlm_decade.stages.embed.local import length_batches
from vlm_decade.stages.embed.table import encoder_key, previous_files, vector_sources

TEXTS_SCHEMA = pa.schema([("text_sha256", pa.string()), ("text", pa.string())])
HAVE_SCHEMA = pa.schema(
    [("text_sha256", pa.string()), ("encoder_key", pa.string()), ("encoder", pa.string()), ("source", pa.int32())]
)


def check_encoders(study: StudyBase) -> list[Problem]:
    """A key, endpoint and price for every API encoder, before any work (`api_entry_problems`). Every
    encoder's backend is known: `load_study` said which is not (`studies.backend_problems`)."""
    problems, entries = [], []
    for i, enc in enumerate(getattr(study, "encoders", ())):
        provider = api_provider(enc.backend)
        if provider is None:
            problems += local_encoder_problems(enc, ("encoders", i))
            if enc.endpoint is not None:
                problems.append(
                    Problem(
                        STUDY_FILE,
                        f"`endpoint` is for API encoders; {enc.backend} runs here",
                        field=field_path(("encoders", i, "endpoint")),
                    )
                )
            continue
        entries.append(APIEntry(("encoders", i), f"encoder '{enc.name}'", provider, enc.endpoint, enc.model_id))
    return problems + api_entry_problems(study.providers, entries)


def _hashed(texts: pa.Array) -> tuple[pa.Table, np.ndarray]:
    """The non-blank texts of a batch, stripped, with their keys (text_sha256, text), and each one's
    bucket (the key's first two hex digits)."""
    texts = stripped(texts)
    texts = texts.filter(pc.fill_null(pc.greater(pc.binary_length(texts), 0), False))
    table = pa.table({"text_sha256": text_keys(texts), "text": texts.cast(pa.string())})
    return table, key_buckets(table.column("text_sha256"))


@dataclass
class EmbedPlan:
    """The stage's work, bucket by bucket on disk: each bucket's distinct texts (sorted by key) with
    a `source_<i>` column saying where encoder i's vector of it is (a file of the previous table,
    the parts: `vector_sources`' numbers; -1: to encode), the previous table's files and which of them are
    kept as they are (`clean`), and the counts."""

    encoders: list[EncoderConfig]
    texts: Spill
    wanted: int  # distinct texts
    todo: dict[str, int]  # texts to encode, per encoder name
    previous: list[tuple[Path, dict[str, Any] | None]]
    clean: frozenset[int]  # the previous table's segments whose every row is wanted as it is

    def todo_tables(self, i: int):
        """Encoder i's texts to encode, (text_sha256, text) a bucket at a time, in key order."""
        for bucket in self.texts.buckets:
            table = self.texts.read(bucket)
            table = table.filter(pc.equal(table.column(f"source_{i}"), -1)).select(["text_sha256", "text"])
            if table.num_rows:
                yield table

    def local_batches(self, i: int):
        """Encoder i's texts to encode in batches of about one length (`local.length_batches`)."""
        return length_batches(self.todo_tables(i))

    def written_keys(self, digits: int, i: int) -> pa.ChunkedArray:
        """The keys of bucket `digits` whose vector of encoder i goes into the new segment: those
        not in a segment kept as it is."""
        table = self.texts.read(digits)
        kept = pc.is_in(table.column(f"source_{i}"), pa.array(sorted(self.clean), pa.int32()))
        return table.column("text_sha256").filter(pc.invert(kept))


def plan_texts(folder: RunFolder, encoders: list[EncoderConfig], spill: Path) -> EmbedPlan:
    """Every distinct non-empty text of the references and the ok responses, stripped, keyed by
    its sha256, and where each encoder's vector of it is (the first the previous table or the parts
    hold), worked out a bucket of keys at a time: the texts and the (key, encoder) pairs the sources
    hold are first spread over 256 buckets by the key's first two hex digits. A segment of the
    previous table is kept as it is (`clean`) when each of its rows is such a first vector, under
    its encoder's current name. The buckets are held in memory when the texts' files are small
    (`HOLD_FILES_BYTES`; the vectors' keys, one per text and encoder, count once per encoder)."""
    held = (folder.stored_bytes("references") + folder.stored_bytes("responses")) * len(encoders) <= HOLD_FILES_BYTES
    with ThreadPoolExecutor(1) as checker:
        # The previous table's files are checked (hashed whole: gigabytes; or trusted by their recorded
        # size and time) on a thread while the texts are hashed here, a column at a time.
        checked = checker.submit(previous_files, folder)
        raw = Spill(spill / "raw", TEXTS_SCHEMA, held)
        for batch in folder.batches("references", columns=["text"]):
            raw.add(*_hashed(batch.column("text")))
        for batch in folder.batches("responses", columns=["status", "text"]):
            raw.add(*_hashed(batch.filter(pc.equal(batch.column("status"), "ok")).column("text")))
        raw.close()
        previous = checked.result()
    keys = pa.array([encoder_key(cfg) for cfg in encoders], pa.string())
    have = Spill(spill / "have", HAVE_SCHEMA, held)
    for source, table in vector_sources(folder, previous, ["text_sha256", "encoder_key", "encoder"]):
        table = table.filter(pc.is_in(table.column("encoder_key"), keys))
        table = table.append_column("source", pa.array(np.full(table.num_rows, source, np.int32)))
        have.add(table, key_buckets(table.column("text_sha256")))
    have.close()
    texts = Spill(spill / "texts", _plan_schema(len(encoders)), held)
    wanted, todo = 0, dict.fromkeys([cfg.name for cfg in encoders], 0)
    in_place = np.zeros(len(previous) + 1, np.int64)  # per source, its rows chosen as they are
    for bucket in raw.buckets:
        table = first_per_key(raw.read(bucket).sort_by("text_sha256"), "text_sha256")
        encoded = have.read(bucket)
        for i, cfg in enumerate(encoders):
            mine = encoded.filter(pc.equal(encoded.column("encoder_key"), encoder_key(cfg)))
            mine = first_per_key(mine.sort_by("text_sha256"), "text_sha256")  # a stable sort: the first source's
            at = pc.index_in(table.column("text_sha256"), mine.column("text_sha256"))
            source = pc.fill_null(mine.column("source").take(at), -1)
            table = table.append_column(f"source_{i}", source)
            todo[cfg.name] += pc.sum(pc.equal(source, -1)).as_py() or 0
            chosen = pc.and_(
                pc.is_in(mine.column("text_sha256"), table.column("text_sha256")),
                pc.equal(mine.column("encoder"), cfg.name),
            )
            in_place += np.bincount(mine.column("source").filter(chosen).to_numpy(), minlength=len(in_place))
        texts.add(table, np.full(table.num_rows, bucket))
        wanted += table.num_rows
    raw.remove()
    have.remove()
    texts.close()
    clean = frozenset(
        i for i, (_, segment) in enumerate(previous) if segment is not None and in_place[i] == segment["rows"]
    )
    return EmbedPlan(encoders, texts, wanted, todo, previous, clean)


def _plan_schema(n_encoders: int) -> pa.Schema:
    return pa.schema([*TEXTS_SCHEMA, *(pa.field(f"source_{i}", pa.int32()) for i in range(n_encoders))])
