"""Writing the embeddings table, a folder of segments (`RunFolder.write_segment`): a run keeps,
file for file, each segment of the last table whose every row it still wants, and writes one new
segment of the rest (the vectors it encoded, and the rows it keeps of a segment that also holds
rows it no longer wants), so images added to a run cost their own vectors, not a rewrite of every
vector. The new segment is sorted without holding its vectors all at once.
"""

from __future__ import annotations

import math
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.columns import first_per_key, run_starts
from vlm_decade.core.runfolder import SEGMENT, RunFolder, segments_record
from vlm_decade.core.runner import Written
from vlm_decade.core.spill import Spill, key_buckets
from vlm_decade.stages.embed.plan import EmbedPlan
from vlm_decade.stages.embed.table import EMBEDDINGS_SCHEMA, VECTOR_BATCH, encoder_key, vector_sources

# Writing the table: a spilled row (Arrow, uncompressed) against the same row in a part (Parquet),
# and the share of the free space the spill and the table may take.
SPILL_GROWTH, FREE_KEPT = 1.25, 0.9
# Sources (the parts and the segments not kept) up to this size are sorted in memory (about twice
# their size at the peak), not spread over buckets on disk first: what images added to a run encode.
SORT_IN_MEMORY_BYTES = 512 * 2**20


def _vector_blocks(vectors: pa.ChunkedArray, at: np.ndarray, rows: int):
    """Rows `at` of a vector column, `rows` at a time: where every vector has one width, gathered
    as rows of each chunk's float matrix into a block (neither a list take, which copies a vector
    at a time, nor one matrix of them all, whose fresh pages cost more than the copying: 0.8 s
    for 261 MB here); else by Arrow."""
    widths = pc.min_max(pc.list_value_length(vectors)).as_py()
    if widths["min"] != widths["max"]:
        for lo in range(0, len(at), rows):
            yield vectors.take(at[lo : lo + rows]).combine_chunks()
        return
    width = widths["min"]
    matrices = [chunk.flatten().to_numpy().reshape(-1, width) for chunk in vectors.chunks if len(chunk)]
    starts = np.cumsum([0, *(len(m) for m in matrices)])
    chunk_of = np.searchsorted(starts, at, side="right") - 1
    within = at - starts[chunk_of]
    for lo in range(0, len(at), rows):
        chunks, places = chunk_of[lo : lo + rows], within[lo : lo + rows]
        block = np.empty((len(chunks), width), np.float32)
        for k in np.unique(chunks).tolist():
            mine = chunks == k
            block[mine] = matrices[k][places[mine]]
        offsets = pa.array(np.arange(len(block) + 1, dtype=np.int32) * width)
        yield pa.ListArray.from_arrays(offsets, pa.array(block.reshape(-1)))


def write_passes(source_bytes: int, free_bytes: int, buckets: int) -> int:
    """How many passes over the sources `write_selected` makes, each spilling a range of its
    buckets, so that the spill beside the table being written fits in the free space (the table
    takes about what its sources take): one when the whole spill fits, at most one per bucket."""
    room = FREE_KEPT * free_bytes - source_bytes
    if room <= 0:
        return buckets
    return max(1, min(buckets, math.ceil(SPILL_GROWTH * source_bytes / room)))


def write_selected(folder: RunFolder, plan: EmbedPlan, spill: Path) -> Written:
    """The table the current texts and encoders need, one vector each (the first the sources
    hold): the previous table's `clean` segments kept as they are, and one new segment of every
    other vector (sorted by encoder and text), written without holding them all: the sources' rows
    but those of the clean segments are spread over buckets by encoder and the key's first two hex
    digits (spill files under `spill`: a bucket is 1/256 of an encoder's vectors), then each bucket
    is kept to its texts (`plan.written_keys`), sorted and written. Where the disk has no room for
    the whole spill beside the segment, the buckets are spilled a range at a time, a pass over the
    sources each (`write_passes`). Vectors of texts no longer wanted, or of encoders no longer
    named, are left out. A new segment with no rows is written only when no segment is kept (the
    table then has none)."""
    name_of = {encoder_key(cfg): cfg.name for cfg in plan.encoders}
    order = {name: i for i, name in enumerate(sorted(set(name_of.values())))}
    index_of = {cfg.name: i for i, cfg in enumerate(plan.encoders)}
    keys = pa.array(list(name_of), pa.string())
    names = pa.array(list(name_of.values()), pa.string())
    rank = np.array([order[name] for name in name_of.values()], dtype=np.int64)
    by_rank = [index_of[name] for name in sorted(order)]  # the encoder of each rank
    buckets = len(order) * 256
    source_bytes = folder.parts_bytes("embeddings") + sum(
        path.stat().st_size for i, (path, _) in enumerate(plan.previous) if i not in plan.clean
    )
    passes = write_passes(source_bytes, shutil.disk_usage(folder.root).free, buckets)

    def in_range(first: int, end: int, ranges: dict) -> bool:
        # Whether a row group may hold rows of buckets [first, end): the plan hands each encoder's
        # texts out a few buckets of keys at a time, so a part's keys span few buckets, and a
        # segment's row groups fewer; a pass reads those alone, not every source again.
        text, encoder = ranges["text_sha256"], ranges["encoder_key"]
        low, high = (0, 255) if text is None else (int(text[0][:2], 16), int(text[1][:2], 16))
        ranks = {rank[i] for i, key in enumerate(name_of) if encoder is None or encoder[0] <= key <= encoder[1]}
        return any(r * 256 + low < end and r * 256 + high >= first for r in ranks)

    def spilled(first: int, end: int) -> Spill:
        vectors = Spill(spill / f"{first:06d}", EMBEDDINGS_SCHEMA)
        for _, table in vector_sources(folder, plan.previous, skip=plan.clean, touches=partial(in_range, first, end)):
            table = table.filter(pc.is_in(table.column("encoder_key"), keys))
            which = pc.index_in(table.column("encoder_key"), value_set=keys)
            table = table.set_column(1, "encoder", pc.take(names, which))
            bucket = rank[which.to_numpy(zero_copy_only=False)] * 256 + key_buckets(table.column("text_sha256"))
            mine = (bucket >= first) & (bucket < end)
            vectors.add(table.filter(pa.array(mine)), bucket[mine])
        vectors.close()
        return vectors

    def sorted_in_memory():
        # The rows the spill's buckets give, in their order (by encoder, then key; a key's first
        # source, as the stable sort keeps it), the vectors gathered a block at a time.
        tables = [table for _, table in vector_sources(folder, plan.previous, skip=plan.clean)]
        if not tables:
            return
        table = pa.concat_tables(tables)
        which = pc.index_in(table.column("encoder_key"), value_set=keys).to_numpy(zero_copy_only=False)
        which = np.nan_to_num(which, nan=-1).astype(np.int64)  # -1: a vector of an encoder no longer named
        for r, name in enumerate(sorted(order)):
            wanted = pa.concat_arrays([plan.written_keys(digits, by_rank[r]).combine_chunks() for digits in range(256)])
            mine = (which >= 0) & (rank[which] == r)
            mine &= pc.is_in(table.column("text_sha256"), value_set=wanted).to_numpy(zero_copy_only=False)
            at = np.flatnonzero(mine)
            at = at[pc.sort_indices(table.column("text_sha256").take(at)).to_numpy()]
            at = at[run_starts(table.column("text_sha256").take(at))]
            rows = table.drop_columns(["vector"]).take(at)
            rows = rows.set_column(1, "encoder", pa.repeat(pa.scalar(name, pa.string()), rows.num_rows))
            for lo, vectors in zip(range(0, len(at), VECTOR_BATCH), _vector_blocks(table["vector"], at, VECTOR_BATCH)):
                block = rows.slice(lo, VECTOR_BATCH).add_column(4, EMBEDDINGS_SCHEMA.field("vector"), vectors)
                yield from block.to_batches()

    def sorted_batches():
        if source_bytes <= SORT_IN_MEMORY_BYTES:
            yield from sorted_in_memory()
            return
        bounds = np.linspace(0, buckets, passes + 1).round().astype(int).tolist()
        for first, end in zip(bounds, bounds[1:]):
            vectors = spilled(first, end)
            for bucket in vectors.buckets:
                table = vectors.read(bucket)
                wanted = plan.written_keys(bucket % 256, by_rank[bucket // 256])
                table = table.filter(pc.is_in(table.column("text_sha256"), wanted))
                yield from first_per_key(table.sort_by("text_sha256"), "text_sha256").to_batches()
            vectors.remove()

    kept = [segment for i, (_, segment) in enumerate(plan.previous) if i in plan.clean]
    numbers = [int(SEGMENT.match(s["name"]).group(1)) for _, s in plan.previous if s is not None]
    new = folder.write_segment(
        "embeddings", max(numbers, default=0) + 1, EMBEDDINGS_SCHEMA, sorted_batches(), row_group_rows=VECTOR_BATCH
    )
    if not new["rows"] and kept:
        (folder.segment_folder("embeddings") / new["name"]).unlink()
    else:
        kept.append(new)
    return Written(**segments_record(kept))
