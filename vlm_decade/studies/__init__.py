"""The two studies, side by side over the shared stages: `decade` (Study A, a decade of VLMs
against people) and `openworld` (Study B, LMMs as open-world classifiers).

Each study is a package with its config, its own stages and a `pipeline` module that offers the
same five functions, the `Pipeline` protocol: `check` (config, data and models, before anything is
written), `run`, `estimate` (API spend before any), `summary` (what `validate` says of it) and
`redraw_report`. The command line and the Ray job scripts reach a study only through `pipeline_of`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from pydantic import ValidationError

from vlm_decade.core.config import read_study_file, resolve_entry_paths, resolve_path
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.storage import is_uri, uri_problem, working_copy
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig

if TYPE_CHECKING:
    from vlm_decade.core.progress import Reporter
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.stages.estimate import Line
    from vlm_decade.stages.images import ImageCache

STUDIES = {"decade": StudyConfig, "openworld": OpenWorldStudyConfig}
AnyStudy = StudyConfig | OpenWorldStudyConfig


class Pipeline(Protocol):
    """What a study's `pipeline` module offers; `data` is what its `check` returns."""

    def check(self, study: Any, cache: ImageCache | None = None) -> Any: ...

    def run(self, study: Any, reporter: Reporter | None = None) -> RunFolder: ...

    def estimate(self, study: Any, data: Any) -> tuple[list[Line], tuple[str, ...]]: ...

    def summary(self, study: Any, data: Any) -> tuple[str, list[str]]: ...

    def redraw_report(self, folder: RunFolder, study: Any) -> list[str]: ...


def pipeline_of(study: AnyStudy) -> Pipeline:
    """The study's pipeline module."""
    return cast(Pipeline, importlib.import_module(f"vlm_decade.studies.{study.study}.pipeline"))


def study_from_dict(raw: dict) -> AnyStudy:
    """A validated study of the kind its `study` field names (Study A when absent)."""
    kind = raw.get("study", "decade")
    if not isinstance(kind, str) or kind not in STUDIES:
        raise ValidationError.from_exception_data(
            "StudyConfig", [{"type": "literal_error", "loc": ("study",), "input": kind, "ctx": {"expected": "'decade' or 'openworld'"}}]
        )
    return STUDIES[kind].model_validate(raw)


def recorded_study(manifest: dict, where: str) -> AnyStudy:
    """The study a run folder's manifest records (`core.runfolder.open_run_folder` read it);
    InputError naming `where` (the manifest) and the field."""
    try:
        return study_from_dict(manifest["config"])
    except ValidationError as exc:
        raise InputError(config_problems(where, exc, "config")) from None


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Paths in a study file are relative to its folder: make them absolute, in place."""
    # Only what has the right shape is resolved: a field of the wrong type (`models: 5`) is left for
    # validation to name, with its field.
    data = raw.get("data")
    if isinstance(data, dict):
        raw["data"] = {k: resolve_path(v, base) for k, v in data.items()}
    lists = {section: raw[section] for section in ("models", "encoders", "metrics") if isinstance(raw.get(section), list)}
    entries = [e for section in lists.values() for e in section]
    entries += [m.get("encoder") for m in lists.get("metrics", []) if isinstance(m, dict)]
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
    if isinstance(raw.get("output"), str) and is_uri(raw["output"]):  # a run folder in a bucket: its local working copy
        problem = uri_problem(raw["output"])
        if problem is not None:
            raise InputError([Problem(str(path) if output is None else "--out", f"{raw['output']}: {problem}", field="output" if output is None else "--out")])
        raw["output"] = str(working_copy(raw["output"]))
    try:
        return study_from_dict(raw)
    except ValidationError as exc:
        raise InputError(config_problems(str(path), exc)) from None


PLAIN = {"path_type": "must be a path (text)", "tuple_type": "must be a list"}


def config_problems(file: str, exc: ValidationError, *within: str) -> list[Problem]:
    """pydantic's errors as problems naming the field (inside `within`, as in a manifest's `config`)
    and, for a value of the wrong kind, the value. A list that is "too short" only because its
    entries failed is not reported again."""
    errors = exc.errors()
    failed = [err["loc"] for err in errors]
    problems = []
    for err in errors:
        loc = err["loc"]
        if err["type"] == "too_short" and any(other[: len(loc)] == loc and other != loc for other in failed):
            continue
        message = PLAIN.get(err["type"]) or err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        if err["type"].endswith(("_type", "_parsing")) and not isinstance(value, (dict, list)):
            message += f" (got {repr(value)[:40]})"
        problems.append(Problem(file, message, field=".".join(str(p) for p in (*within, *loc)) or None))
    return problems
