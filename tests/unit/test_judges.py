"""Study A's judge metrics by hand: the prompts as their authors format them, how an answer is read
(an unreadable one is NaN, never an exception), and the values a transcript gives in the scores."""

import asyncio
import math

import pyarrow as pa
import pytest

from vlm_decade.studies import study_from_dict
from vlm_decade.studies.decade import judges
from vlm_decade.studies.decade.judging import JUDGE_SCHEMA, check_judges, judge_settings, judge_values


def study(judge_metrics, providers=None):
    return study_from_dict(
        {
            "name": "s",
            "data": {"images": "images.csv", "image_dir": "imgs", "descriptions": "d.csv"},
            "models": [
                {"name": "m", "backend": "imported", "model_id": "x", "era": "mllm", "options": {"file": "caps.csv"}}
            ],
            "judge_metrics": judge_metrics,
            **({"providers": providers} if providers else {}),
        }
    )


def test_the_clair_prompt_is_the_authors_with_one_line_per_caption():
    prompt = judges.rating_prompt("A dog runs.", ["A brown dog runs on grass."])
    assert prompt == (
        "You are trying to tell if a candidate set of captions is describing the same image as a reference set "
        "of captions.\n"
        "Candidate set:\n- A dog runs.\n\nReference set:\n- A brown dog runs on grass.\n\n"
        "On a precise scale from 0 to 100, how likely is it that the candidate set is describing the same image as the "
        'reference set? (JSON format, with a key "score", value between 0 and 100, and a key "reason" with a '
        "string value.)\n"
    )


def test_the_caparena_prompt_puts_the_description_first_then_second():
    first = judges.preference_prompt("model text", "gold text", "candidate-first")
    second = judges.preference_prompt("model text", "gold text", "gold-first")
    assert first.startswith("You are a highly capable multimodal AI assistant tasked with evaluating image captions.")
    assert "Judgment: <Caption 1 is better>/<Caption 2 is better>/<Tie>\n\nCaption 1:\n" in first
    assert first.endswith(
        "Caption 1:\nmodel text\nCaption 2:\ngold text\nDetermine which is better and answer with the given "
        "format. Only mark a tie if there is no discernible difference in quality, informativeness, and "
        "precision after careful evaluation."
    )
    assert "Caption 1:\ngold text\nCaption 2:\nmodel text\n" in second


@pytest.mark.parametrize(
    "answer, score, reason",
    [
        ('{"score": 85, "reason": "Same dog, same grass."}', 85.0, "Same dog, same grass."),
        ('```json\n{"score": 42.5, "reason": "Partly."}\n```', 42.5, "Partly."),
        ('Sure! {"score": 70, "reason": "cut off', 70.0, "cut off"),  # broken JSON: its fields are read
        ('{"score": 150, "reason": "very"}', math.nan, "very"),  # outside 0-100: no rating
        ("I would give it 80 out of 100.", math.nan, ""),  # a number that is no score field
        ('{"score": "high"}', math.nan, ""),
        ("", math.nan, ""),
    ],
)
def test_a_clair_answer_is_read_from_its_score_field_or_is_nan(answer, score, reason):
    got, why = judges.read_rating(answer)
    assert (math.isnan(got) and math.isnan(score)) or got == score
    assert why == reason


@pytest.mark.parametrize(
    "answer, verdict",
    [
        ("Reason: the first names the otter.\nJudgment: Caption 1 is better", 1),
        ("Reason: more precise.\nJudgment: <Caption 2 is better>.", 2),
        ("Reason: both fine.\n**Judgment:** Tie.", 0),
        (
            "Reason: hmm\nJudgment: Caption 1 is better\nOn second thought...\nJudgment: Caption 2 is better",
            2,
        ),  # the last one
        ("Caption 1 is better.", None),  # no Judgment line
        ("Reason: x\nJudgment: Caption 3 is better", None),
    ],
)
def test_a_caparena_answer_is_read_from_its_last_judgment_line(answer, verdict):
    assert judges.read_preference(answer)[0] == verdict


def test_each_order_scores_the_description_not_the_position():
    assert [judges.order_value(v, "candidate-first") for v in (1, 2, 0)] == [1.0, 0.0, 0.5]
    assert [judges.order_value(v, "gold-first") for v in (1, 2, 0)] == [0.0, 1.0, 0.5]
    assert math.isnan(judges.order_value(None, "gold-first"))


def test_the_scores_rows_follow_the_transcript():
    s = study(
        [
            {"name": "CLAIR", "kind": "rating", "backend": "openai", "model_id": "gpt-4o-mini"},
            {"name": "Arena", "kind": "preference", "backend": "openai", "model_id": "gpt-4o-mini"},
        ]
    )
    nan = math.nan

    def row(metric, subject, image, key, order, value):
        return {
            "metric": metric,
            "subject": subject,
            "image_id": image,
            "candidate_key": key,
            "order": order,
            "answer": "",
            "reason": "",
            "value": value,
            "status": "ok",
            "error": "",
            "cost_usd": 0.0,
        }

    table = pa.Table.from_pylist(
        [
            row("CLAIR", "m", "a", "k1", "", 85.0),
            row("CLAIR", "m", "b", "k2", "", nan),  # unreadable: no value for m on b
            row("CLAIR", "human:top", "a", "h1", "", 60.0),
            row("CLAIR", "human:top", "a", "h2", "", nan),  # one member unreadable: the other's value
            row("Arena", "m", "a", "k1", "candidate-first", 1.0),
            row("Arena", "m", "a", "k1", "gold-first", 0.0),  # split: 0.5
            row("Arena", "m", "b", "k2", "candidate-first", 1.0),
            row("Arena", "m", "b", "k2", "gold-first", 1.0),  # preferred in both orders: 1
            row("Arena", "human:top", "a", "h1", "candidate-first", 0.5),
            row("Arena", "human:top", "a", "h1", "gold-first", nan),  # either order unreadable: none
            row("Arena", "human:top", "a", "h2", "candidate-first", 0.0),
            row("Arena", "human:top", "a", "h2", "gold-first", 0.5),  # 0.25 for this member, the group's only value
        ],
        schema=JUDGE_SCHEMA,
    )
    images = pa.table({"image_id": ["a", "b"], "dataset": ["d1", "d2"]})
    got = {(r["metric"], r["subject"], r["image_id"]): r["value"] for r in judge_values(s, table, images).to_pylist()}
    assert got[("CLAIR", "m", "a")] == pytest.approx(0.85) and math.isnan(got[("CLAIR", "m", "b")])
    assert got[("CLAIR", "human:top", "a")] == pytest.approx(0.60)
    assert got[("Arena", "m", "a")] == 0.5 and got[("Arena", "m", "b")] == 1.0
    assert got[("Arena", "human:top", "a")] == 0.25
    assert len(got) == 6


def test_validate_names_a_judge_without_key_with_unknown_options_or_without_price(monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-judges0123456789")
    s = study(
        [
            {
                "name": "CLAIR",
                "kind": "rating",
                "backend": "openai",
                "model_id": "gpt-4o-mini",
                "options": {"temprature": 0},
            },
            {"name": "Arena", "kind": "preference", "backend": "openai", "model_id": "no-such-model"},
            {"name": "G", "kind": "rating", "backend": "gemini", "model_id": "gemini-2.0-flash"},
        ]
    )
    messages = [p.message for p in check_judges(s)]
    assert len(messages) == 2
    assert "no price for openai model 'no-such-model'" in messages[0]
    assert "needs an API key" in messages[1]
    # options are checked with every backend's, when the study is read (studies.backend_problems)
    from vlm_decade.studies import backend_problems

    (unknown,) = backend_problems(s)
    assert unknown.field == "judge_metrics[0].options.temprature" and "temperature" in unknown.message


def test_a_rating_is_text_only_with_the_judges_output_cap():
    s = study(
        [
            {"name": "CLAIR", "kind": "rating", "backend": "openai", "model_id": "gpt-4o-mini"},
            {
                "name": "Arena",
                "kind": "preference",
                "backend": "openai",
                "model_id": "gpt-4o-mini",
                "options": {"max_output_tokens": 900},
            },
        ]
    )
    assert judge_settings(s.judge_metrics[0]) == {"max_output_tokens": 512, "temperature": 0.0}
    assert judge_settings(s.judge_metrics[1]) == {"max_output_tokens": 900, "temperature": 0.0, "detail": "auto"}
    # A thinking judge's thinking counts against the cap: it keeps the larger one, thinking little.
    thinking = study([{"name": "CLAIR", "kind": "rating", "backend": "gemini", "model_id": "gemini-2.5-flash"}])
    assert judge_settings(thinking.judge_metrics[0]) == {
        "max_output_tokens": 2000,
        "temperature": 0.0,
        "thinking_budget": 1024,
    }


def test_judge_metric_names_are_metric_names():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="repeated: SBERT-SI"):
        study([{"name": "SBERT-SI", "kind": "rating", "backend": "openai", "model_id": "gpt-4o-mini"}])


# -- a judge on a named endpoint ----------------------------------------------------------------------


def test_validate_asks_a_judges_endpoint_and_names_an_unknown_one_with_the_known_ones(monkeypatch):
    from vlm_decade.testing.fake_api import FakeAPIServer

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # an endpoint without `key_env` needs no key
    with FakeAPIServer(models=("llama-judge",)) as engine:
        endpoints = {"engine": {"base_url": engine.openai_url, "free": True}}
        s = study(
            [
                {"name": "A", "kind": "rating", "backend": "openai", "model_id": "llama-judge", "endpoint": "engine"},
                {"name": "B", "kind": "rating", "backend": "openai", "model_id": "llama-judge", "endpoint": "engin"},
                {"name": "C", "kind": "preference", "backend": "openai", "model_id": "qwen", "endpoint": "engine"},
            ],
            {"endpoints": endpoints},
        )
        problems = {p.field: p.message for p in check_judges(s)}
        assert engine.counts()["openai.models"] == 1  # asked once for both of its judges
    assert set(problems) == {"judge_metrics[1].endpoint", "judge_metrics[2].model_id"}
    assert problems["judge_metrics[1].endpoint"] == (
        "no endpoint 'engin' under providers.endpoints (did you mean 'engine'?); known: engine"
    )
    assert problems["judge_metrics[2].model_id"] == (
        f"endpoint 'engine' at {engine.openai_url} does not serve 'qwen'; it serves: llama-judge"
    )
    # A Gemini judge cannot name an endpoint that speaks the OpenAI API.
    gemini = study(
        [{"name": "G", "kind": "rating", "backend": "gemini", "model_id": "g", "endpoint": "engine"}],
        {"endpoints": endpoints},
    )
    (other_api,) = check_judges(gemini)
    assert other_api.field == "judge_metrics[0].endpoint" and "speaks the openai API" in other_api.message


def test_an_endpoint_judge_in_batch_mode_is_refused_when_the_study_is_read():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="an endpoint has no batch interface"):
        study(
            [{"name": "A", "kind": "rating", "backend": "openai", "model_id": "q", "endpoint": "e", "mode": "batch"}],
            {"endpoints": {"e": {"base_url": "http://127.0.0.1:1/v1", "free": True}}},
        )


def test_a_judge_on_an_endpoint_is_estimated_sent_and_cached_under_the_endpoints_name(tmp_path):
    from types import SimpleNamespace

    from vlm_decade.models.api.endpoints import served_by
    from vlm_decade.models.api.gateway import Gateway
    from vlm_decade.models.api.keys import Secret
    from vlm_decade.models.api.providers import ChatRequest, chat_key
    from vlm_decade.studies.decade.judging import estimate
    from vlm_decade.studies.estimate import render
    from vlm_decade.testing.fake_api import FakeAPIServer

    with FakeAPIServer(models=("llama-judge",)) as engine:
        s = study(
            [
                {"name": "A", "kind": "rating", "backend": "openai", "model_id": "llama-judge", "endpoint": "engine"},
                {"name": "B", "kind": "rating", "backend": "openai", "model_id": "gpt-4o-mini"},
            ],
            {"endpoints": {"engine": {"base_url": engine.openai_url, "free": True}}},
        )
        on_engine, on_openai = s.judge_metrics
        # The estimate puts each judge on its own gateway's line: the endpoint's free, OpenAI's priced.
        data = SimpleNamespace(
            references=pa.table(
                {
                    "image_id": ["a", "a"],
                    "condition": ["full"] * 2,
                    "role": ["gold", "top"],
                    "text": ["A dog.", "A cat."],
                }
            ),
            images=pa.table({"image_id": ["a"], "width": [64], "height": [64]}),
        )
        lines = {line.what: line for line in estimate(s, data)}
        assert (lines["judge A"].provider, lines["judge A"].usd) == ("engine", 0.0)
        assert lines["judge B"].provider == "openai" and lines["judge B"].usd > 0
        assert lines["judge A"].requests == lines["judge B"].requests == 2  # the model's and the human's
        text = render(s, [lines["judge A"]])
        assert f"engine (endpoint {engine.openai_url}): free: every model it serves is priced at zero" in text

        # A question goes to the endpoint's gateway, and its cache entry is keyed by the endpoint's name.
        name = served_by(on_engine.backend, on_engine.endpoint)
        gateway = Gateway(name, s.providers.of(name), Secret("no-key"), tmp_path / "cache")
        req = ChatRequest(
            on_engine.model_id, judges.rating_prompt("A dog.", ["A cat."]), settings=judge_settings(on_engine)
        )
        answer = asyncio.run(gateway.chat(req))
        assert answer["status"] == "ok" and answer["cost_usd"] == 0.0
        assert engine.counts()["openai.chat"] == 1
    assert gateway.cache.has("chat", chat_key("engine", req)) and not gateway.cache.has("chat", chat_key("openai", req))
    assert served_by(on_openai.backend, on_openai.endpoint) == "openai"
