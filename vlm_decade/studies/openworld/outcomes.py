"""The kind of answer an open-world prediction is, read from where CS and LI agree or disagree
(METHOD.md, "Study B", error analysis):

| CS     | LI   | outcome       | meaning                                                        |
| ------ | ---- | ------------- | -------------------------------------------------------------- |
| high   | high | `correct`     | close to the label and accepted by the judge                   |
| high   | low  | `granularity` | right but too generic ("bird" for "scarlet tanager")           |
| low    | high | `ambiguity`   | accepted though far from the label: ambiguous or several labels |
| low    | low  | `confusion`   | wrong but specific (one fine-grained class for another)        |
| any    | none | `unjudged`    | no judge ran (LI is None or NaN)                               |

CS_HIGH was measured with all-MiniLM-L6-v2 on hand-made pairs (docs/openworld-metrics.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

CS_HIGH = 0.55  # best separates right answers (same or broader concept) from wrong ones
LI_HIGH = 0.5  # LI is 0 or 1 per prediction

OUTCOMES = ("correct", "granularity", "ambiguity", "confusion", "unjudged")


def outcome(cs: float, li: float | None, cs_high: float = CS_HIGH, li_high: float = LI_HIGH) -> str:
    """One prediction's outcome from its CS and its LI (None or NaN: not judged)."""
    if math.isnan(cs):
        raise ValueError("CS is NaN")
    if li is None or math.isnan(li):
        return "unjudged"
    if cs >= cs_high:
        return "correct" if li >= li_high else "granularity"
    return "ambiguity" if li >= li_high else "confusion"


def outcomes(
    cs: Iterable[float],
    li: Iterable[float | None] | None,
    cs_high: float = CS_HIGH,
    li_high: float = LI_HIGH,
) -> list[str]:
    """`outcome` for each prediction; `li=None` when no prediction was judged."""
    cs = [float(value) for value in cs]
    li = [None] * len(cs) if li is None else [None if value is None else float(value) for value in li]
    if len(cs) != len(li):
        raise ValueError(f"{len(cs)} CS values but {len(li)} LI values")
    return [outcome(c, j, cs_high, li_high) for c, j in zip(cs, li)]
