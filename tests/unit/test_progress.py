"""What the person watching is told: progress per model with rate and time left, plain lines off a
terminal, no hard wrapping, and repeated messages collapsed."""

import io
import re

from rich.console import Console

from vlm_decade.core.progress import Reporter, collapsed, console, progress_line, shape


def test_progress_line_says_count_share_rate_and_time_left():
    # 40 of 150 in 10 s: 4/s, so the 110 left take 27.5 s
    assert (
        progress_line("describe ssd", 40, 150, 10.0)
        == "describe ssd             40/150  27%  4/s  about 28s left (10s so far)"
    )
    assert progress_line("embed", 150, 150, 125.0).endswith("150/150 100%  1.2/s (2m05s so far)")
    assert progress_line("embed", 0, 10, 0.0) == "embed                    0/10   0% (0s so far)"


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
