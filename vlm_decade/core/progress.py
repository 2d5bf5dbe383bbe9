"""What the person watching is told: stage lines, progress per model with its rate and time left (once
it has a sound basis: the rate since the first finished batch, over ESTIMATE_AFTER_S at least), and
long lists of messages with the repeats collapsed: the input's problems by file and row, one kind of
problem on many rows (the same message but for its paths, numbers, names and quoted values) shown
a few times and counted.

On a terminal, rich progress bars; elsewhere (CI logs, `ray job logs`, a pipe) plain lines, one at
each tenth of the work (or a minute at most), and no line is ever hard-wrapped (`console`): a path
in a log stays whole, so grep finds it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Hashable, Iterable, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from vlm_decade.core.errors import Problem

# A message repeated on more than COLLAPSE_FROM rows is shown SHOWN times, then counted.
COLLAPSE_FROM = 5
SHOWN = 3
PLAIN_EVERY_S = 60.0  # off a terminal, a progress line at least this often
# A time left is said once the rate since the first finished batch was measured over this long: before
# the first batch a model is loading (a 20-second model's first estimate said "about 3h11m"), and a
# rate over a second or two is noise.
ESTIMATE_AFTER_S = 10.0
# The variable parts of a message, quoted or not: quoted text, paths, numbers, and names holding a digit
# or joined by `.`, `_`, `-` or `:` (img_0001, coco_1, data.background); the rest is the kind of problem.
_VARIABLE = re.compile(r"""'[^']*'|"[^"]*"|`[^`]*`|\S*[/\\]\S*|\S*\d\S*|\w+(?:[._:-]\w+)+""")
_MASKS = re.compile(r"…(?:\s*…)+")


def console(stderr: bool = True) -> Console:
    """The one way a Console is made: off a terminal, lines are never wrapped (rich would wrap at
    80 columns and break a path mid-word)."""
    made = Console(stderr=stderr)
    if not made.is_terminal:
        made.soft_wrap = True
    return made


def collapsed(items: Iterable[tuple[Hashable, str]], shown: int = SHOWN, least: int = COLLAPSE_FROM) -> list[str]:
    """The lines of `items` ((key, line) pairs), the lines of one key together in the order the keys
    first come: a key with more than `least` lines shows its first `shown`, then '... and N more rows
    like it'."""
    groups: dict[Hashable, list[str]] = {}
    for key, line in items:
        groups.setdefault(key, []).append(line)
    lines = []
    for group in groups.values():
        if len(group) > least:
            lines += [*group[:shown], f"    ... and {len(group) - shown} more rows like it"]
        else:
            lines += group
    return lines


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 problem', '900 problems': a count with its noun in the right number."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def shape(message: str) -> str:
    """A message with its variable parts masked: the messages of one kind of problem on many rows
    ("image 'coffee' has no 'full' description", "/data/img_0007.png has transparent pixels")
    share it, whatever their quoting. Masks side by side are one: a path with a space is one value."""
    return _MASKS.sub("…", _VARIABLE.sub("…", message))


def problem_lines(problems: Sequence[Problem], every: bool = False) -> list[str]:
    """Each problem as a line, by file (in the order the files first come) then row; unless `every`,
    one kind of problem (its file, field and message's `shape`) on more than COLLAPSE_FROM rows is
    shown SHOWN times and counted."""
    files: dict[str, int] = {}
    for problem in problems:
        files.setdefault(problem.file, len(files))
    ordered = sorted(problems, key=lambda p: (files[p.file], p.row or 0))
    items = [((p.file, p.field, shape(p.message)), f"  - {p}") for p in ordered]
    return [line for _, line in items] if every else collapsed(items)


def progress_line(description: str, done: int, total: int, seconds: float, left: float | None = None) -> str:
    """'describe ssd-label   40/150  27%  3.1/s  about 35s left (13s so far)': a plain progress line;
    `left` the seconds left (`_Meter.left`), None while there is no estimate."""
    line = f"{description:<24} {done}/{total} {100 * done / total:3.0f}%"
    if seconds > 0 and done:
        line += f"  {done / seconds:.3g}/s"
    if left is not None and done < total:
        line += f"  about {_duration(left)} left"
    return f"{line} ({_duration(seconds)} so far)"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}m{seconds:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


class _Meter:
    """One count of work: its time left, and off a terminal when a line is due (each tenth, and at
    least every PLAIN_EVERY_S seconds while work goes on)."""

    def __init__(self, total: int, start: float):
        self.total, self.start, self.done = total, start, 0
        self.tenths, self.last_said = 0, start  # tenths of the work said so far
        self.first: tuple[int, float] | None = None  # done, and when, at the first finished batch

    def left(self, now: float) -> float | None:
        """Seconds left at the rate since the first finished batch (which paid for loading and
        queueing), or None until that rate was measured over ESTIMATE_AFTER_S."""
        if self.first is None or self.done >= self.total:
            return None
        done, then = self.first
        if self.done <= done or now - then < ESTIMATE_AFTER_S:
            return None
        return (self.total - self.done) * (now - then) / (self.done - done)

    def advance(self, n: int, now: float) -> bool:
        self.done += n
        if self.first is None:
            self.first = (self.done, now)
        tenths = 10 * self.done // self.total  # whole numbers: 3 of 10 is three tenths, exactly
        due = tenths > self.tenths or now - self.last_said >= PLAIN_EVERY_S
        self.tenths = max(self.tenths, tenths)
        if due:
            self.last_said = now
        return due


def _counts(description: str, total: int, parts: dict[str, int]):
    """(key, (name, total)) of each count shown: the whole (key None) and each part; one part alone
    is the whole."""
    if len(parts) == 1:
        ((name, _),) = parts.items()
        return [(None, (f"{description} {name}", total))]
    return [(None, (description, total))] + [(name, (f"{description} {name}", n)) for name, n in parts.items()]


class Reporter:
    def __init__(self, console_: Console | None = None, quiet: bool = False, clock=time.monotonic):
        self.console = console_ or console()
        self.quiet = quiet
        self.clock = clock  # a test's fake clock

    def say(self, message: str) -> None:
        if not self.quiet:
            self.console.print(message, highlight=False)

    def stage(self, name: str, state: str, detail: str = "") -> None:
        mark = {"skip": "[dim]skip[/dim]", "run": "[bold cyan]run [/bold cyan]", "done": "[green]done[/green]"}[state]
        self.say(f"{mark} {name:<17} {detail}")

    @contextmanager
    def track(self, description: str, total: int, parts: dict[str, int] | None = None):
        """Yields `advance(n=1, part=None)`. `parts`: the work per model (or other part), each with its
        own count, rate and time left; `advance` then names the part it counts."""
        parts = {name: n for name, n in (parts or {}).items() if n}
        if self.quiet or total == 0:
            yield lambda n=1, part=None: None
            return
        now = self.clock()
        meters = {key: (name, _Meter(n, now)) for key, (name, n) in _counts(description, total, parts)}
        if self.console.is_terminal:
            with Progress(
                TextColumn("     {task.description:<24}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>9}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[left]}"),
                console=self.console,
                transient=True,
            ) as bar:
                tasks = {
                    key: bar.add_task(name, total=meter.total, rate="", left="")
                    for key, (name, meter) in meters.items()
                }

                def advance(n: int = 1, part: str | None = None) -> None:
                    now = self.clock()
                    for key in {None, part} & set(tasks):
                        meter = meters[key][1]
                        meter.advance(n, now)
                        bar.advance(tasks[key], n)
                        speed, left = bar.tasks[tasks[key]].speed, meter.left(now)
                        bar.update(
                            tasks[key],
                            rate=f"{speed:.3g}/s" if speed else "",
                            left="" if left is None else f"about {_duration(left)} left",
                        )

                yield advance
            return

        def advance(n: int = 1, part: str | None = None) -> None:
            now = self.clock()
            for key in [k for k in dict.fromkeys((part, None)) if k in meters]:  # part None: the total once
                name, meter = meters[key]
                if meter.advance(n, now):
                    line = progress_line(name, meter.done, meter.total, now - meter.start, meter.left(now))
                    self.say(f"     {line}")

        yield advance
