"""The built-in price table: every MLLM the seed paper names has a dated list price, and a model id
takes its longest listed prefix (values as listed in docs/api.md, checked by hand)."""

from __future__ import annotations

import datetime as dt

import pytest

from vlm_decade.core.config import DEFAULT_PRICES, ProvidersConfig, longest_prefix

from .config_only import config_only_study

SEED_MLLMS = [
    # (provider, model id as a study names it, US$ per million input, output tokens)
    ("openai", "gpt-4", 30.00, 60.00),
    ("openai", "gpt-4-0613", 30.00, 60.00),
    ("openai", "gpt-4-turbo", 10.00, 30.00),
    ("openai", "gpt-4-turbo-2024-04-09", 10.00, 30.00),
    ("openai", "gpt-4-vision-preview", 10.00, 30.00),
    ("openai", "gpt-4o", 2.50, 10.00),
    ("openai", "gpt-4o-2024-05-13", 5.00, 15.00),
    ("openai", "gpt-4o-2024-08-06", 2.50, 10.00),
    ("openai", "o1", 15.00, 60.00),
    ("openai", "o1-2024-12-17", 15.00, 60.00),
    ("openai", "gpt-5.1", 1.25, 10.00),
    ("gemini", "gemini-1.0-pro-vision", 0.50, 1.50),
    ("gemini", "gemini-1.5-pro", 1.25, 5.00),
    ("gemini", "gemini-1.5-flash-002", 0.075, 0.30),
    ("gemini", "gemini-1.5-flash-8b", 0.0375, 0.15),
    ("gemini", "gemini-3-pro-preview", 2.00, 12.00),
]


@pytest.mark.parametrize("provider, model_id, input_usd, output_usd", SEED_MLLMS)
def test_the_seed_papers_mllms_have_their_list_prices(provider, model_id, input_usd, output_usd):
    price = getattr(ProvidersConfig(), provider).price(provider, model_id)
    assert (price.input_per_mtok, price.output_per_mtok) == (input_usd, output_usd)


def test_every_listed_price_is_dated_and_a_study_price_overrides_it():
    for provider, table in DEFAULT_PRICES.items():
        for model_id, listed in table.items():
            assert dt.date.fromisoformat(listed.as_of) <= dt.date(2026, 12, 1), (provider, model_id)
    assert longest_prefix("gpt-4-turbo-preview", DEFAULT_PRICES["openai"]) == "gpt-4-turbo"
    assert longest_prefix("gpt-3.5-turbo", DEFAULT_PRICES["openai"]) is None
    own = ProvidersConfig.model_validate({"openai": {"rpm": 1, "tpm": 1, "prices": {"gpt-4": {"input_per_mtok": 1.0}}}})
    assert own.openai.price("openai", "gpt-4-0613").input_per_mtok == 1.0


def test_the_docs_show_the_price_table_as_the_code_has_it():
    import re
    from pathlib import Path

    from vlm_decade.core.config import price_table_markdown
    from vlm_decade.models.api.batch import BATCH_DISCOUNT

    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- prices -->\n(.*?)<!-- /prices -->", text, re.S)
    assert found and found.group(1) == price_table_markdown(BATCH_DISCOUNT), "docs/api.md's price table is out of date"


def test_estimate_names_listed_prices_over_a_year_old_and_leaves_a_studys_own_alone():
    from vlm_decade.core.config import stale_prices

    providers = ProvidersConfig.model_validate(
        {"gemini": {"rpm": 1, "tpm": 1, "prices": {"gemini-1.5-pro": {"input_per_mtok": 1}}}}
    )
    uses = [
        ("openai", "gpt-4-turbo-2024-04-09"),
        ("openai", "gpt-4-turbo"),
        ("openai", "gpt-5.1"),
        ("gemini", "gemini-1.5-pro"),
        ("gemini", "gemini-1.5-flash"),
    ]
    # gpt-4-turbo read 2024-11-20 and gemini-1.5-flash 2024-10-01: over 365 days before 2026-03-21;
    # gpt-5.1 read that day; gemini-1.5-pro priced by the study itself.
    warned = stale_prices(uses, providers, dt.date(2026, 3, 21))
    assert [w.split(":")[0] for w in warned] == ["gemini `gemini-1.5-flash`", "openai `gpt-4-turbo`"]
    assert stale_prices([("openai", "gpt-4-turbo")], providers, dt.date(2025, 11, 20)) == []  # 365 days: not over
    # A study's price for a shorter prefix does not price a model a longer listed entry prices.
    own_gpt4 = ProvidersConfig.model_validate(
        {"openai": {"rpm": 1, "tpm": 1, "prices": {"gpt-4": {"input_per_mtok": 1}}}}
    )
    assert own_gpt4.openai.price("openai", "gpt-4-turbo").input_per_mtok == 10.0
    assert [
        w.split(":")[0]
        for w in stale_prices([("openai", "gpt-4-turbo"), ("openai", "gpt-4-0613")], own_gpt4, dt.date(2026, 3, 21))
    ] == ["openai `gpt-4-turbo`"]


def test_the_estimate_says_which_prices_are_over_a_year_old():
    from vlm_decade.studies.estimate import Line, render

    study = config_only_study()
    lines = [
        Line("openai", "gpt4", 10, usd=0.2, model_id="gpt-4-turbo-2024-04-09"),
        Line("openai", "gpt51", 10, usd=0.1, model_id="gpt-5.1"),
    ]

    def warned(today):
        return [s for s in render(study, lines, today=today).splitlines() if s.startswith("price older")]

    assert warned(dt.date(2026, 12, 1)) == [
        "price older than a year: openai `gpt-4-turbo`: listed price read 2024-11-20, over a "
        "year ago; check the provider's page (providers.openai.prices overrides it)"
    ]
    assert len(warned(dt.date(2027, 3, 23))) == 2  # gpt-5.1's price, read 2026-03-21, is then over a year old too
