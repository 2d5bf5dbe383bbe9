"""What API calls cost: the providers' published list prices built in (`DEFAULT_PRICES`, each with
the date it was read and where), a study's own `Price` entries over them, the prefix rule by which a
model id takes its price, what `estimate` warns of (prices over a year old), and the table
docs/api.md shows.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, NamedTuple

from pydantic import Field

from vlm_decade.core.config.settings import Settings

if TYPE_CHECKING:
    from vlm_decade.core.config.providers import ProvidersConfig


# Published list prices in US$ per million tokens (standard tier, text and image input alike; the
# batch interfaces bill half of them), each with the date it was read and where (docs/api.md lists
# the sources). Prices change: a study can override or add entries under `providers.<name>.prices`,
# and `estimate` says which listed prices are over a year old. A model id takes the price of its
# longest listed prefix, so a dated snapshot (gpt-4o-2024-08-06) takes its family's price.
class ListedPrice(NamedTuple):
    input_per_mtok: float
    output_per_mtok: float
    as_of: str  # ISO date the price was read


_OPENAI_PAGE, _OPENAI_2024, _READ_2025 = "2026-03-21", "2024-11-20", "2025-08-15"
_GEMINI_PAGE, _GEMINI_1X = "2025-11-18", "2024-10-01"
# Where each reading came from (docs/api.md shows them beside the prices).
PRICE_SOURCES = {
    _OPENAI_PAGE: "OpenAI's pricing page (openai.com/api/pricing), as tabulated on 2026-03-21",
    _OPENAI_2024: "OpenAI's pricing page, legacy models, 2024-11-20 (GPT-4o's May 2024 snapshot kept its launch price)",
    _READ_2025: "the providers' pricing pages, 2025-08-15",
    _GEMINI_PAGE: "Google's Gemini API pricing page at Gemini 3 Pro's launch, 2025-11-18 (prompts up to 200k tokens)",
    _GEMINI_1X: "Google's Gemini API pricing page after the 2024-10-01 price cut (prompts up to 128k tokens)",
}
DEFAULT_PRICES: dict[str, dict[str, ListedPrice]] = {
    "openai": {
        # the papers' lineups: GPT-4 (its 32k and vision previews), GPT-4 Turbo, GPT-4o, o1, GPT-5.1
        "gpt-4": ListedPrice(30.00, 60.00, _OPENAI_2024),
        "gpt-4-32k": ListedPrice(60.00, 120.00, _OPENAI_2024),
        "gpt-4-turbo": ListedPrice(10.00, 30.00, _OPENAI_2024),
        "gpt-4-1106-preview": ListedPrice(10.00, 30.00, _OPENAI_2024),
        "gpt-4-0125-preview": ListedPrice(10.00, 30.00, _OPENAI_2024),
        "gpt-4-vision-preview": ListedPrice(10.00, 30.00, _OPENAI_2024),
        "gpt-4o": ListedPrice(2.50, 10.00, _OPENAI_PAGE),
        "gpt-4o-2024-05-13": ListedPrice(5.00, 15.00, _OPENAI_2024),
        "gpt-4o-mini": ListedPrice(0.15, 0.60, _OPENAI_PAGE),
        "gpt-4.1": ListedPrice(2.00, 8.00, _OPENAI_PAGE),
        "gpt-4.1-mini": ListedPrice(0.40, 1.60, _OPENAI_PAGE),
        "gpt-4.1-nano": ListedPrice(0.10, 0.40, _OPENAI_PAGE),
        "gpt-5": ListedPrice(1.25, 10.00, _OPENAI_PAGE),
        "gpt-5-mini": ListedPrice(0.25, 2.00, _OPENAI_PAGE),
        "gpt-5-nano": ListedPrice(0.05, 0.40, _OPENAI_PAGE),
        "gpt-5-pro": ListedPrice(15.00, 120.00, _OPENAI_PAGE),
        "gpt-5.1": ListedPrice(1.25, 10.00, _OPENAI_PAGE),
        "gpt-5.4": ListedPrice(2.50, 15.00, _OPENAI_PAGE),
        "o1": ListedPrice(15.00, 60.00, _READ_2025),
        "o1-mini": ListedPrice(1.10, 4.40, _READ_2025),
        "o3": ListedPrice(2.00, 8.00, _OPENAI_PAGE),
        "o3-mini": ListedPrice(1.10, 4.40, _OPENAI_PAGE),
        "o4-mini": ListedPrice(1.10, 4.40, _OPENAI_PAGE),
        "text-embedding-3-large": ListedPrice(0.13, 0.0, _READ_2025),
        "text-embedding-3-small": ListedPrice(0.02, 0.0, _READ_2025),
    },
    "gemini": {
        # Gemini 1.x at prompts up to 128k tokens, Gemini 3 Pro up to 200k (longer prompts cost more)
        "gemini-1.0-pro": ListedPrice(0.50, 1.50, _GEMINI_1X),
        "gemini-1.5-pro": ListedPrice(1.25, 5.00, _GEMINI_1X),
        "gemini-1.5-flash": ListedPrice(0.075, 0.30, _GEMINI_1X),
        "gemini-1.5-flash-8b": ListedPrice(0.0375, 0.15, _GEMINI_1X),
        "gemini-2.0-flash": ListedPrice(0.10, 0.40, _READ_2025),
        "gemini-2.5-pro": ListedPrice(1.25, 10.00, _READ_2025),
        "gemini-2.5-flash": ListedPrice(0.30, 2.50, _READ_2025),
        "gemini-2.5-flash-lite": ListedPrice(0.10, 0.40, _READ_2025),
        "gemini-3-pro-preview": ListedPrice(2.00, 12.00, _GEMINI_PAGE),
        "gemini-embedding-001": ListedPrice(0.15, 0.0, _READ_2025),
    },
}


def stale_prices(uses, providers: ProvidersConfig, today: datetime.date, max_age_days: int = 365) -> list[str]:
    """What `estimate` warns of: each (provider, model id) in `uses` priced by a built-in entry read
    more than `max_age_days` before `today` (a study's own price is the user's to keep)."""
    found = {}
    for provider, model_id in uses:
        own, table = providers.of(provider).prices, DEFAULT_PRICES.get(provider, {})
        key = longest_prefix(model_id, {**table, **own})  # the entry `price` charges by
        if key is None or key in own:
            continue
        if (today - datetime.date.fromisoformat(table[key].as_of)).days > max_age_days:
            found[(provider, key)] = table[key].as_of
    return [
        f"{provider} `{key}`: listed price read {as_of}, over a year ago; check the provider's page "
        f"(providers.{provider}.prices overrides it)"
        for (provider, key), as_of in sorted(found.items())
    ]


def price_table_markdown(batch_discount: float) -> str:
    """The built-in prices as docs/api.md shows them, then each reading's source (a test keeps the
    two the same)."""
    lines = [
        "| provider | model id (prefix) | input | output | batch input | batch output | read |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for provider, table in DEFAULT_PRICES.items():
        for model_id, p in sorted(table.items()):
            lines.append(
                f"| {provider} | `{model_id}` | {p.input_per_mtok:g} | {p.output_per_mtok:g} | "
                f"{p.input_per_mtok * batch_discount:g} | {p.output_per_mtok * batch_discount:g} | {p.as_of} |"
            )
    lines.append("")
    lines += [f"- {date}: {source}" for date, source in sorted(PRICE_SOURCES.items(), reverse=True)]
    return "\n".join(lines) + "\n"


def longest_prefix(model_id: str, keys) -> str | None:
    """The key a model id is priced by: itself, or the longest key it extends with `-...`."""
    matches = [k for k in keys if model_id == k or model_id.startswith(k + "-")]
    return max(matches, key=len) if matches else None


class Price(Settings):
    """US$ per million tokens; output includes reasoning ("thinking") tokens, billed as output."""

    input_per_mtok: float = Field(ge=0, description="US$ per million input tokens.")
    output_per_mtok: float = Field(0.0, ge=0, description="US$ per million output tokens (reasoning tokens included).")
