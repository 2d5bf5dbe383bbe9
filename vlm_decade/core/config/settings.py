"""What every section of a study file is: `Settings`, a frozen pydantic model whose unknown keys are
errors and whose fields each carry the description `vlm-decade schema` prints; `BackendOptions`, the
strict options a backend declares; and the field kinds that say more of a field than its type: an
`operational` one changes how fast work runs but never what it produces (`Settings.fingerprint()`
leaves it out), a `for_studies` one only some studies take, a `registry_field` names a registry's
entry, and a `FolderLocation` is a local folder or an object-storage URI.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema, field_validator

from vlm_decade.core.storage import is_uri, uri_problem

OPERATIONAL = {"affects_results": False}


def _folder_location(value: Any) -> Path | str:
    if isinstance(value, Path):
        return value
    if not isinstance(value, str):
        raise ValueError("must be a path or an s3:// or gs:// URI (text)")
    if is_uri(value):
        problem = uri_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value
    return Path(value)


# A folder on a local or shared disk (a Path), or in object storage (the URI as text).
FolderLocation = Annotated[Path | str, PlainValidator(_folder_location), WithJsonSchema({"type": "string"})]


def operational(default: Any, description: str, **constraints: Any) -> Any:
    """A field that changes how work runs, never what it produces: left out of `fingerprint()`."""
    return Field(default, description=description, json_schema_extra=OPERATIONAL, **constraints)


def for_studies(default: Any, description: str, *studies: str) -> Any:
    """A field only the named studies take: `vlm-decade schema` shows it for them alone, and
    any other refuses it, set (`set_for_other_studies`)."""
    return Field(default, description=description, json_schema_extra={"studies": list(studies)})


def registry_field(default: Any, description: str, registry: str) -> Any:
    """A field whose value names an entry of a registry ("backend", "encoder"): the schema lists the
    registry's names, read from it, so a new backend is shown the moment it is registered."""
    return Field(default, min_length=1, description=description, json_schema_extra={"registry": registry})


def schema_extra(field: Any, key: str) -> Any:
    """What a field's kind put under `key` in its schema extra ("studies", "registry", "key"), or None."""
    return field.json_schema_extra.get(key) if isinstance(field.json_schema_extra, dict) else None


def taken_by(field: Any, study: str | None) -> bool:
    """Whether `study` takes this field (every field but those `for_studies` names others for)."""
    studies = schema_extra(field, "studies")
    return study is None or studies is None or study in studies


def set_for_other_studies(section: Settings, study: str) -> list[str]:
    """The fields set in `section` to other than their default that `study` does not take (the study
    refuses them). A default written out, as a run folder's manifest records every field, is no
    request for anything."""
    fields = type(section).model_fields
    return sorted(
        name
        for name in section.model_fields_set
        if not taken_by(fields[name], study)
        and getattr(section, name) != fields[name].get_default(call_default_factory=True)
    )


def settings_in(annotation: Any) -> type[Settings] | None:
    """The Settings class a field holds, directly or as the items of a tuple (or None-able)."""
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, Settings)), None)


class Settings(BaseModel):
    """A frozen section of a study file. No text field may be only whitespace: a name or prompt of
    blanks would pass a length check and name nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _not_only_whitespace(cls, value: Any) -> Any:
        if isinstance(value, str) and value and not value.strip():
            raise ValueError("is only whitespace")
        return value

    @classmethod
    def _operational(cls) -> dict:
        """pydantic's `exclude` for the operational fields, nested sections included."""
        exclude: dict = {}
        for name, field in cls.model_fields.items():
            if field.json_schema_extra == OPERATIONAL:
                exclude[name] = True
                continue
            inner = settings_in(field.annotation)
            nested = inner._operational() if inner else {}
            if nested:
                is_tuple = getattr(field.annotation, "__origin__", None) is tuple
                exclude[name] = {"__all__": nested} if is_tuple else nested
        return exclude

    def fingerprint(self) -> dict:
        """What in these settings decides results: every field but the operational ones, as JSON."""
        return self.model_dump(mode="json", exclude=self._operational())

    def key(self, without: tuple[str, ...] = ()) -> str:
        """A short hash of `fingerprint()` less the fields `without` (e.g. a display name)."""
        payload = {k: v for k, v in self.fingerprint().items() if k not in without}
        return hashlib.sha256(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()[:16]


class BackendOptions(Settings):
    """The options one backend takes (`options:` of a model, encoder, detector, locator or judge),
    declared next to the backend class as its `Options`: `check_options` refuses an unknown name with
    a "did you mean" and a bad value with its allowed range, before any work. Strict: `k: 2.5` or
    `score_threshold: "high"` is refused, not rounded or read."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
