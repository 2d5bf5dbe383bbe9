"""The embed stage: each distinct text (human or model) is encoded once per encoder.

Vectors are keyed by the sha256 of the stripped text, so a description shared by several rows, or
by two runs, costs one encoding. Encoding runs in a Ray actor that loads the encoder once; each
finished batch is saved as a part, so a killed run keeps what it finished. API encoders (`remote`)
send their batches through the provider's gateway actor instead, several at once; it caches every
vector, so a text is paid for once across runs.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .config import EncoderConfig, StudyConfig
from .encoders import encoder_class
from .progress import Reporter
from .runfolder import RunFolder

EMBEDDINGS_SCHEMA = pa.schema(
    [
        ("text_sha256", pa.string()),
        ("encoder", pa.string()),
        ("encoder_key", pa.string()),
        ("dim", pa.int32()),
        # Variable-length so encoders of different widths share one table; `dim` says the width.
        ("vector", pa.list_(pa.float32())),
    ]
)
TEXT_BATCH = 128
REMOTE_IN_FLIGHT = 8  # batches of texts in flight to an API encoder's gateway


def text_key(text: str) -> str:
    return hashlib.sha256(text.strip().encode("utf-8")).hexdigest()


def encoder_key(cfg: EncoderConfig) -> str:
    """What decides an encoder's vectors (not its display name or batch size)."""
    payload = cfg.model_dump_json(exclude={"name", "batch_size"})
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def texts_to_embed(references: pa.Table, responses: pa.Table) -> dict[str, str]:
    """sha256 -> text for every distinct non-empty text to score."""
    texts = references.column("text").to_pylist()
    ok = responses.filter(pc.equal(responses.column("status"), "ok"))
    texts += ok.column("text").to_pylist()
    return {text_key(t): t.strip() for t in texts if t and t.strip()}


class EncodeActor:
    def __init__(self, cfg: EncoderConfig):
        self.encoder = encoder_class(cfg.backend)(cfg)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encoder.encode(texts)


def _rows(keys: list[str], vectors: np.ndarray, cfg: EncoderConfig) -> pa.Table:
    return pa.table(
        {
            "text_sha256": keys,
            "encoder": [cfg.name] * len(keys),
            "encoder_key": [encoder_key(cfg)] * len(keys),
            "dim": [vectors.shape[1]] * len(keys),
            "vector": list(vectors.astype(np.float32)),
        },
        schema=EMBEDDINGS_SCHEMA,
    )


def _existing(run: RunFolder) -> pa.Table:
    old = run.read("embeddings") if run.has("embeddings") else EMBEDDINGS_SCHEMA.empty_table()
    return pa.concat_tables([old.cast(EMBEDDINGS_SCHEMA), run.read_parts("embeddings", EMBEDDINGS_SCHEMA)])


def run_embed(study: StudyConfig, texts: dict[str, str], run: RunFolder, reporter: Reporter, ensure_ray) -> pa.Table:
    existing = _existing(run)
    have = set(zip(existing.column("text_sha256").to_pylist(), existing.column("encoder_key").to_pylist()))
    todo = {cfg.name: sorted(k for k in texts if (k, encoder_key(cfg)) not in have) for cfg in study.encoders}
    total = sum(len(v) for v in todo.values())
    if have:
        reporter.say(f"     embeddings   {len(texts) * len(study.encoders) - total} already encoded, kept")
    with reporter.track("embed", total) as advance:
        for cfg in study.encoders:
            keys = todo[cfg.name]
            if not keys:
                continue
            ray = ensure_ray()
            if encoder_class(cfg.backend).remote:
                _embed_remote(study, cfg, keys, texts, run, advance, ray)
                continue
            actor = ray.remote(EncodeActor).options(num_cpus=study.runtime.cpus_per_actor).remote(cfg)
            try:
                batches = [keys[i : i + TEXT_BATCH] for i in range(0, len(keys), TEXT_BATCH)]
                refs = [actor.encode.remote([texts[k] for k in batch]) for batch in batches]
                for batch, ref in zip(batches, refs):
                    run.append_part("embeddings", _rows(batch, ray.get(ref), cfg))
                    advance(len(batch))
            finally:
                ray.kill(actor)
    return _select(_existing(run), texts, study.encoders)


def _embed_remote(study: StudyConfig, cfg: EncoderConfig, keys: list[str], texts: dict[str, str], run: RunFolder, advance, ray) -> None:
    """Batches of texts through the provider's gateway; a failed or refused batch stops the stage
    after the rest in flight are saved, and says why."""
    from .api.session import APIStopped, BudgetReached, RemoteSession

    provider = encoder_class(cfg.backend).provider
    queue = iter([keys[i : i + cfg.batch_size] for i in range(0, len(keys), cfg.batch_size)])
    pending: dict = {}
    stopped: list[dict] = []
    with RemoteSession(ray, study, run, provider) as session:

        def submit() -> None:
            batch = next(queue, None) if not stopped else None
            if batch is not None:
                pending[session.actor.embed.remote(cfg.model_id, [texts[k] for k in batch])] = batch

        for _ in range(REMOTE_IN_FLIGHT):
            submit()
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            batch = pending.pop(ref)
            answer = ray.get(ref)
            if answer["status"] == "ok":
                run.append_part("embeddings", _rows(batch, answer["vectors"], cfg))
                advance(len(batch))
                session.record()
            else:
                stopped.append(answer)
            submit()
    if stopped:
        kind = BudgetReached if any(a["status"] == "skipped" for a in stopped) else APIStopped
        raise kind(f"encoder {cfg.name}: {stopped[0]['error']}; the vectors finished so far are kept")


def _select(table: pa.Table, texts: dict[str, str], encoders) -> pa.Table:
    """The vectors the current texts and encoders need, one row each, sorted."""
    wanted = {(k, encoder_key(cfg)): cfg.name for cfg in encoders for k in texts}
    rows = {}
    for row in table.to_pylist():
        name = wanted.get((row["text_sha256"], row["encoder_key"]))
        if name is not None:
            rows[(name, row["text_sha256"])] = {**row, "encoder": name}
    return pa.Table.from_pylist([rows[k] for k in sorted(rows)], schema=EMBEDDINGS_SCHEMA)
