"""The `openai` and `gemini` backends: multimodal chat models behind their providers' APIs.

These backends are `remote`: they never sit in the describe stage's CPU actor pool. The describe
stage encodes each stimulus as PNG bytes in loader tasks and sends the requests through the
provider's gateway actor (`vlm_decade.models.api.gateway`), which holds the limits, cache and budget.
Options (`models[].options`): temperature, max_output_tokens, detail (openai), reasoning_effort
(openai o-series / gpt-5), thinking_budget (gemini 2.5).
"""

from __future__ import annotations

from vlm_decade.core.config import ModelConfig
from vlm_decade.core.errors import Problem
from vlm_decade.models.api.keys import api_key, key_hint
from vlm_decade.models.api.providers import CHAT_OPTIONS, provider_class
from vlm_decade.models.backends import Backend, Description, Stimulus


class APIBackend(Backend):
    remote = True
    provider: str

    @classmethod
    def settings(cls, model: ModelConfig) -> dict:
        """The generation settings sent with every request (part of the API cache key)."""
        return provider_class(cls.provider).settings(model.model_id, model.options)

    @classmethod
    def fingerprint(cls, model: ModelConfig) -> dict:
        return {"provider": cls.provider, "model_id": model.model_id, "settings": cls.settings(model)}

    @classmethod
    def check(cls, model: ModelConfig, image_ids: set[str], variants: list[str]) -> list[Problem]:
        where = f"models[{model.name}]"
        problems = []
        if api_key(cls.provider) is None:
            problems.append(Problem("environment", f"model '{model.name}' needs an API key: set {key_hint(cls.provider)}", field=where))
        unknown = sorted(set(model.options) - CHAT_OPTIONS)
        if unknown:
            problems.append(Problem("study file", f"unknown options {unknown}; known: {sorted(CHAT_OPTIONS)}", field=f"{where}.options"))
        else:
            try:
                cls.settings(model)
            except (TypeError, ValueError) as exc:
                problems.append(Problem("study file", f"bad option value: {exc}", field=f"{where}.options"))
        return problems

    def describe(self, batch: list[Stimulus]) -> list[Description]:
        raise RuntimeError("API backends are described through their provider's gateway actor (stages.describe.remote)")


class OpenAIBackend(APIBackend):
    provider = "openai"


class GeminiBackend(APIBackend):
    provider = "gemini"
