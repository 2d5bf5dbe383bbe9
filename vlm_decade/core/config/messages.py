"""A pydantic validation error as the author of a study file reads it: the field's place
(`models[2].options.threshold`), an unknown name with the closest known one, a number out of range
with the range allowed; and `check_options`, a backend's options checked against what it declares.
"""

from __future__ import annotations

from typing import Any

import annotated_types
from pydantic import BaseModel, ValidationError

from vlm_decade.core.config.settings import BackendOptions, settings_in
from vlm_decade.core.errors import STUDY_FILE, Problem
from vlm_decade.core.names import did_you_mean


def field_path(loc: tuple) -> str:
    """A pydantic location as a study file's author reads it: `models[2].options.threshold`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def section_at(cls: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section class a location (less its last part) ends in: list indices and mapping keys
    (a provider's prices by model id) are stepped over."""
    skip = False
    for part in loc:
        if skip:
            skip = False
            continue
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        inner = settings_in(field.annotation) if field is not None else None
        if inner is None:
            return None
        skip = getattr(field.annotation, "__origin__", None) in (tuple, dict)
        cls = inner
    return cls


def range_text(field: Any) -> str | None:
    """A numeric field's allowed range from its bounds ("in 0..1", "> 0 and <= 1", ">= 1"), or None."""
    kinds = {
        annotated_types.Gt: ("gt", ">"),
        annotated_types.Ge: ("ge", ">="),
        annotated_types.Lt: ("lt", "<"),
        annotated_types.Le: ("le", "<="),
    }
    bounds = {kinds[type(m)][1]: getattr(m, kinds[type(m)][0]) for m in field.metadata if type(m) in kinds}
    if ">=" in bounds and "<=" in bounds:
        return f"in {bounds['>=']:g}..{bounds['<=']:g}"
    return " and ".join(f"{sign} {value:g}" for sign, value in bounds.items()) or None


_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")
_PLAIN = {"path_type": "must be a path (text)", "tuple_type": "must be a list"}


def error_message(cls: type[BaseModel], err: dict, what: str = "field") -> str:
    """One pydantic error as a sentence: an unknown name with the closest known one and the list,
    a value out of range with the range allowed, a value of the wrong kind with the value."""
    loc, value = err["loc"], err.get("input")
    if err["type"] == "extra_forbidden":
        section = section_at(cls, loc[:-1])
        known = list(section.model_fields) if section is not None else []
        return f"unknown {what} '{loc[-1]}'{did_you_mean(str(loc[-1]), known)}" + (
            f"; known: {', '.join(known)}" if known else ""
        )
    if err["type"] in _RANGE_ERRORS:
        section = section_at(cls, loc[:-1])
        field = section.model_fields.get(loc[-1]) if section is not None else None
        allowed = range_text(field) if field is not None else None
        if allowed is not None:
            return f"must be {allowed}, got {value!r}"
    message = _PLAIN.get(err["type"]) or err["msg"].removeprefix("Value error, ")
    if err["type"].endswith(("_type", "_parsing", "literal_error")) and not isinstance(value, (dict, list)):
        message += f" (got {repr(value)[:40]})"
    return message


def check_options(
    cls: type[BackendOptions], options: Any, where: tuple, backend: str, file: str = STUDY_FILE
) -> list[Problem]:
    """Why `options` (of the entry at location `where`, e.g. ("models", 2), run by `backend`) are not
    what `cls` declares: one problem per unknown name or bad value, each naming its field
    (`models[2].options.x`)."""
    try:
        cls.model_validate(options)
    except ValidationError as exc:
        return [
            Problem(
                file, error_message(cls, err, f"{backend} option"), field=field_path((*where, "options", *err["loc"]))
            )
            for err in exc.errors()
        ]
    return []
