"""`transformers serve` (the transformers package's own OpenAI-compatible server) as a real endpoint
for the tests: one process on 127.0.0.1 serving saved tiny models under their folder paths.

It loads a model on the first request naming it, and its GET /v1/models lists the models it has
in memory (besides those of the hub cache, which it is given an empty one of), so each model is
loaded before the first test and kept loaded for the session."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.required import missing, module

START_S = 180  # a cold start imports torch and transformers: over a minute on a loaded machine


@dataclass(frozen=True)
class Served:
    """A running server: its base URL, and the ids (folder paths) of the models it has loaded."""

    url: str
    vlm: str
    judge: str


def _cli() -> str:
    module("fastapi")
    module("uvicorn")
    cli = Path(sys.executable).parent / "transformers"
    if not cli.exists():
        missing("transformers serve", f"no `transformers` command beside {sys.executable}")
    return str(cli)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TransformersServe:
    """`with TransformersServe(folder) as server:` starts the process (its output in
    `folder/serve.log`), which takes a while: save the models meanwhile, then `server.load(path)`
    each one. `server.url` is its base URL (…/v1). The process is killed on exit."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, _free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = folder / "serve.log"
        self.up = False

    def __enter__(self) -> TransformersServe:
        hub = self.folder / "hub"  # empty: /v1/models lists the loaded models alone
        hub.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}
        cmd = [_cli(), "serve", "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu"]
        cmd += ["--model-timeout", "86400", "--log-level", "warning"]  # kept loaded, so /v1/models lists it
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def __exit__(self, *_) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # nothing of it is kept
        self.proc.wait(timeout=30)

    def _wait_up(self) -> None:
        import httpx

        deadline = time.monotonic() + START_S
        while not self.up:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()[-3000:]
            try:
                self.up = httpx.get(self.url.removesuffix("/v1") + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                pass
            if not self.up:
                time.sleep(0.3)

    def load(self, model: Path) -> str:
        """Load `model` (POST /load_model streams progress until ready or error): the id it is served under."""
        import httpx

        self._wait_up()
        url = self.url.removesuffix("/v1") + "/load_model"
        with httpx.stream("POST", url, json={"model": str(model)}, timeout=START_S) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert events and events[-1].get("status") == "ready", (events[-3:], self.log.read_text()[-3000:])
        return str(model)
