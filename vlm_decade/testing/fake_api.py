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
judge that must read "1" or "0"; `ended` an answer that is empty, cut off or withheld); an embedding is a seeded normal vector keyed by the text.
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

This module holds the server itself and is where its public names are imported from; its parts
live beside it: `fake_http` (routes and sending), `fake_openai` and `fake_gemini` (the wire
formats), `fake_answers` (the texts and vectors), `fake_faults` (the knobs and the fault draw),
`fake_log` (the records) and `fake_batch` (files and batches).
"""

from __future__ import annotations

import threading
from collections import Counter

from vlm_decade.testing.fake_answers import ChatAnswer, chat_text, ended, fake_vector, image_sha, scripted
from vlm_decade.testing.fake_batch import BatchStore
from vlm_decade.testing.fake_faults import FaultConfig, fault_outcome
from vlm_decade.testing.fake_http import FakeHandler, FakeHTTPServer
from vlm_decade.testing.fake_log import Received, max_in_window


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
        handler = type("Handler", (FakeHandler,), {"fake": self})
        self.httpd = FakeHTTPServer(("127.0.0.1", port), handler)
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
    def attempt(self, key) -> int:
        """How many times `key` (a payload's sha256, or a batch line's) came before; counts this time."""
        with self.lock:
            seen = self._seen[key]
            self._seen[key] += 1
        return seen

    def outcome(self, digest: str, body: bytes) -> str:
        """What this attempt at the payload `digest` meets: ok, or the fault it draws."""
        if self.faults.only_if and self.faults.only_if.encode() not in body:
            return "ok"
        return fault_outcome(self.faults, digest, self.attempt(digest))


__all__ = [
    "FakeAPIServer",
    "FaultConfig",
    "Received",
    "chat_text",
    "ended",
    "fake_vector",
    "image_sha",
    "max_in_window",
    "scripted",
]
