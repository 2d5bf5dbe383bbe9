"""How a study file is read: its YAML (a key given twice is refused) as a mapping, every path in it
made absolute against the file's folder (`resolve_paths`), so everything downstream sees absolute
paths, and why a run folder named in it (or on the command line) cannot be written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from vlm_decade.core.config.settings import Settings, settings_in
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.storage import is_uri, uri_problem
from vlm_decade.core.tables import regular_file_problem

# A URI whose "//" a path type (or a typing hand) has folded to one slash.
FOLDED_URI = re.compile(r"^(s3|gs):/[^/]")


def resolve_path(value: Any, base: Path) -> Any:
    """A path relative to `base` made absolute; a URI (one with a slash lost, too), and anything that
    is no path text (a number, a list), is left as it is, for the field's own check to name."""
    if not isinstance(value, str) or is_uri(value) or FOLDED_URI.match(value) or Path(value).is_absolute():
        return value
    return str(base / value)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key that appears twice in one mapping (plain YAML keeps the
    last one silently, so a setting written twice would be half ignored)."""

    def construct_mapping(self, node, deep=False):
        first: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` then overrides: that is allowed
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                seen = key in first
            except TypeError:  # an unhashable key: the base class names it
                break
            if seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key '{key}' appears twice (lines {first[key]} and {line}): each key may be given once",
                    key_node.start_mark,
                )
            first[key] = line
        return super().construct_mapping(node, deep=deep)


def read_study_file(path: str | Path) -> dict:
    """A study file's YAML as a mapping, or an InputError naming the file."""
    path = Path(path)
    problem = regular_file_problem(path)
    if problem is not None:
        raise InputError([Problem(str(path), f"study file {problem}")])
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except OSError as exc:
        raise InputError([Problem(str(path), f"study file cannot be read: {exc.strerror or exc}")]) from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError([Problem(str(path), f"not valid YAML: {exc}")]) from None
    if not isinstance(raw, dict):
        raise InputError([Problem(str(path), "a study file must be a YAML mapping")])
    return raw


def output_problems(output: str | Path, field: str = "output") -> list[Problem]:
    """Why the run folder `output` cannot be written (it is a file, under a file, or in a folder
    this user may not write; a URI of a store not supported), found before any work; [] when it can."""
    if is_uri(str(output)):  # a run folder in a bucket, worked on in a local copy (core.storage)
        problem = uri_problem(str(output))
        return [] if problem is None else [Problem(str(output), problem, field=field)]
    if FOLDED_URI.match(str(output)):
        return [
            Problem(
                str(output), "looks like a URI with one slash: write s3://bucket/... or gs://bucket/...", field=field
            )
        ]
    output = Path(output)
    if "\0" in str(output):
        return [Problem(str(output).replace("\0", "\\0"), "a path cannot hold a NUL byte", field=field)]
    if output.exists() and not output.is_dir():
        return [Problem(str(output), "the run folder exists and is not a folder", field=field)]
    existing = next((p for p in (output, *output.parents) if p.exists()), None)
    if existing is None:
        return []
    if not existing.is_dir():
        return [
            Problem(
                str(output), f"{existing} is a file, not a folder: the run folder cannot be made under it", field=field
            )
        ]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [Problem(str(output), f"{existing} may not be written by this user", field=field)]
    return []


# Backend options that name a file (the imported backend's descriptions, CaSED's caption database).
PATH_OPTIONS = ("file", "database")


def _is_path(annotation: Any) -> bool:
    # Through unions and Annotated: an optional folder location (`FolderLocation | None`) is a path too.
    return annotation is Path or any(_is_path(a) for a in getattr(annotation, "__args__", ()))


def resolve_paths(raw: Any, cls: type[Settings], base: Path) -> None:
    """Every path of a study file's section `raw` (a mapping, changed in place) made absolute
    against `base`, the study file's folder: each field `cls` declares as a path (`output` too), in
    its sections and their lists, and the options that name a file. Only what has the right shape is
    touched: a field of the wrong type (`models: 5`) is left for validation to name."""
    if not isinstance(raw, dict):
        return
    for name, field in cls.model_fields.items():
        value = raw.get(name)
        if value is None:
            continue
        if _is_path(field.annotation):  # a list of paths (`data.shards`) path by path
            raw[name] = [resolve_path(v, base) for v in value] if isinstance(value, list) else resolve_path(value, base)
        inner = settings_in(field.annotation)
        if inner is None:
            continue
        origin = getattr(field.annotation, "__origin__", None)
        items = (
            value
            if origin is tuple and isinstance(value, list)
            else value.values()
            if origin is dict and isinstance(value, dict)
            else [value]
        )
        for item in items:
            resolve_paths(item, inner, base)
    options = raw.get("options") if "options" in cls.model_fields else None
    if isinstance(options, dict):
        for key in PATH_OPTIONS:
            if options.get(key) is not None:
                options[key] = resolve_path(options[key], base)
