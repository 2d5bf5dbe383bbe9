"""The fake server's batch interfaces: OpenAI's Files + Batches and Gemini's batch mode.

    POST /v1/files                                   upload a JSONL of requests (multipart, purpose batch)
    GET  /v1/files/{id}/content                      download a file (input, output or errors)
    POST /v1/batches                                 create: input_file_id, endpoint, completion_window, metadata
    GET  /v1/batches/{id}  | /v1/batches             retrieve | list
    POST /v1/batches/{id}/cancel                     cancel
    POST /v1beta/models/{model}:batchGenerateContent Gemini: create with inline requests or an uploaded file
    POST /upload/v1beta/files, then /upload-session/{id}   Gemini: a resumable upload (start; upload, finalize)
    GET  /v1beta/files/{id}:download                 Gemini: download a file (a file batch's results)
    POST /v1beta/models/{model}:asyncBatchEmbedContent Gemini: create an embedding batch (inline texts)
    GET  /v1beta/batches/{id}  | /v1beta/batches     get (inline responses when done) | list
    POST /v1beta/batches/{id}:cancel                 cancel

A batch is worked through `batch_delay_s` after it was created, the first time it is looked at
from then on: every line is answered as the synchronous endpoint would answer it (the same text and
usage; OpenAI batches of the `/v1/embeddings` endpoint and Gemini embedding batches answer vectors,
the latter in the order of the requests and without keys), or fails at `batch_line_fail_rate` (seeded by the line and how often it came before); the
first `batch_expire_first` batches expire instead, with only the first half of their lines done, and
the next `batch_fail_first` fail validation (status failed, no line run); a batch cancelled before
its time has the share of its lines its time so far reached done. Until then a batch is
`validating` for the first quarter of its time (Gemini: pending) and `in_progress` (running) after.
Every line is logged as a `Received` with endpoint `<provider>.batch_line` and `mode` batch, so the
server's `billed_usd` bills it (at the batch discount) and a test can count lines sent twice.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from vlm_decade.testing.fake_gemini import gemini_answer, gemini_embed_answer, gemini_usage
from vlm_decade.testing.fake_log import Received
from vlm_decade.testing.fake_openai import openai_chat_answer, openai_embed_answer, openai_usage

GEMINI_STATE = {
    "validating": "BATCH_STATE_PENDING",
    "in_progress": "BATCH_STATE_RUNNING",
    "completed": "BATCH_STATE_SUCCEEDED",
    "expired": "BATCH_STATE_EXPIRED",
    "cancelled": "BATCH_STATE_CANCELLED",
    "failed": "BATCH_STATE_FAILED",
}
FAILED_VALIDATION = "the input file failed validation"


@dataclass
class FakeBatch:
    id: str
    provider: str
    created: float
    lines: list[tuple[str, dict]]  # (custom id or key, request body)
    model: str = ""  # Gemini: the model of the create call
    endpoint: str = "/v1/chat/completions"  # OpenAI: the batch's endpoint; Gemini embedding batches: /v1/embeddings
    label: str = ""  # OpenAI metadata / Gemini displayName
    metadata: dict = field(default_factory=dict)
    input_file_id: str = ""  # OpenAI: the input file; Gemini: set when the requests came in a file
    status: str = "in_progress"  # in_progress, completed, expired, cancelled, failed
    expire: bool = False  # expires with half its lines done
    fail: bool = False  # fails validation
    results: list[tuple[str, dict | None, dict | None]] = field(default_factory=list)  # (id, answer body, error)
    output_file_id: str | None = None
    error_file_id: str | None = None


class BatchStore:
    """The server's files and batches; `fake` answers the lines and logs them."""

    def __init__(self, fake):
        self.fake = fake
        self.lock = threading.Lock()
        self.files: dict[str, bytes] = {}
        self.uploads: dict[str, bytearray] = {}  # Gemini resumable upload sessions
        self.batches: dict[str, FakeBatch] = {}
        self.ids = itertools.count(1)
        self.created = 0

    def _id(self, prefix: str) -> str:
        return f"{prefix}{next(self.ids):06d}"

    # OpenAI -------------------------------------------------------------------------------------
    def upload(self, data: bytes, filename: str) -> dict:
        with self.lock:
            file_id = self._id("file-")
            self.files[file_id] = data
        return {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": "batch",
            "status": "processed",
        }

    def create_openai(self, body: dict) -> dict:
        data = self.files[body["input_file_id"]]
        lines = []
        for raw in data.splitlines():
            if raw.strip():
                line = json.loads(raw)
                lines.append((line["custom_id"], line["body"]))
        batch = self._new(
            "openai",
            lines,
            label=(body.get("metadata") or {}).get("vlm_decade", ""),
            metadata=body.get("metadata") or {},
        )
        batch.input_file_id, batch.endpoint = body["input_file_id"], body["endpoint"]
        return self.openai_view(batch)

    def openai_view(self, batch: FakeBatch) -> dict:
        self._work(batch)
        done = [r for r in batch.results if r[1] is not None]
        errors = (
            {"object": "list", "data": [{"code": "invalid_request", "message": FAILED_VALIDATION, "line": None}]}
            if batch.status == "failed"
            else None
        )
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "errors": errors,
            "input_file_id": batch.input_file_id,
            "completion_window": "24h",
            "status": self._status(batch),
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": int(batch.created),
            "metadata": batch.metadata,
            "request_counts": {
                "total": len(batch.lines),
                "completed": len(done),
                "failed": len(batch.results) - len(done),
            },
        }

    # Gemini -------------------------------------------------------------------------------------
    def upload_start(self) -> str:
        with self.lock:
            session = self._id("upload-")
            self.uploads[session] = bytearray()
        return session

    def upload_chunk(self, session: str, data: bytes, final: bool) -> dict | None:
        """Add a chunk to an upload; the file's resource once the upload is finalized."""
        with self.lock:
            self.uploads[session] += data
            if not final:
                return None
            name = f"files/{self._id('f')}"
            self.files[name] = bytes(self.uploads.pop(session))
        return {
            "file": {
                "name": name,
                "mimeType": "application/jsonl",
                "sizeBytes": str(len(self.files[name])),
                "state": "ACTIVE",
            }
        }

    def create_gemini(self, model: str, body: dict) -> dict:
        spec = body["batch"]
        source = spec["inputConfig"]
        if "fileName" in source:  # a JSONL of {"key", "request"} lines
            rows = [json.loads(raw) for raw in self.files[source["fileName"]].splitlines() if raw.strip()]
            lines = [(row["key"], row["request"]) for row in rows]
        else:
            requests = source["requests"]["requests"]
            lines = [((r.get("metadata") or {}).get("key", str(i)), r["request"]) for i, r in enumerate(requests)]
        batch = self._new("gemini", lines, model=model, label=spec.get("displayName", ""))
        batch.input_file_id = source.get("fileName", "")
        return self.gemini_view(batch)

    def create_gemini_embed(self, model: str, body: dict) -> dict:
        spec = body["batch"]
        requests = spec["inputConfig"]["requests"]["requests"]
        lines = [
            (str(i), {**r["request"], **{k: v for k, v in r.items() if k != "request"}}) for i, r in enumerate(requests)
        ]
        batch = self._new("gemini", lines, model=model, label=spec.get("displayName", ""))
        batch.endpoint = "/v1/embeddings"
        return self.gemini_view(batch)

    def gemini_view(self, batch: FakeBatch) -> dict:
        self._work(batch)
        status = self._status(batch)
        meta = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
            "name": batch.id,
            "displayName": batch.label,
            "model": f"models/{batch.model}",
            "state": GEMINI_STATE[status],
            "createTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(batch.created)),
        }
        if batch.output_file_id:
            meta["output"] = {"responsesFile": batch.output_file_id}
        elif batch.results:
            inlined = []
            embeddings = batch.endpoint == "/v1/embeddings"
            for key, answer, error in batch.results:
                item = (
                    {} if embeddings else {"metadata": {"key": key}}
                )  # embedding answers come in request order, keyless
                item.update({"response": answer} if answer is not None else {"error": error})
                inlined.append(item)
            meta["output"] = {"inlinedResponses": {"inlinedResponses": inlined}}
        out = {"name": batch.id, "metadata": meta, "done": batch.status != "in_progress"}
        if batch.status == "failed":
            out["error"] = {"code": 3, "message": FAILED_VALIDATION}
        return out

    # both ---------------------------------------------------------------------------------------
    def _status(self, batch: FakeBatch) -> str:
        if batch.status != "in_progress":
            return batch.status
        early = time.time() < batch.created + self.fake.faults.batch_delay_s / 4
        return "validating" if early else "in_progress"

    def get(self, batch_id: str) -> FakeBatch | None:
        return self.batches.get(batch_id)

    def cancel(self, batch_id: str) -> FakeBatch:
        """Stop a batch: the share of its lines that its time so far reached are answered (a batch
        cancelled halfway through `batch_delay_s` has its first half done), the rest never."""
        batch = self.batches[batch_id]
        self._work(batch)
        with self.lock:
            if batch.status == "in_progress":
                elapsed = (time.time() - batch.created) / max(self.fake.faults.batch_delay_s, 1e-9)
                reached = batch.lines[: math.floor(len(batch.lines) * min(1.0, elapsed))]
                batch.results = [self._answer(batch, key, body) for key, body in reached]
                batch.status = "cancelled"
                self._result_files(batch)
        return batch

    def _new(
        self, provider: str, lines: list, model: str = "", label: str = "", metadata: dict | None = None
    ) -> FakeBatch:
        with self.lock:
            batch_id = self._id("batch_") if provider == "openai" else f"batches/{self._id('b')}"
            batch = FakeBatch(batch_id, provider, time.time(), lines, model=model, label=label, metadata=metadata or {})
            faults = self.fake.faults
            batch.expire = self.created < faults.batch_expire_first
            batch.fail = faults.batch_expire_first <= self.created < faults.batch_expire_first + faults.batch_fail_first
            self.created += 1
            self.batches[batch_id] = batch
        return batch

    def _work(self, batch: FakeBatch) -> None:
        """Answer the batch's lines once its time has come (or half of them, for one that expires)."""
        with self.lock:
            if batch.status != "in_progress" or time.time() < batch.created + self.fake.faults.batch_delay_s:
                return
            if batch.fail:
                batch.status = "failed"
                return
            expire = batch.expire
            todo = batch.lines[: math.ceil(len(batch.lines) / 2)] if expire else batch.lines
            batch.results = [self._answer(batch, key, body) for key, body in todo]
            batch.status = "expired" if expire else "completed"
            self._result_files(batch)

    def _answer(self, batch: FakeBatch, key: str, body: dict) -> tuple[str, dict | None, dict | None]:
        fake = self.fake
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        seen = fake.attempt(("batch", digest))
        failed = (
            np.random.default_rng([fake.faults.seed, int(digest[:15], 16), seen + 1]).random()
            < fake.faults.batch_line_fail_rate
        )
        endpoint = f"{batch.provider}.batch_line"
        record = Received(
            time.time(),
            endpoint,
            digest,
            "500" if failed else "ok",
            mode="batch",
            key=key,
            batch=batch.id,
            answered=time.time(),
            delivered=not failed,
            body=json.dumps(body).encode(),
        )
        if failed:
            error = {"code": 500, "message": "internal error", "status": "INTERNAL", "type": "server_error"}
            answer = None
        elif batch.provider == "openai" and batch.endpoint == "/v1/embeddings":
            answer, error = openai_embed_answer(body), None
            record.model, record.input_tokens, record.output_tokens = openai_usage("openai.embeddings", answer, body)
        elif batch.provider == "openai":
            answer, error = openai_chat_answer(fake.answer, body), None
            record.model, record.input_tokens, record.output_tokens = openai_usage("openai.chat", answer, body)
        elif batch.endpoint == "/v1/embeddings":
            answer, error = gemini_embed_answer(body, "embedContent"), None
            record.model, record.input_tokens, record.output_tokens = gemini_usage(
                "gemini.embed", answer, body, batch.model
            )
        else:
            answer, error = gemini_answer(fake.answer, body, batch.model), None
            record.model, record.input_tokens, record.output_tokens = gemini_usage(
                "gemini.generate", answer, body, batch.model
            )
        with fake.lock:
            fake.log.append(record)
        return key, answer, error

    def _result_files(self, batch: FakeBatch) -> None:
        if batch.provider == "openai":
            self._openai_files(batch)
        elif batch.input_file_id:
            self._gemini_file(batch)

    def _gemini_file(self, batch: FakeBatch) -> None:
        """A file batch's results: a JSONL of {"key", "response"} or {"key", "error"} lines."""
        lines = [
            {"key": key, **({"response": answer} if answer is not None else {"error": error})}
            for key, answer, error in batch.results
        ]
        batch.output_file_id = f"files/{self._id('out')}"
        self.files[batch.output_file_id] = "".join(json.dumps(x) + "\n" for x in lines).encode()

    def _openai_files(self, batch: FakeBatch) -> None:
        out, err = [], []
        for i, (key, answer, error) in enumerate(batch.results):
            line = {"id": f"batch_req_{batch.id}_{i}", "custom_id": key, "error": None}
            if answer is not None:
                out.append({**line, "response": {"status_code": 200, "request_id": f"req_{i}", "body": answer}})
            else:
                err.append(
                    {**line, "response": {"status_code": 500, "request_id": f"req_{i}", "body": {"error": error}}}
                )
        done = {k for k, _, _ in batch.results}
        for key, _ in batch.lines:  # what an expired or cancelled batch did not reach
            if key not in done:
                err.append(
                    {
                        "id": f"batch_req_{batch.id}_x",
                        "custom_id": key,
                        "response": None,
                        "error": {
                            "code": "batch_cancelled",
                            "message": "This request was not executed: the batch was cancelled.",
                        }
                        if batch.status == "cancelled"
                        else {
                            "code": "batch_expired",
                            "message": "This request could not be executed before the completion window expired.",
                        },
                    }
                )
        for lines, attr in ((out, "output_file_id"), (err, "error_file_id")):
            if lines:
                file_id = self._id("file-")
                self.files[file_id] = "".join(json.dumps(x) + "\n" for x in lines).encode()
                setattr(batch, attr, file_id)
