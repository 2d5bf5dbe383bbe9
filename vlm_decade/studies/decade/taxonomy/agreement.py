"""Hand labels for the error taxonomy, and how well the automatic labels agree with them.

The paper labelled errors by hand; here the detector rules and probes label them automatically and a
person may check any subset. `apply_hand_labels` lets hand labels override automatic ones and reports,
per error type, Cohen's kappa between the two on the rows both label.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

KEY_FIELDS = ("subject", "image_id", "error_type")
_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Cohen's kappa of two raters' binary labels: (p_o - p_e) / (1 - p_e), with p_o the observed
    agreement and p_e the agreement expected from each rater's rate of True.

    NaN when p_e = 1, i.e. both raters give one and the same label to every item: agreement is then
    perfect but carries no information beyond chance, and kappa is 0/0 (sklearn also returns NaN).
    Raises ValueError for sequences of different lengths or no items."""
    if len(a) != len(b):
        raise ValueError(f"the raters labelled different numbers of items ({len(a)} and {len(b)})")
    n = len(a)
    if n == 0:
        raise ValueError("kappa needs at least one item")
    a = [_as_bool(x) for x in a]
    b = [_as_bool(x) for x in b]
    agree = sum(x == y for x, y in zip(a, b))
    true_a, true_b = sum(a), sum(b)
    # In counts (times n^2) so the constant-and-equal case is exact: chance agreement = n^2.
    chance = true_a * true_b + (n - true_a) * (n - true_b)
    if chance == n * n:
        return math.nan
    return (agree * n - chance) / (n * n - chance)


def apply_hand_labels(auto_rows: Sequence[Mapping], hand_rows: Sequence[Mapping]) -> tuple[list[dict], dict[str, dict]]:
    """Merge hand labels into automatic ones and measure their agreement.

    Rows are dicts with subject, image_id, error_type and present: a bool, "true"/"false"/"1"/"0" as
    read from a CSV, or None (or "") for no label (an automatic label that could not be decided; a
    hand row without a label is ignored). Hand rows may carry a `note`. Returns:
    - every automatic row, with `source` "auto", or "hand" where a hand row of the same key replaces
      its `present` (and adds its note; the automatic label stays as `auto_present`), followed by the
      hand rows that have no automatic row, with source "hand";
    - per error type that has hand labels: {"kappa", "n", "observed_agreement"} over the rows with a
      hand and an automatic label (kappa and agreement NaN when n = 0; kappa NaN when both raters give
      one constant label).
    Raises ValueError on a key given twice in the same list, a missing field or an unreadable label."""
    auto = {key: _label(row["present"]) for key, row in _by_key(auto_rows, "automatic").items()}
    hand_by_key = {key: row for key, row in _by_key(hand_rows, "hand").items() if _label(row["present"]) is not None}
    hand = {key: _label(row["present"]) for key, row in hand_by_key.items()}

    merged = []
    for row in auto_rows:
        key = _key(row)
        out = {**row, "present": auto[key], "source": "auto"}
        if key in hand:
            out.update(present=hand[key], source="hand", auto_present=auto[key])
            if hand_by_key[key].get("note"):
                out["note"] = hand_by_key[key]["note"]
        merged.append(out)
    merged += [{**row, "present": hand[key], "source": "hand"} for key, row in hand_by_key.items() if key not in auto]

    agreement = {}
    for error_type in dict.fromkeys(key[2] for key in hand):
        both = [key for key in hand if key[2] == error_type and auto.get(key) is not None]
        hand_labels = [hand[key] for key in both]
        auto_labels = [auto[key] for key in both]
        agreement[error_type] = {
            "kappa": cohen_kappa(hand_labels, auto_labels) if both else math.nan,
            "n": len(both),
            "observed_agreement": (
                sum(h == a for h, a in zip(hand_labels, auto_labels)) / len(both) if both else math.nan
            ),
        }
    return merged, agreement


def _key(row: Mapping) -> tuple[str, str, str]:
    return tuple(str(row[f]) for f in KEY_FIELDS)


def _by_key(rows: Sequence[Mapping], what: str) -> dict[tuple, Mapping]:
    keyed: dict[tuple, Mapping] = {}
    for row in rows:
        missing = [f for f in (*KEY_FIELDS, "present") if f not in row]
        if missing:
            raise ValueError(f"{what} row {dict(row)} lacks {', '.join(missing)}")
        key = _key(row)
        if key in keyed:
            raise ValueError(f"{what} label given twice for subject={key[0]} image_id={key[1]} error_type={key[2]}")
        keyed[key] = row
    return keyed


def _label(value) -> bool | None:
    """A row's label: None when there is none (None or an empty string), else a bool."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return _as_bool(value)


def _as_bool(value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"not a yes/no label: {value!r}")
