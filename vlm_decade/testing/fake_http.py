"""The fake API's HTTP side: the threaded server, the routes and how answers are sent.

A POST to a chat or embeddings route (`/v1/chat/completions`, `/v1/embeddings`,
`/v1beta/models/{model}:generateContent`, `:batchEmbedContents`, `:embedContent`) is logged, meets
the fault its attempt draws, waits out the latency (longer past the server's `capacity`, refused
past `overload_at`) and is answered by the wire format of its provider. Files and batches routes
go to the server's batch store (`fake_batch`) and are logged as control requests; GET /v1/models
lists the models the server serves. A request without the server's key is refused (401), and
whether each answer reached a client still connected is noted on its record.
"""

from __future__ import annotations

import hashlib
import json
import re
import select
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from vlm_decade.testing.fake_gemini import gemini_answer, gemini_embed_answer, gemini_usage
from vlm_decade.testing.fake_log import Received
from vlm_decade.testing.fake_openai import openai_chat_answer, openai_embed_answer, openai_usage

if TYPE_CHECKING:
    from vlm_decade.testing.fake_api import FakeAPIServer

_GEMINI = re.compile(
    r"^/v1beta/models/(?P<model>[^:/]+):(?P<method>generateContent|batchEmbedContents|embedContent|batchGenerateContent|asyncBatchEmbedContent)$"
)
_OPENAI_BATCH = re.compile(r"^/v1/batches/(?P<id>[^/]+?)(?P<cancel>/cancel)?$")
_GEMINI_BATCH = re.compile(r"^/v1beta/batches/(?P<id>[^/:]+?)(?P<cancel>:cancel)?$")


class FakeHTTPServer(ThreadingHTTPServer):
    """A thread per connection; a client that hangs up is no error to print."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)  # a client hanging up is no error


class FakeHandler(BaseHTTPRequestHandler):
    """Serves one connection for `fake`, the server a subclass names."""

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
        route = self._sync_route(path)
        if route is None:
            return self._send(404, {"error": {"message": f"no route {path}"}})
        endpoint, answer, model = route
        fake = self.fake
        digest = hashlib.sha256(body).hexdigest()
        outcome = fake.outcome(digest, body)
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
            time.sleep(fake.faults.answer_delay(at_once, digest))
            return self._answer(outcome, endpoint, answer, body, model)
        finally:
            with fake.lock:
                fake.in_flight -= 1

    def _sync_route(self, path: str):
        """(endpoint, the answer to a parsed body, the model the path names) of a chat or embeddings
        route; None when `path` is none."""
        fake, gemini = self.fake, _GEMINI.match(path)
        if path == "/v1/chat/completions":
            return "openai.chat", lambda p: openai_chat_answer(fake.answer, p), ""
        if path == "/v1/embeddings":
            return "openai.embeddings", openai_embed_answer, ""
        if gemini and gemini["method"] == "generateContent":
            return "gemini.generate", lambda p: gemini_answer(fake.answer, p, gemini["model"]), gemini["model"]
        if gemini:
            return "gemini.embed", lambda p: gemini_embed_answer(p, gemini["method"]), gemini["model"]
        return None

    def _answer(self, outcome: str, endpoint: str, answer, body: bytes, model: str) -> None:
        fake = self.fake
        if outcome == "timeout":
            time.sleep(fake.faults.timeout_sleep_s)
        if outcome == "429":
            return self._send(429, *_rate_limited(fake.faults.retry_hint, fake.faults.retry_after_s))
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
        if endpoint.startswith("openai."):
            used = openai_usage(endpoint, payload, request)
        else:
            used = gemini_usage(endpoint, payload, request, model)
        with fake.lock:
            self.record.model, self.record.input_tokens, self.record.output_tokens = used
            if endpoint.endswith("embed") or endpoint.endswith("embeddings"):
                self.record.inputs = len(payload.get("data") or payload.get("embeddings") or [payload])
        return self._send(200, payload)

    # batches ----------------------------------------------------------------------------------
    def _batch_route(self, method: str, path: str, body: bytes) -> bool:
        """Serve a Files / Batches request; False when `path` is no batch route."""
        if self._openai_batch_route(method, path, body) or self._gemini_batch_route(method, path, body):
            return True
        if method == "GET":
            self._send(404, {"error": {"message": f"no route {path}"}})
            return True
        return False

    def _openai_batch_route(self, method: str, path: str, body: bytes) -> bool:
        store, route = self.fake.batches, (method, path)
        if route == ("POST", "/v1/files"):
            data, filename = _multipart_file(self.headers.get("Content-Type", ""), body)
            return self._control("openai.files.create", lambda: (200, store.upload(data, filename)))
        if method == "GET" and path.startswith("/v1/files/") and path.endswith("/content"):
            return self._file("openai.files.content", path[len("/v1/files/") : -len("/content")])
        if route == ("POST", "/v1/batches"):
            return self._control("openai.batches.create", lambda: (200, store.create_openai(json.loads(body))))
        if route == ("GET", "/v1/batches"):
            return self._control("openai.batches.list", lambda: (200, _openai_list(store)))
        m_openai = _OPENAI_BATCH.match(path)
        if m_openai:
            batch = store.get(m_openai["id"])
            if batch is None:
                return self._control("openai.batches.retrieve", lambda: (404, _error(400, "no such batch")))
            if method == "POST" and m_openai["cancel"]:
                return self._control("openai.batches.cancel", lambda: (200, store.openai_view(store.cancel(batch.id))))
            return self._control("openai.batches.retrieve", lambda: (200, store.openai_view(batch)))
        return False

    def _gemini_batch_route(self, method: str, path: str, body: bytes) -> bool:
        store, route = self.fake.batches, (method, path)
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
            return self._control("gemini.batches.list", lambda: (200, _gemini_list(store)))
        m_gemini = _GEMINI_BATCH.match(path)
        if m_gemini:
            batch = store.get(f"batches/{m_gemini['id']}")
            if batch is None:
                return self._control("gemini.batches.get", lambda: (404, _error(400, "no such batch")))
            if method == "POST" and m_gemini["cancel"]:
                return self._control("gemini.batches.cancel", lambda: (200, store.gemini_view(store.cancel(batch.id))))
            return self._control("gemini.batches.get", lambda: (200, store.gemini_view(batch)))
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


def _openai_list(store) -> dict:
    """GET /v1/batches: every OpenAI batch, newest first."""
    batches = [store.openai_view(b) for b in reversed(list(store.batches.values())) if b.provider == "openai"]
    return {"object": "list", "has_more": False, "data": batches}


def _gemini_list(store) -> dict:
    """GET /v1beta/batches: every Gemini batch, newest first."""
    return {
        "operations": [store.gemini_view(b) for b in reversed(list(store.batches.values())) if b.provider == "gemini"]
    }


def _multipart_file(content_type: str, body: bytes) -> tuple[bytes, str]:
    """The file part of a multipart/form-data upload: (its bytes, its file name)."""
    boundary = re.search(r'boundary="?([^";]+)"?', content_type).group(1).encode()
    for part in body.split(b"--" + boundary):
        head, _, data = part.partition(b"\r\n\r\n")
        name = re.search(rb'filename="([^"]*)"', head)
        if name:
            return data[:-2] if data.endswith(b"\r\n") else data, name.group(1).decode()
    raise ValueError("no file in the upload")


def _rate_limited(hint: str, wait_s: float) -> tuple[dict, dict]:
    """(body, headers) of a 429 that says to wait `wait_s` where `hint` puts it (`FaultConfig.retry_hint`)."""
    body = _error(429, "rate limited")
    if hint == "retry-after":
        return body, {"Retry-After": f"{wait_s:g}"}
    if hint == "retry-info":
        retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{wait_s:g}s"}
        body["error"]["details"] = [{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []}, retry]
        return body, {}
    if hint == "ratelimit-reset":
        return body, {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": f"{wait_s * 1000:g}ms",
            "x-ratelimit-limit-tokens": "150000",
            "x-ratelimit-remaining-tokens": "149000",
            "x-ratelimit-reset-tokens": "20ms",
        }
    return body, {}


def _error(code: int, message: str) -> dict:
    """An error body both clients read: OpenAI's `type`, Gemini's `status`."""
    status = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL"}.get(
        code, "UNKNOWN"
    )
    return {"error": {"code": code, "message": message, "status": status, "type": status.lower()}}
