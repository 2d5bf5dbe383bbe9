"""What the studies' loaders share when they check a table row by row: the row a key was first given
at, so a key given again is reported with it ("... (first at row 3)")."""

from __future__ import annotations

from collections.abc import Hashable


class FirstRows:
    """Each key's first row."""

    def __init__(self) -> None:
        self._rows: dict[Hashable, int] = {}

    def again(self, key: Hashable, row: int) -> int | None:
        """The row `key` was first given at, or None when this is its first (then `row` is kept as its first)."""
        first = self._rows.setdefault(key, row)
        return None if first == row else first
