"""`vlm-decade estimate`: the requests, tokens and dollars a study's API work would take, before any
is spent. The shared stages' requests are counted here (`describe_lines`, `embed_lines`), the
studies' own ones beside their stages (Study B's judge, the taxonomy's probes); a study's pipeline
puts the lines together and `render` prints them.

Input tokens follow the providers' published counting rules (text at about 4 characters a token,
images by tiles); output is counted at each model's `max_output_tokens` cap, so the dollars are an
upper bound. A request the cache already answers is counted as cached and free. Each line is a range:
`usd_low` is what its requests cost if every answer were empty (the requests certain to be sent,
at their input tokens); for requests that depend on the answers (the taxonomy's probe questions, the
LI judge) the low end is nothing and the high end an upper bound on how many there can be.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from vlm_decade.core.config import StudyBase, stale_prices
from vlm_decade.models.api.batch import BATCH_DISCOUNT
from vlm_decade.models.api.cache import ResponseCache
from vlm_decade.models.api.endpoints import cache_revision, is_free, served_by
from vlm_decade.models.api.session import cache_dir
from vlm_decade.models.backends import backend_class
from vlm_decade.models.encoders import encoder_class
from vlm_decade.stages.describe.plan import Plan, jobs_from, load_png, plan_jobs


@dataclass
class Line:
    """What one model, encoder or judge would send to one provider."""

    provider: str
    what: str  # model or encoder name
    requests: int = 0
    cached: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0  # at most
    usd_low: float = 0.0  # at least
    mode: str | None = None  # the model's, encoder's or judge's own `mode` (none: the provider's)
    model_id: str = ""  # what the provider is asked for: its price is looked up by it

    @property
    def usd_batch(self) -> float:
        """At most, in batch mode."""
        return self.usd * BATCH_DISCOUNT

    def planned(self, provider_mode: str) -> tuple[float, float]:
        """(at least, at most) in the mode these requests will be sent in."""
        discount = BATCH_DISCOUNT if (self.mode or provider_mode) == "batch" else 1.0
        return self.usd_low * discount, self.usd * discount


def response_cache(study: StudyBase) -> ResponseCache:
    """The cache the study's gateways would answer from."""
    return ResponseCache(cache_dir(study.providers))


def describe_lines(study: StudyBase, plan: Plan, images: pa.Table, cache) -> tuple[list[Line], int, int]:
    """The describe stage's API requests, built exactly as the stage would send them (a request the
    cache answers is counted as cached and free); and how many answers they give, and the answer
    tokens at most, which the embed stage would then encode."""
    from vlm_decade.models.api.providers import ChatRequest, chat_key, cost, provider_class

    api_models = {m.name: m for m in study.models if backend_class(m.backend).remote}
    by_model = defaultdict(list)
    jobs = plan_jobs(study, plan, images)
    api_jobs = jobs.filter(pc.is_in(jobs.column("subject"), pa.array(list(api_models), pa.string())))
    for job in jobs_from(api_jobs, plan, images):
        by_model[job.subject].append(job)
    lines, answer_tokens = [], 0
    n_answers = sum(len(j) for j in by_model.values())
    for name, model_jobs in by_model.items():
        model = api_models[name]
        cls = backend_class(model.backend)
        provider, settings = served_by(cls.provider, model.endpoint), cls.settings(model)
        cfg = study.providers.of(provider)
        price, revision = cfg.price(provider, model.model_id), cache_revision(cfg)
        line = Line(provider, name, mode=model.mode, model_id=model.model_id)
        for job, png in zip(model_jobs, load_png(model_jobs)):
            if isinstance(png, str):
                continue  # an unreadable image is an error row, never a request
            req = ChatRequest(model.model_id, job.prompt, png, settings)
            line.requests += 1
            answer_tokens += settings["max_output_tokens"]
            if cache.has("chat", chat_key(provider, req, revision)):
                line.cached += 1
                continue
            n_in = provider_class(study.providers.api(provider)).estimate_input(req)
            line.input_tokens += n_in
            line.output_tokens += settings["max_output_tokens"]
            line.usd += cost(price, n_in, settings["max_output_tokens"]) if price else 0.0
            line.usd_low += cost(price, n_in, 0) if price else 0.0
        lines.append(line)
    return lines, n_answers, answer_tokens


def embed_lines(study: StudyBase, human_texts: list[str], n_answers: int, answer_tokens: int, cache) -> list[Line]:
    """The embed stage's requests, per API encoder: every human description the cache lacks, plus
    the models' answers (`n_answers`, `answer_tokens` at most)."""
    from vlm_decade.models.api.providers import cost, embed_key, text_tokens

    human = sorted({t.strip() for t in human_texts if t and t.strip()})
    lines = []
    for enc in study.encoders:
        cls = encoder_class(enc.backend)
        if not cls.remote:
            continue
        name = served_by(cls.provider, enc.endpoint)
        provider = study.providers.of(name)
        price, revision = provider.price(name, enc.model_id), cache_revision(provider)
        line = Line(name, enc.name, mode=enc.mode, model_id=enc.model_id)
        todo = [t for t in human if not cache.has("embed", embed_key(name, enc.model_id, t, revision))]
        human_tokens = sum(map(text_tokens, todo))
        per_request = 1 if (enc.mode or provider.mode) == "batch" else enc.batch_size  # a batch line is one text
        line.requests = -(-(len(todo) + n_answers) // per_request)
        line.cached = len(human) - len(todo)
        line.input_tokens = human_tokens + answer_tokens
        line.usd = cost(price, line.input_tokens, 0) if price else 0.0
        line.usd_low = cost(price, human_tokens, 0) if price else 0.0  # no answer to encode
        lines.append(line)
    return lines


def render(study: StudyBase, lines: list[Line], notes: tuple[str, ...] = (), today: datetime.date | None = None) -> str:
    if not lines:
        return "no API models, encoders or judge in this study: nothing to spend"
    out = [
        f"{'provider':<8} {'model/encoder':<24} {'requests':>9} {'cached':>7} {'tokens in':>11} {'tokens out*':>12} "
        f"{'US$ at least':>13} {'US$ at most':>12} {'batch mode**':>13}"
    ]
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    own_modes: dict[str, list[str]] = defaultdict(list)
    for ln in lines:
        out.append(
            f"{ln.provider:<8} {ln.what:<24} {ln.requests:>9} {ln.cached:>7} {ln.input_tokens:>11} {ln.output_tokens:>12} "
            f"{ln.usd_low:>13.4f} {ln.usd:>12.4f} {ln.usd_batch:>13.4f}"
        )
        low, high = ln.planned(study.providers.of(ln.provider).mode)
        for i, value in enumerate((ln.usd, ln.usd_batch, low, high)):
            totals[ln.provider][i + 1] += value
        if ln.mode is not None:
            own_modes[ln.provider].append(f"{ln.what}: {ln.mode}")
    for provider, (_, high, batch, low, spend) in sorted(totals.items()):
        cfg = study.providers.of(provider)
        budget = cfg.budget_usd
        cap = (
            "no budget cap"
            if budget is None
            else f"budget ${budget:g}" + (" (would stop the run)" if spend > budget else "")
        )
        modes = ", ".join([f"{cfg.mode} mode", *own_modes[provider]])
        free = [ln for ln in lines if ln.provider == provider and is_free(cfg, provider, ln.model_id)]
        if free and len(free) == sum(ln.provider == provider for ln in lines):
            out.append(f"{provider} (endpoint {cfg.base_url}): free: every model it serves is priced at zero")
            continue
        out.append(
            f"{provider} ({modes}): between ${low:.4f} and ${spend:.4f} "
            f"(all sync at most ${high:.4f}, all batch at most ${batch:.4f}); {cap}"
        )
    out.append(
        "* output counted at each model's max_output_tokens (at least: none); cached requests are free; embeddings "
        "of model answers counted at that cap too. Prices: the built-in table (docs/api.md: each price with the "
        "date it was read) and providers.<name>.prices"
    )
    out.append(
        f"** at most, in batch mode (providers.<name>.mode, or a model's, encoder's or the judge's own `mode`): "
        f"{BATCH_DISCOUNT:.0%} of the price; in batch mode each text to embed is a request of its own"
    )
    stale = stale_prices([(ln.provider, ln.model_id) for ln in lines], study.providers, today or datetime.date.today())
    out += [f"price older than a year: {s}" for s in stale]
    out += notes
    return "\n".join(out)
