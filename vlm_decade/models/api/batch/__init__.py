"""Batch mode (`providers.<name>.mode: batch`): the same requests at about half price, sent in
groups through the providers' batch interfaces and collected when they are done.

- `lines.py`: what a batch holds (a request as written to disk, an embedding answer), the batch
  price and the states of a batch;
- `openai_batches.py`, `gemini_batches.py`: the providers' batch interfaces (OpenAI's Files and
  Batch APIs; Gemini's inline and file batches, and its embedding batches);
- `records.py`: each batch's record and requests on disk, and the readers of a run folder's records;
- `batcher.py`: the `Batcher`, which groups a gateway's requests, submits, polls and collects.

A batch holds chat requests or texts to embed, never both. Embedding batches hold at most
`EMBED_LINES` texts (our bound, under both providers' limits): their answers are downloaded whole,
and 10,000 vectors of 3,072 floats are 120 MB. Both providers bill batch requests at 50% of the
standard price (`BATCH_DISCOUNT`, as both state it on the pricing pages docs/api.md dates).

Every request keeps its cache key (the same as in sync mode) as its id in the batch, so an answer
bought in batch is a cache hit for a later sync run and the reverse.
"""

from vlm_decade.models.api.batch.batcher import Batcher
from vlm_decade.models.api.batch.lines import BATCH_DISCOUNT
from vlm_decade.models.api.batch.records import run_batch_labels, run_batches, run_records

__all__ = ["BATCH_DISCOUNT", "Batcher", "run_batch_labels", "run_batches", "run_records"]
