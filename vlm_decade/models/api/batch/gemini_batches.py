"""Gemini's batch interface: batch mode of the Gemini API through google-genai
(ai.google.dev/gemini-api/docs/batch-mode), one model per batch: inline requests up to 20 MB a
batch, and larger batches as a JSONL file uploaded through the Files API (up to 2 GB; held here to
200 MB, as OpenAI's, since a batch's requests and answers are held in memory), whose answers come
back as a file too; texts to embed go in inline embedding batches (`batches.create_embeddings`),
whose answers come back in the order of the requests (they carry no key of their own). A request
carries its cache key as its metadata `key` (in a file: its `key`; in an embedding batch: its
place)."""

from __future__ import annotations

import io
import json
import re
import warnings

from vlm_decade.models.api.batch.lines import Embedding, Limits, Line
from vlm_decade.models.api.providers import EMBED_DIM, ChatRequest, GeminiProvider, Reply

GEMINI_INLINE_BYTES = 20 * 2**20  # larger Gemini chat batches go as an uploaded file


class GeminiBatches:
    """Submit, find, cancel and read Gemini batches through the provider's client."""

    LIMITS = Limits(50_000, 200 * 2**20)

    def __init__(self, provider):
        self.provider, self.client, self.types = provider, provider.client, provider.types

    def max_bytes(self, kind: str) -> int:
        # embedding batches are sent inline only
        return min(self.LIMITS.bytes, GEMINI_INLINE_BYTES) if kind == "embed" else self.LIMITS.bytes

    def payload(self, key: str, req: ChatRequest) -> dict:
        contents, config = self.provider.request_parts(req)
        inlined = self.types.InlinedRequest(contents=contents, config=config, metadata={"key": key})
        return inlined.model_dump(mode="json", exclude_none=True)

    def embed_payload(self, key: str, model_id: str, text: str) -> dict:
        return {"text": text}

    async def submit(self, kind: str, model_id: str, lines: list[Line], label: str) -> str:
        if kind == "embed":
            src = {
                "inlined_requests": {
                    "contents": [line.payload["text"] for line in lines],
                    "config": {"output_dimensionality": EMBED_DIM},
                }
            }
            with warnings.catch_warnings():  # google-genai marks batch embeddings experimental
                warnings.simplefilter("ignore")
                batch = await self.client.aio.batches.create_embeddings(
                    model=model_id, src=src, config={"display_name": label}
                )
            return batch.name
        if sum(len(json.dumps(line.payload)) for line in lines) <= GEMINI_INLINE_BYTES:
            src = [self.types.InlinedRequest.model_validate(line.payload) for line in lines]
            for request in src:
                request.config = self.provider.as_sent(request.config)
        else:  # too large to inline: a JSONL file of {"key", "request"} lines, uploaded through the Files API
            upload = await self.client.aio.files.upload(
                file=io.BytesIO(self.file_lines(lines)), config={"mime_type": "jsonl", "display_name": label}
            )
            src = upload.name
        batch = await self.client.aio.batches.create(model=model_id, src=src, config={"display_name": label})
        return batch.name

    @staticmethod
    def file_lines(lines: list[Line]) -> bytes:
        """A batch's input file: each request as the REST API documents it (camelCase field names, as
        the client sends a sync request: `generationConfig.thinkingConfig.thinkingBudget`; the
        inline payload's base64 bytes), under its key."""
        rows = (
            {
                "key": line.key,
                "request": _camel({"contents": line.payload["contents"], "generation_config": line.payload["config"]}),
            }
            for line in lines
        )
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
        status = {
            "JOB_STATE_SUCCEEDED": "completed",
            "JOB_STATE_EXPIRED": "expired",
            "JOB_STATE_CANCELLED": "cancelled",
            "JOB_STATE_FAILED": "failed",
        }.get(name, "pending")
        return status, batch

    async def results(self, batch, record: dict) -> dict[str, Reply | Embedding | str]:
        if record.get("kind") == "embed":
            return self._embeddings(batch, record["keys"])
        if batch.dest and batch.dest.file_name:
            return self._file_results(
                await self.client.aio.files.download(file=batch.dest.file_name), batch.model or ""
            )
        out: dict[str, Reply | Embedding | str] = {}
        for item in batch.dest.inlined_responses if batch.dest and batch.dest.inlined_responses else []:
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
                out[row["key"]] = self.provider.reply_from(
                    self.types.GenerateContentResponse.model_validate(row["response"]), model
                )
            else:
                error = row.get("error") or row.get("status") or {}
                out[row["key"]] = f"batch line {error.get('code', '')}: {error.get('message', 'failed')}"
        return out

    @staticmethod
    def _embeddings(batch, keys: list[str]) -> dict[str, Embedding | str]:
        """An embedding batch's answers, in the order of its requests, made unit-length as in sync mode."""
        out: dict[str, Embedding | str] = {}
        items = (
            batch.dest.inlined_embed_content_responses
            if batch.dest and batch.dest.inlined_embed_content_responses
            else []
        )
        for key, item in zip(keys, items):
            item = item if isinstance(item, dict) else item.model_dump(by_alias=False)
            response, error = item.get("response"), item.get("error")
            if error or not response:
                error = error or {}
                out[key] = f"batch line {error.get('code', '')}: {error.get('message', 'failed')}"
                continue
            vector = GeminiProvider.unit_rows([response["embedding"]["values"]])[0]
            out[key] = Embedding(
                vector,
                response.get("token_count") or response.get("tokenCount"),
                (batch.model or "").removeprefix("models/"),
            )
        return out


def _camel(value):
    """A payload with its field names spelled as REST JSON spells them (snake_case to camelCase)."""
    if isinstance(value, dict):
        return {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): _camel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel(v) for v in value]
    return value
