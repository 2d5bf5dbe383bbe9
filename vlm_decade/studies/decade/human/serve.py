"""`vlm-decade human serve`: an experiment folder on 127.0.0.1 for lab sessions, saving as it goes.

The app serves the folder's files (index.html, experiment.js, jspsych/, images/; nothing outside the
folder, no hidden file, no listing, never data/) and one resource per participant, `/data/<id>`:

- GET answers what is held for the participant (their records and their design participant: the one
  held, else `?p=` when the design has it, else the one fewest participants have been given), so a
  reloaded page skips the trials it finished;
- POST takes a JSON array of jsPsych trial records (at most `MAX_BODY` bytes), checks each against
  the interface of docs/human.md and the design, appends those it does not hold yet (a trial is
  held once: a resend after a lost answer or a reload adds nothing) and writes `data/<id>.json`
  whole and atomically before it answers 200, so a crash loses no trial the browser saw saved.

A participant id must be a safe file name (`core.files.safe_name` leaves it as it is). A request
whose Host is not this machine's name (DNS rebinding) or whose POST is not `application/json` (a
form another site submits) is refused.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from vlm_decade.core.errors import Problems
from vlm_decade.core.files import atomic_write_bytes, safe_name
from vlm_decade.core.hosts import LOOPBACK_NAMES, host_name
from vlm_decade.studies.decade.human.experiment import build_experiment

MAX_BODY = 1 << 20
MAX_ID = 64
DESIGN_KINDS = frozenset({"describe", "rank", "rate", "attention"})
KINDS = DESIGN_KINDS | {"instructions", "example", "end"}
REQUIRED = ("trial_type", "trial_index", "vd_experiment", "vd_participant", "vd_design_participant", "vd_kind")


class Refused(ValueError):
    """A request the server does not take; the message says why (a 400 answer)."""


class Store:
    """The participants' records, in memory and in `data/<id>.json`, written under one lock."""

    def __init__(self, folder: Path, design: dict):
        self.folder, self.design = folder, design
        self.lock = threading.Lock()
        self.records: dict[str, list[dict]] = {}
        problems = Problems()
        for path in sorted((folder / "data").glob("*.json")):
            try:
                held = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as exc:
                held = f"not JSON: {exc}"
            if isinstance(held, list) and all(isinstance(record, dict) for record in held):
                self.records[path.stem] = held
            else:
                problems.add(path, held if isinstance(held, str) else "not a list of trial records")
        problems.raise_if_any()
        self.given: dict[str, str] = {p: _design_participant(rs) for p, rs in self.records.items() if rs}
        self.trials = {p: {t["trial"]: t["kind"] for t in listed} for p, listed in design["participants"].items()}

    def design_participant(self, participant: str, asked: str | None) -> str:
        """The participant's design participant, given on first asking and kept."""
        with self.lock:
            if participant not in self.given:
                if asked in self.trials:
                    self.given[participant] = asked
                else:
                    load = {p: 0 for p in self.trials}
                    for given in self.given.values():
                        load[given] = load.get(given, 0) + 1
                    self.given[participant] = min(sorted(self.trials), key=lambda p: load[p])
            return self.given[participant]

    def add(self, participant: str, records: list[dict]) -> int:
        """Check `records`, append the new ones, write the file; the number of new records."""
        with self.lock:
            held = self.records.get(participant, [])
            design_participant = self.given.get(participant)
            keys = {_key(record) for record in held}
            new = []
            for index, record in enumerate(records):
                design_participant = self._check(participant, design_participant, index, record)
                if _key(record) not in keys:
                    keys.add(_key(record))
                    new.append(record)
            if new:
                atomic_write_bytes(self.folder / "data" / f"{participant}.json", _json(held + new))
                self.records[participant] = held + new
                self.given[participant] = design_participant
            return len(new)

    def _check(self, participant: str, design_participant: str | None, index: int, record) -> str:
        """The record's problem as a `Refused` naming it; its design participant when it has none."""
        where = f"record {index + 1}"
        if not isinstance(record, dict):
            raise Refused(f"{where}: not a JSON object")
        absent = [field for field in REQUIRED if field not in record]
        if absent:
            raise Refused(f"{where}: no field {', '.join(absent)}")
        if record["vd_experiment"] != self.design["experiment_id"]:
            raise Refused(f"{where}: vd_experiment '{record['vd_experiment']}' is not this experiment's")
        if record["vd_participant"] != participant:
            raise Refused(f"{where}: vd_participant is not '{participant}'")
        kind, trial, given = record["vd_kind"], record.get("vd_trial"), record["vd_design_participant"]
        if kind not in KINDS:
            raise Refused(f"{where}: vd_kind '{kind}' is not one of {', '.join(sorted(KINDS))}")
        if given not in self.trials or (design_participant is not None and given != design_participant):
            raise Refused(f"{where}: vd_design_participant '{given}' is not the participant's")
        if kind in DESIGN_KINDS and self.trials[given].get(trial) != kind:
            raise Refused(f"{where}: the design has no {kind} trial {trial} for {given}")
        return given

    def progress(self) -> str:
        finished = sum(any(r.get("vd_kind") == "end" for r in rs) for rs in self.records.values())
        trials = sum(r.get("vd_kind") in DESIGN_KINDS for rs in self.records.values() for r in rs)
        return f"{len(self.records)} participants ({finished} finished), {trials} trials received"


def _design_participant(records: list[dict]) -> str:
    return records[0].get("vd_design_participant", "")


def _key(record: dict) -> str:
    """What makes a record the same one again: its design trial (or the end), else all of it."""
    if record.get("vd_kind") in DESIGN_KINDS | {"end"}:
        return f"{record['vd_kind']}:{record.get('vd_trial')}"
    return json.dumps(record, sort_keys=True)


def _json(records: list[dict]) -> bytes:
    return (json.dumps(records, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def _participant(request: Request) -> str:
    participant = request.path_params["participant"]
    if not participant or len(participant) > MAX_ID or safe_name(participant) != participant:
        raise Refused(f"participant id '{participant[:MAX_ID]}' is not a safe name (letters, digits, . _ -)")
    return participant


async def data(request: Request) -> Response:
    store: Store = request.app.state.store
    try:
        participant = _participant(request)
        if request.method == "GET":
            given = store.design_participant(participant, request.query_params.get("p"))
            held = store.records.get(participant, [])
            return JSONResponse({"server": "vlm-decade", "design_participant": given, "records": held})
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise Refused("the body must be application/json")
        body = await _body(request)
        try:
            records = json.loads(body)
        except ValueError as exc:
            raise Refused(f"the body is not JSON: {exc}") from None
        if not isinstance(records, list):
            raise Refused("the body must be a JSON array of trial records")
        added = store.add(participant, records)
    except Refused as exc:
        return PlainTextResponse(str(exc), status_code=400)
    print(f"human serve: {participant} +{added}; {store.progress()}", file=sys.stderr, flush=True)
    return JSONResponse({"received": len(records), "added": added})


async def _body(request: Request) -> bytes:
    """The request's body, refused past MAX_BODY bytes (read no further than that)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise Refused(f"the body is over {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def folder_file(request: Request) -> Response:
    """A file of the experiment folder: not hidden, not under data/, not outside the folder."""
    root: Path = request.app.state.root
    relative = request.path_params["path"] or "index.html"
    if relative == "jatos.js":  # what index.html loads for JATOS: here, a script that does nothing
        return Response("", media_type="text/javascript")
    parts = Path(relative).parts
    target = (root / relative).resolve()
    if (
        Path(relative).is_absolute()
        or any(part.startswith(".") for part in parts)
        or (parts and parts[0] == "data")
        or not target.is_relative_to(root)
        or not target.is_file()
    ):
        return PlainTextResponse("not found", status_code=404)
    return FileResponse(target, headers={"Cache-Control": "no-store"})


class LocalOnly:
    """Answers only requests whose Host is this machine's loopback name (no DNS rebinding)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            if host_name(dict(scope["headers"]).get(b"host", b"").decode("latin-1")) not in LOOPBACK_NAMES:
                await PlainTextResponse("bad host", status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(folder: str | Path) -> Starlette:
    """The app over an experiment folder (its index.html and jspsych/ built first)."""
    root = Path(folder).resolve()
    design = build_experiment(root)
    app = Starlette(
        routes=[Route("/data/{participant}", data, methods=["GET", "POST"]), Route("/{path:path}", folder_file)]
    )
    app.state.root, app.state.store = root, Store(root, design)
    app.add_middleware(LocalOnly)
    return app


def serve(app: Starlette, sock) -> None:
    """Serve until interrupted, on a socket already listening (`view.app.bind`'s kind)."""
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])
