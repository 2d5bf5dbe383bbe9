"""The `openai` and `gemini` backends: multimodal chat models behind their providers' APIs.

These backends are `remote`: they never sit in the describe stage's CPU actor pool. The describe
stage encodes each stimulus as PNG bytes in loader tasks and sends the requests through the
provider's gateway actor (`vlm_decade.models.api.gateway`), which holds the limits, cache and budget.
Options (`models[].options`): temperature, max_output_tokens, detail (openai), reasoning_effort
(openai o-series / gpt-5), thinking_budget (gemini 2.5), thinking_level (gemini 3).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vlm_decade.core.config import BackendOptions, ModelConfig
from vlm_decade.models.api.providers import provider_class
from vlm_decade.models.backends import Backend, Description, Stimulus


class ChatOptions(BackendOptions):
    """What both providers' chat models take."""

    temperature: float = Field(
        0.0, ge=0.0, le=2.0, description="sampling temperature (0: the most likely answer; reasoning models take none)"
    )
    max_output_tokens: int = Field(
        None,
        ge=1,
        description="the longest answer, reasoning or thinking included "
        "(default: 300; 2000 for reasoning and thinking models)",
    )


class OpenAITextOptions(ChatOptions):
    """OpenAI's chat options for a request without an image (the LI judge)."""

    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] = Field(
        None, description="o-series and gpt-5 models: how much they reason (default: low; gpt-5-pro: high)"
    )


class OpenAIOptions(OpenAITextOptions):
    detail: Literal["auto", "low", "high"] = Field("auto", description="how finely the image is read (low: 85 tokens)")


class GeminiOptions(ChatOptions):
    thinking_budget: int = Field(
        None,
        ge=-1,
        description="Gemini 2.5: thinking tokens (0: none; -1: the model decides; default: 1024, Flash-Lite 0)",
    )
    thinking_level: Literal["minimal", "low", "medium", "high"] = Field(
        None, description="Gemini 3: how much it thinks (its Pro: low or high; default: low)"
    )


class APIBackend(Backend):
    remote = True
    provider: str

    @classmethod
    def settings(cls, model: ModelConfig) -> dict:
        """The generation settings sent with every request (part of the API cache key)."""
        return provider_class(cls.provider).settings(model.model_id, model.options)

    @classmethod
    def fingerprint(cls, model: ModelConfig) -> dict:
        return {"provider": model.endpoint or cls.provider, "model_id": model.model_id, "settings": cls.settings(model)}

    def describe(self, batch: list[Stimulus]) -> list[Description]:
        raise RuntimeError("API backends are described through their provider's gateway actor (stages.describe.remote)")


class OpenAIBackend(APIBackend):
    provider = "openai"
    Options = OpenAIOptions


class GeminiBackend(APIBackend):
    provider = "gemini"
    Options = GeminiOptions
