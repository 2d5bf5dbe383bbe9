"""What a run tells the person watching it: stage lines and progress bars.

On a terminal, rich progress bars; elsewhere (CI logs, `ray job logs`) a plain line at each tenth.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class Reporter:
    def __init__(self, console: Console | None = None, quiet: bool = False):
        self.console = console or Console(stderr=True)
        self.quiet = quiet

    def say(self, message: str) -> None:
        if not self.quiet:
            self.console.print(message, highlight=False)

    def stage(self, name: str, state: str, detail: str = "") -> None:
        mark = {"skip": "[dim]skip[/dim]", "run": "[bold cyan]run [/bold cyan]", "done": "[green]done[/green]"}[state]
        self.say(f"{mark} {name:<17} {detail}")

    @contextmanager
    def track(self, description: str, total: int):
        """Yields an `advance(n)` function."""
        if self.quiet or total == 0:
            yield lambda n=1: None
            return
        if self.console.is_terminal:
            with Progress(
                TextColumn("     {task.description:<17}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            ) as bar:
                task = bar.add_task(description, total=total)
                yield lambda n=1: bar.advance(task, n)
            return
        done, next_mark, start = 0, 0.1, time.monotonic()

        def advance(n: int = 1) -> None:
            nonlocal done, next_mark
            done += n
            if done / total >= next_mark or done == total:
                self.say(f"     {description:<17} {done}/{total} ({time.monotonic() - start:.0f}s)")
                while next_mark <= done / total:
                    next_mark += 0.1

        yield advance
