"""One run per run-folder URI across machines: the bucket's lease object, taken, renewed and
released by conditional writes (S3's If-None-Match and If-Match, GCS's ifGenerationMatch), which
pyarrow's file systems do not offer, so each store's own API is spoken here.

A working copy's `.lock` holds on one machine only. Across machines the run holds a lease object,
`<run folder>/.lease`, created only where none is (S3: PutObject with If-None-Match: *; GCS: an
upload with ifGenerationMatch=0), renewed every LEASE_RENEW_S by overwriting it only while it is
still the version this run wrote (S3 If-Match, GCS ifGenerationMatch), and deleted at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import socket
import threading
import time

from vlm_decade.core.errors import StoreError
from vlm_decade.core.storage.objects import gcs_emulator

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
        emulator = gcs_emulator()
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
