"""API judges through the run's gateway actor against the fake server: an OpenAI and a Gemini judge
return exactly the answers the server was scripted to give, one request per distinct prompt, with
no image; asked again, the cache answers and nothing more is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.studies.openworld.config import JudgeConfig, OpenWorldStudyConfig
from vlm_decade.studies.openworld.judge import RemoteJudge, judge_available
from vlm_decade.testing.fake_api import FakeAPIServer, scripted

pytestmark = pytest.mark.ray

# Prompt text -> the scripted verdict; the prompts are the judge's, the verdicts the test's own.
VERDICTS = {
    "Label: scarlet tanager. Prediction: a scarlet tanager on a branch.": "1",
    "Label: scarlet tanager. Prediction: a bird.": "0",
    "Label: golden retriever. Prediction: a dog, probably a golden retriever.": "1",
    "Label: yurt. Prediction: a tent.": "0",
    "Label: Dalmatian. Prediction: a spotted dog.": "1",
}


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-judge0123456789")
    monkeypatch.setenv("GEMINI_API_KEY", "AIzaTESTjudge0123456789abcdefgh")
    received: list[int] = []
    verdict = scripted(VERDICTS, otherwise=lambda prompt, _: f"unscripted prompt {prompt!r}")

    def answer(prompt: str, images: list[bytes]) -> str:
        received.append(len(images))
        return verdict(prompt, images)

    with FakeAPIServer(answer=answer) as s:
        s.images_received = received
        yield s


def study(tmp_path: Path, server: FakeAPIServer) -> OpenWorldStudyConfig:
    limits = {"rpm": 6000, "tpm": 10**8, "timeout_s": 5, "max_concurrency": 2, "budget_usd": 1.0}
    return OpenWorldStudyConfig.model_validate(
        {
            "name": "judge-test",
            "study": "openworld",
            "data": {"labels": tmp_path / "labels.csv", "image_dir": tmp_path, "classnames": tmp_path / "classes.json"},
            "models": [{"name": "m", "backend": "imported", "model_id": "m"}],
            "providers": {
                "cache_dir": str(tmp_path / "cache"),
                "openai": {**limits, "base_url": server.openai_url},
                "gemini": {**limits, "base_url": server.gemini_url},
            },
        }
    )


@pytest.mark.parametrize(
    "backend,model_id,endpoint",
    [("openai", "gpt-4o-mini", "openai.chat"), ("gemini", "gemini-2.0-flash", "gemini.generate")],
)
def test_api_judge_returns_the_scripted_verdicts_and_the_cache_answers_again(
    server, tmp_path, backend, model_id, endpoint
):
    import ray

    config = JudgeConfig(backend=backend, model_id=model_id)
    cfg, run = study(tmp_path, server), RunFolder(tmp_path / "run")
    assert judge_available(config, cfg.providers) is None
    prompts = list(VERDICTS) + [next(iter(VERDICTS))]  # one prompt twice: asked once
    judge = RemoteJudge(ray, cfg, run, config, Reporter(quiet=True))

    first = judge.judge(prompts)
    assert [a.text for a in first] == [VERDICTS[p] for p in prompts]
    assert {a.status for a in first} == {"ok"} and not any(a.cached for a in first)
    assert all(a.cost_usd > 0 and a.model_version.startswith(model_id) for a in first)
    assert server.counts() == {endpoint: len(VERDICTS)} and server.images_received == [0] * len(VERDICTS)
    spent = run.manifest()["spend_usd"][backend]
    assert spent == pytest.approx(sum(a.cost_usd for a in first[:-1]), abs=1e-6)

    again = RemoteJudge(ray, cfg, run, config, Reporter(quiet=True)).judge(prompts[::-1])
    assert [a.text for a in again] == [VERDICTS[p] for p in prompts[::-1]]
    assert all(a.cached for a in again) and server.counts() == {endpoint: len(VERDICTS)}
    assert run.manifest()["spend_usd"][backend] == pytest.approx(spent)  # cached answers cost nothing more
