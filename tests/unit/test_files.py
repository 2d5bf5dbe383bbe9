"""The one file writer: a file is the old one or the new one, synced before it takes the name, with
the mode the umask gives; file hashes are sha256 of the bytes (safe names: test_runfolder.py)."""

import hashlib
import os
import stat

import pytest

from vlm_decade.core import files, storage
from vlm_decade.core.files import atomic_file, atomic_write_bytes, file_sha256, write_if_changed


@pytest.fixture
def umask():
    """Set the process's umask for one test (as a user's shell would), and put it back."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)])
def test_a_written_file_has_the_mode_the_umask_gives(tmp_path, umask, mask, mode):
    umask(mask)
    atomic_write_bytes(tmp_path / "new.bin", b"x")
    (tmp_path / "old.bin").write_bytes(b"x")  # a file made the ordinary way, for comparison
    atomic_write_bytes(tmp_path / "old.bin", b"y")  # replacing a file gives it the mode of a new one
    assert stat.S_IMODE((tmp_path / "new.bin").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "old.bin").stat().st_mode) == mode


def test_a_working_copys_record_follows_the_umask(tmp_path, umask, monkeypatch):
    """`.mirror.json` was made 0600 by a writer of its own; it is the one writer's now."""
    umask(0o022)
    monkeypatch.setenv("VLM_DECADE_WORKING_COPIES", str(tmp_path))
    record = storage.working_copy("s3://bucket/run") / storage.MIRROR_FILE
    assert stat.S_IMODE(record.stat().st_mode) == 0o644


def test_the_content_is_synced_before_it_takes_the_name_and_the_folder_after(tmp_path, monkeypatch):
    path = tmp_path / "t.bin"
    path.write_bytes(b"old")
    reader = open(path, "rb")  # a reader that opened the old file keeps reading all of it
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        events.append(
            (
                "fsync",
                os.path.basename(target) if target != str(tmp_path) else "folder",
                open(target, "rb").read() if os.path.isfile(target) else None,
            )
        )
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.basename(dst), None))
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    atomic_write_bytes(path, b"new content")
    monkeypatch.undo()
    [synced, renamed, folder] = events
    assert (
        synced[0] == "fsync"
        and synced[1].startswith(".t.bin.")
        and synced[1].endswith(".tmp")
        and synced[2] == b"new content"
    )
    assert renamed == ("replace", "t.bin", None) and folder == ("fsync", "folder", None)
    assert path.read_bytes() == b"new content" and reader.read() == b"old"
    reader.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.bin"]


@pytest.mark.parametrize("failure", ["in the block", "at fsync"])
def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, failure):
    path = tmp_path / "t.bin"
    path.write_bytes(b"old")
    if failure == "at fsync":

        def full(fd):
            raise OSError(28, "No space left on device")  # half the bytes are on disk when this fails

        monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        with atomic_file(path) as fh:
            fh.write(b"new and longer than the old")
            if failure == "in the block":
                raise OSError(28, "No space left on device")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.bin"]


def test_a_file_is_written_into_a_folder_made_for_it(tmp_path):
    atomic_write_bytes(tmp_path / "a" / "b" / "c.json", b"{}")
    assert (tmp_path / "a" / "b" / "c.json").read_bytes() == b"{}"


def test_unchanged_bytes_are_not_written_again(tmp_path):
    path = tmp_path / "t.csv"
    assert write_if_changed(path, b"a,b\n")
    inode = path.stat().st_ino
    assert not write_if_changed(path, b"a,b\n") and path.stat().st_ino == inode
    assert write_if_changed(path, b"a,c\n") and path.read_bytes() == b"a,c\n"


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 1 << 20, 3 * (1 << 20) + 17])
def test_a_files_hash_is_the_sha256_of_its_bytes(tmp_path, size):
    data = hashlib.shake_256(str(size).encode()).digest(size) if size else b""
    (tmp_path / "f").write_bytes(data)
    assert file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()
