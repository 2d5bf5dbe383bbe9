"""The LI judge of Study B (METHOD.md): an instruct LLM reads a ready-made prompt (does this
prediction name this label?) and answers in text. The prompts are built by
`openworld.metrics.judge_prompt`, and the metric turns the answers into 1 or 0; this module only
gets the answers.

The same interface, `Judge.judge(prompts) -> list[JudgeAnswer]` (one answer per prompt, in order),
covers both kinds of judge:

- `LocalJudge` (backend `hf-judge`): a local instruct model through transformers, like the paper's
  Llama-3.2-3B-Instruct. Each prompt is one user message in the tokenizer's chat template,
  answered greedily with at most 16 new tokens. Prompts are batched with left padding, so a batch
  gives the same answers as its prompts one at a time. Weights are found the same way as for the HF
  backends: the configured path, then the hub id (with HF_HUB_OFFLINE, only the hub cache).
- `RemoteJudge` / `judge_remote` (backends `openai`, `gemini`): text-only chat requests through the
  provider's gateway actor, so the judge shares the run's cache, rate limits and budget with every
  other API request.

`judge_available` tells the pipeline before any work whether the configured judge can run, and if
not, why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from vlm_decade.core.config import ModelConfig, ProvidersConfig
from vlm_decade.core.dispatch import batches, bounded
from vlm_decade.core.errors import InputError, Problem, error_text
from vlm_decade.core.progress import Reporter
from vlm_decade.models.api.answers import gateway_call_failed
from vlm_decade.models.api.endpoints import endpoint_problems, prices_field, route_problems, served_by
from vlm_decade.models.api.keys import api_key, key_hint
from vlm_decade.models.api.providers import judge_settings as api_judge_settings
from vlm_decade.models.backends import parsed_options
from vlm_decade.models.backends.hf_common import (
    configure_threads,
    generation_kwargs,
    model_version,
    placement,
    run_split,
    weight_problems,
    weight_source,
)
from vlm_decade.studies.openworld.config import JudgeConfig, LocalJudgeOptions
from vlm_decade.studies.openworld.metrics import JUDGE_MAX_NEW_TOKENS

LOCAL_BACKEND = "hf-judge"
JUDGE_NAME = "LI judge"  # how messages name it
RECORD_S = 5.0  # how often it writes the money spent to the manifest


@dataclass(frozen=True)
class JudgeAnswer:
    """The judge's raw answer to one prompt. `status` is ok, error (`error` says why) or skipped
    (an API budget stopped the request). Tokens and cost are recorded where they are known. `cached`
    means an API answer came from the response cache."""

    text: str
    status: str = "ok"
    error: str = ""
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float = 0.0
    model_version: str = ""
    cached: bool = False


class Judge(Protocol):
    def judge(self, prompts: list[str]) -> list[JudgeAnswer]:
        """One answer per prompt, in order."""
        ...


def _as_model(config: JudgeConfig) -> ModelConfig:
    """The judge as the HF backends' weight resolution sees a model."""
    return ModelConfig(
        name=JUDGE_NAME, backend=config.backend, model_id=config.model_id, path=config.path, options=config.options
    )


# availability -----------------------------------------------------------------------------------
def judge_available(config: JudgeConfig, providers: ProvidersConfig) -> str | None:
    """None if the judge can run; otherwise why it cannot (weights neither at `path` nor in the
    offline hub cache, no API key, no price; its options are checked with the study file). Nothing
    is loaded or sent."""
    if config.backend == LOCAL_BACKEND:
        return " ".join(p.message for p in weight_problems(_as_model(config))) or None
    provider = served_by(config.backend, config.endpoint)
    where = f"{JUDGE_NAME} ({provider} {config.model_id})"
    if config.endpoint is None and api_key(provider) is None:
        return f"{where} needs an API key: set {key_hint(provider)}"
    problems = route_problems(providers, config.backend, config.endpoint, "judge.endpoint")
    if problems:
        return f"{where}: {problems[0].message}"
    cfg = providers.of(provider)
    if cfg.price(provider, config.model_id) is None:
        return f"{where} has no price; add it under {prices_field(provider, cfg)}"
    if config.endpoint is not None:  # its key, and whether it answers and serves the model
        problems = endpoint_problems(providers, {config.endpoint: {config.model_id: "judge.model_id"}})
    return f"{where}: {problems[0].message}" if problems else None


# local ------------------------------------------------------------------------------------------
def _answer_length(tokens: list[int], stops: set[int]) -> int:
    """Generated tokens up to and including the first end-of-sequence token (generate pads what
    follows)."""
    return next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))


class LocalJudge:
    """A local instruct model. Options (`judge.options`): `max_new_tokens` (16), `generate` (extra
    generate kwargs; greedy unless they say otherwise), `dtype`, `device`, `device_map`."""

    def __init__(self, config: JudgeConfig, reporter: Reporter | None = None):
        model = _as_model(config)
        try:
            self.options = parsed_options(model, LocalJudgeOptions)
        except ValueError as exc:
            raise InputError([Problem(JUDGE_NAME, str(exc), field="judge.options")]) from None
        problems = weight_problems(model)
        if problems:
            raise InputError(problems)
        configure_threads()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source = weight_source(model)
        device, dtype, extra = placement(self.options)
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        if not self.tokenizer.chat_template:
            raise InputError(
                [
                    Problem(
                        str(config.path or config.model_id),
                        f"{JUDGE_NAME}: the tokenizer has no chat template, so this is no instruct (chat) model",
                        field="judge.model_id",
                    )
                ]
            )
        # Decoder-only: right padding would put pads between the prompt and the answer.
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:  # Llama 3 has none; pads are masked out anyway
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.net = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **extra)
        if "device_map" not in extra:
            self.net.to(device)
        self.net.eval()
        self.generation = {"pad_token_id": self.tokenizer.pad_token_id, **generation_kwargs(self.options)}
        eos = self.net.generation_config.eos_token_id
        self.stops = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.model_version = model_version(model, self.net)
        self.batch_size = config.batch_size
        self.reporter = reporter or Reporter(quiet=True)
        self._torch = torch

    def chat_text(self, prompt: str) -> str:
        """The templated text for one user message holding `prompt`, ready for the answer."""
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )

    def _run(self, prompts: list[str]) -> list[JudgeAnswer]:
        # The template already holds any BOS token the model wants: adding special tokens would double it.
        inputs = self.tokenizer(
            [self.chat_text(p) for p in prompts], padding=True, add_special_tokens=False, return_tensors="pt"
        ).to(self.net.device)
        out = self.net.generate(**inputs, **self.generation)
        new = out[:, inputs["input_ids"].shape[1] :].tolist()
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        sizes = inputs["attention_mask"].sum(dim=1).tolist()
        return [
            JudgeAnswer(
                text.strip(),
                input_tokens=int(n),
                output_tokens=_answer_length(tokens, self.stops),
                model_version=self.model_version,
            )
            for text, n, tokens in zip(texts, sizes, new)
        ]

    def judge(self, prompts: list[str]) -> list[JudgeAnswer]:
        """Each distinct prompt is answered once. A batch that fails is split in halves until only
        the failing prompt's answer is an error."""
        unique = list(dict.fromkeys(prompts))
        answers: dict[str, JudgeAnswer] = {}
        with self.reporter.track("judge", len(unique)) as advance, self._torch.inference_mode():
            for batch in batches(unique, self.batch_size):
                for prompt, answer in zip(batch, run_split(self._run, batch)):
                    if isinstance(answer, Exception):
                        answer = JudgeAnswer("", "error", error_text(answer), model_version=self.model_version)
                    answers[prompt] = answer
                advance(len(batch))
        return [answers[p] for p in prompts]


# API --------------------------------------------------------------------------------------------
def judge_settings(config: JudgeConfig) -> dict:
    """The generation settings an API judge sends: the paper's 16 output tokens unless the model
    thinks, and no image."""
    return api_judge_settings(
        config.backend, config.model_id, config.options, JUDGE_MAX_NEW_TOKENS, image=False, room_to_think=True
    )


def _from_row(row: dict) -> JudgeAnswer:
    return JudgeAnswer(
        row["text"],
        row["status"],
        row["error"],
        row["input_tokens"],
        row["output_tokens"],
        row["cost_usd"],
        row["model_version"],
        row.get("cached", False),
    )


def judge_remote(
    ray,
    study,
    folder,
    provider: str,
    model_id: str,
    settings: dict,
    prompts: list[str],
    reporter: Reporter,
    mode: str | None = None,
) -> list[JudgeAnswer]:
    """Answers from an API model: each distinct prompt is one text-only request to the run's gateway
    actor for `provider`, with up to twice the provider's `max_concurrency` requests in flight.
    `study` is any study config (its `providers` are used) and `folder` the run folder whose manifest
    records the money spent. An answer the cache holds is not bought again, and a request the budget
    stops comes back `skipped`."""
    from vlm_decade.models.api.providers import ChatRequest
    from vlm_decade.models.api.session import RemoteSession, stop_if_pending

    if not prompts:
        return []  # no gateway actor for nothing
    unique = list(dict.fromkeys(prompts))
    cfg = study.providers.of(provider)
    batch = (mode or cfg.mode) == "batch"
    # In batch mode every question is handed over at once: the gateway groups them into batches.
    in_flight = len(unique) if batch else 2 * cfg.max_concurrency
    answers: dict[str, JudgeAnswer] = {}
    with (
        RemoteSession(ray, study.providers, folder, provider) as session,
        reporter.track("judge", len(unique)) as advance,
    ):
        submit = lambda prompt, _: session.actor.chat.remote(ChatRequest(model_id, prompt, settings=settings), batch)  # noqa: E731
        last_record = time.monotonic()
        for done in bounded(ray, unique, submit, in_flight):
            # a lost call is an error answer, asked again next run
            answers[done.work] = (
                _from_row(done.value)
                if done.error is None
                else JudgeAnswer("", "error", gateway_call_failed(done.error))
            )
            advance(1)
            if time.monotonic() - last_record >= RECORD_S:
                session.record()
                last_record = time.monotonic()
    stop_if_pending([{"status": a.status, "error": a.error} for a in answers.values()], JUDGE_NAME)
    skipped = [a.error for a in answers.values() if a.status == "skipped"]
    if skipped:
        reporter.say(f"     {JUDGE_NAME}: {len(skipped)} requests not sent: {skipped[0]}")
    return [answers[p] for p in prompts]


class RemoteJudge:
    """An API model (backend `openai` or `gemini`) as a `Judge`, through the run's gateway actor."""

    def __init__(self, ray, study, folder, config: JudgeConfig, reporter: Reporter):
        self.ray, self.study, self.folder, self.config, self.reporter = ray, study, folder, config, reporter
        self.settings = judge_settings(config)

    def judge(self, prompts: list[str]) -> list[JudgeAnswer]:
        return judge_remote(
            self.ray,
            self.study,
            self.folder,
            served_by(self.config.backend, self.config.endpoint),
            self.config.model_id,
            self.settings,
            prompts,
            self.reporter,
            self.config.mode,
        )
