"""The embed stage: each distinct text (human or model) is encoded once per encoder.

Vectors are keyed by the sha256 of the stripped text, so a description shared by several rows, or
by two runs, costs one encoding. Encoding runs in a Ray actor that loads the encoder once; each
finished batch is saved as a part, so a killed run keeps what it finished. API encoders (`remote`)
send their batches through the provider's gateway actor instead, several at once; it caches every
vector, so a text is paid for once across runs.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.config import EncoderConfig, StudyBase
from vlm_decade.core.dispatch import bounded
from vlm_decade.core.errors import Problem
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import Stage, StudyRun
from vlm_decade.models.api.keys import api_key, key_hint
from vlm_decade.models.encoders import api_provider, encoder_class, text_key
from vlm_decade.stages.estimate import Line

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
IN_FLIGHT = 2  # batches in flight to a local encoder's actor: the next is ready while one is saved
REMOTE_IN_FLIGHT = 8  # batches of texts in flight to an API encoder's gateway


def encoder_key(cfg: EncoderConfig) -> str:
    """What decides an encoder's vectors (not its display name or batch size)."""
    return cfg.key(without=("name",))


def check_encoders(study: StudyBase) -> list[Problem]:
    """An API key and a price for every API encoder, before any work."""
    problems = []
    for i, enc in enumerate(getattr(study, "encoders", ())):
        try:
            provider = api_provider(enc.backend)
        except KeyError as exc:
            problems.append(Problem("study file", exc.args[0], field=f"encoders.{i}.backend"))
            continue
        if provider is None:
            continue
        if api_key(provider) is None:
            problems.append(Problem("environment", f"encoder '{enc.name}' needs an API key: set {key_hint(provider)}", field=f"encoders.{i}"))
        if getattr(study.providers, provider).price(provider, enc.model_id) is None:
            problems.append(Problem("study file", f"no price for {provider} model '{enc.model_id}'; add one under "
                                    f"providers.{provider}.prices", field=f"encoders.{i}.model_id"))
    return problems


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


def _existing(folder: RunFolder) -> pa.Table:
    old = folder.read("embeddings") if folder.has("embeddings") else EMBEDDINGS_SCHEMA.empty_table()
    return pa.concat_tables([old.cast(EMBEDDINGS_SCHEMA), folder.read_parts("embeddings", EMBEDDINGS_SCHEMA)])


def run_embed(study: StudyBase, texts: dict[str, str], run: StudyRun) -> pa.Table:
    existing = _existing(run.folder)
    have = set(zip(existing.column("text_sha256").to_pylist(), existing.column("encoder_key").to_pylist()))
    todo = {cfg.name: sorted(k for k in texts if (k, encoder_key(cfg)) not in have) for cfg in study.encoders}
    total = sum(len(v) for v in todo.values())
    if have:
        run.reporter.say(f"     embeddings   {len(texts) * len(study.encoders) - total} already encoded, kept")
    with run.reporter.track("embed", total) as advance:
        for cfg in study.encoders:
            keys = todo[cfg.name]
            if not keys:
                continue
            if encoder_class(cfg.backend).remote:
                _embed_remote(study, cfg, keys, texts, run, advance)
                continue
            ray = run.ray()
            actor = ray.remote(EncodeActor).options(num_cpus=study.runtime.cpus_per_actor).remote(cfg)
            submit = lambda batch, _: actor.encode.remote([texts[k] for k in batch])  # noqa: E731
            try:
                for done in bounded(ray, [keys[i : i + TEXT_BATCH] for i in range(0, len(keys), TEXT_BATCH)], submit, IN_FLIGHT):
                    if done.error is not None:
                        raise done.error
                    run.folder.append_part("embeddings", _rows(done.work, done.value, cfg))
                    advance(len(done.work))
            finally:
                ray.kill(actor)
    return _select(_existing(run.folder), texts, study.encoders)


def _embed_remote(study: StudyBase, cfg: EncoderConfig, keys: list[str], texts: dict[str, str], run: StudyRun, advance) -> None:
    """Batches of texts through the provider's gateway. A batch that fails after the gateway's
    retries is left out and the others go on; a budget stop ends the sending. The embeddings table
    has no error rows (every vector in it is whole): the texts left out make the stage stop after
    the rest are saved, saying how many and why; the next run encodes exactly those."""
    from collections import Counter

    from vlm_decade.models.api.session import APIStopped, BudgetReached, RemoteSession

    ray = run.ray()
    provider = encoder_class(cfg.backend).provider
    failed: Counter = Counter()  # error -> texts
    stopped: list[str] = []
    encoded = 0

    def work():
        for i in range(0, len(keys), cfg.batch_size):
            if stopped:
                return
            yield keys[i : i + cfg.batch_size]

    with RemoteSession(ray, study.providers, run.folder, provider) as session:
        submit = lambda batch, _: session.actor.embed.remote(cfg.model_id, [texts[k] for k in batch])  # noqa: E731
        for done in bounded(ray, work(), submit, REMOTE_IN_FLIGHT):
            if done.error is not None:
                failed[f"{type(done.error).__name__}: gateway call failed"] += len(done.work)
            elif done.value["status"] == "ok":
                run.folder.append_part("embeddings", _rows(done.work, done.value["vectors"], cfg))
                advance(len(done.work))
                encoded += len(done.work)
            else:
                failed[done.value["error"]] += len(done.work)
                if done.value["status"] == "skipped":
                    stopped.append(done.value["error"])
            session.record()
    if encoded < len(keys):
        left = len(keys) - encoded  # failed, and (after a budget stop) never sent
        common, _ = failed.most_common(1)[0]
        kind = BudgetReached if stopped else APIStopped
        raise kind(f"encoder {cfg.name}: {left} of {len(keys)} texts not encoded (most common: {common}); the vectors "
                   "finished so far are kept, and the next run encodes just the rest")


def _select(table: pa.Table, texts: dict[str, str], encoders) -> pa.Table:
    """The vectors the current texts and encoders need, one row each, sorted."""
    wanted = {(k, encoder_key(cfg)): cfg.name for cfg in encoders for k in texts}
    rows = {}
    for row in table.to_pylist():
        name = wanted.get((row["text_sha256"], row["encoder_key"]))
        if name is not None:
            rows[(name, row["text_sha256"])] = {**row, "encoder": name}
    return pa.Table.from_pylist([rows[k] for k in sorted(rows)], schema=EMBEDDINGS_SCHEMA)


def stage(study: StudyBase) -> Stage:
    """The `embeddings` table: every distinct text of the references and the ok responses, per encoder."""

    def compute(run: StudyRun) -> dict[str, pa.Table]:
        return {"embeddings": run_embed(study, texts_to_embed(run.table("references"), run.table("responses")), run)}

    return Stage("embeddings", ("references", "responses"), [e.fingerprint() for e in study.encoders], compute)


def estimate(study: StudyBase, human_texts: list[str], n_answers: int, answer_tokens: int, cache) -> list[Line]:
    """Each API encoder's requests: every human description the cache lacks, plus the models'
    answers (`n_answers`, `answer_tokens` at most)."""
    from vlm_decade.models.api.providers import cost, embed_key, text_tokens

    human = sorted({t.strip() for t in human_texts if t and t.strip()})
    lines = []
    for enc in study.encoders:
        cls = encoder_class(enc.backend)
        if not cls.remote:
            continue
        price = getattr(study.providers, cls.provider).price(cls.provider, enc.model_id)
        line = Line(cls.provider, enc.name, batchable=False)
        todo = [t for t in human if not cache.has("embed", embed_key(cls.provider, enc.model_id, t))]
        human_tokens = sum(map(text_tokens, todo))
        line.requests = -(-(len(todo) + n_answers) // enc.batch_size)
        line.cached = len(human) - len(todo)
        line.input_tokens = human_tokens + answer_tokens
        line.usd = cost(price, line.input_tokens, 0) if price else 0.0
        line.usd_low = cost(price, human_tokens, 0) if price else 0.0  # no answer to encode
        lines.append(line)
    return lines
