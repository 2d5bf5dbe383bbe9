"""A fake OpenAI and Gemini API on 127.0.0.1, for tests, benchmarks and dry runs without keys.

It speaks the wire formats the official clients use (`openai.AsyncOpenAI(base_url=server.openai_url)`,
`genai.Client(http_options=HttpOptions(base_url=server.gemini_url, api_version="v1beta"))`):

    POST /v1/chat/completions                          OpenAI chat, images as data-URL parts
    POST /v1/embeddings                                OpenAI embeddings (base64 float32 or floats)
    POST /v1beta/models/{model}:generateContent        Gemini, images as inlineData
    POST /v1beta/models/{model}:batchEmbedContents     Gemini embeddings
    GET  /v1/models                                    the models it serves (`models`), as an OpenAI-compatible server lists them

Answers are derived from the request, so a test can check what arrived: a chat answer names the
sha256 of each image's bytes and of the prompt (`chat_text`), or is whatever the server's `answer`
function makes of the prompt and images (`scripted` answers fixed texts by prompt substring, for a
judge that must read "1" or "0"); an embedding is a seeded normal vector keyed by the text.
Faults come at configured rates (and `first_429` / `first_drop`: the first attempts of every
payload answer 429, or lose their connection with no answer) and are deterministic: whether an attempt fails is drawn from a
RNG seeded by (seed, payload hash, how many times this payload came before), so the same requests
meet the same faults in any order. `rate_400` is drawn from the payload alone: a request
refused once is refused again, as a real 4xx is. `capacity` and `overload_at` make a server of a
size the client is not told: past `capacity` requests at once each answer is slower in proportion,
past `overload_at` a request is refused at once (429). `models` is what GET /v1/models lists, and
`key` the one key the server takes (401 otherwise).

Everything received is counted per endpoint and logged (time, endpoint, payload sha256, outcome,
and for an ok answer the model and the usage it reported, when it was written and whether the
client was still there to read it), so a test can prove that nothing was sent twice, that no 60 s
window held more than a limit, and what a provider would have billed (`billed_usd`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from vlm_decade.testing.fake_batch import BatchStore

_GEMINI = re.compile(
    r"^/v1beta/models/(?P<model>[^:/]+):(?P<method>generateContent|batchEmbedContents|embedContent|batchGenerateContent|asyncBatchEmbedContent)$"
)
_OPENAI_BATCH = re.compile(r"^/v1/batches/(?P<id>[^/]+?)(?P<cancel>/cancel)?$")
_GEMINI_BATCH = re.compile(r"^/v1beta/batches/(?P<id>[^/:]+?)(?P<cancel>:cancel)?$")
REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")


@dataclass
class FaultConfig:
    """Rates are per attempt, in [0, 1]. A timeout holds the connection `timeout_sleep_s` before answering."""

    latency_s: float = 0.0
    rate_429: float = 0.0
    retry_after_s: float = 1.0
    rate_500: float = 0.0
    rate_timeout: float = 0.0
    timeout_sleep_s: float = 5.0
    rate_broken_json: float = 0.0
    rate_400: float = 0.0
    first_429: int = 0  # the first n attempts of every distinct payload answer 429, whatever the rates
    first_drop: int = 0  # the first n attempts of every distinct payload: the connection is closed, no answer
    first_status: tuple[
        int, ...
    ] = ()  # the first attempts of every distinct payload answer these statuses, in order (e.g. 408, 409)
    only_if: str = ""  # faults strike only requests whose body holds this text (e.g. the judge's prompt)
    batch_delay_s: float = 0.5  # a batch is worked through this long after it was created
    batch_line_fail_rate: float = 0.0  # lines of a batch that fail (500), per line
    batch_expire_first: int = 0  # the first n batches created expire with half their lines done
    batch_fail_first: int = (
        0  # the first n batches created (after those that expire) fail validation: status failed, no line run
    )
    capacity: int = 0  # past this many chat or embeddings requests at once, each is slower in proportion
    overload_at: int = 0  # past this many at once, a request is refused at once: 429, no Retry-After
    seed: int = 0


@dataclass
class Received:
    """One request as the server saw it. `input_tokens` / `output_tokens` are the usage an ok
    answer reported (what a provider bills); `delivered` says whether that answer went to a client
    still connected (False: the client had gone, e.g. killed, before the answer was ready)."""

    time: float  # when the request had arrived whole
    endpoint: str
    payload_sha256: str
    outcome: str  # ok, 429, 500, timeout, broken, 400, dropped; control: a files or batches request
    model: str = ""
    inputs: int = 1  # texts in an embeddings request
    input_tokens: int = 0
    output_tokens: int = 0
    answered: float | None = None  # when the answer (or the error) was written
    delivered: bool | None = None
    mode: str = "sync"  # batch: a line of a batch (endpoint `<provider>.batch_line`)
    key: str = ""  # a batch line's custom id
    batch: str = ""  # a batch line's batch
    body: bytes = field(default=b"", repr=False)  # the request body, as it arrived (sync requests)


def image_sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def chat_text(prompt: str, images: list[bytes]) -> str:
    """The fake's deterministic answer: tests recompute it from what they sent."""
    names = ", ".join(f"image {image_sha(b)}" for b in images) or "no image"
    return f"A scene showing {names}, asked prompt {hashlib.sha256(prompt.encode()).hexdigest()[:8]}."


ChatAnswer = Callable[[str, list[bytes]], str]  # (prompt, images) -> the answer text


def scripted(rules: dict[str, str], otherwise: ChatAnswer = chat_text) -> ChatAnswer:
    """Answers `rules[s]` for the first substring `s` (in the dict's order) found in the prompt, and
    `otherwise(prompt, images)` when none is."""

    def answer(prompt: str, images: list[bytes]) -> str:
        for substring, text in rules.items():
            if substring in prompt:
                return text
        return otherwise(prompt, images)

    return answer


def fake_vector(text: str, dim: int, unit: bool) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    # Gemini leaves vectors at reduced dims unnormalised; mimic that with a length != 1.
    return v / np.linalg.norm(v) if unit else v * np.float32(0.5)


def tokens(text: str) -> int:
    return max(1, len(text) // 4)


class FakeAPIServer:
    """`with FakeAPIServer(FaultConfig(...)) as server:` serves on 127.0.0.1 on a free port; `answer`
    makes each chat answer from the prompt and the images received."""

    def __init__(
        self,
        faults: FaultConfig | None = None,
        port: int = 0,
        answer: ChatAnswer = chat_text,
        models: tuple[str, ...] = (),
        key: str | None = None,
    ):
        """`models`: what GET /v1/models lists; `key`: the one key it takes (none: any)."""
        self.faults = faults or FaultConfig()
        self.models, self.key = models, key
        self.in_flight = 0
        self.most_in_flight = 0
        self.answer = answer
        self.lock = threading.Lock()
        self.log: list[Received] = []
        self._seen: Counter = Counter()
        self.batches = BatchStore(self)
        handler = type("Handler", (_Handler,), {"fake": self})
        self.httpd = _Server(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fake-api", daemon=True)

    # lifecycle ------------------------------------------------------------------------------
    def start(self) -> FakeAPIServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def gemini_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def billed_usd(
        self, price, delivered_only: bool = False, provider: str | None = None, batch_discount: float = 0.5
    ) -> float:
        """What the requests answered ok would cost at `price(model) -> (US$ per M input tokens, per
        M output tokens)`, as a provider bills them: every answer it produced, or only those that
        reached a connected client; all providers' or one's; batch lines at `batch_discount` of the price."""
        total = 0.0
        for r in self.received():
            if (
                r.outcome == "ok"
                and (r.delivered or not delivered_only)
                and (provider is None or r.endpoint.startswith(provider + "."))
            ):
                per_in, per_out = price(r.model)
                factor = batch_discount if r.mode == "batch" else 1.0
                total += factor * (r.input_tokens * per_in + r.output_tokens * per_out) / 1e6
        return total

    def batch_lines(self) -> list[Received]:
        """Every line of every batch worked through, in order."""
        return [r for r in self.received() if r.mode == "batch"]

    # what was received ------------------------------------------------------------------------
    def counts(self) -> Counter:
        """Requests received per endpoint, whatever their outcome."""
        with self.lock:
            return Counter(r.endpoint for r in self.log)

    def received(self) -> list[Received]:
        with self.lock:
            return list(self.log)

    def reset(self) -> None:
        with self.lock:
            self.log.clear()
            self._seen.clear()

    # faults -----------------------------------------------------------------------------------
    def _outcome(self, digest: str, body: bytes) -> str:
        f = self.faults
        if f.only_if and f.only_if.encode() not in body:
            return "ok"
        with self.lock:
            attempt = self._seen[digest]
            self._seen[digest] += 1
        if attempt < f.first_drop:
            return "dropped"
        if attempt < f.first_drop + f.first_429:
            return "429"
        if attempt < f.first_drop + f.first_429 + len(f.first_status):
            return str(f.first_status[attempt - f.first_drop - f.first_429])
        fixed = np.random.default_rng([f.seed, int(digest[:15], 16)])
        if fixed.random() < f.rate_400:
            return "400"
        draw = np.random.default_rng([f.seed, int(digest[:15], 16), attempt + 1]).random()
        for outcome, rate in (
            ("429", f.rate_429),
            ("500", f.rate_500),
            ("timeout", f.rate_timeout),
            ("broken", f.rate_broken_json),
        ):
            if draw < rate:
                return outcome
            draw -= rate
        return "ok"


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)  # a client hanging up is no error


class _Handler(BaseHTTPRequestHandler):
    fake: FakeAPIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _refused(self) -> bool:
        """A request without the server's key (when it has one) is refused: 401."""
        key = self.fake.key
        if key is not None and self.headers.get("Authorization") != f"Bearer {key}":
            self._send(401, _error(401, "invalid api key"))
            return True
        return False

    def do_GET(self) -> None:
        self.record = None
        path = self.path.split("?")[0]
        if self._refused():
            return
        if path == "/v1/models":
            self._log_control("openai.models")
            listed = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.fake.models]
            return self._send(200, {"object": "list", "data": listed})
        self._batch_route("GET", path, b"")

    def do_POST(self) -> None:
        self.record = None
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if len(body) < length:  # the client went away mid-request (killed): nothing was asked
            self.close_connection = True
            return
        path = self.path.split("?")[0]
        if self._refused() or self._batch_route("POST", path, body):
            return
        digest = hashlib.sha256(body).hexdigest()
        gemini = _GEMINI.match(path)
        if path == "/v1/chat/completions":
            endpoint, answer = "openai.chat", self._openai_chat
        elif path == "/v1/embeddings":
            endpoint, answer = "openai.embeddings", self._openai_embed
        elif gemini and gemini["method"] == "generateContent":
            endpoint, answer = "gemini.generate", lambda p: self._gemini_generate(p, gemini["model"])
        elif gemini:
            endpoint, answer = "gemini.embed", lambda p: self._gemini_embed(p, gemini["model"], gemini["method"])
        else:
            return self._send(404, {"error": {"message": f"no route {path}"}})
        fake = self.fake
        outcome = fake._outcome(digest, body)
        self.record = Received(time.time(), endpoint, digest, outcome, body=body)
        with fake.lock:
            fake.log.append(self.record)
        if outcome == "dropped":  # hang up with no answer, as a connection lost mid-request
            self.close_connection = True
            self.record.answered, self.record.delivered = time.time(), False
            return
        with fake.lock:
            fake.in_flight += 1
            at_once = fake.in_flight
            fake.most_in_flight = max(fake.most_in_flight, at_once)
        try:
            if fake.faults.overload_at and at_once > fake.faults.overload_at:
                self.record.outcome = "429"
                return self._send(429, _error(429, "server overloaded"))
            time.sleep(fake.faults.latency_s * max(1.0, at_once / (fake.faults.capacity or at_once)))
            return self._answer(outcome, answer, body, endpoint, gemini)
        finally:
            with fake.lock:
                fake.in_flight -= 1

    def _answer(self, outcome: str, answer, body: bytes, endpoint: str, gemini) -> None:
        fake = self.fake
        if outcome == "timeout":
            time.sleep(fake.faults.timeout_sleep_s)
        if outcome == "429":
            return self._send(429, _error(429, "rate limited"), {"Retry-After": f"{fake.faults.retry_after_s:g}"})
        if outcome == "500":
            return self._send(500, _error(500, "internal error"))
        if outcome.isdigit():  # 400, or a status of `first_status`
            return self._send(
                int(outcome), _error(int(outcome), "invalid request" if outcome == "400" else "try again")
            )
        try:
            payload = answer(json.loads(body))
        except (KeyError, ValueError, TypeError) as exc:
            return self._send(400, _error(400, f"malformed request: {exc}"))
        if outcome == "broken":
            return self._send_raw(200, json.dumps(payload).encode()[:-7])
        request = json.loads(body)
        model, used_in, used_out = usage_of(endpoint, payload, request, gemini["model"] if gemini else "")
        with fake.lock:
            self.record.model, self.record.input_tokens, self.record.output_tokens = model, used_in, used_out
            if endpoint.endswith("embed") or endpoint.endswith("embeddings"):
                self.record.inputs = len(payload.get("data") or payload.get("embeddings") or [payload])
        return self._send(200, payload)

    # batches ----------------------------------------------------------------------------------
    def _batch_route(self, method: str, path: str, body: bytes) -> bool:
        """Serve a Files / Batches request; False when `path` is no batch route."""
        store, route = self.fake.batches, (method, path)
        m_openai = _OPENAI_BATCH.match(path)
        m_gemini = _GEMINI_BATCH.match(path)
        if route == ("POST", "/v1/files"):
            data, filename = _multipart_file(self.headers.get("Content-Type", ""), body)
            return self._control("openai.files.create", lambda: (200, store.upload(data, filename)))
        if method == "GET" and path.startswith("/v1/files/") and path.endswith("/content"):
            return self._file("openai.files.content", path[len("/v1/files/") : -len("/content")])
        if route == ("POST", "/upload/v1beta/files") and self.headers.get("X-Goog-Upload-Command") == "start":
            self._log_control("gemini.files.upload")
            url = f"http://127.0.0.1:{self.server.server_address[1]}/upload-session/{store.upload_start()}"
            self._send(200, {}, {"x-goog-upload-url": url, "x-goog-upload-status": "active"})
            return True
        if method == "POST" and path.startswith("/upload-session/"):
            final = "finalize" in (self.headers.get("X-Goog-Upload-Command") or "")
            done = store.upload_chunk(path.rsplit("/", 1)[1], body, final)
            self._send(200, done or {}, {"x-goog-upload-status": "final" if final else "active"})
            return True
        if method == "GET" and path.startswith("/v1beta/files/") and path.endswith(":download"):
            return self._file("gemini.files.download", path[len("/v1beta/") : -len(":download")])
        if route == ("POST", "/v1/batches"):
            return self._control("openai.batches.create", lambda: (200, store.create_openai(json.loads(body))))
        if route == ("GET", "/v1/batches"):
            return self._control(
                "openai.batches.list",
                lambda: (
                    200,
                    {
                        "object": "list",
                        "has_more": False,
                        "data": [
                            store.openai_view(b)
                            for b in reversed(list(store.batches.values()))
                            if b.provider == "openai"
                        ],
                    },
                ),
            )
        if m_openai:
            batch = store.get(m_openai["id"])
            if batch is None:
                return self._control("openai.batches.retrieve", lambda: (404, _error(400, "no such batch")))
            if method == "POST" and m_openai["cancel"]:
                return self._control("openai.batches.cancel", lambda: (200, store.openai_view(store.cancel(batch.id))))
            return self._control("openai.batches.retrieve", lambda: (200, store.openai_view(batch)))
        gemini = _GEMINI.match(path)
        if method == "POST" and gemini and gemini["method"] == "batchGenerateContent":
            return self._control(
                "gemini.batches.create", lambda: (200, store.create_gemini(gemini["model"], json.loads(body)))
            )
        if method == "POST" and gemini and gemini["method"] == "asyncBatchEmbedContent":
            return self._control(
                "gemini.batches.create", lambda: (200, store.create_gemini_embed(gemini["model"], json.loads(body)))
            )
        if route == ("GET", "/v1beta/batches"):
            return self._control(
                "gemini.batches.list",
                lambda: (
                    200,
                    {
                        "operations": [
                            store.gemini_view(b)
                            for b in reversed(list(store.batches.values()))
                            if b.provider == "gemini"
                        ]
                    },
                ),
            )
        if m_gemini:
            batch = store.get(f"batches/{m_gemini['id']}")
            if batch is None:
                return self._control("gemini.batches.get", lambda: (404, _error(400, "no such batch")))
            if method == "POST" and m_gemini["cancel"]:
                return self._control("gemini.batches.cancel", lambda: (200, store.gemini_view(store.cancel(batch.id))))
            return self._control("gemini.batches.get", lambda: (200, store.gemini_view(batch)))
        if method == "GET":
            self._send(404, {"error": {"message": f"no route {path}"}})
            return True
        return False

    def _file(self, endpoint: str, name: str) -> bool:
        """Send a stored file's bytes (an OpenAI file's content, a Gemini download)."""
        self._log_control(endpoint)
        if name not in self.fake.batches.files:
            self._send(404, _error(400, f"no file {name}"))
        else:
            self._send_raw(200, self.fake.batches.files[name], content_type="application/octet-stream")
        return True

    def _log_control(self, endpoint: str) -> None:
        with self.fake.lock:
            self.fake.log.append(Received(time.time(), endpoint, "", "control", answered=time.time(), delivered=True))

    def _control(self, endpoint: str, serve) -> bool:
        self._log_control(endpoint)
        status, payload = serve()
        self._send(status, payload)
        return True

    # wire formats -----------------------------------------------------------------------------
    def _openai_chat(self, p: dict) -> dict:
        return openai_chat_answer(self.fake, p)

    def _openai_embed(self, p: dict) -> dict:
        return openai_embed_answer(p)

    def _gemini_generate(self, p: dict, model: str) -> dict:
        return gemini_answer(self.fake, p, model)

    def _gemini_embed(self, p: dict, model: str, method: str) -> dict:
        return gemini_embed_answer(p, method)

    # sending ----------------------------------------------------------------------------------
    def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
        self._send_raw(status, json.dumps(payload).encode(), headers)

    def _client_gone(self) -> bool:
        """Whether the client has closed its end (a killed process's sockets are closed by the
        kernel): the answer would reach no one."""
        try:
            if select.select([self.connection], [], [], 0)[0]:
                return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
        return False

    def _send_raw(
        self, status: int, body: bytes, headers: dict | None = None, content_type: str = "application/json"
    ) -> None:
        record = self.record
        if record is not None:
            record.answered, record.delivered = time.time(), not self._client_gone()
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            if record is not None:
                record.delivered = False  # the client gave up (a timeout): nothing to answer


def openai_chat_answer(fake, p: dict) -> dict:
    """The chat completion the fake answers to an OpenAI request body."""
    model, prompt, images = p["model"], [], []
    for message in p["messages"]:
        content = message["content"]
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            if part["type"] == "text":
                prompt.append(part["text"])
            elif part["type"] == "image_url":
                url = part["image_url"]["url"]
                head, data = url.split(",", 1)
                if head != "data:image/png;base64":
                    raise ValueError(f"unexpected image url header {head}")
                images.append(base64.b64decode(data))
    reasoning = model.startswith(REASONING_PREFIXES)
    if reasoning and ("temperature" in p or "max_tokens" in p):
        raise ValueError("reasoning models take max_completion_tokens and no temperature")
    text = fake.answer("\n".join(prompt), images)
    thought = 64 if reasoning else 0
    prompt_tokens = tokens("\n".join(prompt)) + 85 * len(images)
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": f"{model}-2025-01-01",
        "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": tokens(text) + thought,
            "total_tokens": prompt_tokens + tokens(text) + thought,
            "completion_tokens_details": {"reasoning_tokens": thought},
        },
    }


def openai_embed_answer(p: dict) -> dict:
    texts = [p["input"]] if isinstance(p["input"], str) else p["input"]
    dim = p.get("dimensions") or (1536 if "small" in p["model"] else 3072)
    data = []
    for i, text in enumerate(texts):
        v = fake_vector(text, dim, unit=True)
        emb = (
            base64.b64encode(v.astype("<f4").tobytes()).decode() if p.get("encoding_format") == "base64" else v.tolist()
        )
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = sum(tokens(t) for t in texts)
    return {"object": "list", "model": p["model"], "data": data, "usage": {"prompt_tokens": n, "total_tokens": n}}


def gemini_answer(fake, p: dict, model: str) -> dict:
    """The GenerateContentResponse the fake answers to a Gemini request body."""
    prompt, images = [], []
    for content in p["contents"]:
        for part in content["parts"]:
            if "text" in part:
                prompt.append(part["text"])
            elif "inlineData" in part or "inline_data" in part:  # proto JSON takes either spelling
                inline = part.get("inlineData") or part["inline_data"]
                if inline.get("mimeType", inline.get("mime_type")) != "image/png":
                    raise ValueError("expected image/png")
                images.append(base64.urlsafe_b64decode(inline["data"]))
    text = fake.answer("\n".join(prompt), images)
    thoughts = 32 if "2.5" in model else 0
    prompt_tokens = tokens("\n".join(prompt)) + 258 * len(images)
    return {
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {
            "promptTokenCount": prompt_tokens,
            "candidatesTokenCount": tokens(text),
            "thoughtsTokenCount": thoughts,
            "totalTokenCount": prompt_tokens + tokens(text) + thoughts,
        },
        "modelVersion": f"{model}-001",
        "responseId": "fake",
    }


def gemini_embed_answer(p: dict, method: str) -> dict:
    requests = p["requests"] if method == "batchEmbedContents" else [p]
    out = []
    for r in requests:
        text = "".join(part["text"] for part in r["content"]["parts"])
        dim = r.get("outputDimensionality") or 3072
        out.append({"values": fake_vector(text, dim, unit=dim == 3072).tolist()})
    return {"embeddings": out} if method == "batchEmbedContents" else {"embedding": out[0]}


def usage_of(endpoint: str, answer: dict, request: dict, gemini_model: str) -> tuple[str, int, int]:
    """(model, input tokens, output tokens) an ok answer reports, as billed."""
    if endpoint == "openai.chat":
        usage = answer["usage"]
        return request["model"], usage["prompt_tokens"], usage["completion_tokens"]
    if endpoint == "openai.embeddings":
        return request["model"], answer["usage"]["prompt_tokens"], 0
    if endpoint == "gemini.generate":
        usage = answer["usageMetadata"]
        return gemini_model, usage["promptTokenCount"], usage["candidatesTokenCount"] + usage["thoughtsTokenCount"]
    # Gemini reports no usage for embeddings; the gateway bills them at 4 characters a token.
    requests = request["requests"] if "requests" in request else [request]
    return (
        gemini_model,
        sum(max(1, -(-len("".join(p["text"] for p in r["content"]["parts"])) // 4)) for r in requests),
        0,
    )


def _multipart_file(content_type: str, body: bytes) -> tuple[bytes, str]:
    """The file part of a multipart/form-data upload: (its bytes, its file name)."""
    boundary = re.search(r'boundary="?([^";]+)"?', content_type).group(1).encode()
    for part in body.split(b"--" + boundary):
        head, _, data = part.partition(b"\r\n\r\n")
        name = re.search(rb'filename="([^"]*)"', head)
        if name:
            return data[:-2] if data.endswith(b"\r\n") else data, name.group(1).decode()
    raise ValueError("no file in the upload")


def _error(code: int, message: str) -> dict:
    status = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL"}.get(
        code, "UNKNOWN"
    )
    return {"error": {"code": code, "message": message, "status": status, "type": status.lower()}}


def max_in_window(times: list[float], window_s: float = 60.0) -> int:
    """The most requests whose arrival times fall in any half-open window of `window_s`."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


__all__ = [
    "FakeAPIServer",
    "FaultConfig",
    "Received",
    "chat_text",
    "fake_vector",
    "image_sha",
    "max_in_window",
    "scripted",
]
