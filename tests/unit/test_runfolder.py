"""The run folder trusts nothing because it exists: damaged tables, parts and manifests are found
and set right; one run holds a folder at a time; files follow the umask."""

import json
import os
import re
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from vlm_decade.core import runfolder
from vlm_decade.core.config import RuntimeConfig
from vlm_decade.core.fingerprints import table_fingerprint
from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import STAMP_NS, RunFolder, RunFolderBusy, segments_record
from vlm_decade.core.runner import Stage, StudyRun, Written
from vlm_decade.core.runtime import LazyRay


class Said(list):
    def __call__(self, message):
        self.append(message)


def _run(folder):
    reporter = Reporter(quiet=True)
    said = Said()
    reporter.say = said
    folder.say = said
    return StudyRun(folder, reporter, LazyRay(RuntimeConfig())), said


def _stage(calls, value=1):
    def compute(run):
        calls.append(1)
        return {"t": pa.table({"x": [value, value + 1, value + 2]})}

    return Stage("t", (), {}, compute)


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "emptied": lambda p: p.write_bytes(b""),
    "edited": lambda p: pq.write_table(pa.table({"x": [7, 8, 9]}), p),
    "one byte": lambda p: p.write_bytes(p.read_bytes()[:-9] + bytes([p.read_bytes()[-9] ^ 1]) + p.read_bytes()[-8:]),
}


def _damaged_and_done_again(tmp_path, damage: str, make_stage, damaged: Path) -> list[str]:
    """Run the stage (once: a second run skips it), damage a file of its table, run it again:
    it runs again; what the run said."""
    run, _ = _run(RunFolder(tmp_path))
    calls = []
    assert run.run_stage(make_stage(calls))
    assert not run.run_stage(make_stage(calls))
    DAMAGE[damage](damaged)
    run, said = _run(RunFolder(tmp_path))
    assert run.run_stage(make_stage(calls)) and len(calls) == 2
    return said


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_table_is_found_and_its_stage_done_again(tmp_path, damage):
    said = _damaged_and_done_again(tmp_path, damage, _stage, RunFolder(tmp_path).table_path("t"))
    assert any("does not match the hash recorded" in m for m in said)
    assert RunFolder(tmp_path).read("t").column("x").to_pylist() == [1, 2, 3]


def _segmented_stage(calls, pieces=([1, 2], [3], [4, 5, 6])):
    """A stage whose table `s` is written as segments, one per piece."""

    def compute(run):
        calls.append(1)
        segments = [
            run.folder.write_segment("s", k + 1, pa.schema([("x", pa.int64())]), pa.table({"x": xs}).to_batches())
            for k, xs in enumerate(pieces)
        ]
        return {"s": Written(**segments_record(segments))}

    return Stage("s", (), {}, compute)


def test_a_segmented_table_reads_as_one_and_records_each_segment(tmp_path):
    folder = RunFolder(tmp_path)
    run, _ = _run(folder)
    assert run.run_stage(_segmented_stage([]))
    assert folder.read("s").column("x").to_pylist() == [1, 2, 3, 4, 5, 6] and folder.num_rows("s") == 6
    record = folder.manifest()["files"]["s"]
    assert [s["name"] for s in record["segments"]] == [f"segment-00000{k}.parquet" for k in (1, 2, 3)]
    for segment in record["segments"]:  # each records its own rows' fingerprint
        assert segment["fingerprint"] == table_fingerprint(pq.read_table(tmp_path / "s" / segment["name"]))


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_segment_is_found_and_its_stage_done_again(tmp_path, damage):
    said = _damaged_and_done_again(tmp_path, damage, _segmented_stage, tmp_path / "s" / "segment-000002.parquet")
    assert any("s/segment-000002.parquet does not match the hash recorded" in m for m in said)
    assert RunFolder(tmp_path).read("s").column("x").to_pylist() == [1, 2, 3, 4, 5, 6]


def test_a_segmented_table_is_rebuilt_into_an_unreadable_manifest_from_its_segments(tmp_path):
    folder = RunFolder(tmp_path)
    run, _ = _run(folder)
    run.run_stage(_segmented_stage([]))
    good = folder.manifest()
    folder.manifest_path.write_text("{")
    with folder.lock():
        rebuilt = folder.manifest()
    assert rebuilt["tables"] == good["tables"] and rebuilt["files"] == good["files"]
    # One damaged segment, and the table is not rebuilt: it is done again.
    DAMAGE["edited"](tmp_path / "s" / "segment-000003.parquet")
    folder.manifest_path.write_text("{")
    with folder.lock():
        assert "s" not in folder.manifest()["tables"]


def test_what_a_segmented_table_no_longer_records_is_removed_and_nothing_else(tmp_path):
    folder = RunFolder(tmp_path)
    fingerprint, record = folder.write("s", pa.table({"x": [0]}))  # as an earlier version wrote it
    folder.save_manifest({"tables": {"s": fingerprint}, "files": {"s": record}})
    stray = folder.write_segment("s", 1, pa.schema([("x", pa.int64())]), [])
    folder.prune_segments("s")  # a segment the manifest does not record: a killed run's
    assert folder.table_path("s").exists() and not folder.segmented("s")
    written = segments_record([folder.write_segment("s", 2, pa.schema([("x", pa.int64())]), [])])
    folder.save_manifest({"tables": {"s": written["fingerprint"]}, "files": {"s": written["file"]}})
    folder.prune_segments("s")
    assert not folder.table_path("s").exists() and [p.name for p in folder.segments("s")] == ["segment-000002.parquet"]
    assert stray["name"] == "segment-000001.parquet" and folder.verified("s", written["file"]) is None


def test_a_damaged_table_is_not_resumed_from(tmp_path):
    folder = RunFolder(tmp_path)
    fp, record = folder.write("t", pa.table({"x": [1]}))
    folder.save_manifest({"tables": {"t": fp}, "files": {"t": record}})
    assert folder.previous("t").column("x").to_pylist() == [1]
    DAMAGE["edited"](folder.table_path("t"))
    assert folder.previous("t") is None


def test_a_damaged_part_is_discarded_and_whole_ones_kept(tmp_path):
    said = Said()
    folder = RunFolder(tmp_path, say=said)
    schema = pa.schema([("x", pa.int64())])
    folder.append_part("t", pa.table({"x": [1, 2]}))
    folder.append_part("t", pa.table({"x": [3]}))
    first = sorted((tmp_path / ".parts" / "t").iterdir())[0]
    DAMAGE["truncated"](first)
    assert folder.read_parts("t", schema).column("x").to_pylist() == [3]
    assert not first.exists() and any("damaged" in m for m in said)


def test_a_files_row_groups_tell_their_ranges_from_the_footer_and_a_damaged_one_none(tmp_path):
    folder = RunFolder(tmp_path)
    keys = [f"{i:02x}{'a' * 62}" for i in (7, 3, 200, 90, 91, 10)]
    folder.write_batches(
        "t",
        pa.schema([("key", pa.string()), ("n", pa.int64())]),
        [pa.record_batch({"key": keys, "n": [5, None, 1, 2, 3, 4]})],
        row_group_rows=2,
    )
    path = folder.table_path("t")
    table = pq.read_table(path)
    expected = []
    for lo in range(0, 6, 2):  # computed from the rows themselves
        group = table.slice(lo, 2)
        expected.append({c: tuple(pc.min_max(group[c]).as_py().values()) for c in ("key", "n")})
    assert folder.column_ranges(path, ["key", "n"]) == expected
    assert expected[0]["key"] == (keys[1], keys[0]) and expected[0]["n"] == (5, 5)
    read = [key for batch in folder.file_batches(path, row_groups=[0, 2]) for key in batch["key"].to_pylist()]
    assert read == keys[:2] + keys[4:]
    # A table's batches, but the row groups whose ranges rule them out (a group with 5 in range)
    within = lambda ranges: ranges["n"] is not None and ranges["n"][0] <= 5 <= ranges["n"][1]  # noqa: E731
    read = [key for batch in folder.batches("t", touches=within, ranged=["n"]) for key in batch["key"].to_pylist()]
    assert read == keys[:2]
    assert [b.num_rows for b in folder.batches("t", touches=lambda ranges: False, ranged=["n"])] == []
    path.write_bytes(path.read_bytes()[:-20])  # the footer cut off
    assert folder.column_ranges(path, ["key"]) is None


def test_an_unreadable_manifest_is_set_aside_and_rebuilt_from_what_verifies(tmp_path):
    folder = RunFolder(tmp_path)
    run, _ = _run(folder)
    run.run_stage(_stage([]))
    run.run_stage(Stage("u", ("t",), {}, lambda r: {"u": pa.table({"y": ["a"]})}))
    good = folder.manifest()
    DAMAGE["edited"](folder.table_path("u"))
    folder.manifest_path.write_text(folder.manifest_path.read_text()[:40])
    with pytest.raises(ValueError, match="not readable as JSON"):
        RunFolder(tmp_path).manifest()  # reading alone changes nothing
    assert not list(tmp_path.glob("manifest.json.unreadable-*"))
    run, said = _run(RunFolder(tmp_path))
    with run.folder.lock():
        rebuilt = run.folder.manifest()
    assert rebuilt["tables"] == {"t": good["tables"]["t"]} and rebuilt["files"] == {"t": good["files"]["t"]}
    assert len(list(tmp_path.glob("manifest.json.unreadable-*"))) == 1
    assert any("could not be read" in m for m in said)
    calls = []
    with run.folder.lock():
        assert run.run_stage(_stage(calls)) and calls  # no stage record survives: it runs again


def test_one_run_at_a_time_and_a_dead_holder_is_taken_over(tmp_path):
    folder = RunFolder(tmp_path)
    with folder.lock():
        with pytest.raises(RunFolderBusy, match=f"pid {os.getpid()}"):
            with RunFolder(tmp_path).lock():
                pass
    (tmp_path / ".lock").write_text("pid 99999999 on elsewhere")  # left by a killed run: no lock held
    said = Said()
    with RunFolder(tmp_path, say=said).lock():
        pass
    assert any("pid 99999999 on elsewhere" in m and "taking over" in m for m in said)


def test_files_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        folder = RunFolder(tmp_path)
        folder.write("t", pa.table({"x": [1]}))
        folder.save_manifest({})
        with folder.lock():
            pass
        for path in (folder.table_path("t"), folder.manifest_path, tmp_path / ".lock"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_the_manifest_records_fingerprint_and_file_hash(tmp_path):
    folder = RunFolder(tmp_path)
    run, _ = _run(folder)
    run.run_stage(_stage([]))
    manifest = json.loads(folder.manifest_path.read_text())
    assert set(manifest["files"]["t"]) == {"sha256", "bytes", "mtime_ns"} and len(manifest["tables"]["t"]) == 64
    assert folder.self_verified("t") == (manifest["tables"]["t"], manifest["files"]["t"])


NASTY = [
    "../../../../x",
    "/etc/passwd",
    "..",
    ".",
    "",
    "a/b",
    "a\\b",
    "con",
    ".hidden",
    "x" * 300,
    "naïve café",
    "\x00nul",
    "ok-name_1.2",
]


@pytest.mark.parametrize("name", NASTY)
def test_safe_name_stays_one_plain_file_inside_the_folder(tmp_path, name):
    from vlm_decade.core.files import safe_name

    safe = safe_name(name)
    assert re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,79}", safe), safe
    folder = RunFolder(tmp_path / "run")
    path = folder.file("figures", f"similarity_{safe}.png")
    assert path.parent == tmp_path / "run" / "figures"
    if name == "ok-name_1.2":
        assert safe == name  # a plain name is kept as it is


def test_distinct_names_never_share_a_file():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from vlm_decade.core.files import safe_name

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=40), st.text(max_size=40))
    def check(a, b):
        if a != b:
            assert safe_name(a) != safe_name(b)

    check()


def test_a_path_outside_the_run_folder_is_refused(tmp_path):
    folder = RunFolder(tmp_path / "run")
    for parts in (("..", "x"), ("figures", "..", "..", "x"), ("/abs",), ("",)):
        with pytest.raises(ValueError, match="not inside the run folder"):
            folder.file(*parts)


def test_a_write_interrupted_midway_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    from vlm_decade.core import files

    folder = RunFolder(tmp_path)
    folder.write("t", pa.table({"x": [1, 2, 3]}))
    before = folder.table_path("t").read_bytes()

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")  # the bytes are half on disk when this fails

    monkeypatch.setattr(files.os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        folder.write("t", pa.table({"x": [7, 8, 9]}))
    with pytest.raises(OSError):
        files.atomic_write_bytes(folder.manifest_path, b"{}")
    monkeypatch.undo()
    assert folder.table_path("t").read_bytes() == before
    assert not folder.manifest_path.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]  # no temporary left behind


def _responses(text, latency, queued):
    return pa.table(
        {
            "subject": ["m", "m"],
            "text": text,
            "latency_s": pa.array(latency, pa.float64()),
            "queued_s": pa.array(queued, pa.float64()),
        }
    )


def test_a_fingerprint_leaves_out_the_wall_clock_columns():
    """Two runs with the same answers give the same fingerprint however long they took; a changed
    answer changes it; and it is the fingerprint of the table without those columns."""
    from vlm_decade.core.fingerprints import table_fingerprint

    first = _responses(["a cat", "a dog"], [0.31, 1.7], [0.0, 2.5])
    again = _responses(["a cat", "a dog"], [5.02, 0.04], [None, 0.1])
    assert table_fingerprint(first) == table_fingerprint(again)
    assert table_fingerprint(first) != table_fingerprint(_responses(["a cat", "a bird"], [0.31, 1.7], [0.0, 2.5]))
    assert table_fingerprint(first) == table_fingerprint(first.drop_columns(["latency_s", "queued_s"]))


def test_a_table_of_rows_but_no_columns_has_a_fingerprint_of_its_row_count():
    """A comparison that leaves out every column (the same-tables test's) used to hang: pyarrow slices
    a table of no columns to the length asked, so the batching never ran out of rows."""
    from vlm_decade.core.fingerprints import FINGERPRINT_ROWS, table_fingerprint

    prints = {n: table_fingerprint(pa.table({"a": range(n)}).select([])) for n in (0, 3, FINGERPRINT_ROWS + 1)}
    assert len(set(prints.values())) == 3
    assert prints[3] == table_fingerprint(pa.Table.from_batches([pa.record_batch({"b": [1, 2, 3]})]).select([]))


def test_a_table_written_in_pieces_carries_the_fingerprint_without_the_wall_clock(tmp_path):
    from vlm_decade.core.fingerprints import table_fingerprint

    folder = RunFolder(tmp_path)
    table = _responses(["a cat", "a dog"], [0.31, 1.7], [0.0, 2.5])
    fingerprint, record = folder.write("responses", table)
    assert fingerprint == table_fingerprint(table.drop_columns(["latency_s", "queued_s"]))
    assert folder.read("responses").equals(table)  # the columns are kept in the table, only not hashed
    assert folder.self_verified("responses") == (fingerprint, record)


def test_a_run_that_cannot_begin_releases_the_folder_at_once(tmp_path, monkeypatch):
    """A working copy whose store fails while the run records itself (after the pull, under the
    lock): the StoreError comes out of `open_run`, the lock is released then (not when the lock's
    generator is collected, which printed "Exception ignored in: <generator RunFolder.lock>" and a
    traceback after the message), and a later run can take the folder."""
    import gc
    import sys

    from vlm_decade.core import storage
    from vlm_decade.core.config import ModelConfig, StudyBase
    from vlm_decade.core.errors import StoreError
    from vlm_decade.core.runner import open_run

    monkeypatch.setenv("VLM_DECADE_WORKING_COPIES", str(tmp_path))
    copy = storage.working_copy("s3://bucket/run")

    def offline(self, root):  # a mirror that never reaches a store
        self.root, self.uri = root, "s3://bucket/run"

    monkeypatch.setattr(storage.Mirror, "__init__", offline)
    monkeypatch.setattr(storage.Mirror, "check", lambda self: None)
    monkeypatch.setattr(storage.Mirror, "pull", lambda self: 0)
    monkeypatch.setattr(storage.Lease, "take", lambda self: None)  # nor a lease

    def push(self, paths=None):
        raise StoreError("s3://bucket/run: could not save the working copy there: the store went away")

    monkeypatch.setattr(storage.Mirror, "push", push)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    study = StudyBase(name="s", models=[ModelConfig(name="m", backend="imported", model_id="m")], output=copy)
    with pytest.raises(StoreError, match="the store went away"):
        open_run(study, Reporter(quiet=True), "")
    gc.collect()
    assert unraisable == []
    assert (copy / ".lock").read_text() == ""  # released: the holder's name is cleared
    monkeypatch.setattr(storage.Mirror, "push", lambda self, paths=None: 0)  # the store is back
    with RunFolder(copy).lock():
        pass


def _counting_hashes(monkeypatch) -> list[str]:
    hashed = []
    real = runfolder.file_sha256
    monkeypatch.setattr(runfolder, "file_sha256", lambda path: hashed.append(Path(path).name) or real(path))
    return hashed


def _same_size_edit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-9] ^= 1  # inside the footer: the file no longer hashes the same
    path.write_bytes(bytes(data))


def test_an_unchanged_table_is_trusted_by_its_size_and_time_and_hashed_on_rehash(tmp_path, monkeypatch):
    folder = RunFolder(tmp_path)
    _, record = folder.write("t", pa.table({"x": [1, 2, 3]}))
    hashed = _counting_hashes(monkeypatch)
    assert folder.verified("t", record) is None and hashed == []  # as written: not read again
    assert RunFolder(tmp_path, rehash=True).verified("t", record) is None and hashed == ["t.parquet"]
    # Bytes changed and the time put back as recorded: only a rehash can tell (the limit of the rule).
    _same_size_edit(folder.table_path("t"))
    os.utime(folder.table_path("t"), ns=(record["mtime_ns"], record["mtime_ns"]))
    assert folder.verified("t", record) is None
    assert "does not match the hash" in RunFolder(tmp_path, rehash=True).verified("t", record)


def test_a_change_in_the_clock_tick_of_the_write_is_still_found(tmp_path):
    """A write just after the table's gets the file system's time of the same coarse clock tick: the
    time it had before the record set it past (`STAMP_NS`), never the recorded one."""
    folder = RunFolder(tmp_path)
    _, record = folder.write("t", pa.table({"x": [1, 2, 3]}))
    path = folder.table_path("t")
    _same_size_edit(path)
    same_tick = record["mtime_ns"] - STAMP_NS
    os.utime(path, ns=(same_tick, same_tick))
    assert path.stat().st_size == record["bytes"]
    assert "does not match the hash recorded" in folder.verified("t", record)


def test_a_file_system_without_nanoseconds_records_no_time_and_is_always_hashed(tmp_path, monkeypatch):
    monkeypatch.setattr(runfolder.os, "utime", lambda path, ns: None)  # the time set is not kept
    folder = RunFolder(tmp_path)
    _, record = folder.write("t", pa.table({"x": [1, 2, 3]}))
    assert "mtime_ns" not in record
    hashed = _counting_hashes(monkeypatch)
    assert folder.verified("t", record) is None and hashed == ["t.parquet"]
    _same_size_edit(folder.table_path("t"))
    assert "does not match the hash recorded" in folder.verified("t", record)
