"""`vlm-decade human serve`'s app (studies/decade/human/serve.py) in process: each POST on disk,
whole, before its answer; a resend adds nothing; a new server over the folder answers what the last
one held (a reload resumes); design participants given once and evenly; bad ids, bodies and paths
refused with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from vlm_decade.studies.decade.human.serve import MAX_BODY, create_app

from .human_folder import write_folder

LOCAL = "http://127.0.0.1:8766"


@pytest.fixture
def folder(tmp_path) -> Path:
    return write_folder(tmp_path / "rank", "rank")


def _client(folder: Path) -> TestClient:
    return TestClient(create_app(folder), base_url=LOCAL)


def _experiment(folder: Path) -> str:
    return json.loads((folder / "experiment.json").read_text())["experiment_id"]


def _record(folder: Path, participant: str, trial: int | None, kind: str, design: str = "p001", **fields) -> dict:
    record = {
        "trial_type": "html-button-response",
        "trial_index": trial or 0,
        "rt": 812,
        "time_elapsed": 1000,
        "response": 1,
        "vd_experiment": _experiment(folder),
        "vd_participant": participant,
        "vd_design_participant": design,
        "vd_kind": kind,
    }
    return record | ({"vd_trial": trial} if trial is not None else {}) | fields


def _post(client: TestClient, participant: str, records, **kwargs):
    return client.post(
        f"/data/{participant}", content=json.dumps(records), headers={"Content-Type": "application/json"}, **kwargs
    )


def _held(folder: Path, participant: str) -> list[dict]:
    return json.loads((folder / "data" / f"{participant}.json").read_text())


def test_each_post_is_on_disk_whole_and_a_resend_adds_nothing(folder, capsys):
    client = _client(folder)
    assert client.get("/data/ann").json() == {"server": "vlm-decade", "design_participant": "p001", "records": []}
    intro = _record(folder, "ann", None, "instructions")
    first = _record(folder, "ann", 1, "rank", chosen="dog-1")
    answer = _post(client, "ann", [intro, first])
    assert answer.status_code == 200 and answer.json() == {"received": 2, "added": 2}
    assert _held(folder, "ann") == [intro, first]
    assert [p.name for p in (folder / "data").iterdir()] == ["ann.json"]  # no temporary file left
    # The same trial again (a retry, a reload), even with another answer: held once, the first kept.
    again = _post(client, "ann", [intro, first | {"chosen": "dog-2"}, _record(folder, "ann", 2, "rank")])
    assert again.json() == {"received": 3, "added": 1}
    assert [r.get("vd_trial") for r in _held(folder, "ann")] == [None, 1, 2]
    assert _held(folder, "ann")[1]["chosen"] == "dog-1"
    assert capsys.readouterr().err.splitlines()[-1].endswith("ann +1; 1 participants (0 finished), 2 trials received")


def test_a_new_server_resumes_what_the_last_one_held(folder):
    client = _client(folder)
    client.get("/data/ann?p=p002")
    records = [_record(folder, "ann", 1, "rank", "p002"), _record(folder, "ann", 3, "attention", "p002")]
    _post(client, "ann", records)
    held = _client(folder).get("/data/ann?p=p001").json()
    assert held["records"] == records and held["design_participant"] == "p002"  # kept, not re-given


def test_design_participants_are_given_evenly_and_kept(folder):
    client = _client(folder)
    given = [client.get(f"/data/{name}").json()["design_participant"] for name in ("a", "b", "c", "a")]
    assert given == ["p001", "p002", "p001", "p001"]
    assert client.get("/data/d?p=p002").json()["design_participant"] == "p002"
    # p999 is not in the design: the least given, the first of a tie (two each now).
    assert client.get("/data/e?p=p999").json()["design_participant"] == "p001"
    assert client.get("/data/f").json()["design_participant"] == "p002"


@pytest.mark.parametrize("participant", ["..a", ".hidden", "a b", "x" * 65, "a%2Fb", "%00"])
def test_unsafe_participant_ids_are_refused(folder, participant):
    client = _client(folder)
    assert client.get(f"/data/{participant}").status_code in (400, 404)
    assert _post(client, participant, []).status_code in (400, 404, 405)
    assert not (folder / "data").exists()


def test_bad_bodies_are_refused_and_nothing_is_written(folder):
    client = _client(folder)
    good = _record(folder, "ann", 1, "rank")
    bad = {
        "not JSON": "{",
        "must be a JSON array": json.dumps(good),
        "record 2: not a JSON object": json.dumps([good, 3]),
        "no field vd_kind": json.dumps([{k: v for k, v in good.items() if k != "vd_kind"}]),
        "is not this experiment's": json.dumps([good | {"vd_experiment": "0" * 16}]),
        "vd_participant is not": json.dumps([good | {"vd_participant": "bob"}]),
        "no rank trial 9": json.dumps([good | {"vd_trial": 9}]),
        "no rate trial 1": json.dumps([good | {"vd_kind": "rate"}]),
        "vd_kind 'chat'": json.dumps([good | {"vd_kind": "chat"}]),
        "vd_design_participant 'p009'": json.dumps([good | {"vd_design_participant": "p009"}]),
        "over": json.dumps([good | {"text": "x" * MAX_BODY}]),
    }
    for why, body in bad.items():
        answer = client.post("/data/ann", content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 400 and why in answer.text, (why, answer.text)
    plain = client.post("/data/ann", content=json.dumps([good]), headers={"Content-Type": "text/plain"})
    assert plain.status_code == 400
    assert not (folder / "data").exists()
    # Another design participant than the one held is refused too.
    _post(client, "ann", [good])
    assert _post(client, "ann", [_record(folder, "ann", 2, "rank", "p002")]).status_code == 400
    assert len(_held(folder, "ann")) == 1


def test_only_the_folders_own_files_are_served(folder):
    client = _client(folder)
    _post(client, "ann", [_record(folder, "ann", 1, "rank")])
    (folder / ".secret").write_text("no")
    (folder.parent / "outside.txt").write_text("no")
    (folder / "images" / "link.png").symlink_to(folder.parent / "outside.txt")
    page = client.get("/")
    assert page.status_code == 200 and 'id="vd-design"' in page.text
    assert client.get("/images/dog.png").content == (folder / "images" / "dog.png").read_bytes()
    # /data/<id> is the participant resource, never the file: "ann.json" is another (unknown) participant.
    assert client.get("/data/ann.json").json()["records"] == []
    for path in ("/data/x/ann.json", "/.secret", "/images/", "/images", "/../outside.txt", "/%2e%2e/outside.txt",
                 "/images/link.png", "/images/..%2f..%2foutside.txt", "//etc/passwd"):  # fmt: skip
        assert client.get(path).status_code == 404, path
    assert client.get("/", headers={"Host": "evil.example:8766"}).status_code == 400


def test_the_command_refuses_a_folder_that_is_no_experiment(folder):
    from typer.testing import CliRunner

    from vlm_decade.cli import app

    (folder / "data").mkdir()
    (folder / "data" / "ann.json").write_text('{"not": "a list"}')
    result = CliRunner().invoke(app, ["human", "serve", str(folder), "--port", "0"])
    assert result.exit_code == 2 and "ann.json: not a list of trial records" in result.output
    result = CliRunner().invoke(app, ["human", "serve", str(folder / "nowhere")])
    assert result.exit_code == 2 and "experiment.json: missing" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_the_command_refuses_a_port_in_use(folder):
    import socket

    from typer.testing import CliRunner

    from vlm_decade.cli import app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["human", "serve", str(folder), "--port", str(port)])
    assert result.exit_code == 2 and f"cannot listen on port {port}" in result.output
