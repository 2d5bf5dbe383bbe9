"""`vlm-decade estimate`: the requests, tokens and dollars a study's API work would take, before
any is spent. Each request is built exactly as the describe stage would build it, so a request the
cache already answers is counted as cached and free.

Input tokens follow the providers' published counting rules (text at about 4 characters a token,
images by tiles); output is counted at each model's `max_output_tokens` cap, so the dollars are an
upper bound. Embeddings count every human description plus one answer per request at the cap.
Study B's API judge counts one request per prediction (every model, image and prompt), each
prediction at its model's cap (LOCAL_ANSWER_TOKENS for local models).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..config import StudyConfig
from .cache import ResponseCache
from .providers import ChatRequest, chat_key, cost, embed_key, provider_class, text_tokens
from .session import cache_dir

LOCAL_ANSWER_TOKENS = 64  # what a local model's answer is counted at in a judge request


@dataclass
class Line:
    provider: str
    what: str  # model or encoder name
    requests: int = 0
    cached: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0


def estimate(study: StudyConfig, images, references) -> list[Line]:
    from ..backends import backend_class
    from ..describe import load_png, plan_jobs
    from ..encoders import encoder_class

    cache = ResponseCache(cache_dir(study))
    lines: list[Line] = []
    answer_tokens = 0
    api_models = {m.name: m for m in study.models if backend_class(m.backend).remote}
    jobs = [j for j in plan_jobs(study, images) if j.subject in api_models]
    by_model = defaultdict(list)
    for job in jobs:
        by_model[job.subject].append(job)
    for name, model_jobs in by_model.items():
        model = api_models[name]
        cls = backend_class(model.backend)
        provider, settings = cls.provider, cls.settings(model)
        price = getattr(study.providers, provider).price(provider, model.model_id)
        line = Line(provider, name)
        for job, png in zip(model_jobs, load_png(model_jobs)):
            if isinstance(png, str):
                continue  # an unreadable image is an error row, never a request
            req = ChatRequest(model.model_id, job.prompt, png, settings)
            line.requests += 1
            answer_tokens += settings["max_output_tokens"]
            if cache.has("chat", chat_key(provider, req)):
                line.cached += 1
                continue
            n_in = provider_class(provider).estimate_input(req)
            line.input_tokens += n_in
            line.output_tokens += settings["max_output_tokens"]
            line.usd += cost(price, n_in, settings["max_output_tokens"]) if price else 0.0
        lines.append(line)
    human = sorted({t.strip() for t in references.column("text").to_pylist() if t and t.strip()})
    for enc in getattr(study, "encoders", ()):
        cls = encoder_class(enc.backend)
        if not cls.remote:
            continue
        price = getattr(study.providers, cls.provider).price(cls.provider, enc.model_id)
        line = Line(cls.provider, enc.name)
        todo = [t for t in human if not cache.has("embed", embed_key(cls.provider, enc.model_id, t))]
        tokens = sum(map(text_tokens, todo)) + answer_tokens
        line.requests = -(-(len(todo) + len(jobs)) // enc.batch_size)
        line.cached = len(human) - len(todo)
        line.input_tokens = tokens
        line.usd = cost(price, tokens, 0) if price else 0.0
        lines.append(line)
    judge = getattr(study, "judge", None)
    if judge is not None and judge.backend in ("openai", "gemini"):
        lines.append(_judge_line(study, images))
    return lines


def _judge_line(study, images) -> Line:
    """The LI judge: at most one text-only request per prediction."""
    from ..backends import backend_class
    from ..describe import model_prompts
    from ..openworld.judge import judge_settings
    from ..openworld.metrics import judge_prompt

    judge, provider = study.judge, study.judge.backend
    price = getattr(study.providers, provider).price(provider, judge.model_id)
    out_cap = judge_settings(judge)["max_output_tokens"]
    line = Line(provider, f"judge {judge.model_id}")
    template = text_tokens(judge_prompt("", ""))
    for model in study.models:
        cls = backend_class(model.backend)
        answer = cls.settings(model)["max_output_tokens"] if cls.remote else LOCAL_ANSWER_TOKENS
        n = images.num_rows * len(model_prompts(model, study))
        line.requests += n
        line.input_tokens += n * (template + answer + 4)  # + the label
        line.output_tokens += n * out_cap
    line.usd = cost(price, line.input_tokens, line.output_tokens) if price else 0.0
    return line


def render(study: StudyConfig, lines: list[Line]) -> str:
    if not lines:
        return "no API models, encoders or judge in this study: nothing to spend"
    out = [f"{'provider':<8} {'model/encoder':<24} {'requests':>9} {'cached':>7} {'tokens in':>11} {'tokens out*':>12} {'US$ at most':>12}"]
    totals: dict[str, float] = defaultdict(float)
    for ln in lines:
        out.append(f"{ln.provider:<8} {ln.what:<24} {ln.requests:>9} {ln.cached:>7} {ln.input_tokens:>11} {ln.output_tokens:>12} {ln.usd:>12.4f}")
        totals[ln.provider] += ln.usd
    for provider, usd in sorted(totals.items()):
        budget = getattr(study.providers, provider).budget_usd
        cap = "no budget cap" if budget is None else f"budget ${budget:g}" + (" (would stop the run)" if usd > budget else "")
        out.append(f"{provider}: at most ${usd:.4f}; {cap}")
    out.append("* output counted at each model's max_output_tokens; cached requests are free; embeddings of "
               "model answers counted at that cap too. Prices: config.DEFAULT_PRICES as of config.PRICES_AS_OF "
               "and providers.<name>.prices")
    if getattr(study, "taxonomy", None) is not None:
        out.append("The error taxonomy's probe questions (one or two per object an API model's description leaves "
                   "out or adds) are not counted: they depend on the descriptions; the budget caps them too.")
    return "\n".join(out)
