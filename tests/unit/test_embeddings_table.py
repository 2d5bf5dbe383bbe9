"""The embeddings table: every distinct stripped text of the references and the ok responses, once
per encoder, sorted by (encoder, key); a vector the previous table or a part holds is reused (the
first one found), nothing else is kept, and how many buckets or chunks the work is cut into changes
nothing. Across versions: a table written before the `mode` column existed is reused with the
column empty, beside new rows that carry the mode that bought them. (The encoding itself goes
through Ray and is covered by the run tests; here a deterministic encoder stands in for it.)"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import vlm_decade.stages.embed.local as local_module
import vlm_decade.stages.embed.plan as plan_module
import vlm_decade.stages.embed.table as table_module
import vlm_decade.stages.embed.write as write_module
from vlm_decade.core.config import EncoderConfig
from vlm_decade.core.fingerprints import table_fingerprint
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.models.encoders import text_key
from vlm_decade.stages.embed.plan import plan_texts
from vlm_decade.stages.embed.table import EMBEDDINGS_SCHEMA, encoder_key, spill_folder, vector_rows
from vlm_decade.stages.embed.write import write_selected

SBERT = EncoderConfig(name="SBERT-SI")
OTHER = EncoderConfig(name="Other-SI", model_id="sentence-transformers/all-mpnet-base-v2")


def vector(cfg: EncoderConfig, text: str, salt: str = "") -> np.ndarray:
    """A vector that differs by encoder, text and `salt` (an older vector of the same text)."""
    digest = hashlib.sha256(f"{encoder_key(cfg)}|{salt}|{text}".encode()).digest()
    return np.frombuffer(digest[:16], dtype=np.uint8).astype(np.float32)


def embed_here(folder: RunFolder, encoders: list[EncoderConfig]) -> tuple[dict, list]:
    """The stage as `run_embed` runs it for local encoders, `vector` standing in for the actors:
    each batch they would be given encoded and saved as a part, then the table written. Returns
    the texts encoded per encoder and the batches."""
    with spill_folder(folder) as spill:
        plan = plan_texts(folder, encoders, spill)
        encoded, given = {}, []
        for i, cfg in enumerate(encoders):
            encoded[cfg.name] = []
            with folder.parts("embeddings", EMBEDDINGS_SCHEMA, local_module.PART_ROWS, local_module.PART_S) as parts:
                for batch in plan.local_batches(i):
                    texts = batch.column("text").to_pylist()
                    given.append(texts)
                    encoded[cfg.name] += texts
                    parts.add(vector_rows(batch.column("text_sha256"), np.stack([vector(cfg, t) for t in texts]), cfg))
            assert len(encoded[cfg.name]) == plan.todo[cfg.name]
        written = write_selected(folder, plan, spill / "vectors")
        for segment in written.file["segments"]:  # each carries its own content's fingerprint
            path = folder.segment_folder("embeddings") / segment["name"]
            assert segment["fingerprint"] == table_fingerprint(pq.read_table(path))
        # as the runner does once the table is written
        folder.save_manifest({"tables": {"embeddings": written.fingerprint}, "files": {"embeddings": written.file}})
        folder.prune_segments("embeddings")
        folder.clear_parts("embeddings")
    return encoded, given


def inputs(folder: RunFolder, references: list, responses: list[tuple[str, str | None]]) -> None:
    folder.write("references", pa.table({"text": pa.array(references, pa.string())}))
    status, text = zip(*responses) if responses else ((), ())
    folder.write("responses", pa.table({"status": pa.array(status, pa.string()), "text": pa.array(text, pa.string())}))


def expected(references, responses, encoders, kept: dict) -> pa.Table:
    """The table worked out plainly: each wanted text's vector per encoder, the one in `kept`
    ((encoder_key, key) -> vector) if there, else a new one; sorted by encoder name, then key."""
    texts = {}
    for t in list(references) + [t for status, t in responses if status == "ok"]:
        if t and t.strip():
            texts[text_key(t)] = t.strip()
    rows = []
    for cfg in sorted(encoders, key=lambda c: c.name):
        for key in sorted(texts):
            v = kept.get((encoder_key(cfg), key))
            rows.append((key, cfg, v if v is not None else vector(cfg, texts[key])))
    out = [vector_rows([key], v[None], cfg) for key, cfg, v in rows]
    return pa.concat_tables(out) if out else EMBEDDINGS_SCHEMA.empty_table()


REFERENCES = ["a cat on a mat", "  a cat on a mat  ", "a dog\n", "", "   ", None, "two birds", "a red bus"]
RESPONSES = [("ok", "a dog"), ("ok", " a red bus"), ("error", "never embedded"), ("ok", ""), ("ok", None), ("ok", "x")]
# Enough texts to fill many of the 256 buckets, some of them in one bucket with others.
MANY = [f"text number {i} " + "word " * (i % 7) for i in range(80)]


def test_a_fresh_table_holds_each_distinct_stripped_text_once_per_encoder(tmp_path):
    folder = RunFolder(tmp_path)
    inputs(folder, REFERENCES, RESPONSES)
    encoded, given = embed_here(folder, [SBERT, OTHER])
    assert folder.read("embeddings").equals(expected(REFERENCES, RESPONSES, [SBERT, OTHER], {}))
    # Shared and padded texts are encoded once, blank ones and failed answers never.
    for name in ("SBERT-SI", "Other-SI"):
        assert sorted(encoded[name]) == sorted(["a cat on a mat", "a dog", "two birds", "a red bus", "x"])
    # Fewer texts than a chunk: batched as if sorted whole, by length (then key).
    by_key = sorted(encoded["SBERT-SI"], key=text_key)
    assert given[0] == sorted(by_key, key=len)


def test_a_rerun_reuses_the_previous_table_and_the_parts_of_a_killed_run_and_drops_what_is_not_wanted(tmp_path):
    folder = RunFolder(tmp_path)
    inputs(folder, MANY[:50] + ["gone"], [])
    embed_here(folder, [SBERT, OTHER])
    # A killed run's parts: new vectors for some texts, one already in the table (the table's is
    # found first, so it stays), and one of an encoder no longer named.
    kept_old = {(encoder_key(c), text_key(t)): vector(c, t.strip()) for c in (SBERT, OTHER) for t in MANY[:50]}
    killed = {(encoder_key(SBERT), text_key(t)): vector(SBERT, t, salt="killed") for t in MANY[50:56]}
    folder.append_part(
        "embeddings",
        vector_rows([k for _, k in killed], np.stack(list(killed.values())), SBERT),
    )
    folder.append_part("embeddings", vector_rows([text_key(MANY[0])], vector(SBERT, MANY[0], "later")[None], SBERT))
    gone = EncoderConfig(name="Gone-SI", model_id="sentence-transformers/paraphrase-MiniLM-L3-v2")
    folder.append_part("embeddings", vector_rows([text_key(MANY[1])], vector(gone, MANY[1])[None], gone))
    references, responses = MANY[:70], [("ok", t) for t in MANY[20:40]]
    inputs(folder, references, responses)

    encoded, _ = embed_here(folder, [SBERT, OTHER])

    assert sorted(encoded["SBERT-SI"]) == sorted(t.strip() for t in MANY[56:70])
    assert sorted(encoded["Other-SI"]) == sorted(t.strip() for t in MANY[50:70])
    table = folder.read("embeddings")
    assert table.equals(expected(references, responses, [SBERT, OTHER], {**kept_old, **killed}))
    assert text_key("gone") not in table.column("text_sha256").to_pylist()


@pytest.mark.parametrize("chunk, batch", [(1, 1), (10, 3)])
def test_chunks_and_batches_change_nothing_but_the_batches(tmp_path, monkeypatch, chunk, batch):
    references, responses = MANY[:60] + REFERENCES, [("ok", t) for t in MANY[40:]] + RESPONSES
    whole = RunFolder(tmp_path / "whole")
    inputs(whole, references, responses)
    embed_here(whole, [SBERT, OTHER])
    monkeypatch.setattr(local_module, "CHUNK_TEXTS", chunk)
    monkeypatch.setattr(local_module, "TEXT_BATCH", batch)
    cut = RunFolder(tmp_path / "cut")
    inputs(cut, references, responses)
    encoded, given = embed_here(cut, [SBERT, OTHER])
    assert cut.read("embeddings").equals(whole.read("embeddings"))
    assert cut.read("embeddings").equals(expected(references, responses, [SBERT, OTHER], {}))
    assert all(len(b) <= batch for b in given) and len(encoded["SBERT-SI"]) == len(set(encoded["SBERT-SI"]))
    if chunk > 1:  # each chunk of buckets sorted by length on its own
        assert any(len(b[-1]) > len(a[0]) for a, b in zip(given[1:], given))


def test_a_table_without_the_mode_column_is_reused_with_it_empty(tmp_path):
    cfg = EncoderConfig(name="GPT-SI", backend="openai-embedding", model_id="text-embedding-3-large")
    old_text, new_text = "a cat on a mat", "a dog in the park"
    old_vector, new_vector = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    # as an earlier version wrote it
    old = vector_rows([text_key(old_text)], old_vector[None], cfg).drop_columns(["mode"])
    folder = RunFolder(tmp_path)
    fingerprint, record = folder.write("embeddings", old)
    folder.save_manifest({"tables": {"embeddings": fingerprint}, "files": {"embeddings": record}})
    folder.append_part("embeddings", vector_rows([text_key(new_text)], new_vector[None], cfg, ["batch"]))
    inputs(folder, [old_text, new_text], [])

    encoded, _ = embed_here(folder, [cfg])

    assert encoded == {"GPT-SI": []}
    table = folder.read("embeddings")
    assert table.schema.equals(EMBEDDINGS_SCHEMA)
    rows = {r["text_sha256"]: r for r in table.to_pylist()}
    assert rows[text_key(old_text)]["mode"] is None and rows[text_key(new_text)]["mode"] == "batch"
    assert (
        rows[text_key(old_text)]["vector"] == old_vector.tolist()
        and rows[text_key(new_text)]["vector"] == new_vector.tolist()
    )
    assert {r["encoder_key"] for r in rows.values()} == {encoder_key(cfg)}
    assert not folder.table_path("embeddings").exists()  # the one-file table is now a folder of segments


def two_runs(folder: RunFolder) -> list[pa.Table]:
    """Both encoders' tables after a first run of many texts, and after a second run in which ten of
    them are no longer wanted and two are new."""
    responses = [("ok", t) for t in MANY[30:]] + RESPONSES
    inputs(folder, MANY + REFERENCES, responses)
    embed_here(folder, [SBERT, OTHER])
    first = folder.read("embeddings")
    inputs(folder, MANY[10:] + REFERENCES + ["a text added later", "and another"], responses)
    embed_here(folder, [SBERT, OTHER])
    return [first, folder.read("embeddings")]


@pytest.mark.parametrize("passes", [1, 2, 7, 512])
def test_spilling_a_range_of_buckets_at_a_time_writes_the_table_sorted_in_memory(tmp_path, monkeypatch, passes):
    """Sources spread over buckets on disk, in one pass or a range of buckets at a time, give the
    table that sorting them in memory gives (what a study's few new vectors take): from parts alone,
    and again from a segment that holds texts no longer wanted beside the parts of new ones."""
    in_memory = two_runs(RunFolder(tmp_path / "in-memory"))
    monkeypatch.setattr(write_module, "SORT_IN_MEMORY_BYTES", -1)
    monkeypatch.setattr(write_module, "write_passes", lambda source_bytes, free_bytes, buckets: passes)
    spilled = two_runs(RunFolder(tmp_path / "spilled"))
    assert [t.num_rows for t in in_memory] == [t.num_rows for t in spilled]
    assert all(a.equals(b) for a, b in zip(spilled, in_memory))


def test_a_pass_reads_only_the_parts_and_row_groups_that_hold_keys_of_its_buckets(tmp_path, monkeypatch):
    """Parts saved as the plan hands out the texts (a bucket of keys at a time here) are read about
    once over all the passes, not once a pass (at a million images, 26 GB read six times): a part
    again only where a pass's first bucket falls among its keys. So are a segment's row groups
    when a later run rewrites it. The tables are those one pass writes."""
    monkeypatch.setattr(local_module, "CHUNK_TEXTS", 1)  # each bucket's texts batched on their own
    monkeypatch.setattr(local_module, "PART_ROWS", 3)
    monkeypatch.setattr(table_module, "VECTOR_BATCH", 4)  # a segment of row groups of 4 rows
    monkeypatch.setattr(write_module, "VECTOR_BATCH", 4)
    monkeypatch.setattr(write_module, "SORT_IN_MEMORY_BYTES", -1)
    passes, reads = 7, {"parts": 0, "row groups": 0}

    iter_parts, file_batches = RunFolder.iter_parts, RunFolder.file_batches

    def parts_read(*args, **kwargs):
        for part in iter_parts(*args, **kwargs):
            reads["parts"] += writing
            yield part

    def groups_read(path, *args, row_groups=None, **kwargs):
        if writing:
            reads["row groups"] += pq.ParquetFile(path).num_row_groups if row_groups is None else len(row_groups)
        return file_batches(path, *args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(RunFolder, "iter_parts", parts_read)
    monkeypatch.setattr(RunFolder, "file_batches", staticmethod(groups_read))
    write = write_selected

    def written(folder, plan, spill):
        nonlocal writing
        parts = len(list(folder._parts_dir("embeddings").glob("part-*.parquet")))
        groups = sum(
            pq.ParquetFile(path).num_row_groups for i, (path, _) in enumerate(plan.previous) if i not in plan.clean
        )
        writing = True
        try:
            return write(folder, plan, spill)
        finally:
            writing = False
            counts.append((parts, groups, dict(reads)))
            reads.update(dict.fromkeys(reads, 0))

    writing, counts = False, []
    monkeypatch.setitem(globals(), "write_selected", written)  # what `embed_here` calls
    one_pass = two_runs(RunFolder(tmp_path / "one-pass"))
    monkeypatch.setattr(write_module, "write_passes", lambda source_bytes, free_bytes, buckets: passes)
    many_passes = two_runs(RunFolder(tmp_path / "passes"))

    assert all(a.equals(b) for a, b in zip(many_passes, one_pass))
    (fresh_parts, _, fresh_reads), (later_parts, later_groups, later_reads) = counts[2:]
    assert fresh_parts > 2 * passes and later_parts and later_groups > passes
    # Each part or group once, and once more for each of the passes' 6 inner bounds it may straddle.
    assert fresh_parts <= fresh_reads["parts"] <= fresh_parts + passes - 1
    assert later_parts <= later_reads["parts"] <= later_parts + passes - 1
    assert later_groups <= later_reads["row groups"] <= later_groups + passes - 1


def test_the_passes_keep_the_spill_and_the_table_within_the_free_space():
    gb = 10**9
    # 26 GB of parts: a 26 GB table and a 32.5 GB spill, within 90% of the free space.
    assert write_module.write_passes(26 * gb, 80 * gb, 512) == 1  # 46 GB of room
    assert write_module.write_passes(26 * gb, 40 * gb, 512) == 4  # 10 GB of room: 32.5 / 10
    assert write_module.write_passes(26 * gb, 20 * gb, 512) == 512  # no room even for the table: as small as it goes
    assert write_module.write_passes(26 * gb, int(28.9 * gb), 512) == 512  # 0.01 GB of room
    assert write_module.write_passes(0, 0, 256) == 256 and write_module.write_passes(0, 1, 256) == 1


def _segments(folder: RunFolder) -> dict[str, tuple[int, int]]:
    """Each segment file of the table: (its inode, its modification time), to tell a file kept as
    it was from one written again."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.segments("embeddings")}


def _in_order(table: pa.Table) -> pa.Table:
    return table.sort_by([("encoder", "ascending"), ("text_sha256", "ascending")])


@pytest.mark.parametrize("held", [True, False])
def test_texts_added_cost_one_new_segment_of_their_vectors_and_the_table_is_a_fresh_runs(tmp_path, monkeypatch, held):
    # the plan's buckets held in memory (small files) or spread over files: the same table
    monkeypatch.setattr(plan_module, "HOLD_FILES_BYTES", 2**40 if held else -1)
    folder = RunFolder(tmp_path / "incremental")
    inputs(folder, MANY[:40], [("ok", t) for t in MANY[10:30]])
    embed_here(folder, [SBERT, OTHER])
    first = _segments(folder)
    assert list(first) == ["segment-000001.parquet"]

    references, responses = MANY[:60], [("ok", t) for t in MANY[10:30]] + [("ok", "a new answer")]
    inputs(folder, references, responses)
    encoded, _ = embed_here(folder, [SBERT, OTHER])

    added = sorted([t.strip() for t in MANY[40:60]] + ["a new answer"])
    assert {name: sorted(texts) for name, texts in encoded.items()} == {"SBERT-SI": added, "Other-SI": added}
    now = _segments(folder)
    assert now["segment-000001.parquet"] == first["segment-000001.parquet"]  # not written again
    new = pq.read_table(folder.segment_folder("embeddings") / "segment-000002.parquet")
    assert sorted(new.column("text_sha256").to_pylist()) == sorted([text_key(t) for t in added] * 2)
    assert new.equals(_in_order(new))  # a segment is sorted by encoder and text
    fresh = RunFolder(tmp_path / "fresh")
    inputs(fresh, references, responses)
    embed_here(fresh, [SBERT, OTHER])
    assert _in_order(folder.read("embeddings")).equals(fresh.read("embeddings"))
    assert fresh.read("embeddings").equals(expected(references, responses, [SBERT, OTHER], {}))


def test_a_segment_holding_a_text_no_longer_wanted_is_written_again_without_it_and_the_others_kept(tmp_path):
    folder = RunFolder(tmp_path)
    for end in (20, 40, 60):  # three runs: three segments
        inputs(folder, MANY[:end], [])
        embed_here(folder, [SBERT])
    before = _segments(folder)
    assert len(before) == 3
    references = MANY[:25] + MANY[26:60]  # one text of the second segment gone
    inputs(folder, references, [])

    encoded, _ = embed_here(folder, [SBERT])

    assert encoded == {"SBERT-SI": []}
    now = _segments(folder)
    assert {k: now[k] for k in ("segment-000001.parquet", "segment-000003.parquet")} == {
        k: before[k] for k in ("segment-000001.parquet", "segment-000003.parquet")
    }
    assert "segment-000002.parquet" not in now  # pruned once the manifest no longer records it
    rewritten = pq.read_table(folder.segment_folder("embeddings") / "segment-000004.parquet")
    assert sorted(rewritten.column("text_sha256").to_pylist()) == sorted(
        text_key(t) for t in MANY[20:40] if t != MANY[25]
    )
    assert _in_order(folder.read("embeddings")).equals(expected(references, [], [SBERT], {}))


def test_an_encoder_renamed_has_its_segments_written_again_under_its_new_name_and_nothing_encoded(tmp_path):
    folder = RunFolder(tmp_path)
    inputs(folder, MANY[:30], [])
    embed_here(folder, [SBERT, OTHER])
    renamed = EncoderConfig(name="MiniLM", model_id=SBERT.model_id)  # the same vectors: the same encoder key
    assert encoder_key(renamed) == encoder_key(SBERT)

    encoded, _ = embed_here(folder, [renamed, OTHER])

    assert encoded == {"MiniLM": [], "Other-SI": []}
    assert list(_segments(folder)) == ["segment-000002.parquet"]
    assert _in_order(folder.read("embeddings")).equals(expected(MANY[:30], [], [renamed, OTHER], {}))


def test_a_segment_the_manifest_does_not_record_is_removed_and_its_texts_encoded_again(tmp_path):
    """A run killed after writing its new segment and before saving the manifest: the segment is
    not part of the table; the next run removes it and writes the table a run without the kill gives."""
    folder = RunFolder(tmp_path / "killed")
    inputs(folder, MANY[:30], [])
    embed_here(folder, [SBERT])
    inputs(folder, MANY[:50], [])
    recorded = folder.manifest()
    embed_here(folder, [SBERT])
    folder.save_manifest(recorded)  # the manifest as the kill left it: the second segment unrecorded
    assert len(_segments(folder)) == 2

    folder.prune_segments("embeddings")  # as the runner does before the stage runs
    assert list(_segments(folder)) == ["segment-000001.parquet"]
    encoded, _ = embed_here(folder, [SBERT])

    assert sorted(encoded["SBERT-SI"]) == sorted(t.strip() for t in MANY[30:50])
    assert _in_order(folder.read("embeddings")).equals(expected(MANY[:50], [], [SBERT], {}))


def test_the_folder_of_segments_reads_as_one_table_in_pyarrow_pandas_and_duckdb(tmp_path):
    import duckdb

    folder = RunFolder(tmp_path)
    for end in (30, 60):  # two segments
        inputs(folder, MANY[:end], [])
        embed_here(folder, [SBERT, OTHER])
    assert len(folder.segments("embeddings")) == 2
    table = _in_order(folder.read("embeddings"))
    assert _in_order(pq.read_table(folder.segment_folder("embeddings"))).equals(table)
    frame = __import__("pandas").read_parquet(folder.segment_folder("embeddings"))
    assert sorted(frame["text_sha256"]) == sorted(table.column("text_sha256").to_pylist())
    glob = str(folder.segment_folder("embeddings") / "*.parquet")
    rows = duckdb.sql(f"SELECT encoder, text_sha256, vector FROM read_parquet('{glob}') ORDER BY 1, 2").fetchall()
    assert rows == [(r["encoder"], r["text_sha256"], r["vector"]) for r in table.to_pylist()]


@pytest.mark.parametrize("widths", [(3, 3, 3), (3, 5, 3)])
def test_vectors_gathered_in_blocks_are_the_ones_arrow_takes(widths):
    """Rows of a vector column in many chunks, gathered a block at a time as rows of each chunk's
    matrix where every vector has one width, and by Arrow otherwise: the rows Arrow's take gives."""
    rng = np.random.default_rng(0)
    chunks = [
        pa.array([rng.random(width, dtype=np.float32).tolist() for _ in range(n)], pa.list_(pa.float32()))
        for width, n in zip(widths, (4, 1, 6))
    ]
    column = pa.chunked_array([chunks[0], chunks[1].slice(0, 0), chunks[1], chunks[2].slice(1)])
    for at in (np.array([], np.int64), np.array([9, 0, 4, 4, 2]), rng.permutation(len(column))):
        for rows in (1, 3, 100):
            blocks = list(write_module._vector_blocks(column, at, rows))
            assert [len(b) for b in blocks] == [min(rows, len(at) - lo) for lo in range(0, len(at), rows)]
            assert all(b.type == pa.list_(pa.float32()) for b in blocks)
            assert [v for b in blocks for v in b.to_pylist()] == column.take(at).to_pylist()


@pytest.mark.parametrize(
    "slots, n_texts, actors",
    [(4, 1, 1), (4, 512, 1), (4, 513, 2), (4, 1536, 3), (4, 2048, 4), (4, 10**6, 4), (1, 10**6, 1)],
)
def test_an_encoder_gets_an_actor_per_call_of_work_up_to_what_the_cluster_fits(slots, n_texts, actors):
    """docs/architecture.md: as many actors as the CPUs (or GPUs) allow, but none with no call of
    512 texts to make (worked by hand: 513 texts are two calls)."""
    assert local_module.TEXT_BATCH == 512
    assert local_module.actors_for(slots, n_texts) == actors


@pytest.mark.parametrize(
    "slots, cpus, local, at_once",
    [(2, 2, True, 1), (1, 2, True, 1), (16, 16, True, 15), (4, 16, True, 4), (2, 1, True, 1), (8, 2, True, 1)]
    + [(2, 2, False, 2), (64, 64, False, 64)],
)
def test_actors_load_at_once_no_more_than_the_cores_the_driver_leaves(slots, cpus, local, at_once):
    """docs/architecture.md: on a local Ray the driver keeps a core, so 2 cores load one encoder at
    a time (the second after the first), 16 cores fifteen; a cluster's nodes load all at once."""
    assert local_module.loading_at_once(slots, cpus, local) == at_once
