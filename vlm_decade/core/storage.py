"""Object storage: images read from `s3://` or `gs://` URIs, and run folders kept in a bucket.

Images: a location is a local path or a URI (`s3://bucket/key`), read through pyarrow.fs, so the
workers of a cluster need no shared disk. Each store's SDK finds credentials, region and endpoint in
the environment as it always does (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `AWS_EC2_METADATA_DISABLED`,
`GOOGLE_APPLICATION_CREDENTIALS`, `STORAGE_EMULATOR_HOST` for a GCS emulator, ...); nothing of them is stored.

Run folders: an object store cannot rename, append or lock, which is what the run folder's guarantees
rest on. So a run folder at a URI is worked on in a local working copy (`working_copy`) that a
`Mirror` keeps in step with the bucket: each part of an incremental stage is uploaded as soon as it
is saved, and every manifest save uploads whatever else changed, the manifest last, so the manifest
in the bucket only ever names objects already there; an object is written whole or not at all. A run
on another machine (or after the working copy is lost) first downloads what the bucket holds and
resumes from it, verifying every table and part as a local run does (docs/cluster.md).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import socket
import threading
import time
from functools import cache
from pathlib import Path
from typing import BinaryIO

from pyarrow import fs

from vlm_decade.core.errors import StoreError
from vlm_decade.core.files import atomic_file, atomic_write_bytes
from vlm_decade.core.tables import regular_file_problem

SCHEMES = ("s3", "gs")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_uri(location: str | Path) -> bool:
    """Whether `location` names an object (`scheme://...`) rather than a local path."""
    return isinstance(location, str) and _URI.match(location) is not None


def uri_problem(uri: str) -> str | None:
    """Why `uri` cannot name an image folder or file (an unsupported scheme, no bucket), or None."""
    scheme = _URI.match(uri).group(1).lower()
    if scheme not in SCHEMES:
        return f"'{scheme}://' is not supported: use a local path, s3:// or gs://"
    if not uri[len(scheme) + 3 :].split("/", 1)[0]:
        return "the URI names no bucket"
    return None


def join(folder: str | Path, name: str) -> str:
    """The location of `name` inside `folder`. Under a URI, `.` and `..` are resolved as a local path's
    would be, so `a/../b.png` and `b.png` are the same object."""
    if not is_uri(folder):
        return os.path.abspath(os.path.join(folder, name))  # as `Path(folder) / name` would, at a twentieth of the cost
    scheme, rest = folder.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    key = posixpath.normpath(posixpath.join("/", prefix, name)).lstrip("/")
    return f"{scheme}://{bucket}/{key}"


# Google's client libraries take a GCS emulator's address from this variable (pyarrow's does not); an
# emulator takes no credentials. S3's counterpart, AWS_ENDPOINT_URL, pyarrow reads itself.
GCS_EMULATOR = "STORAGE_EMULATOR_HOST"


def _gcs_emulator() -> tuple[str, str] | None:
    """(scheme, host:port) of the GCS emulator named by $STORAGE_EMULATOR_HOST, or None."""
    address = os.environ.get(GCS_EMULATOR, "")
    if not address:
        return None
    scheme, _, host = address.rpartition("://")
    return scheme or "http", host.rstrip("/")


@cache
def _store(scheme: str, bucket: str) -> fs.FileSystem:
    emulator = _gcs_emulator() if scheme == "gs" else None
    if emulator is not None:
        return fs.GcsFileSystem(endpoint_override=emulator[1], scheme=emulator[0], anonymous=True)
    return fs.FileSystem.from_uri(f"{scheme}://{bucket}")[0]  # one client per bucket and process


def _object(uri: str) -> tuple[fs.FileSystem, str]:
    scheme, rest = uri.split("://", 1)
    return _store(scheme.lower(), rest.split("/", 1)[0]), rest.rstrip("/")


def _info(uri: str) -> fs.FileInfo:
    store, key = _object(uri)
    return store.get_file_info(key)


def file_problem(location: str | Path) -> str | None:
    """Why `location` cannot be read as a file (missing, a folder, not a regular file, a store that
    cannot be reached), or None."""
    if not is_uri(location):
        return regular_file_problem(location)
    problem = uri_problem(str(location))
    if problem is not None:
        return problem
    try:
        kind = _info(str(location)).type
    except OSError as exc:
        return f"cannot be read: {exc}"
    if kind == fs.FileType.NotFound:
        return "not found"
    if kind == fs.FileType.Directory:
        return "is a folder, not a file"
    return None


def is_folder(location: str | Path) -> bool:
    """Whether `location` is a folder (under a URI: a bucket, or a prefix that holds objects);
    StoreError when the store cannot be asked."""
    if not is_uri(location):
        return Path(location).is_dir()
    if uri_problem(str(location)) is not None:
        return False
    try:
        return _info(str(location)).type == fs.FileType.Directory
    except OSError as exc:  # the store did not answer: not the user's input, so not "not found"
        raise StoreError(f"{location}: could not look into the bucket: {exc}") from None


def stat(location: str | Path) -> tuple[int, int]:
    """(size in bytes, modification time in ns) of a file; OSError when it cannot be read."""
    if not is_uri(location):
        st = os.stat(location)
        return st.st_size, st.st_mtime_ns
    info = _info(str(location))
    if info.type != fs.FileType.File:
        raise FileNotFoundError(str(location))
    return info.size, info.mtime_ns or 0


def read_bytes(location: str | Path) -> bytes:
    """A file's whole content; OSError when it cannot be read."""
    if not is_uri(location):
        with open(location, "rb") as fh:
            return fh.read()
    store, key = _object(str(location))
    with store.open_input_stream(key) as stream:
        return stream.read()


def open_file(location: str | Path) -> BinaryIO:
    """A file opened for reading: a local file as it is, an object read into memory."""
    if not is_uri(location):
        return open(location, "rb")
    return io.BytesIO(read_bytes(location))


# The working copy's own files, never copied: the lock, temporary files, the embed stage's spill,
# the viewer's picture cache, and the mirror's record; and the bucket's lease, never brought in.
MIRROR_FILE = ".mirror.json"
LOCAL_ONLY = re.compile(r"^(\.lock|\.lease|\.mirror\.json)$|(^|/)\.[^/]*\.tmp$|^\.(spill|view)/")
MANIFEST = "manifest.json"


def working_copy(uri: str) -> Path:
    """The local working copy of the run folder at `uri`: under $VLM_DECADE_WORKING_COPIES (default
    ~/.cache/vlm_decade/runs), named by the URI's hash, made and tied to the URI on first use."""
    base = (
        os.environ.get("VLM_DECADE_WORKING_COPIES")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vlm_decade" / "runs"
    )
    folder = Path(base) / hashlib.sha256(uri.encode()).hexdigest()[:16]
    record = folder / MIRROR_FILE
    if not record.exists():
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(record, {"uri": uri, "synced": {}})
    return folder


def _write_json(path: Path, value) -> None:
    atomic_write_bytes(path, json.dumps(value).encode())


def _named_tables(manifest: Path) -> set[str]:
    """The table files a manifest records (`files`): never removed because the bucket lacks them."""
    try:
        files = json.loads(manifest.read_bytes()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return set()
    if not isinstance(files, dict):
        return set()
    named = set()
    for name, record in files.items():
        segments = record.get("segments") if isinstance(record, dict) else None
        named |= {f"{name}/{s['name']}" for s in segments} if segments else {f"{name}.parquet"}
    return named


def _local_state(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns]


class Mirror:
    """Keeps a working copy (`root`) and its run folder in object storage in step. `synced` records,
    per file, its local (size, mtime) and the object's (size, mtime) when the two were last equal, so
    either side's changes since are told apart from the other's."""

    def __init__(self, root: Path):
        self.root = Path(root)
        record = json.loads((self.root / MIRROR_FILE).read_text())
        self.uri: str = record["uri"]
        self.synced: dict[str, dict[str, list[int]]] = record["synced"]
        self.store, self.prefix = _object(self.uri)

    @classmethod
    def of(cls, root: Path) -> Mirror | None:
        """The mirror of a working copy, or None for a plain run folder."""
        return cls(root) if (Path(root) / MIRROR_FILE).exists() else None

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}"

    def _objects(self) -> dict[str, list[int]]:
        found = self.store.get_file_info(fs.FileSelector(self.prefix, recursive=True, allow_not_found=True))
        start = len(self.prefix) + 1
        return {i.path[start:]: [i.size, i.mtime_ns or 0] for i in found if i.type == fs.FileType.File}

    def _save(self) -> None:
        _write_json(self.root / MIRROR_FILE, {"uri": self.uri, "synced": self.synced})

    def check(self) -> None:
        """StoreError unless the store answers and has the bucket (a store that lost it, or was
        started again empty, has none). A run asks before it takes the folder, so a store that
        answers wrongly stops it with the working copy untouched."""
        bucket = self.prefix.split("/", 1)[0]
        try:
            found = self.store.get_file_info(bucket).type
        except OSError as exc:
            raise self._unreachable(exc) from None
        if found == fs.FileType.NotFound:
            raise StoreError(
                f"{self.uri}: the store has no bucket '{bucket}' (it lost it, or was started again empty); "
                f"the working copy {self.root} is kept as it is, and is saved there once the bucket exists"
            )

    def pull(self) -> int:
        """Bring the working copy up to the bucket: download each object changed there since the
        two last agreed (every object, the first time). A local file whose object is gone is removed
        only when the bucket's manifest changed since (another machine's run went on and removed it:
        parts folded into a table) and does not name it; else the store lost it, and the file is
        kept and saved there again. Returns the count of files brought in or removed."""
        self.check()
        try:
            return self._pull()
        except StoreError:
            raise
        except OSError as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: OSError) -> StoreError:
        return StoreError(f"{self.uri}: could not bring the run folder into its working copy {self.root}: {exc}")

    def push(self, paths: list[Path] | None = None) -> int:
        """Upload what changed in the working copy since the last sync: `paths` only, or every file,
        the manifest last, after which objects whose files are gone here are deleted. Returns the
        count of objects written."""
        try:
            return self._push(paths)
        except OSError as exc:
            raise StoreError(f"{self.uri}: could not save the working copy {self.root} there: {exc}") from None

    def _pull(self) -> int:
        objects = self._objects()
        moved_on = MANIFEST in objects and objects[MANIFEST] != self.synced.get(MANIFEST, {}).get("remote")
        changed = 0
        for rel, remote in sorted(objects.items()):
            if LOCAL_ONLY.search(rel):
                continue
            local = self.root / rel
            if self.synced.get(rel, {}).get("remote") == remote and local.exists():
                continue  # unchanged there since the last sync; the local file is as new or newer
            with atomic_file(local) as out, self.store.open_input_stream(self._key(rel)) as source:
                shutil.copyfileobj(source, out, 8 << 20)
            self.synced[rel] = {"local": _local_state(local), "remote": remote}
            changed += 1
        named = _named_tables(self.root / MANIFEST) if moved_on else set()
        for rel in [r for r in self.synced if r not in objects]:
            local = self.root / rel
            # Removed there by a run that went on, and not changed here since; anything else is kept,
            # and (no longer recorded as in step) saved there again by the next push.
            if moved_on and rel not in named and _local_state(local) == self.synced[rel]["local"]:
                local.unlink(missing_ok=True)
                changed += 1
            del self.synced[rel]
        self._save()
        return changed

    def _push(self, paths: list[Path] | None) -> int:
        if paths is None:
            rels = [p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file()]
        else:
            rels = [Path(p).relative_to(self.root).as_posix() for p in paths]
        todo = [
            r
            for r in rels
            if not LOCAL_ONLY.search(r) and _local_state(self.root / r) != self.synced.get(r, {}).get("local")
        ]
        todo.sort(key=lambda rel: rel == MANIFEST)  # the manifest names files: they go first
        for rel in todo:
            local = self.root / rel
            state = _local_state(local)
            with open(local, "rb") as source, self.store.open_output_stream(self._key(rel)) as out:
                shutil.copyfileobj(source, out, 8 << 20)
            info = self.store.get_file_info(self._key(rel))
            self.synced[rel] = {"local": state, "remote": [info.size, info.mtime_ns or 0]}
        if paths is None:
            for rel in [r for r in self.synced if not (self.root / r).exists()]:
                self.store.delete_file(self._key(rel))
                del self.synced[rel]
        self._save()
        return len(todo)


# One run per run-folder URI across machines ---------------------------------------------------------
# A working copy's `.lock` holds on one machine only. Across machines the run holds a lease object,
# `<run folder>/.lease`, created only where none is (S3: PutObject with If-None-Match: *; GCS: an
# upload with ifGenerationMatch=0), renewed every LEASE_RENEW_S by overwriting it only while it is
# still the version this run wrote (S3 If-Match, GCS ifGenerationMatch), and deleted at the end.
LEASE = ".lease"
LEASE_RENEW_S = 60.0
# A lease not renewed for this long belongs to a run that is gone (its machine lost, its process
# killed) and is taken over; one whose holder is a dead process on this machine, at once.
LEASE_STALE_S = 600.0


class LeaseHeld(RuntimeError):
    """Another run holds the run folder's lease; the message names it."""


class _Unsupported(Exception):
    """The store does not take conditional writes."""


class _Conditional:
    """Conditional writes of one small object in one store: what pyarrow's file systems do not offer.
    `token` is the version of the object a write saw (S3: its ETag; GCS: its generation)."""

    def create(self, key: str, body: bytes) -> str | None:
        """Write `key` only if no object is there; its token, or None when one is."""
        raise NotImplementedError

    def read(self, key: str) -> tuple[bytes, str] | None:
        """The object's content and token, or None when there is none."""
        raise NotImplementedError

    def replace(self, key: str, body: bytes, token: str) -> str | None:
        """Overwrite `key` only while it is at version `token`; the new token, or None."""
        raise NotImplementedError

    def delete(self, key: str, token: str) -> None:
        raise NotImplementedError


class _S3Conditional(_Conditional):
    def __init__(self, bucket: str):
        import boto3  # endpoint, region and credentials from the environment, as pyarrow takes them
        from botocore.exceptions import BotoCoreError, ClientError

        self.client, self.bucket, self.error, self.failure = boto3.client("s3"), bucket, ClientError, BotoCoreError

    def _put(self, key: str, body: bytes, **condition) -> str | None:
        try:
            return self.client.put_object(Bucket=self.bucket, Key=key, Body=body, **condition)["ETag"]
        except self.error as exc:
            # 412: the condition failed; 409: a concurrent conditional write won
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (409, 412):
                return None
            if status == 501:  # an S3-compatible store without conditional writes
                raise _Unsupported(str(exc)) from None
            raise OSError(str(exc)) from None
        except self.failure as exc:  # no credentials, no answer
            raise OSError(str(exc)) from None

    def create(self, key, body):
        return self._put(key, body, IfNoneMatch="*")

    def read(self, key):
        try:
            found = self.client.get_object(Bucket=self.bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            return None
        except (self.error, self.failure) as exc:
            raise OSError(str(exc)) from None
        return found["Body"].read(), found["ETag"]

    def replace(self, key, body, token):
        return self._put(key, body, IfMatch=token)

    def delete(self, key, token):
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key, IfMatch=token)
        except self.error as exc:
            # 412: no longer this run's (another took it over); 404: already gone. Neither is deleted.
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") not in (404, 412):
                raise OSError(str(exc)) from None
        except self.failure as exc:
            raise OSError(str(exc)) from None


class _GcsConditional(_Conditional):
    """Through GCS's JSON API (plain HTTP): the emulator's when $STORAGE_EMULATOR_HOST names one (no
    credentials), else Google's, with the application-default credentials."""

    def __init__(self, bucket: str):
        emulator = _gcs_emulator()
        self.base = f"{emulator[0]}://{emulator[1]}" if emulator else "https://storage.googleapis.com"
        self.bucket, self.credentials = bucket, None
        if emulator is None:
            import google.auth

            self.credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_write"])

    def _call(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        import urllib.error
        import urllib.request

        headers = dict(headers or {})
        if self.credentials is not None:
            import google.auth.transport.requests

            if not self.credentials.valid:
                self.credentials.refresh(google.auth.transport.requests.Request())
            headers["Authorization"] = f"Bearer {self.credentials.token}"
        request = urllib.request.Request(f"{self.base}{path}", data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except urllib.error.URLError as exc:
            raise OSError(f"{self.base}: {exc.reason}") from None

    def _object(self, key: str) -> str:
        from urllib.parse import quote

        return f"/storage/v1/b/{quote(self.bucket, safe='')}/o/{quote(key, safe='')}"

    def _upload(self, key: str, body: bytes, generation: str) -> str | None:
        from urllib.parse import quote

        boundary = hashlib.sha256(body).hexdigest()
        data = (
            (
                f"--{boundary}\r\nContent-Type: application/json\r\n\r\n{json.dumps({'name': key})}\r\n"
                f"--{boundary}\r\nContent-Type: application/json\r\n\r\n"
            ).encode()
            + body
            + f"\r\n--{boundary}--\r\n".encode()
        )
        status, answer = self._call(
            "POST",
            f"/upload/storage/v1/b/{quote(self.bucket, safe='')}/o?uploadType=multipart&ifGenerationMatch={generation}",
            data,
            {"Content-Type": f"multipart/related; boundary={boundary}"},
        )
        if status == 412:
            return None
        if status != 200:
            raise OSError(f"gs://{self.bucket}/{key}: HTTP {status}: {answer[:200]!r}")
        return str(json.loads(answer)["generation"])

    def create(self, key, body):
        return self._upload(key, body, "0")  # generation 0: only where no object is

    def read(self, key):
        status, answer = self._call("GET", self._object(key))
        if status == 404:
            return None
        if status != 200:
            raise OSError(f"gs://{self.bucket}/{key}: HTTP {status}: {answer[:200]!r}")
        generation = str(json.loads(answer)["generation"])
        status, body = self._call("GET", f"{self._object(key)}?alt=media&generation={generation}")
        if status == 404:
            return None  # replaced or deleted in between: as good as not there (the caller asks again)
        if status != 200:
            raise OSError(f"gs://{self.bucket}/{key}: HTTP {status}: {body[:200]!r}")
        return body, generation

    def replace(self, key, body, token):
        return self._upload(key, body, token)

    def delete(self, key, token):
        status, answer = self._call("DELETE", f"{self._object(key)}?ifGenerationMatch={token}")
        if status not in (200, 204, 404, 412):  # 412: no longer this run's; not deleted
            raise OSError(f"gs://{self.bucket}/{key}: HTTP {status}: {answer[:200]!r}")


def _holder(record: dict) -> str:
    return f"pid {record.get('pid')} on {record.get('host')}, started {record.get('started')}"


def _gone(record: dict, now: float) -> str | None:
    """Why the lease's holder is gone (no renewal for LEASE_STALE_S; a dead process on this machine),
    or None while it may be running."""
    if now - float(record.get("renewed", 0)) > LEASE_STALE_S:
        return f"not renewed for {(now - float(record.get('renewed', 0))) / 60:.0f} minutes"
    if record.get("host") == socket.gethostname():
        try:
            os.kill(int(record.get("pid", 0)), 0)
        except ProcessLookupError:
            return "its process is gone"
        except (PermissionError, ValueError, OverflowError):
            pass
    return None


class Lease:
    """This run's hold on the run folder at `uri` across machines (`take`, `release`), renewed by a
    thread while held. `say` tells what was found (a lease taken over, a store that cannot guard)."""

    def __init__(self, uri: str, say=lambda message: None):
        scheme, rest = uri.split("://", 1)
        bucket, _, prefix = rest.partition("/")
        self.uri, self.key, self.say = uri, posixpath.join(prefix.rstrip("/"), LEASE), say
        self.scheme, self.bucket = scheme.lower(), bucket
        self.record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "renewed": time.time(),
        }
        self.store: _Conditional | None = None
        self.token: str | None = None
        self.stop = threading.Event()
        self.renewer: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps(self.record).encode()

    def take(self) -> None:
        """Hold the lease, or LeaseHeld naming the live run that does. A store that cannot write
        conditionally (no SDK installed, a store that refuses the condition) is said, and the run goes
        on unguarded; a store that does not answer is a StoreError."""
        try:
            self.store = _S3Conditional(self.bucket) if self.scheme == "s3" else _GcsConditional(self.bucket)
            self.token = self._claim()
        except (ImportError, _Unsupported) as exc:
            self.say(f"[yellow]{self.uri}: not guarded against a run on another machine ({exc})[/yellow]")
            self.store = None
            return
        except OSError as exc:
            raise StoreError(f"{self.uri}: could not take the run folder's lease {LEASE}: {exc}") from None
        self.renewer = threading.Thread(target=self._renew, name="lease", daemon=True)
        self.renewer.start()

    def _claim(self) -> str:
        for _ in range(3):  # a lease deleted or replaced between two calls: ask again
            token = self.store.create(self.key, self._body())
            if token is not None:
                return token
            found = self.store.read(self.key)
            if found is None:
                continue
            try:
                record = json.loads(found[0])
            except ValueError:
                record = None
            if not isinstance(record, dict):
                record = {}  # not a lease this code wrote: as good as stale
            gone = _gone(record, time.time())
            if gone is None:
                raise LeaseHeld(
                    f"{self.uri} is in use by {_holder(record)} (its lease {LEASE}); wait for that run "
                    f"to end, or use another --out"
                )
            token = self.store.replace(self.key, self._body(), found[1])
            if token is not None:
                self.say(
                    f"[yellow]{self.uri}: an earlier run ({_holder(record)}) is gone ({gone}); taking over[/yellow]"
                )
                return token
        raise LeaseHeld(f"{self.uri}: its lease {LEASE} kept changing under this run; another run is starting there")

    def _renew(self) -> None:
        while not self.stop.wait(LEASE_RENEW_S):
            self.record["renewed"] = time.time()
            try:
                token = self.store.replace(self.key, self._body(), self.token)
            except OSError:
                continue  # the store did not answer this time: the lease stays fresh for LEASE_STALE_S
            if token is None:
                self.say(f"[red]{self.uri}: this run's lease {LEASE} was taken over by another run[/red]")
                self.token = None
                return
            self.token = token

    def release(self) -> None:
        """Stop renewing and delete the lease, unless another run took it over."""
        self.stop.set()
        if self.renewer is not None:
            self.renewer.join()
        if self.store is not None and self.token is not None:
            try:
                self.store.delete(self.key, self.token)
            except OSError as exc:
                self.say(f"[yellow]{self.uri}: could not release the lease {LEASE}: {exc}[/yellow]")
            self.token = None
