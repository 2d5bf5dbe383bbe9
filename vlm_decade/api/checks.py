"""Study-level checks for API models and encoders, run by `validate` before any work, and the
demo's rule for API models whose key is missing (dropped, with a note, rather than failing)."""

from __future__ import annotations

from ..config import StudyConfig
from ..errors import Problem
from .keys import api_key, key_hint


def _api_provider(kind: str, backend: str) -> str | None:
    from ..backends import backend_class
    from ..encoders import encoder_class

    try:
        cls = backend_class(backend) if kind == "models" else encoder_class(backend)
    except KeyError:
        return None  # reported by the registry check
    return getattr(cls, "provider", None) if cls.remote else None


def study_problems(study: StudyConfig) -> list[Problem]:
    """Missing keys for API encoders (models check their own), and models without a known price."""
    problems = []
    for kind, entries in (("models", study.models), ("encoders", getattr(study, "encoders", ()))):
        for i, entry in enumerate(entries):
            provider = _api_provider(kind, entry.backend)
            if provider is None:
                continue
            if kind == "encoders" and api_key(provider) is None:
                problems.append(Problem("environment", f"encoder '{entry.name}' needs an API key: set {key_hint(provider)}", field=f"encoders.{i}"))
            if getattr(study.providers, provider).price(provider, entry.model_id) is None:
                problems.append(
                    Problem("study file", f"no price for {provider} model '{entry.model_id}'; add one under providers.{provider}.prices", field=f"{kind}.{i}.model_id")
                )
    return problems


def api_budgets(study: StudyConfig) -> dict[str, float | None]:
    """Budgets of the providers a study's models use: part of the describe stage's settings, so a
    run with a higher budget takes up the rows an earlier budget skipped."""
    used = {p for m in study.models if (p := _api_provider("models", m.backend))}
    return {p: getattr(study.providers, p).budget_usd for p in sorted(used)}


def drop_unkeyed(study: StudyConfig) -> tuple[StudyConfig, list[str]]:
    """The study without API models and encoders whose key is missing, and a note for each."""
    notes: list[str] = []

    def keyed(entries, section: str, what: str) -> tuple:
        kept = []
        for entry in entries:
            p = _api_provider(section, entry.backend)
            if p and api_key(p) is None:
                notes.append(f"skipping {what} {entry.name}: no {key_hint(p)} set")
            else:
                kept.append(entry)
        return tuple(kept)

    update = {"models": keyed(study.models, "models", "model")}
    if hasattr(study, "encoders"):  # Study B's Sentence-BERT encoder is always local
        update["encoders"] = keyed(study.encoders, "encoders", "encoder")
    return study.model_copy(update=update), notes
