"""OpenAI's batch interface: a JSONL file of requests uploaded through the Files API and run by the
Batch API within its 24 h window; at most 50,000 requests and 200 MB per file, one model and one
endpoint (chat completions or embeddings) per file, and at most 50,000 embedding inputs per batch
(platform.openai.com/docs/guides/batch). Each request's `custom_id` is its cache key."""

from __future__ import annotations

import base64
import json

import numpy as np

from vlm_decade.models.api.batch.lines import FINISHED, Embedding, Limits, Line
from vlm_decade.models.api.providers import EMBED_DIM, ChatRequest, Reply


class OpenAIBatches:
    """Submit, find, cancel and read OpenAI batches through the provider's client."""

    LIMITS = Limits(50_000, 200 * 2**20)
    ENDPOINT = {"chat": "/v1/chat/completions", "embed": "/v1/embeddings"}

    def __init__(self, provider):
        self.provider, self.client = provider, provider.client

    def max_bytes(self, kind: str) -> int:
        return self.LIMITS.bytes

    def payload(self, key: str, req: ChatRequest) -> dict:
        return {"custom_id": key, "method": "POST", "url": self.ENDPOINT["chat"], "body": self.provider.chat_body(req)}

    def embed_payload(self, key: str, model_id: str, text: str) -> dict:
        body = {"model": model_id, "input": [text], "dimensions": EMBED_DIM, "encoding_format": "base64"}
        return {"custom_id": key, "method": "POST", "url": self.ENDPOINT["embed"], "body": body}

    async def submit(self, kind: str, model_id: str, lines: list[Line], label: str) -> str:
        data = b"".join((json.dumps(line.payload, separators=(",", ":")) + "\n").encode() for line in lines)
        upload = await self.client.files.create(file=(f"{label}.jsonl", data), purpose="batch")
        batch = await self.client.batches.create(
            input_file_id=upload.id,
            endpoint=self.ENDPOINT[kind],
            completion_window="24h",
            metadata={"vlm_decade": label},
        )
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
                    out[line["custom_id"]] = (
                        f"batch line {response.get('status_code', error.get('code', ''))}: {error.get('message', 'failed')}"
                    )
        return out

    @staticmethod
    def _embedding(body: dict) -> Embedding:
        """An embeddings response with one input, as the sync client would decode it."""
        value = body["data"][0]["embedding"]
        vector = (
            np.frombuffer(base64.b64decode(value), dtype="<f4")
            if isinstance(value, str)
            else np.asarray(value, np.float32)
        )
        return Embedding(
            vector.astype(np.float32), (body.get("usage") or {}).get("prompt_tokens"), body.get("model", "")
        )
