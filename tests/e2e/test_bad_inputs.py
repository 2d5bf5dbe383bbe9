"""A corpus of bad inputs walked through `validate`, `run`, `estimate`, `masks` and `report`: each ends
with exit status 2 (the input) or 1 (the environment), a message naming the file, row and field
where there is one, no traceback, and nothing written outside the output folder (the folders around
it are listed before and after); a refused run writes nothing at all.

The corpus runs in-process (typer's runner, through the same handler as the installed command);
a sample runs as a subprocess too, as a user would, to show the real entry point prints no traceback.
"""

from __future__ import annotations

import errno
import io
import os
import re
import shutil
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from PIL import Image
from typer.testing import CliRunner

from vlm_decade import cli

from .conftest import vlm_decade

pytestmark = pytest.mark.e2e

FIFOS = hasattr(os, "mkfifo")


# --- ways to damage a copy of the demo's inputs (Study A in the folder, Study B in openworld/) ----------


def replace(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count), encoding="utf-8")


def line_of(path: Path, start: str) -> int:
    """The 1-based line (= spreadsheet row, for one-line rows) that starts with `start`."""
    return next(n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.startswith(start))


def png(array: np.ndarray) -> bytes:
    """A 16-bit gray PNG written by hand."""
    height, width = array.shape
    raw = b"".join(b"\x00" + array[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def bomb() -> bytes:
    """A PNG header claiming 20,000 x 20,000 pixels over a few bytes."""
    whole = png(np.zeros((1, 1), np.uint16))
    header = struct.pack(">IIBBBBB", 20_000, 20_000, 8, 0, 0, 0, 0)
    ihdr = struct.pack(">I", 13) + b"IHDR" + header + struct.pack(">I", zlib.crc32(b"IHDR" + header) & 0xFFFFFFFF)
    return whole[:8] + ihdr + whole[33:]


def float_tiff(values) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.array(values, dtype=np.float32)).save(buf, format="TIFF")
    return buf.getvalue()


def truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def to_parquet(d: Path, table: str, change: Callable[[pa.Table], pa.Table]) -> None:
    """Study A's `table` as Parquet, changed, and the study file pointed at it."""
    t = change(
        pacsv.read_csv(
            d / f"{table}.csv",
            convert_options=pacsv.ConvertOptions(strings_can_be_null=False, column_types={"worker_id": pa.string()}),
        )
    )
    pq.write_table(t, d / f"{table}.parquet")
    replace(d / "study.yaml", f"{table}: {table}.csv", f"{table}: {table}.parquet")


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def study_line(d: Path, old: str, new: str) -> None:
    replace(d / "study.yaml", old, new)


@dataclass
class Case:
    damage: Callable[[Path], None]
    says: list[str]  # fragments the message must hold (file, row, field where there are some)
    commands: tuple[str, ...] = ("validate", "run", "estimate")
    study: str = "study.yaml"
    status: int = 2
    args: list[str] = field(default_factory=list)  # extra arguments, {d} = the inputs folder, {out} = the output
    needs_fifo: bool = False


ROW_W03 = "row 4"  # astronaut-w03, the third description (the header is row 1)
CASES: dict[str, Case] = {
    # images
    "corrupt image": Case(
        lambda d: (d / "images" / "coffee.png").write_bytes(b"not a png"),
        ["images.csv", "row 3", "field 'file'", "coffee.png"],
    ),
    "truncated image": Case(
        lambda d: truncated(d / "images" / "coffee.png"),
        ["images.csv", "row 3", "field 'file'", "not a readable image"],
    ),
    "float image with no known scale": Case(
        lambda d: (d / "images" / "coffee.png").write_bytes(float_tiff([[-2.0, 7.5]])),
        ["images.csv", "row 3", "field 'file'", "no faithful 8-bit reading"],
    ),
    "decompression bomb": Case(
        lambda d: (d / "images" / "coffee.png").write_bytes(bomb()),
        ["images.csv", "row 3", "field 'file'", "decompression bomb"],
    ),
    "image path is a FIFO": Case(
        lambda d: fifo(d / "images" / "coffee.png"), ["images.csv", "row 3", "field 'file'", "FIFO"], needs_fifo=True
    ),
    "image path is a folder": Case(
        lambda d: ((d / "images" / "coffee.png").unlink(), (d / "images" / "coffee.png").mkdir()),
        ["images.csv", "row 3", "field 'file'", "folder"],
    ),
    # tables
    "images table is a FIFO": Case(lambda d: fifo(d / "images.csv"), ["images.csv", "FIFO"], needs_fifo=True),
    "unterminated quote": Case(
        lambda d: replace(d / "descriptions.csv", ",An astronaut.\n", ',"An astronaut.\n'),
        ["descriptions.csv", ROW_W03],
    ),
    "quote swallowing rows": Case(
        lambda d: (
            replace(d / "descriptions.csv", ",An astronaut.\n", ',"An astronaut.\n')
            or replace(
                d / "descriptions.csv",
                "lady astronaut smiling for her photo in an orange suit\n",
                'lady astronaut smiling for her photo in an orange suit"\n',
            )
        ),
        ["descriptions.csv", ROW_W03, "field 'text'", "closes only at line 5"],
    ),
    "NUL byte in a text": Case(
        lambda d: replace(d / "descriptions.csv", ",An astronaut.", ",An astro\x00naut."),
        ["descriptions.csv", ROW_W03, "field 'text'", "NUL"],
    ),
    "UTF-16 table": Case(
        lambda d: (d / "votes.csv").write_bytes((d / "votes.csv").read_text().encode("utf-16")), ["votes.csv", "UTF-16"]
    ),
    "Latin-1 bytes": Case(
        lambda d: (d / "descriptions.csv").write_bytes(
            (d / "descriptions.csv").read_bytes().replace(b",An astronaut.", b",An astronaut\xe9.")
        ),
        ["descriptions.csv", ROW_W03, "field 'text'", "UTF-8"],
    ),
    "missing column": Case(
        lambda d: replace(d / "descriptions.csv", "description_id,", "descr_id,"),
        ["descriptions.csv", "row 1", "field 'description_id'"],
    ),
    "Parquet binary paths": Case(
        lambda d: to_parquet(d, "images", lambda t: t.set_column(2, "file", t["file"].cast(pa.binary()))),
        ["images.parquet", "row 1", "field 'file'", "binary"],
    ),
    "Parquet float ids": Case(
        lambda d: to_parquet(
            d, "descriptions", lambda t: t.set_column(2, "worker_id", pa.array([float(i) for i in range(t.num_rows)]))
        ),
        ["descriptions.parquet", "row 1", "field 'worker_id'", "double"],
    ),
    "Parquet list ids": Case(
        lambda d: to_parquet(
            d, "images", lambda t: t.set_column(0, "image_id", pa.array([[i] for i in t["image_id"].to_pylist()]))
        ),
        ["images.parquet", "row 1", "field 'image_id'", "list<"],
    ),
    "vote on an unknown image": Case(
        lambda d: replace(d / "votes.csv", "\nastronaut,", "\nastronot,"),
        ["votes.csv", "row 2", "field 'image_id'", "astronot"],
    ),
    "caption of an unknown image": Case(
        lambda d: replace(d / "imported_captions.csv", "\nastronaut,", "\nastronot,"),
        ["imported_captions.csv", "row 2", "field 'image_id'", "astronot"],
    ),
    "imported file is a folder": Case(
        lambda d: ((d / "imported_captions.csv").unlink(), (d / "imported_captions.csv").mkdir()),
        ["imported_captions.csv", "folder"],
    ),
    "rating off the scale": Case(
        lambda d: replace(d / "ratings.csv", "s01,demo-imported,astronaut,3", "s01,demo-imported,astronaut,9"),
        ["ratings.csv", "row 2", "field 'rating'"],
    ),
    # the study file
    "models: 5": Case(
        lambda d: study_line(d, "models:\n", "models: 5\nx-unused:\n"), ["study.yaml", "field 'models'", "got 5"]
    ),
    "metrics: 7": Case(
        lambda d: study_line(d, "metrics:\n", "metrics: 7\nx-metrics:\n"), ["study.yaml", "field 'metrics'", "got 7"]
    ),
    "data.images: 5": Case(
        lambda d: study_line(d, "images: images.csv", "images: 5"), ["study.yaml", "field 'data.images'", "got 5"]
    ),
    # (`run --out` overrides `output`, so only the commands that read it from the file)
    "output: 5": Case(
        lambda d: study_line(d, "demo: true\n", "demo: true\noutput: 5\n"),
        ["study.yaml", "field 'output'"],
        commands=("validate", "estimate"),
    ),
    "options.file: 5": Case(
        lambda d: study_line(d, "options: {file: imported_captions.csv}", "options: {file: 5}"),
        ["study.yaml", "field 'models[1].options.file'", "got 5"],
    ),
    "a key given twice": Case(
        lambda d: study_line(d, "demo: true\n", "demo: true\nname: again\n"), ["study.yaml", "key 'name' appears twice"]
    ),
    "a blank model name": Case(
        lambda d: study_line(d, "name: demo-imported", "name: '   '"),
        ["study.yaml", "field 'models[1].name'", "whitespace"],
    ),
    "seed -1": Case(lambda d: study_line(d, "seed: 20261129", "seed: -1"), ["study.yaml", "field 'statistics.seed'"]),
    "seed 2**80": Case(
        lambda d: study_line(d, "seed: 20261129", f"seed: {2**80}"), ["study.yaml", "field 'statistics.seed'"]
    ),
    "n_resamples 1e10": Case(
        lambda d: study_line(d, "n_resamples: 10000", "n_resamples: 1.0e+10"),
        ["study.yaml", "field 'statistics.n_resamples'"],
    ),
    "unknown backend": Case(
        lambda d: study_line(d, "backend: imported", "backend: importd"),
        ["study.yaml", "field 'models[1].backend'", "importd"],
    ),
    "study file missing": Case(lambda d: (d / "study.yaml").unlink(), ["study.yaml", "not found"]),
    "study file is a folder": Case(
        lambda d: ((d / "study.yaml").unlink(), (d / "study.yaml").mkdir()), ["study.yaml", "folder"]
    ),
    "study file is a FIFO": Case(lambda d: fifo(d / "study.yaml"), ["study.yaml", "FIFO"], needs_fifo=True),
    "study file not YAML": Case(
        lambda d: (d / "study.yaml").write_text("name: [unclosed\n"), ["study.yaml", "not valid YAML"]
    ),
    "study file not a mapping": Case(lambda d: (d / "study.yaml").write_text("- a\n- b\n"), ["study.yaml", "mapping"]),
    "imported file lacks rows (--strict)": Case(
        lambda d: (d / "imported_captions.csv").write_text(
            "\n".join((d / "imported_captions.csv").read_text().splitlines()[:-8]) + "\n"
        ),
        ["study.yaml", "--strict", "model 'demo-imported'", "8 of the 64"],
        commands=("validate",),
        args=["--strict"],
    ),
    # Study B
    "Study B: unknown granularity": Case(
        lambda d: replace(d / "openworld" / "labels.csv", ",prototypical,", ",very-prototypical,"),
        ["labels.csv", "row 2", "field 'granularity'"],
        study="openworld/study.yaml",
    ),
    "Study B: corrupt image": Case(
        lambda d: (d / "openworld" / "images" / "cifar10_00_3.png").write_bytes(b"junk"),
        ["labels.csv", "row 2", "field 'file'"],
        study="openworld/study.yaml",
    ),
    "Study B: models: 5": Case(
        lambda d: replace(d / "openworld" / "study.yaml", "models:\n", "models: 5\nx-unused:\n"),
        ["study.yaml", "field 'models'"],
        study="openworld/study.yaml",
    ),
    # --out
    "--out is a file": Case(
        lambda d: (d / "afile").write_text("x"),
        ["afile", "exists and is not a folder"],
        commands=("run",),
        args=["--out", "{d}/afile"],
    ),
    "--out under a file": Case(
        lambda d: (d / "afile").write_text("x"),
        ["afile", "is a file, not a folder"],
        commands=("run",),
        args=["--out", "{d}/afile/run"],
    ),
}


@pytest.fixture
def place(pristine, tmp_path, monkeypatch):
    """A fresh copy of the inputs in tmp_path/inputs, the working folder tmp_path/cwd."""
    inputs = tmp_path / "inputs"
    shutil.copytree(pristine, inputs)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(cli.err, "width", 10_000)  # no wrapped lines: fragments stay whole
    return tmp_path


def listing(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


def invoke(args: list[str]):
    result = CliRunner().invoke(cli.app, args)
    said = " ".join(result.output.split())
    # An exception other than the exit would be a traceback from the installed command.
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception), said)
    assert "Traceback" not in result.output, said
    return result.exit_code, said


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_named_with_exit_2_and_nothing_written(name, place):
    case = CASES[name]
    if case.needs_fifo and not FIFOS:
        pytest.skip("no FIFOs here")
    inputs = place / "inputs"
    case.damage(inputs)
    out = place / "out" / "run"
    before = listing(place)
    for command in case.commands:
        extra = [a.format(d=inputs, out=out) for a in case.args]
        args = [command, str(inputs / case.study)]
        if command == "run" and "--out" not in extra:
            args += ["--out", str(out)]
        status, said = invoke(args + extra)
        assert status == case.status, (command, said)
        for fragment in case.says:
            assert fragment in said, (command, fragment, said)
        assert listing(place) == before, f"{command} wrote {sorted(listing(place) - before)}"


MASK_CASES = {
    "not an image": (
        lambda d: (d / "x.png").write_bytes(b"text"),
        "{d}/x.png",
        "{d}/masks",
        ["x.png", "not a readable image"],
    ),
    "truncated": (
        lambda d: (d / "x.png").write_bytes((d / "images" / "coffee.png").read_bytes()[:5000]),
        "{d}/x.png",
        "{d}/masks",
        ["x.png", "not a readable image"],
    ),
    "decompression bomb": (
        lambda d: (d / "x.png").write_bytes(bomb()),
        "{d}/x.png",
        "{d}/masks",
        ["x.png", "decompression bomb"],
    ),
    "missing": (lambda d: None, "{d}/nothing.png", "{d}/masks", ["nothing.png", "not found"]),
    "a FIFO": (
        lambda d: os.mkfifo(d / "x.png") if FIFOS else None,
        "{d}/x.png",
        "{d}/masks",
        ["x.png", "FIFO" if FIFOS else "not found"],
    ),
    "--out is a file": (
        lambda d: (d / "afile").write_text("x"),
        "{d}/images/coffee.png",
        "{d}/afile",
        ["afile", "exists and is not a folder"],
    ),
    "--out under a file": (
        lambda d: (d / "afile").write_text("x"),
        "{d}/images/coffee.png",
        "{d}/afile/masks",
        ["afile", "a file, not a folder"],
    ),
    "a bad --study": (
        lambda d: (d / "study.yaml").write_text("masks: {count: 0}\n"),
        "{d}/images/coffee.png",
        "{d}/masks",
        ["study.yaml", "field 'name'", "field 'masks.count'"],
    ),
}


@pytest.mark.parametrize("name", list(MASK_CASES))
def test_masks_refuses_what_it_cannot_read_or_write(name, place):
    damage, image, out, says = MASK_CASES[name]
    inputs = place / "inputs"
    damage(inputs)
    before = listing(place)
    args = ["masks", image.format(d=inputs), "--out", out.format(d=inputs)]
    if name == "a bad --study":
        args += ["--study", str(inputs / "study.yaml")]
    status, said = invoke(args)
    assert status == 2, said
    for fragment in says:
        assert fragment in said, (fragment, said)
    assert listing(place) == before


def test_masks_of_a_16_bit_image_are_not_white(place):
    values = (np.arange(48 * 64).reshape(48, 64) * 20).astype(np.uint16)
    (place / "deep.png").write_bytes(png(values))
    status, said = invoke(["masks", str(place / "deep.png"), "--out", str(place / "masks")])
    assert status == 0, said
    with Image.open(place / "masks" / "full.png") as full:
        assert np.array_equal(np.asarray(full)[:, :, 0], np.rint(values / 257.0).astype(np.uint8))


REPORT_CASES = {
    "truncated manifest": (
        lambda run: (run / "manifest.json").write_text('{"config": {"name": "x", '),
        ["manifest.json", "not readable as JSON"],
    ),
    "manifest not a mapping": (
        lambda run: (run / "manifest.json").write_text("[1, 2]"),
        ["manifest.json", "not a JSON object"],
    ),
    "config damaged": (
        lambda run: (run / "manifest.json").write_text('{"config": {"name": "x", "models": 5}}'),
        ["manifest.json", "field 'config.models'"],
    ),
    "config not a mapping": (
        lambda run: (run / "manifest.json").write_text('{"config": 5}'),
        ["manifest.json", "field 'config'"],
    ),
    "manifest is a folder": (lambda run: (run / "manifest.json").mkdir(), ["manifest.json", "folder"]),
    "no run folder": (lambda run: shutil.rmtree(run), ["manifest.json", "no run here"]),
}


@pytest.mark.parametrize("command", ["report", "status", "cancel", "view"])
@pytest.mark.parametrize("name", list(REPORT_CASES))
def test_a_command_on_a_damaged_manifest(name, command, place):
    """Every command that opens a run folder opens it one way: exit 2 naming the manifest, no
    traceback, nothing written."""
    damage, says = REPORT_CASES[name]
    run = place / "run"
    run.mkdir()
    damage(run)
    before = listing(place)
    status, said = invoke([command, str(run)])
    assert status == 2, said
    assert re.match(r"(1 problem|\d+ problems) in the input; nothing was run or written: - ", said), said
    assert str(run / "manifest.json") in said
    for fragment in says:
        assert fragment in said, (fragment, said)
    assert listing(place) == before


def test_a_full_disk_says_which_folder_and_what_was_kept(place, monkeypatch):
    """ENOSPC while a run writes its second table: exit 1, the folder named with its free space, the
    finished stages listed (a re-run skips them), nothing written elsewhere."""
    from vlm_decade.core import runfolder

    real = runfolder.RunFolder.write_batches

    def full_disk(self, name, schema, batches):
        if name == "references":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name, schema, batches)

    monkeypatch.setattr(runfolder.RunFolder, "write_batches", full_disk)
    out = place / "run"
    before = listing(place)
    status, said = invoke(["run", str(place / "inputs" / "study.yaml"), "--out", str(out)])
    assert status == 1, said
    assert f"no space left on the device holding {out}" in said
    assert "1 finished stage(s) (images)" in said and "run the same command again" in said
    assert all(p.startswith(str(out)) for p in listing(place) - before)
    assert not (out / "references.parquet").exists() and (out / "images.parquet").exists()


def test_an_unwritable_output_folder_is_named_before_any_work(place, monkeypatch):
    # As root every folder is writable, so the check is shown with os.access saying no.
    out = place / "locked" / "run"
    (place / "locked").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == place / "locked" else real(path, mode))
    status, said = invoke(["run", str(place / "inputs" / "study.yaml"), "--out", str(out)])
    assert status == 2 and "field '--out'" in said and "may not be written" in said
    assert not out.exists()


# --- the installed command, as a user runs it ---------------------------------------------------------

SAMPLE = [
    "corrupt image",
    "quote swallowing rows",
    "models: 5",
    "options.file: 5",
    "seed 2**80",
    "--out is a file",
    "Parquet float ids",
]


@pytest.mark.parametrize("name", SAMPLE)
def test_the_installed_command_prints_no_traceback(name, pristine, tmp_path):
    case = CASES[name]
    inputs = tmp_path / "inputs"
    shutil.copytree(pristine, inputs)
    case.damage(inputs)
    command = case.commands[-1]
    args = [command, str(inputs / case.study)] + [a.format(d=inputs) for a in case.args]
    if command == "run" and "--out" not in args:
        args += ["--out", str(tmp_path / "run")]
    before = listing(tmp_path)
    done = vlm_decade(*args, cwd=tmp_path)
    said = " ".join(done.stderr.split())
    assert done.returncode == case.status and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert all(fragment in said for fragment in case.says), said
    assert listing(tmp_path) == before


def test_the_ray_job_main_handles_the_same_errors(place, capsys):
    """`jobs/*.py` share `vlm_decade.job.main`: the same problems, located, exit 2, nothing written."""
    from vlm_decade.job import main

    inputs = place / "inputs"
    CASES["unknown backend"].damage(inputs)
    before = listing(place)
    assert main("decade", "test", ["--config", str(inputs / "study.yaml"), "--out", str(place / "run")]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"{inputs / 'study.yaml'}, field 'models[1].backend'" in said
    (place / "afile").write_text("x")
    assert main("decade", "test", ["--config", str(inputs / "study.yaml"), "--out", str(place / "afile")]) == 2
    assert "exists and is not a folder" in " ".join(capsys.readouterr().err.split())
    assert listing(place) - before == {str(place / "afile")}
