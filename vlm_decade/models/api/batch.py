"""Batch mode (`providers.<name>.mode: batch`): the same requests at about half price, sent in
groups through the providers' batch interfaces and collected when they are done.

- OpenAI: a JSONL file of requests uploaded through the Files API and run by the Batch API within
  its 24 h window; at most 50,000 requests and 200 MB per file, one model and one endpoint
  (chat completions or embeddings) per file, and at most 50,000 embedding inputs per batch
  (platform.openai.com/docs/guides/batch).
- Gemini: batch mode of the Gemini API through google-genai (ai.google.dev/gemini-api/docs/batch-mode),
  one model per batch: inline requests up to 20 MB a batch, and larger batches as a JSONL file
  uploaded through the Files API (up to 2 GB; held here to 200 MB, as OpenAI's, since a batch's
  requests and answers are held in memory), whose answers come back as a file too; texts to
  embed go in inline embedding batches (`batches.create_embeddings`), whose answers come back in
  the order of the requests (they carry no key of their own).

A batch holds chat requests or texts to embed, never both. Embedding batches hold at most
`EMBED_LINES` texts (our bound, under both providers' limits): their answers are downloaded whole,
and 10,000 vectors of 3,072 floats are 120 MB.

Both bill batch requests at 50% of the standard price (`BATCH_DISCOUNT`, as both providers state
it, checked on the date of `PRICES_AS_OF`).

Every request keeps its cache key (the same as in sync mode) as its `custom_id` (Gemini: the
request's metadata `key`, its `key` in a file, or its place in an embedding batch), so an answer
bought in batch is a cache hit for a later sync run and the reverse. The `Batcher` groups the
requests a gateway is given per kind and model, writes each group to disk
(`<cache_dir>/batches/<provider>/<label>.jsonl`) and records it (`<label>.json`, and a copy in the
run folder's `api/batches/<provider>/`) before it is submitted, with a fresh label that goes with
the batch to the provider; then it records the batch's id. A gateway started later, by a rerun
or on another machine that shares the cache folder, finds the batches that are still pending and
collects them instead of submitting their requests again (a batch whose submission was cut off
before its id was recorded is found by its label among the provider's batches). Finished batches
are downloaded, each line matched to its request by its custom id, priced at the batch price,
written to the cache and the spend log at once, and handed back as rows; a line that failed
becomes an error row that a later run retries; the lines an expired batch (or one cancelled
elsewhere) did not reach are submitted again (read back from disk), and nothing else. `cancel`
(`vlm-decade cancel`) stops batches on purpose: it keeps what they answered and submits nothing
again.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import uuid
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.runfolder import atomic_write_bytes
from vlm_decade.models.api.cache import vector_entry
from vlm_decade.models.api.providers import EMBED_DIM, ChatRequest, GeminiProvider, Reply, chat_key, cost, embed_key, text_tokens

BATCH_DISCOUNT = 0.5  # both providers bill batch requests at half the standard price
LINGER_S = 2.0  # a group is submitted once no request has joined it for this long (or when full)
MAX_POLL_S = 600.0


@dataclass(frozen=True)
class Limits:
    requests: int
    bytes: int


LIMITS = {"openai": Limits(50_000, 200 * 2**20), "gemini": Limits(50_000, 200 * 2**20)}
GEMINI_INLINE_BYTES = 20 * 2**20  # larger Gemini chat batches go as an uploaded file
EMBED_LINES = 10_000
FINISHED = {"completed", "expired", "cancelled", "failed"}
OPEN = ("creating", "submitted")  # a recorded batch not collected yet (its id may not be recorded)


@dataclass
class Line:
    """One request of a batch, as written to disk: its key, model, worst-case cost (at the batch
    price), tokens for the limits and the bill, the provider's payload, and its kind (chat or
    embed)."""

    key: str
    model_id: str
    worst: float
    tokens: int
    payload: dict
    kind: str = "chat"

    def dump(self) -> bytes:
        return (json.dumps({"key": self.key, "model_id": self.model_id, "worst": self.worst, "tokens": self.tokens,
                            "payload": self.payload, "kind": self.kind}, separators=(",", ":")) + "\n").encode()

    @staticmethod
    def load(raw: bytes) -> "Line":
        d = json.loads(raw)
        return Line(d["key"], d["model_id"], d["worst"], d["tokens"], d["payload"], d.get("kind", "chat"))


@dataclass(frozen=True)
class Embedding:
    """One text's vector from an embedding batch; `tokens` None when the provider reports none."""

    vector: np.ndarray
    tokens: int | None
    model_version: str


# the providers' batch interfaces ---------------------------------------------------------------
class OpenAIBatches:
    def __init__(self, provider):
        self.provider, self.client = provider, provider.client

    ENDPOINT = {"chat": "/v1/chat/completions", "embed": "/v1/embeddings"}

    def payload(self, key: str, req: ChatRequest) -> dict:
        return {"custom_id": key, "method": "POST", "url": self.ENDPOINT["chat"], "body": self.provider.chat_body(req)}

    def embed_payload(self, key: str, model_id: str, text: str) -> dict:
        body = {"model": model_id, "input": [text], "dimensions": EMBED_DIM, "encoding_format": "base64"}
        return {"custom_id": key, "method": "POST", "url": self.ENDPOINT["embed"], "body": body}

    async def submit(self, kind: str, model_id: str, lines: list[Line], label: str) -> str:
        data = b"".join((json.dumps(line.payload, separators=(",", ":")) + "\n").encode() for line in lines)
        upload = await self.client.files.create(file=(f"{label}.jsonl", data), purpose="batch")
        batch = await self.client.batches.create(input_file_id=upload.id, endpoint=self.ENDPOINT[kind],
                                                 completion_window="24h", metadata={"vlm_decade": label})
        return batch.id

    async def find(self, label: str) -> str | None:
        async for batch in self.client.batches.list(limit=100):
            if (batch.metadata or {}).get("vlm_decade") == label:
                return batch.id
        return None

    async def cancel(self, batch_id: str) -> None:
        await self.client.batches.cancel(batch_id)

    @staticmethod
    def failure(batch) -> str:
        """Why a failed batch failed (its input did not validate, say)."""
        errors = (batch.errors.data if batch.errors else None) or []
        return "; ".join(f"{e.code}: {e.message}" for e in errors[:3]) or "no reason given"

    async def state(self, batch_id: str):
        batch = await self.client.batches.retrieve(batch_id)
        status = batch.status
        return ("pending" if status not in FINISHED else status), batch

    async def results(self, batch, record: dict) -> dict[str, Reply | Embedding | str]:
        out: dict[str, Reply | Embedding | str] = {}
        embed = record.get("kind") == "embed"
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            content = await self.client.files.content(file_id)
            for raw in content.content.splitlines():
                if not raw.strip():
                    continue
                line = json.loads(raw)
                response = line.get("response") or {}
                if (line.get("error") or {}).get("code") in ("batch_expired", "batch_cancelled"):
                    continue  # not reached: submitted again, as a request the batch did not answer
                if response.get("status_code") == 200:
                    body = response["body"]
                    out[line["custom_id"]] = self._embedding(body) if embed else self.provider.reply_from(body)
                else:
                    error = line.get("error") or (response.get("body") or {}).get("error") or {}
                    out[line["custom_id"]] = f"batch line {response.get('status_code', error.get('code', ''))}: {error.get('message', 'failed')}"
        return out

    @staticmethod
    def _embedding(body: dict) -> Embedding:
        """An embeddings response with one input, as the sync client would decode it."""
        value = body["data"][0]["embedding"]
        vector = np.frombuffer(base64.b64decode(value), dtype="<f4") if isinstance(value, str) else np.asarray(value, np.float32)
        return Embedding(vector.astype(np.float32), (body.get("usage") or {}).get("prompt_tokens"), body.get("model", ""))


class GeminiBatches:
    def __init__(self, provider):
        self.provider, self.client, self.types = provider, provider.client, provider.types

    def payload(self, key: str, req: ChatRequest) -> dict:
        contents, config = self.provider.request_parts(req)
        inlined = self.types.InlinedRequest(contents=contents, config=config, metadata={"key": key})
        return inlined.model_dump(mode="json", exclude_none=True)

    def embed_payload(self, key: str, model_id: str, text: str) -> dict:
        return {"text": text}

    async def submit(self, kind: str, model_id: str, lines: list[Line], label: str) -> str:
        if kind == "embed":
            src = {"inlined_requests": {"contents": [line.payload["text"] for line in lines],
                                        "config": {"output_dimensionality": EMBED_DIM}}}
            with warnings.catch_warnings():  # google-genai marks batch embeddings experimental
                warnings.simplefilter("ignore")
                batch = await self.client.aio.batches.create_embeddings(model=model_id, src=src, config={"display_name": label})
            return batch.name
        if sum(len(json.dumps(line.payload)) for line in lines) <= GEMINI_INLINE_BYTES:
            src = [self.types.InlinedRequest.model_validate(line.payload) for line in lines]
        else:  # too large to inline: a JSONL file of {"key", "request"} lines, uploaded through the Files API
            upload = await self.client.aio.files.upload(file=io.BytesIO(self.file_lines(lines)),
                                                        config={"mime_type": "jsonl", "display_name": label})
            src = upload.name
        batch = await self.client.aio.batches.create(model=model_id, src=src, config={"display_name": label})
        return batch.name

    @staticmethod
    def file_lines(lines: list[Line]) -> bytes:
        """A batch's input file: each request as the REST API takes it (proto JSON, which accepts the
        snake_case field names and base64 bytes of the inline payload), under its key."""
        rows = ({"key": line.key, "request": {"contents": line.payload["contents"], "generation_config": line.payload["config"]}}
                for line in lines)
        return b"".join((json.dumps(row, separators=(",", ":")) + "\n").encode() for row in rows)

    async def find(self, label: str) -> str | None:
        pager = await self.client.aio.batches.list(config={"page_size": 100})
        async for batch in pager:
            if batch.display_name == label:
                return batch.name
        return None

    async def cancel(self, batch_id: str) -> None:
        await self.client.aio.batches.cancel(name=batch_id)

    @staticmethod
    def failure(batch) -> str:
        return "no reason given"  # google-genai does not pass on the Gemini API's reason for a failed batch

    async def state(self, batch_id: str):
        batch = await self.client.aio.batches.get(name=batch_id)
        name = getattr(batch.state, "value", str(batch.state))
        status = {"JOB_STATE_SUCCEEDED": "completed", "JOB_STATE_EXPIRED": "expired", "JOB_STATE_CANCELLED": "cancelled",
                  "JOB_STATE_FAILED": "failed"}.get(name, "pending")
        return status, batch

    async def results(self, batch, record: dict) -> dict[str, Reply | Embedding | str]:
        if record.get("kind") == "embed":
            return self._embeddings(batch, record["keys"])
        if batch.dest and batch.dest.file_name:
            return self._file_results(await self.client.aio.files.download(file=batch.dest.file_name), batch.model or "")
        out: dict[str, Reply | Embedding | str] = {}
        for item in (batch.dest.inlined_responses if batch.dest and batch.dest.inlined_responses else []):
            key = (item.metadata or {}).get("key")
            if key is None:
                continue
            if item.error is not None or item.response is None:
                error = item.error
                out[key] = f"batch line {getattr(error, 'code', '')}: {getattr(error, 'message', 'failed')}"
            else:
                out[key] = self.provider.reply_from(item.response, batch.model or "")
        return out

    def _file_results(self, data: bytes, model: str) -> dict[str, Reply | str]:
        """A file batch's results: a JSONL of {"key", "response"} (a GenerateContentResponse in
        REST JSON) or {"key", "error"} lines."""
        out: dict[str, Reply | str] = {}
        for raw in data.splitlines():
            if not raw.strip():
                continue
            row = json.loads(raw)
            if row.get("response") is not None:
                out[row["key"]] = self.provider.reply_from(self.types.GenerateContentResponse.model_validate(row["response"]), model)
            else:
                error = row.get("error") or row.get("status") or {}
                out[row["key"]] = f"batch line {error.get('code', '')}: {error.get('message', 'failed')}"
        return out

    @staticmethod
    def _embeddings(batch, keys: list[str]) -> dict[str, Embedding | str]:
        """An embedding batch's answers, in the order of its requests, made unit-length as in sync mode."""
        out: dict[str, Embedding | str] = {}
        items = batch.dest.inlined_embed_content_responses if batch.dest and batch.dest.inlined_embed_content_responses else []
        for key, item in zip(keys, items):
            item = item if isinstance(item, dict) else item.model_dump(by_alias=False)
            response, error = item.get("response"), item.get("error")
            if error or not response:
                error = error or {}
                out[key] = f"batch line {error.get('code', '')}: {error.get('message', 'failed')}"
                continue
            vector = GeminiProvider.unit_rows([response["embedding"]["values"]])[0]
            out[key] = Embedding(vector, response.get("token_count") or response.get("tokenCount"), (batch.model or "").removeprefix("models/"))
        return out


def batches_for(provider):
    return {"openai": OpenAIBatches, "gemini": GeminiBatches}[provider.name](provider)


# where batches are recorded --------------------------------------------------------------------
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
            raise InputError([Problem(str(path), f"damaged batch record ({exc}); copy it back from the cache folder's "
                                      f"batches/{path.parent.name}/{path.name}, or remove it")]) from None
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


# the batcher -----------------------------------------------------------------------------------
class Batcher:
    """Batch mode for one gateway: `submit` a request (an answer at once when the cache has it,
    else it joins a group), `result` waits for its answer; `flush` submits what is grouped.

    With `wait` false, a request whose batch is not finished yet gets a `pending` answer instead of
    a wait: the run can end and a later run collects the batch.
    """

    def __init__(self, gateway, cache_root: str | Path, run_root: str | Path | None, wait: bool = True):
        self.gw = gateway
        self.api = batches_for(gateway.provider)
        self.records = BatchRecords(cache_root, gateway.name, run_root)
        self.wait = wait
        self.resubmit = True  # what a finished batch did not reach is submitted again (not after `cancel`)
        cfg = gateway.cfg
        limits = LIMITS[gateway.name]
        self.max_requests = min(cfg.batch_max_requests or limits.requests, limits.requests)
        self.max_bytes = limits.bytes
        self.poll_s = cfg.batch_poll_s
        self.groups: dict[tuple[str, str], list[Line]] = defaultdict(list)  # (kind, model) -> lines not submitted yet
        self.group_bytes: Counter = Counter()
        self.futures: dict[str, asyncio.Future] = {}
        self.tries: Counter = Counter()  # submissions per key by this gateway
        self.batch_of: dict[str, str] = {}  # key -> label of the batch it is in
        self.open: dict[str, dict] = {}  # label -> record, for batches not collected yet
        self.pollers: dict[str, asyncio.Task] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.stats: Counter = Counter()
        for record in self.records.open_records():  # batches earlier runs left pending
            self.open[record["label"]] = record
            for key in record["keys"]:
                self.batch_of[key] = record["label"]

    # requests ---------------------------------------------------------------------------------
    async def submit(self, req: ChatRequest, hold: bool = False) -> dict:
        """The answer when it is known at once (cache, budget, price), else {"status": "queued"}.
        `hold`: more requests are coming and the caller will `flush`, so no group is submitted
        after a pause, only when it is full."""
        key = chat_key(self.gw.name, req)
        hit = self.gw.cache.get("chat", key)
        if hit is not None:
            return self.gw.cached_answer(hit)

        def line(price) -> Line:
            est_in = self.gw.provider.estimate_input(req)
            cap = req.settings["max_output_tokens"]
            return Line(key, req.model_id, BATCH_DISCOUNT * cost(price, est_in, cap), est_in + cap, self.api.payload(key, req))

        return await self._queue(key, req.model_id, line, hold)

    async def submit_embed(self, model_id: str, text: str, hold: bool = False) -> dict:
        """One text to embed: {"status": "ok", "entry"} (its cache entry) when the cache has it, a
        failed answer when it cannot be sent, else {"status": "queued"}; `hold` as for `submit`."""
        key = embed_key(self.gw.name, model_id, text)
        hit = self.gw.cache.get("embed", key)
        if hit is not None:
            return {"status": "ok", "error": "", "entry": hit, "paid_usd": 0.0}

        def line(price) -> Line:
            tokens = text_tokens(text)
            return Line(key, model_id, BATCH_DISCOUNT * cost(price, tokens, 0), tokens, self.api.embed_payload(key, model_id, text), "embed")

        return await self._queue(key, model_id, line, hold)

    async def embed(self, model_id: str, text: str) -> dict:
        """The answer for one text: from the cache, or from its batch once finished (submitted now
        unless this gateway has it already). The answer is let go once given: a vector is large."""
        key = embed_key(self.gw.name, model_id, text)
        if key not in self.futures:
            first = await self.submit_embed(model_id, text)
            if first["status"] != "queued":
                self.futures.pop(key, None)
                return first
        answer = await self.result(key)
        self.futures.pop(key, None)
        return answer

    async def _queue(self, key: str, model_id: str, make_line, hold: bool) -> dict:
        """Add a request to its group, unless it is waiting already (in this gateway's groups, or in
        a batch an earlier run submitted: collected from there, never submitted again)."""
        if key in self.futures and not self.futures[key].done():
            return {"status": "queued", "key": key}
        self.futures[key] = asyncio.get_running_loop().create_future()
        if key in self.batch_of:
            self._poll(self.batch_of[key])
            return {"status": "queued", "key": key}
        try:
            line = make_line(self.gw._price(model_id))
        except LookupError as exc:
            return self._settle(key, self.gw.failed_answer("error", str(exc)))
        try:
            await self.gw._reserve(line.worst)
        except Exception as exc:  # noqa: BLE001 - a budget stop: the row is skipped
            return self._settle(key, self.gw.failed_answer(*self.gw._failed(exc)))
        self._group(line, hold)
        return {"status": "queued", "key": key}

    async def result(self, key: str) -> dict:
        future = self.futures.get(key)
        if future is None:
            return self.gw.failed_answer("error", "no such request in this gateway")
        return await asyncio.shield(future)

    async def chat(self, req: ChatRequest) -> dict:
        first = await self.submit(req)
        return first if first["status"] != "queued" else await self.result(first["key"])

    def _settle(self, key: str, answer: dict) -> dict:
        future = self.futures.get(key)
        if future is not None and not future.done():
            future.set_result(answer)
        return answer

    # grouping and submitting ------------------------------------------------------------------
    def _max_lines(self, kind: str) -> int:
        return min(self.max_requests, EMBED_LINES) if kind == "embed" else self.max_requests

    def _max_bytes(self, kind: str) -> int:
        # Gemini's embedding batches are sent inline only
        return min(self.max_bytes, GEMINI_INLINE_BYTES) if kind == "embed" and self.gw.name == "gemini" else self.max_bytes

    def _group(self, line: Line, hold: bool) -> None:
        size = len(json.dumps(line.payload))
        name = (line.kind, line.model_id)
        group = self.groups[name]
        if group and (len(group) >= self._max_lines(line.kind) or self.group_bytes[name] + size > self._max_bytes(line.kind)):
            full, self.groups[name], self.group_bytes[name] = group, [], 0
            asyncio.get_running_loop().create_task(self._submit(name, full))
            group = self.groups[name]
        group.append(line)
        self.group_bytes[name] += size
        if not hold:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = asyncio.get_running_loop().call_later(LINGER_S, lambda: asyncio.ensure_future(self.flush()))

    async def flush(self) -> None:
        """Submit every group that has requests."""
        await asyncio.gather(*[self._submit(name) for name in list(self.groups) if self.groups[name]])

    async def _submit(self, name: tuple[str, str], lines: list[Line] | None = None) -> None:
        """Submit one group of requests of one kind and model as a batch."""
        if lines is None:
            lines, self.groups[name], self.group_bytes[name] = self.groups[name], [], 0
        if not lines:
            return
        kind, model_id = name
        label = f"vlm_decade-{uuid.uuid4().hex}"
        record = {"label": label, "provider": self.gw.name, "kind": kind, "model_id": model_id, "id": None, "state": "creating",
                  "created": time.time(), "keys": [line.key for line in lines]}
        self.records.write_lines(label, lines)
        self.records.save(record)  # before the provider hears of it: a cut-off submission is found by its label
        try:
            record["id"] = await self.api.submit(kind, model_id, lines, label)
        except Exception as exc:  # noqa: BLE001 - the requests are error rows, retried by a later run
            record["state"] = "refused"
            self.records.save(record)
            self.records.drop_lines(label)
            error = self.gw._error(exc)
            for line in lines:
                self.gw._release(line.worst, 0.0)
                self._settle(line.key, self.gw.failed_answer("error", f"batch not accepted: {error}"))
            return
        record["state"] = "submitted"
        self.records.save(record)
        self.stats["batches"] += 1
        self.stats["lines"] += len(lines)
        for line in lines:
            self.tries[line.key] += 1
            self.batch_of[line.key] = label
            if self.gw.log:
                self.gw.log.write(a=f"{record['id']}:{line.key}", e="sent", worst=line.worst, t=round(time.time(), 3), tok=line.tokens, m="batch")
        self.open[label] = record
        self._poll(label, reserved=True)

    async def cancel(self, labels: list[str]) -> dict:
        """Cancel these pending batches (by label) and collect what they answered before the
        provider stopped them: those answers go to the cache and the spend log; the requests they
        did not reach are dropped from the records, submitted again by no one, so the next run sends
        them in the mode its study then says. {"batches", "answered", "dropped", "unknown" (labels
        this gateway's cache folder holds no pending record of)}."""
        self.resubmit = False
        unknown = [label for label in labels if label not in self.open]  # not in this cache folder, or collected already
        labels = [label for label in labels if label in self.open]
        before = Counter(self.stats)
        for label in labels:
            record = self.open[label]
            if record["id"] is None:
                record["id"] = await self.api.find(label)
            if record["id"] is None:
                continue
            try:
                await self.api.cancel(record["id"])
            except Exception:  # noqa: BLE001 - finished already, or refused: collected as it stands
                self.stats["cancel_refused"] += 1
        for label in labels:
            self._poll(label)
        await asyncio.gather(*[self.pollers[label] for label in labels])
        return {"batches": len(labels), "answered": self.stats["answered"] - before["answered"],
                "dropped": self.stats["dropped"] - before["dropped"], "unknown": len(unknown)}

    # collecting -------------------------------------------------------------------------------
    def _poll(self, label: str, reserved: bool = False) -> None:
        if label not in self.pollers or self.pollers[label].done():
            self.pollers[label] = asyncio.get_running_loop().create_task(self._collect(label, reserved))

    async def _collect(self, label: str, reserved: bool) -> None:
        """Poll one batch with backoff until it is finished, then hand out its answers."""
        record = self.open[label]
        delay = self.poll_s
        try:
            if record["id"] is None:  # cut off between submitting and recording: look for it
                record["id"] = await self.api.find(label)
                if record["id"] is None:
                    return await self._lost(label)
                record["state"] = "submitted"
                self.records.save(record)
            while True:
                status, batch = await self.api.state(record["id"])
                if status in FINISHED:
                    break
                if not self.wait or not self.gw.driver.alive():
                    return self._pending(label, reserved)
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, MAX_POLL_S)
            results = await self.api.results(batch, record)
            why = f"failed ({self.api.failure(batch)})" if status == "failed" else status
        except Exception as exc:  # noqa: BLE001 - this batch's requests wait for a later run
            self.stats["poll_errors"] += 1
            return self._pending(label, reserved, f"could not reach the batch: {self.gw._error(exc)}")
        await self._finish(label, status, results, reserved, why)

    def _pending(self, label: str, reserved: bool, why: str = "") -> None:
        """The batch is not finished and this run will not wait: its requests answer `pending`. What
        they may cost stays in the spend log as unresolved (the next gateway counts it); here it
        leaves the reservations for the budget's total, so no request waits on it."""
        record = self.open[label]
        if reserved:
            lines = self.records.lines(label)
            for key in record["keys"]:
                worst = lines[key].worst if key in lines else 0.0
                self.gw._release(worst, 0.0)
                self.gw.spent_before += worst
                self.gw.open_before[f"{record['id']}:{key}"] = worst
        note = why or f"in {self.gw.name} batch {record['id']} (submitted {time.strftime('%Y-%m-%d %H:%M', time.gmtime(record['created']))} UTC)"
        for key in record["keys"]:
            self._settle(key, self.gw.failed_answer("pending", f"{note}; a later run collects it"))

    async def _lost(self, label: str) -> None:
        """A submission cut off before the provider had it: its requests are submitted again."""
        record = self.open.pop(label)
        record["state"] = "lost"
        self.records.save(record)
        lines = self.records.lines(label)
        self.records.drop_lines(label)
        if self.resubmit:
            await self._again(list(lines.values()), reserve=True)
            return
        self.stats["dropped"] += len(lines)
        for key in lines:
            self._settle(key, self.gw.failed_answer("error", f"{self.gw.name} never received its batch; a later run sends it again"))

    async def _finish(self, label: str, status: str, results: dict, reserved: bool, why: str) -> None:
        """Hand out a finished batch's answers. The requests it did not reach are submitted again
        (expired, or cancelled elsewhere), except after `cancel` and when the batch failed as a
        whole (its input would fail again): then they are error rows that a later run sends again."""
        record = self.open.pop(label)
        lines = self.records.lines(label)
        missing = []
        for key in record["keys"]:
            attempt = f"{record['id']}:{key}"
            worst = lines[key].worst if key in lines else 0.0
            answer = results.get(key)
            paid = 0.0
            if isinstance(answer, Embedding):
                tokens = answer.tokens or (lines[key].tokens if key in lines else 0)  # Gemini reports none: estimated, as in sync mode
                paid = BATCH_DISCOUNT * cost(self.gw._price(record["model_id"]), tokens, 0)
                entry = vector_entry(answer.vector, answer.model_version, paid, "batch")
                if self.gw.log:
                    self.gw.log.write(a=attempt, e="paid", usd=paid, tok=tokens, m="batch")
                self.gw.cache.put("embed", key, entry)
                row = {"status": "ok", "error": "", "entry": entry, "paid_usd": paid}
            elif isinstance(answer, Reply):
                price = self.gw._price(record["model_id"])
                paid = BATCH_DISCOUNT * cost(price, answer.input_tokens, answer.output_tokens)
                entry = {"text": answer.text, "input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens,
                         "cost_usd": paid, "model_version": answer.model_version, "latency_s": None, "mode": "batch"}
                if self.gw.log:
                    self.gw.log.write(a=attempt, e="paid", usd=paid, tok=answer.input_tokens + answer.output_tokens, m="batch")
                self.gw.cache.put("chat", key, entry)
                row = {**entry, "status": "ok", "error": "", "queued_s": None, "paid_usd": paid, "cached": False}
            else:
                if self.gw.log:
                    self.gw.log.write(a=attempt, e="failed", m="batch")
                row = self.gw.failed_answer("error", answer) if isinstance(answer, str) else None
            self.gw._settle_spend(attempt, worst, paid, reserved)
            self.batch_of.pop(key, None)
            if row is not None:
                self._settle(key, row)
            elif key in lines:
                missing.append(lines[key])
            else:
                self._settle(key, self.gw.failed_answer("error", f"{self.gw.name} batch {record['id']} {status} before this request"))
        record.update(state=status, finished=time.time(), answered=sum(not isinstance(r, str) for r in results.values()))
        self.records.save(record)
        self.records.drop_lines(label)
        self.stats[f"batches_{status}"] += 1
        self.stats["answered"] += record["answered"]
        if self.resubmit and status != "failed":
            await self._again(missing, reserve=True)
            return
        self.stats["dropped"] += len(missing)
        for line in missing:
            self._settle(line.key, self.gw.failed_answer("error", f"{self.gw.name} batch {record['id']} {why}; a later run sends it again"))

    async def _again(self, lines: list[Line], reserve: bool) -> None:
        """Submit again the requests a batch did not reach (expired, cancelled, lost), up to the
        provider's `max_attempts` submissions each."""
        again = []
        for line in lines:
            if self.tries[line.key] >= self.gw.cfg.max_attempts:
                self._settle(line.key, self.gw.failed_answer("error", f"not answered in {self.tries[line.key]} batches; a later run tries again"))
                continue
            if line.key not in self.futures:
                self.futures[line.key] = asyncio.get_running_loop().create_future()
            try:
                if reserve:
                    await self.gw._reserve(line.worst)
            except Exception as exc:  # noqa: BLE001 - a budget stop: skipped
                self._settle(line.key, self.gw.failed_answer(*self.gw._failed(exc)))
                continue
            again.append(line)
        by_name = defaultdict(list)
        for line in again:
            by_name[(line.kind, line.model_id)].append(line)
        for name, group in by_name.items():
            size = self._max_lines(name[0])
            for i in range(0, len(group), size):
                await self._submit(name, group[i : i + size])
