"""Close names for a name that is not known: the one "did you mean" of every message (an unknown
label, backend, option, field or key), so they all suggest alike."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` most likely meant: one equal to it but for case first (labels must match
    exactly, so that is the likeliest slip), else the nearest by difflib's ratio (at least 0.6)."""
    known = [k for k in known if isinstance(k, str)]
    same = [k for k in known if k.casefold() == str(name).casefold()]
    if same:
        return same[0]
    near = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
    return near[0] if near else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" for the closest known name, or "" when none is close."""
    near = closest(name, known)
    return f" (did you mean '{near}'?)" if near is not None else ""
