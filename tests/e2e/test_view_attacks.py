"""`vlm-decade view` on the demo's run folders under attack, through Starlette's test client (the
app as uvicorn serves it, without a socket): a cache entry that is a link, an images table whose
path or sha256 was edited, a foreign Host, a missing token, NUL bytes and huge page numbers, and a
property test over paths and query strings. None may serve a file from outside the run folder,
write one outside it, or answer 5xx.

A test that tampers with a run works on a copy of the session's demo run.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import string
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from vlm_decade.view.access import Access
from vlm_decade.view.app import create_app
from vlm_decade.view.runs import open_run

from ..unit.view_runs import write

pytestmark = pytest.mark.e2e

LOCAL = "http://127.0.0.1:8765"
SECRET = "a secret outside the run folder"


def client(run: Path, access: Access | None = None, base_url: str = LOCAL) -> TestClient:
    return TestClient(
        create_app(open_run(run), access), base_url=base_url, raise_server_exceptions=True, follow_redirects=False
    )


@pytest.fixture
def run(demo_run, tmp_path) -> Path:
    """A copy of the demo's Study A run, to tamper with; a secret file sits beside it."""
    copy = tmp_path / "run"
    shutil.copytree(demo_run[0] / "decade", copy, ignore=shutil.ignore_patterns(".view"))
    (tmp_path / "secret.txt").write_text(SECRET)
    return copy


def first_image(run: Path) -> dict:
    return pq.read_table(run / "images.parquet").to_pylist()[0]


def edit_images(run: Path, change, record: bool) -> None:
    """Rewrite the images table with `change` applied to its first row; with `record`, the manifest
    records the edited file's hash too (a tamperer who also edits the manifest)."""
    table = pq.read_table(run / "images.parquet")
    rows = table.to_pylist()
    change(rows[0])
    if record:
        write(run, "images", rows, table.schema)
    else:
        pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), run / "images.parquet")


def placeholder_text(answer) -> str:
    """What a placeholder picture says, its lines joined."""
    assert answer.headers["content-type"].startswith("image/svg+xml"), answer.headers["content-type"]
    return re.sub(r"<[^>]+>", "", answer.text)


def files_outside(root: Path, run: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_relative_to(run)}


def test_a_cache_entry_that_is_a_link_is_not_followed(run, tmp_path):
    image = first_image(run)
    thumbs = run / ".view" / "thumbs"
    thumbs.mkdir(parents=True)
    entry = thumbs / f"{image['sha256']}-240.jpg"
    entry.symlink_to(tmp_path / "secret.txt")
    answer = client(run).get(f"/picture/thumb/{quote(image['image_id'], safe='')}")
    assert answer.status_code == 200 and answer.content[:2] == b"\xff\xd8" and SECRET.encode() not in answer.content
    # The link was replaced by the thumbnail, not written through.
    assert not entry.is_symlink() and entry.read_bytes() == answer.content
    assert (tmp_path / "secret.txt").read_text() == SECRET


def test_a_cache_folder_that_is_a_link_is_neither_read_nor_written(run, tmp_path):
    image = first_image(run)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "variants").mkdir(parents=True)
    planted = elsewhere / "variants" / f"{image['sha256']}-full.jpg"
    planted.write_text(SECRET)
    (run / ".view").symlink_to(elsewhere)
    app = client(run)
    full = app.get(f"/picture/full/{quote(image['image_id'], safe='')}")
    assert full.status_code == 200 and full.content[:2] == b"\xff\xd8" and SECRET.encode() not in full.content
    assert app.get(f"/picture/thumb/{quote(image['image_id'], safe='')}").status_code == 200
    assert {p.name for p in elsewhere.rglob("*")} == {"variants", planted.name} and planted.read_text() == SECRET


def test_an_edited_table_is_a_page_that_says_so_not_data(run, tmp_path):
    image = first_image(run)
    edit_images(run, lambda r: r.update(path=str(tmp_path / "secret.txt")), record=False)
    app = client(run)
    for url in ("/", f"/image/{image['image_id']}", f"/picture/original/{image['image_id']}", "/run/images.parquet"):
        answer = app.get(url)
        assert answer.status_code == 409 and SECRET not in answer.text, url
        assert "images.parquet does not match the hash recorded when it was written" in answer.text, url
        assert 'class="card"' not in answer.text and 'id="main-image"' not in answer.text, url


def test_an_edited_path_is_served_only_if_its_bytes_are_the_images(run, tmp_path):
    """Even with the manifest edited to match, a path to another file serves nothing of it."""
    image = first_image(run)
    edit_images(run, lambda r: r.update(path=str(tmp_path / "secret.txt")), record=True)
    app = client(run)
    for kind in ("original", "thumb", "full", "m1"):
        answer = app.get(f"/picture/{kind}/{quote(image['image_id'], safe='')}")
        assert answer.status_code == 200 and SECRET.encode() not in answer.content, kind
        assert "not the file the run recorded (its bytes do not match the recorded sha256)" in placeholder_text(
            answer
        ), kind
    # A copy of the right bytes elsewhere is the image the run recorded, and is served.
    moved = tmp_path / "moved.png"
    shutil.copyfile(image["path"], moved)
    edit_images(run, lambda r: r.update(path=str(moved)), record=True)
    answer = client(run).get(f"/picture/original/{quote(image['image_id'], safe='')}")
    assert answer.status_code == 200 and answer.content == moved.read_bytes()
    assert hashlib.sha256(answer.content).hexdigest() == image["sha256"]


@pytest.mark.parametrize("digest", ["../../../../ESCAPED_THUMB", "/tmp/ESCAPED_THUMB", "A" * 64, ""])
def test_a_sha256_that_is_not_one_names_no_file(run, tmp_path, digest):
    image = first_image(run)
    edit_images(run, lambda r: r.update(sha256=digest), record=True)
    before = files_outside(tmp_path.parent, run)
    app = client(run)
    for url in ("picture/thumb", "picture/full", "picture/m1", "picture/original", "heatmap", "image"):
        answer = app.get(f"/{url}/{quote(image['image_id'], safe='')}")
        assert answer.status_code < 500, url
        if url.startswith("picture"):
            assert "the run records no valid sha256 for it" in placeholder_text(answer), url
    assert files_outside(tmp_path.parent, run) == before
    assert not [p for p in tmp_path.parent.rglob("*ESCAPED_THUMB*")] and not list(Path("/tmp").glob("ESCAPED_THUMB*"))


def test_a_foreign_host_is_refused(demo_run):
    app = client(demo_run[0] / "decade", base_url="http://attacker.example.com")
    for url in ("/", "/run/manifest.json", "/static/view.css"):
        answer = app.get(url)
        assert answer.status_code == 400 and "attacker.example.com" in answer.text and "config" not in answer.text
    allowed = client(
        demo_run[0] / "decade",
        Access.bound("127.0.0.1", 8765, ["viewer.example.org"]),
        "http://viewer.example.org:8765",
    )
    assert allowed.get("/run/manifest.json").status_code == 200
    for host in ("localhost", "127.0.0.1", "[::1]"):
        assert client(demo_run[0] / "decade", base_url=f"http://{host}:8765").get("/").status_code == 200, host


def test_beyond_loopback_a_token_is_asked_then_kept_in_a_cookie(demo_run):
    access = Access.bound("192.0.2.7", 8765, token="t0ken")
    assert access.url("192.0.2.7", 8765) == "http://192.0.2.7:8765/?token=t0ken"
    assert Access.bound("127.0.0.1", 8765).token is None and Access.bound("0.0.0.0", 8765).token is not None
    app = client(demo_run[0] / "decade", access, "http://192.0.2.7:8765")
    for url in ("/", "/run/manifest.json", "/?token=wrong"):
        answer = app.get(url)
        assert answer.status_code == 403 and "token" in answer.text and "config" not in answer.text, url
    onward = app.get("/image/a%20%C3%A9?token=t0ken&dataset=x%26y")
    assert onward.status_code == 303 and onward.headers["location"] == "/image/a%20%C3%A9?dataset=x%26y"
    app.cookies.clear()
    first = app.get("/run/manifest.json?token=t0ken")
    assert first.status_code == 303 and first.headers["location"] == "/run/manifest.json"
    assert (
        "httponly" in first.headers["set-cookie"].lower() and "samesite=strict" in first.headers["set-cookie"].lower()
    )
    assert app.get("/run/manifest.json").status_code == 200  # the cookie, now
    assert '"config"' in app.get("/run/manifest.json").text


def test_every_answer_carries_the_security_headers(demo_run):
    app = client(demo_run[0] / "decade")
    for url in ("/", "/run/report.html", "/nowhere", "/static/view.js", "/?page=0"):
        headers = app.get(url).headers
        assert headers["x-content-type-options"] == "nosniff", url
        assert "frame-ancestors 'none'" in headers["content-security-policy"], url
    assert "script-src 'self'" in app.get("/").headers["content-security-policy"]
    assert (
        "script" not in app.get("/run/report.html").headers["content-security-policy"]
    )  # default-src 'none': no script


@pytest.mark.parametrize(
    "url, status",
    [
        ("/run/%00/etc/passwd", 400),
        ("/image/%00", 400),
        ("/static/%00", 400),
        ("/?dataset=%00", 400),
        ("/run/a%0d%0aSet-Cookie:x", 400),
        ("/?page=9223372036854775807", 400),
        ("/?page=-1", 400),
        ("/?page=0", 400),
        ("/?page=1e3", 400),
        ("/?page=%EF%BC%91", 400),
        ("/?page=99999", 404),
        ("/model/demo-imported?page=18446744073709551616", 400),
        ("/model/demo-imported?page=500", 404),
        ("/model/nobody", 404),
        ("/picture/nothing/x", 404),
        ("/image/%ff%fe", 404),
        ("/heatmap/..%2f..%2fetc%2fpasswd", 404),
        ("/run/.lock", 404),
        ("/run/.view", 404),
    ],
)
def test_bad_requests_are_4xx(demo_run, url, status):
    answer = client(demo_run[0] / "decade").get(url)
    assert answer.status_code == status, answer.text[-500:]


PREFIXES = (
    "/",
    "/image/",
    "/model/",
    "/confusions",
    "/picture/thumb/",
    "/picture/full/",
    "/picture/original/",
    "/picture/m1/",
    "/heatmap/",
    "/run/",
    "/run/inputs/",
    "/static/",
)
PIECES = (
    "..",
    "%2e%2e",
    "%2F",
    "/",
    "%00",
    "%ff",
    "secret.txt",
    "etc/passwd",
    "manifest.json",
    "images.parquet",
    ".view",
    "~",
    "%",
    "\\",
    "report.html",
)
QUERY_KEYS = (
    "page",
    "dataset",
    "model",
    "error",
    "sde",
    "metric",
    "sort",
    "order",
    "granularity",
    "prompt",
    "outcome",
    "label",
    "prediction",
    "show",
    "token",
)


@st.composite
def requests(draw) -> str:
    path = draw(st.sampled_from(PREFIXES)) + "".join(
        draw(
            st.lists(
                st.one_of(
                    st.sampled_from(PIECES),
                    st.text(alphabet=string.printable, max_size=8).map(lambda t: quote(t, safe="/")),
                ),
                max_size=6,
            )
        )
    )
    text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)  # any character a URL can encode
    values = st.one_of(st.integers(min_value=-(2**70), max_value=2**70).map(str), text, st.sampled_from(PIECES))
    params = draw(st.lists(st.tuples(st.one_of(st.sampled_from(QUERY_KEYS), text), values), max_size=4))
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params)
    return path + ("?" + query if query else "")


@pytest.fixture(scope="module")
def demo_clients(demo_run):
    secret = demo_run[0].parent / "secret.txt"
    secret.write_text(SECRET)
    return [client(demo_run[0] / "decade"), client(demo_run[0] / "openworld")]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(target=requests())
@example(target="////")
@example(target="//etc/passwd")
def test_no_request_answers_5xx_or_serves_a_file_outside_the_run(demo_clients, demo_run, target):
    for app in demo_clients:
        answer = app.get(str(app.base_url).rstrip("/") + target)  # absolute: a path may start with '//'
        assert answer.status_code < 500, (target, answer.text[-500:])
        assert SECRET.encode() not in answer.content and b"root:x:0:0" not in answer.content, target
