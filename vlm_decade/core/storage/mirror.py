"""A run folder kept in a bucket, worked on in a local working copy (`working_copy`) that a `Mirror`
keeps in step with the bucket. An object store cannot rename, append or lock, which is what the run
folder's guarantees rest on; so each part of an incremental stage is uploaded as soon as it is
saved, and every manifest save uploads whatever else changed, the manifest last, so the manifest in
the bucket only ever names objects already there; an object is written whole or not at all. A run
on another machine (or after the working copy is lost) first downloads what the bucket holds and
resumes from it, verifying every table and part as a local run does (docs/cluster.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from pyarrow import fs

from vlm_decade.core.errors import StoreError
from vlm_decade.core.files import atomic_file, atomic_write_bytes
from vlm_decade.core.storage.objects import locate

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
        self.store, self.prefix = locate(self.uri)

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
