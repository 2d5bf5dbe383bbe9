"""The two studies, side by side over the shared stages: `decade` (Study A, a decade of VLMs
against people) and `openworld` (Study B, LMMs as open-world classifiers).

Each study is a package with its config, its own stages and a `pipeline` module that offers the
same six functions, the `Pipeline` protocol: `check` (config, data and models, before anything is
written), `run`, `estimate` (API spend before any), `summary` (what `validate` says of it),
`redraw_report` and `export` (the run as one tidy table). Each is registered once in `registry`
(its config, pipeline, viewer pages, job script and demo); the command line and the Ray job
scripts reach a study only through `pipeline_of`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from pydantic import ValidationError

from vlm_decade.core.config import (
    StudyBase,
    check_options,
    error_message,
    field_path,
    json_schema,
    options_markdown,
    output_problems,
    read_study_file,
    reference_markdown,
    resolve_path,
    resolve_paths,
)
from vlm_decade.core.errors import InputError, Problem
from vlm_decade.core.storage import is_uri, uri_problem, working_copy
from vlm_decade.models.backends import BACKENDS, entry_problems
from vlm_decade.models.encoders import ENCODERS
from vlm_decade.studies.registry import DEFAULT, STUDIES, expected, resolve

if TYPE_CHECKING:
    import pyarrow as pa

    from vlm_decade.core.progress import Reporter
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.stages.images import ImageCache
    from vlm_decade.studies.estimate import Line

AnyStudy = StudyBase  # the config of any registered study


def registries() -> dict[str, list[str]]:
    """The names each registry holds: the values a study file's `backend` fields take."""
    return {"backend": BACKENDS.names(), "encoder": ENCODERS.names()}


def schema_markdown(kind: str) -> str:
    """Every field study `kind` takes, as the table `vlm-decade schema` prints and the docs show."""
    return reference_markdown(STUDIES[kind].config, kind, registries())


def schema_json(kind: str) -> dict:
    """The JSON Schema of the study file study `kind` takes."""
    return json_schema(STUDIES[kind].config, kind, registries())


def declared_options() -> dict[str, type]:
    """Every backend that takes options, by the name docs/models.md gives it, and what it declares:
    the registry's backends, the locator, and the LI judge's."""
    from vlm_decade.models.backends import backend_class
    from vlm_decade.models.backends.hf_locator import HFLocator
    from vlm_decade.studies.openworld.config import JUDGE_OPTIONS

    declared = {name: backend_class(name).Options for name in BACKENDS.names()}
    declared["hf-locator (taxonomy.locator)"] = HFLocator.Options
    declared |= {f"{name} (judge)": cls for name, cls in JUDGE_OPTIONS.items()}
    return declared


def options_reference() -> str:
    """The options of every backend, as docs/models.md shows them (`<!-- options -->`)."""
    return "".join(f"\n### `{name}`\n\n{options_markdown(cls)}" for name, cls in declared_options().items())


class Pipeline(Protocol):
    """What a study's `pipeline` module offers; `data` is what its `check` returns."""

    def check(self, study: Any, cache: ImageCache | None = None) -> Any: ...

    def run(self, study: Any, reporter: Reporter | None = None) -> RunFolder: ...

    def estimate(self, study: Any, data: Any) -> tuple[list[Line], tuple[str, ...]]: ...

    def summary(self, study: Any, data: Any) -> tuple[str, list[str]]: ...

    def redraw_report(self, folder: RunFolder, study: Any) -> list[str]: ...

    def export(self, folder: RunFolder, study: Any) -> pa.Table: ...


def pipeline_of(study: AnyStudy) -> Pipeline:
    """The study's pipeline module."""
    return cast(Pipeline, resolve(STUDIES[study.study].pipeline))


def study_from_dict(raw: dict) -> AnyStudy:
    """A validated study of the kind its `study` field names (Study A when absent)."""
    kind = raw.get("study", DEFAULT)
    if not isinstance(kind, str) or kind not in STUDIES:
        raise ValidationError.from_exception_data(
            "StudyConfig",
            [
                {
                    "type": "literal_error",
                    "loc": ("study",),
                    "input": kind,
                    "ctx": {"expected": expected()},
                }
            ],
        )
    return STUDIES[kind].config.model_validate(raw)


def load_study(path: str | Path, output: str | Path | None = None) -> AnyStudy:
    """Read and validate a study file; every config problem is raised together as an InputError.
    Every path in the file is relative to its folder (`output` too); `output` given here (`--out`,
    relative to the current folder) replaces the file's and is checked exactly as the file's is."""
    path = Path(path)
    raw = read_study_file(path)
    kind = raw.get("study", DEFAULT)
    if isinstance(kind, str) and kind in STUDIES:
        resolve_paths(raw, STUDIES[kind].config, path.resolve().parent)
    field = "output" if output is None else "--out"
    if output is not None:
        raw["output"] = resolve_path(str(output), Path.cwd())
    if isinstance(raw.get("output"), str) and is_uri(raw["output"]):  # a run folder in a bucket: its local working copy
        problem = uri_problem(raw["output"])
        if problem is not None:
            where = str(path) if output is None else "command line"
            raise InputError([Problem(where, f"{raw['output']}: {problem}", field=field)])
        raw["output"] = str(working_copy(raw["output"]))
    try:
        study = study_from_dict(raw)
    except ValidationError as exc:
        raise InputError(config_problems(str(path), exc, config_of(kind))) from None
    problems = backend_problems(study) + output_problems(study.output, field)
    if problems:
        raise InputError(problems).located(path)
    return study


def recorded_study(manifest: dict, where: str) -> AnyStudy:
    """The study a run folder's manifest records (`core.runfolder.open_run_folder` read it);
    InputError naming `where` (the manifest) and the field."""
    try:
        return study_from_dict(manifest["config"])
    except ValidationError as exc:
        kind = manifest["config"].get("study", DEFAULT)
        raise InputError(config_problems(where, exc, config_of(kind), within=("config",))) from None


def config_of(kind: Any) -> type[StudyBase]:
    """The config class a file's `study` value declares; Study A's for a value no study has."""
    entry = STUDIES.get(kind) if isinstance(kind, str) else None
    return (entry or STUDIES[DEFAULT]).config


def backend_problems(study: AnyStudy) -> list[Problem]:
    """Every entry's backend and options, checked against what its backend declares, before any
    work: models, encoders, and the study's own (detector, locator, verifier; the judge)."""
    problems = []
    entries = [(("models", i), m.backend, m.options, None) for i, m in enumerate(study.models)] + study.option_entries()
    for where, backend, options, declared in entries:
        if declared is None:
            problems += entry_problems(backend, options, where, BACKENDS)
        else:
            problems += check_options(declared, options, where, backend)
    for where, backend in study.encoder_entries():
        problems += entry_problems(backend, {}, where, ENCODERS)
    return problems


def config_problems(file: str, exc: ValidationError, cls: type, within: tuple = ()) -> list[Problem]:
    """pydantic's errors as problems naming the field (`models[2].backend`, inside `within`, as in a
    manifest's `config`) and, for a value of the wrong kind, the value; an unknown key with the
    closest known one. A list that is "too short" only because its entries failed is not reported
    again. `cls`: the study the file declares."""
    errors = exc.errors()
    failed = [err["loc"] for err in errors]
    problems = []
    for err in errors:
        loc = err["loc"]
        if err["type"] == "too_short" and any(other[: len(loc)] == loc and other != loc for other in failed):
            continue
        problems.append(Problem(file, error_message(cls, err), field=field_path((*within, *loc)) or None))
    return problems
