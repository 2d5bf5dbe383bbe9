"""The two studies, side by side over the shared stages: `decade` (Study A, a decade of VLMs
against people) and `openworld` (Study B, LMMs as open-world classifiers).

Each study is a package with its config, its own stages and a `pipeline` module that offers the
same five functions: `check` (config, data and models, before anything is written), `run`,
`estimate` (API spend before any), `describe` (what `validate` says of it) and `redraw_report`.
The command line and the Ray job scripts reach a study only through `pipeline_of`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from vlm_decade.core.config import read_study_file, resolve_entry_paths, resolve_path
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig

STUDIES = {"decade": StudyConfig, "openworld": OpenWorldStudyConfig}
AnyStudy = StudyConfig | OpenWorldStudyConfig


def pipeline_of(study: AnyStudy) -> ModuleType:
    """The study's pipeline module (`check`, `run`, `estimate`, `describe`, `redraw_report`)."""
    return importlib.import_module(f"vlm_decade.studies.{study.study}.pipeline")


def study_from_dict(raw: dict) -> AnyStudy:
    """A validated study of the kind its `study` field names (Study A when absent)."""
    kind = raw.get("study", "decade")
    if kind not in STUDIES:
        raise ValidationError.from_exception_data(
            "StudyConfig", [{"type": "literal_error", "loc": ("study",), "input": kind, "ctx": {"expected": "'decade' or 'openworld'"}}]
        )
    return STUDIES[kind].model_validate(raw)


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Paths in a study file are relative to its folder: make them absolute, in place."""
    data = raw.get("data")
    if isinstance(data, dict):
        raw["data"] = {k: resolve_path(v, base) for k, v in data.items()}
    entries = [e for section in ("models", "encoders", "metrics") for e in raw.get(section) or []]
    entries += [m.get("encoder") for m in raw.get("metrics") or [] if isinstance(m, dict)]
    for parent, keys in (("taxonomy", ("detector", "matcher")), ("scoring", ("encoder",))):
        if isinstance(raw.get(parent), dict):
            entries += [raw[parent].get(k) for k in keys]
    entries.append(raw.get("judge"))
    for entry in entries:
        resolve_entry_paths(entry, base)
    providers = raw.get("providers")
    if isinstance(providers, dict) and providers.get("cache_dir") is not None:
        providers["cache_dir"] = resolve_path(providers["cache_dir"], base)


def load_study(path: str | Path, output: str | Path | None = None) -> AnyStudy:
    """Read and validate a study file; every config problem is raised together as an InputError."""
    path = Path(path)
    raw = read_study_file(path)
    _resolve_paths(raw, path.resolve().parent)
    if output is not None:
        raw["output"] = str(output)
    elif raw.get("output") is not None:
        raw["output"] = resolve_path(raw["output"], Path.cwd())
    try:
        return study_from_dict(raw)
    except ValidationError as exc:
        raise InputError(
            [Problem(str(path), err["msg"], field=".".join(str(p) for p in err["loc"]) or None) for err in exc.errors()]
        ) from None
