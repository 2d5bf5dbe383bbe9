"""What the person watching is told: progress per model with rate and time left, plain lines off a
terminal, no hard wrapping, repeated messages collapsed whatever their quoting (in row order), and
counts with their nouns in the right number."""

import io
import re

from PIL import Image
from rich.console import Console
from typer.testing import CliRunner

from vlm_decade.cli import app
from vlm_decade.core.errors import Problem
from vlm_decade.core.progress import Reporter, collapsed, console, counted, problem_lines, progress_line, shape


def test_progress_line_says_count_share_rate_and_time_left():
    assert (
        progress_line("describe ssd", 40, 150, 10.0, left=27.5)
        == "describe ssd             40/150  27%  4/s  about 28s left (10s so far)"
    )
    assert progress_line("describe ssd", 40, 150, 10.0).endswith("27%  4/s (10s so far)")  # no estimate yet
    assert progress_line("embed", 150, 150, 125.0, left=0.0).endswith("150/150 100%  1.2/s (2m05s so far)")
    assert progress_line("embed", 0, 10, 0.0) == "embed                    0/10   0% (0s so far)"


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_time_left_waits_for_a_rate_measured_after_the_first_batch():
    """A model that loads for 120 s, then does 10 items a batch at 1 a second: the first batch's rate
    (10 in 120 s) would say 18 minutes left; no estimate is said until the rate since that batch was
    measured over ESTIMATE_AFTER_S, and then it is the steady rate's."""
    clock, out = FakeClock(), io.StringIO()
    reporter = Reporter(Console(file=out, force_terminal=False, width=80, soft_wrap=True), clock=clock)
    with reporter.track("describe", 100) as advance:
        for at in (120.0, 122.0, 130.0, 140.0):  # batches finish at these times (the second 8 s early)
            clock.now = at
            advance(10)
    lines = [" ".join(line.split()) for line in out.getvalue().splitlines()]
    assert lines == [
        "describe 10/100 10% 0.0833/s (2m00s so far)",  # the first batch: it paid for loading
        "describe 20/100 20% 0.164/s (2m02s so far)",  # 2 s after it: too short to tell
        "describe 30/100 30% 0.231/s about 35s left (2m10s so far)",  # 20 in 10 s since: 70 left at 2/s
        "describe 40/100 40% 0.286/s about 40s left (2m20s so far)",  # 30 in 20 s: 60 left at 1.5/s
    ]


def test_a_message_on_many_rows_is_shown_a_few_times_then_counted():
    items = [("variant", f"f.csv, row {r}: unknown variant 'default'") for r in range(2, 153)]
    items.insert(1, ("other", "f.csv, row 9: empty description"))
    assert collapsed(items, shown=3, least=5) == [
        "f.csv, row 2: unknown variant 'default'",
        "f.csv, row 3: unknown variant 'default'",
        "f.csv, row 4: unknown variant 'default'",
        "    ... and 148 more rows like it",
        "f.csv, row 9: empty description",
    ]
    assert shape("image 'coffee' has no 'full' description") == shape("image 'moon' has no 'full' description")
    assert shape("image 'coffee' has no 'full' description") != shape("image 'coffee' has no file")
    few = [("k", f"line {i}") for i in range(5)]
    assert collapsed(few, shown=3, least=5) == [line for _, line in few]  # five is not collapsed


def test_one_kind_of_problem_is_collapsed_whatever_its_quoting_in_row_order():
    """900 rows of one problem whose message holds an unquoted path, collected in file order (rows 2,
    302, 602, 3, ...): three lines in row order, then the count."""
    problems = [
        Problem("/data/images.csv", f"image file not found: /data/imgs/img_{row - 2:04d}.png", row, "file")
        for start in range(2, 302)
        for row in (start, start + 300, start + 600)
    ]
    problems.insert(450, Problem("study file", "'encoders' is empty", field="encoders"))
    assert problem_lines(problems) == [
        "  - /data/images.csv, row 2, field 'file': image file not found: /data/imgs/img_0000.png",
        "  - /data/images.csv, row 3, field 'file': image file not found: /data/imgs/img_0001.png",
        "  - /data/images.csv, row 4, field 'file': image file not found: /data/imgs/img_0002.png",
        "    ... and 897 more rows like it",
        "  - study file, field 'encoders': 'encoders' is empty",
    ]
    every = problem_lines(problems, every=True)
    assert len(every) == 901 and every[:2] == [f"  - {problems[0]}", f"  - {problems[3]}"]
    assert shape("/a/img_1.png has transparent pixels") == shape("/b c/x-2.png has transparent pixels")
    assert shape("image file not found: /a/1.png") != shape("/a/1.png has transparent pixels")


def test_validate_collapses_900_transparent_images_and_900_wrong_paths(tmp_path):
    """`data.background: none` with 900 transparent images, and a `file` column with a wrong prefix on
    900 more: each kind shown three times in row order, then counted."""
    (tmp_path / "images").mkdir()
    rows, descriptions = ["image_id,dataset,file"], ["description_id,image_id,worker_id,condition,text"]
    for i in range(1800):
        folder = "images" if i < 900 else "imgs"  # the last 900 name a folder that is not there
        if i < 900:
            Image.new("RGBA", (2, 2), (255, 0, 0, 0)).save(tmp_path / "images" / f"img_{i:04d}.png")
        rows.append(f"img_{i:04d},coco,{folder}/img_{i:04d}.png")
        descriptions += [f"d{i}_{k},img_{i:04d},w{k},full,a red ball {k}" for k in range(3)]
    (tmp_path / "images.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "descriptions.csv").write_text("\n".join(descriptions) + "\n")
    (tmp_path / "answers.csv").write_text("image_id,variant,text\nimg_0000,full,a ball\n")
    study = tmp_path / "study.yaml"
    study.write_text(
        "name: many\ndata: {images: images.csv, image_dir: ., descriptions: descriptions.csv, background: none}\n"
        "models:\n  - {name: m, backend: imported, model_id: m, era: pre-mllm, options: {file: answers.csv}}\n"
        "encoders:\n  - name: SBERT-SI\n"
    )
    done = CliRunner().invoke(app, ["validate", str(study)], terminal_width=1000)
    lines = done.output.splitlines()
    assert done.exit_code == 2 and lines[0] == "1800 problems in the input; nothing was run or written:"
    table = tmp_path / "images.csv"
    assert [re.sub(r": .*", "", line) for line in lines[1:9]] == [
        f"  - {table}, row {row}, field 'file'" if row else "    ... and 897 more rows like it"
        for row in (2, 3, 4, None, 902, 903, 904, None)
    ]
    assert "has transparent pixels" in lines[3] and lines[7].endswith(f"not found: {tmp_path}/imgs/img_0902.png")
    assert lines[9:] == [f"every one of them: vlm-decade validate {study} --all"]


def test_a_count_has_its_noun_in_the_right_number():
    assert [counted(n, "problem") for n in (0, 1, 2)] == ["0 problems", "1 problem", "2 problems"]
    assert counted(1, "dataset") == "1 dataset" and counted(3, "class", "classes") == "3 classes"


def plain_reporter() -> tuple[Reporter, io.StringIO]:
    out = io.StringIO()
    return Reporter(Console(file=out, force_terminal=False, width=80, soft_wrap=True)), out


def test_off_a_terminal_progress_is_plain_lines_per_model_and_for_the_whole():
    reporter, out = plain_reporter()
    with reporter.track("describe", 30, {"a": 10, "b": 20}) as advance:
        for _ in range(10):
            advance(1, "a")
        for _ in range(20):
            advance(1, "b")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    counts = [re.match(r"\s+(describe(?: \w)?)\s+(\d+)/(\d+)", line).groups() for line in lines]
    # each model at each tenth of its own work, the whole at each tenth of all the work
    assert [c for c in counts if c[0] == "describe a"] == [("describe a", str(n), "10") for n in range(1, 11)]
    assert [c for c in counts if c[0] == "describe b"] == [("describe b", str(n), "20") for n in range(2, 21, 2)]
    assert [c for c in counts if c[0] == "describe"] == [("describe", str(n), "30") for n in range(3, 31, 3)]


def test_one_model_alone_is_counted_once_under_its_name():
    reporter, out = plain_reporter()
    with reporter.track("embed", 4, {"sbert": 4}) as advance:
        advance(4, "sbert")
    assert re.fullmatch(r"\s+embed sbert\s+4/4 100%.*\n", out.getvalue())


def test_work_without_parts_is_counted_once():
    # A stage with no per-model parts (the detector) advances its one count, not twice.
    reporter, out = plain_reporter()
    with reporter.track("detect", 4) as advance:
        advance(2)
        advance(2)
    assert [re.match(r"\s+detect\s+(\d+/\d+)", line).group(1) for line in out.getvalue().splitlines()] == [
        "2/4",
        "4/4",
    ]


def test_off_a_terminal_a_long_line_is_never_wrapped(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # rich would take its width from it
    out = io.StringIO()
    made = console()
    made.file = out  # not a terminal, as under pytest's capture
    path = "/data/" + "/".join(["a-rather-long-folder-name"] * 8) + "/study.yaml"
    made.print(f"error in the input: {path}: not found", highlight=False)
    assert out.getvalue() == f"error in the input: {path}: not found\n"
