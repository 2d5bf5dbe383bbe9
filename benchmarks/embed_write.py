"""Writing the embeddings table in passes: each pass reading only the parts whose footers say they
hold keys of its buckets, side by side with each pass reading every part (what the write did
before), and with one pass, on the same parts in one run.

The parts are made as a fresh run makes them: the stage's own plan hands the texts out (a chunk of
buckets of keys at a time, sorted by length), and each batch is saved through the stage's part
writer; a seeded generator stands in for the encoder (its vectors' values do not matter to the
write, their bytes do). The passes are forced (`embed.write.write_passes`), as a disk with little room
left would force them: at a million images this machine's disk gave 4 to 6. Run from the
repository root:
    .venv/bin/python benchmarks/embed_write.py [--texts 1500000] [--passes 6]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa

from vlm_decade.core.config import EncoderConfig
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.stages import embed

DIM = 384  # the width of the small sentence encoders the studies use


def make_parts(folder: RunFolder, n_texts: int, cfg: EncoderConfig) -> None:
    """References of `n_texts` distinct texts, planned and 'encoded' into parts as the stage does."""
    words = np.array("a man woman dog cat red blue small old sits runs near under the on street park".split())
    rng = np.random.default_rng(0)
    texts = [f"{i} " + " ".join(words[rng.integers(0, len(words), rng.integers(3, 12))]) for i in range(n_texts)]
    folder.write("references", pa.table({"text": pa.array(texts, pa.string())}))
    folder.write("responses", pa.table({"status": pa.array([], pa.string()), "text": pa.array([], pa.string())}))
    with embed.spill_folder(folder) as spill:
        plan = embed.plan_texts(folder, [cfg], spill)
        with folder.parts("embeddings", embed.EMBEDDINGS_SCHEMA, embed.local.PART_ROWS, embed.local.PART_S) as parts:
            for batch in plan.local_batches(0):
                vectors = rng.standard_normal((batch.num_rows, DIM), dtype=np.float32)
                parts.add(embed.table.vector_rows(batch.column("text_sha256"), vectors, cfg))


def timed_write(folder: RunFolder, cfg: EncoderConfig, passes: int, every_part: bool) -> float:
    """Seconds to plan nothing new and write the table from the parts in `passes` passes; with
    `every_part`, no footer is read, so every pass reads every part."""
    with embed.spill_folder(folder) as spill:
        plan = embed.plan_texts(folder, [cfg], spill)
        unread = mock.patch.object(
            RunFolder, "column_ranges", staticmethod(lambda path, columns: None)
        )  # read as damaged
        with mock.patch.object(embed.write, "write_passes", lambda *_: passes), unread if every_part else nullcontext():
            start = time.perf_counter()
            embed.write_selected(folder, plan, spill / "vectors")
            seconds = time.perf_counter() - start
    shutil.rmtree(folder.segment_folder("embeddings"))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1_500_000, help="distinct texts (a million images: 17 million)")
    parser.add_argument("--passes", type=int, default=6)
    args = parser.parse_args()
    cfg = EncoderConfig(name="SBERT-SI")
    with tempfile.TemporaryDirectory() as tmp:
        folder = RunFolder(Path(tmp))
        make_parts(folder, args.texts, cfg)
        n_parts = len(list((folder.root / ".parts" / "embeddings").glob("part-*.parquet")))
        parts_gb = round(folder.parts_bytes("embeddings") / 1e9, 2)
        seconds = {
            "one_pass_s": timed_write(folder, cfg, 1, every_part=False),
            "passes_every_part_s": timed_write(folder, cfg, args.passes, every_part=True),
            "passes_footers_s": timed_write(folder, cfg, args.passes, every_part=False),
        }
    result = {"texts": args.texts, "parts": n_parts, "parts_gb": parts_gb, "passes": args.passes}
    result |= {name: round(s, 1) for name, s in seconds.items()}
    # The ratio of the seconds as measured: a small run's, rounded, can be 0.0.
    result["every_part_over_footers"] = round(seconds["passes_every_part_s"] / seconds["passes_footers_s"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
