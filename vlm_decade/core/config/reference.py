"""The study file's reference as the docs and `vlm-decade schema` show it, read from the sections
themselves: every field's key, type, default and description (`reference_markdown`), the JSON
Schema of what a study takes (`json_schema`), and a backend's options (`options_markdown`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from vlm_decade.core.config.messages import range_text
from vlm_decade.core.config.settings import BackendOptions, Settings, schema_extra, settings_in, taken_by


def _type_text(annotation: Any) -> str:
    """A field's type as a study file's author reads it."""
    origin, args = getattr(annotation, "__origin__", None), getattr(annotation, "__args__", ())
    if hasattr(annotation, "__metadata__"):  # Annotated (an optional folder location's): its type's text
        return _type_text(origin)
    if origin is Literal:
        return " or ".join(str(a) for a in args)
    if origin is tuple:
        return f"list of {_type_text(args[0])}" if len(args) == 2 and args[1] is Ellipsis else "list"
    if origin is dict:
        return "mapping"
    if origin is list:
        return f"list of {_type_text(args[0])}" if args else "list"
    if args and type(None) in args:  # X | None
        return " or ".join(_type_text(a) for a in args if a is not type(None)) + " or none"
    if isinstance(annotation, type) and issubclass(annotation, Settings):
        return "section"
    if set(args) == {Path, str}:
        return "path or URI"
    return {Path: "path", str: "text", int: "integer", float: "number", bool: "true/false"}.get(
        annotation, str(annotation)
    )


_REQUIRED = object()


def _value_text(value: Any) -> str:
    if value is _REQUIRED:
        return "required"
    if isinstance(value, Settings):
        return "(below)"
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(str(getattr(v, "name", getattr(v, "id", v))) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    text = "{}" if value == {} else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def reference(
    cls: type[Settings],
    prefix: str = "",
    defaults: Settings | None = None,
    study: str | None = None,
    registries: dict[str, list[str]] | None = None,
) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every field of a section and the sections inside it
    that `study` takes; `defaults`: the section's default value, whose fields are the defaults
    shown; `registries`: the names of each registry, the values a `registry_field` takes."""
    rows = []
    for name, field in cls.model_fields.items():
        if not taken_by(field, study):
            continue
        key = prefix + name
        if defaults is not None:
            value = getattr(defaults, name)
        else:
            value = _REQUIRED if field.is_required() else field.get_default(call_default_factory=True)
        names = (registries or {}).get(schema_extra(field, "registry"))
        kind = "one of " + ", ".join(names) if names else _type_text(field.annotation)
        rows.append((key, kind, _value_text(value), field.description or ""))
        inner = settings_in(field.annotation)
        if inner is not None:
            origin = getattr(field.annotation, "__origin__", None)
            label = schema_extra(field, "key") or "<model id>"  # what a mapping's keys are
            nested = {tuple: "[].", dict: f".{label}."}.get(origin, ".")
            rows += reference(inner, key + nested, value if isinstance(value, Settings) else None, study, registries)
    return rows


def reference_markdown(
    cls: type[Settings], study: str | None = None, registries: dict[str, list[str]] | None = None
) -> str:
    """`reference` as a Markdown table (what `vlm-decade schema` prints and the docs show)."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = ["| key | type | default | what |", "| --- | --- | --- | --- |"]
    rows = reference(cls, study=study, registries=registries)
    lines += [f"| `{key}` | {cell(kind)} | {cell(default)} | {cell(what)} |" for key, kind, default, what in rows]
    return "\n".join(lines) + "\n"


def json_schema(cls: type[Settings], study: str | None = None, registries: dict[str, list[str]] | None = None) -> dict:
    """The JSON Schema of what `study` takes: pydantic's, less the fields only other studies take,
    and with each `registry_field`'s names as its enum."""
    schema = cls.model_json_schema()
    for section in [schema, *schema.get("$defs", {}).values()]:
        properties = section.get("properties", {})
        for name, prop in list(properties.items()):
            studies, registry = prop.pop("studies", None), prop.pop("registry", None)
            if study is not None and studies is not None and study not in studies:
                del properties[name]
                section["required"] = [r for r in section.get("required", []) if r != name]
            elif registry in (registries or {}):
                prop["enum"] = list(registries[registry])
    return schema


def options_markdown(cls: type[BackendOptions]) -> str:
    """A backend's declared options as a Markdown table, with each number's allowed range (what
    docs/models.md shows; a test keeps the two equal)."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    if not cls.model_fields:
        return "No options.\n"
    lines = ["| option | type | default | what |", "| --- | --- | --- | --- |"]
    for name, field in cls.model_fields.items():
        allowed = range_text(field)
        kind = _type_text(field.annotation) + (f", {allowed}" if allowed else "")
        default = _value_text(field.get_default(call_default_factory=True))
        lines.append(f"| `{name}` | {cell(kind)} | {cell(default)} | {cell(field.description or '')} |")
    return "\n".join(lines) + "\n"
