"""Named endpoints against a server no one here wrote: `transformers serve` with a tiny LLaVA and a
tiny judge LM (tests/serving.py). Image chat through the describe stage and the Study B judge give
what the server gives the same request sent directly; a Study A run mixes a GPT model on the fake
server, the served model and a local `hf-vlm` model, each answered by its own source and cached
apart; `validate` asks the server what it serves."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml
from PIL import Image

from vlm_decade.core.progress import Reporter
from vlm_decade.core.runfolder import RunFolder
from vlm_decade.core.runner import StudyRun
from vlm_decade.core.runtime import LazyRay
from vlm_decade.core.smoke import first_images
from vlm_decade.demo import materialize
from vlm_decade.models.api.cache import ResponseCache
from vlm_decade.models.api.providers import ChatRequest, OpenAIProvider, chat_key
from vlm_decade.models.backends import Stimulus, backend_class
from vlm_decade.stages.describe.plan import jobs_from, load_png, plan_jobs
from vlm_decade.studies import load_study
from vlm_decade.studies.decade.data import load_study_data
from vlm_decade.studies.decade.pipeline import plan
from vlm_decade.studies.decade.pipeline import run as run_decade
from vlm_decade.studies.openworld.config import OpenWorldStudyConfig
from vlm_decade.studies.openworld.judge import judge_settings
from vlm_decade.studies.openworld.judging import judge_pairs
from vlm_decade.studies.openworld.metrics import judge_prompt, parse_judgement
from vlm_decade.testing.fake_api import FakeAPIServer, chat_text

from .conftest import describe_stage

pytestmark = pytest.mark.ray
IMAGES = 2  # of each of the demo's datasets
ENDPOINT = "serve"


def served_model(served, **extra) -> dict:
    # The served model answers one word and stops; the cap keeps a request short all the same.
    return {
        "name": "served",
        "backend": "openai",
        "model_id": served.vlm,
        "era": "mllm",
        "endpoint": ENDPOINT,
        "options": {"max_output_tokens": 6},
        **extra,
    }


def study_file(tmp_path: Path, served, models: list[dict], providers: dict | None = None) -> Path:
    """The demo study on its first images, with `models` and the server as endpoint `serve`."""
    path = materialize(tmp_path / "inputs")
    raw = yaml.safe_load(path.read_text())
    for key in ("ratings", "hand_labels"):  # about the demo's own models
        raw["data"].pop(key)
    for key in ("taxonomy", "metrics"):
        raw.pop(key)
    raw.update(models=models, limit=IMAGES, stsb_check=False, statistics={"n_resamples": 200, "seed": 1})
    raw["output"] = str(tmp_path / "run")
    raw["providers"] = {
        "cache_dir": str(tmp_path / "cache"),
        "endpoints": {ENDPOINT: {"base_url": served.url, "free": True}},
        **(providers or {}),
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def direct(served, body: dict) -> str:
    """The server's answer to `body` sent with the openai client, past every part of this project."""
    import openai

    client = openai.OpenAI(base_url=served.url, api_key="none", max_retries=0, timeout=60)
    return (client.chat.completions.create(**body).choices[0].message.content or "").strip()


def sent_pngs(study, images, rows) -> list[bytes]:
    """The exact PNG bytes the describe stage sent for each row."""
    jobs = {
        (j.subject, j.image_id, j.variant): j
        for j in jobs_from(plan_jobs(study, plan(study), images), plan(study), images)
    }
    return load_png([jobs[(r["subject"], r["image_id"], r["variant"])] for r in rows])


def chat_request(study, model_name: str, png: bytes) -> ChatRequest:
    model = next(m for m in study.models if m.name == model_name)
    return ChatRequest(model.model_id, model.prompt or study.prompt, png, backend_class("openai").settings(model))


def test_image_chat_through_the_describe_stage_answers_as_the_server_does(served, tmp_path):
    study = load_study(study_file(tmp_path, served, [served_model(served)]))
    images = first_images(load_study_data(study.data, study.ranking, study.masks), IMAGES).images
    table = describe_stage(study, images, tmp_path / "run")
    rows = table.to_pylist()
    assert len(rows) == images.num_rows > 1 and {r["status"] for r in rows} == {"ok"}
    assert {r["model_version"] for r in rows} == {served.vlm} and all(r["cost_usd"] == 0.0 for r in rows)
    for row, png in zip(rows, sent_pngs(study, images, rows)):
        body = OpenAIProvider.chat_body(chat_request(study, "served", png))
        assert row["text"] and row["text"] == direct(served, body), row
    assert len({r["text"] for r in rows}) > 1  # the answers depend on the image
    assert RunFolder(tmp_path / "run").manifest()["spend_usd"][ENDPOINT] == 0.0


def test_the_study_b_judge_through_the_endpoint_gives_verdicts_from_the_server(served, tmp_path):
    study = OpenWorldStudyConfig.model_validate(
        {
            "name": "judge-served",
            "study": "openworld",
            "data": {"labels": tmp_path / "labels.csv", "image_dir": tmp_path, "classnames": tmp_path / "c.json"},
            "models": [{"name": "m", "backend": "imported", "model_id": "m"}],
            "judge": {"backend": "openai", "model_id": served.judge, "endpoint": ENDPOINT},
            "providers": {
                "cache_dir": str(tmp_path / "cache"),
                "endpoints": {ENDPOINT: {"base_url": served.url, "free": True}},
            },
        }
    )
    pairs = [("scarlet tanager", "a bird", ()), ("yurt", "a tent", ("ger",)), ("cat", "a dog", ())]
    run = StudyRun(RunFolder(tmp_path / "run"), Reporter(quiet=True), LazyRay(study.runtime))
    table = judge_pairs(study, pairs, run)
    rows = table.to_pylist()
    assert [(r["label"], r["prediction"], tuple(r["accepted"])) for r in rows] == pairs
    settings = judge_settings(study.judge)
    for row, pair in zip(rows, pairs):
        body = OpenAIProvider.chat_body(ChatRequest(served.judge, judge_prompt(*pair), settings=settings))
        assert "image_url" not in str(body)  # text only
        assert (row["status"], row["answer"]) == ("ok", direct(served, body)), row
    # This judge model answers "1" to everything: a valid verdict, parsed as a match.
    assert [(r["answer"], r["valid"], parse_judgement(r["answer"])) for r in rows] == [("1", True, 1.0)] * 3
    assert all(r["cost_usd"] == 0.0 for r in rows)


def test_a_study_a_run_mixes_a_cloud_model_a_served_model_and_a_local_model(served, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-served0123456789abc")
    with FakeAPIServer() as cloud:
        # The cloud model is asked for the same model id as the served one, so its requests and
        # the endpoint's are the same but for where they go: only the endpoint's name keeps them apart.
        price = {served.vlm: {"input_per_mtok": 0.1, "output_per_mtok": 0.2}}
        limits = {"rpm": 6000, "tpm": 10**8, "timeout_s": 10, "max_concurrency": 4, "budget_usd": 1.0}
        gpt = {"name": "gpt", "backend": "openai", "model_id": served.vlm, "era": "mllm"}
        local = {"name": "local", "backend": "hf-vlm", "model_id": "tiny-llava", "path": served.vlm, "era": "mllm"}
        models = [
            {**gpt, "options": {"max_output_tokens": 6}},
            served_model(served),
            {**local, "options": {"max_new_tokens": 6}},
        ]
        path = study_file(
            tmp_path,
            served,
            models,
            {"openai": {**limits, "base_url": cloud.openai_url, "prices": price}},
        )
        raw = yaml.safe_load(path.read_text())
        raw["encoders"] = [{"name": "GPT-SI", "backend": "openai-embedding", "model_id": "text-embedding-3-large"}]
        path.write_text(yaml.safe_dump(raw))
        study = load_study(path)
        folder = run_decade(study, Reporter(quiet=True))
        counts = cloud.counts()
    responses = folder.read("responses")
    rows = responses.to_pylist()
    images = first_images(load_study_data(study.data, study.ranking, study.masks), IMAGES).images
    n = images.num_rows
    assert Counter((r["subject"], r["status"]) for r in rows) == {(m, "ok"): n for m in ("gpt", "served", "local")}
    assert counts["openai.chat"] == n  # the cloud server saw its own model's requests alone
    api_rows = [r for r in rows if r["subject"] != "local"]
    cache = ResponseCache(tmp_path / "cache")
    keys = {"gpt": set(), "served": set()}
    for row, png in zip(api_rows, sent_pngs(study, images, api_rows)):
        req = chat_request(study, row["subject"], png)
        if row["subject"] == "gpt":
            assert row["text"] == chat_text(req.prompt, [png]) and row["model_version"].endswith("+fp_fake"), row
            key = chat_key("openai", req)
        else:
            assert row["text"] == direct(served, OpenAIProvider.chat_body(req)) and row["model_version"] == served.vlm
            key = chat_key(ENDPOINT, req)
        assert cache.get("chat", key)["text"] == row["text"]  # each source's answer under its own key
        keys[row["subject"]].add(key)
    assert len(keys["gpt"]) == len(keys["served"]) == n and not keys["gpt"] & keys["served"]

    local = next(m for m in study.models if m.name == "local")
    backend = backend_class("hf-vlm")(local)
    paths = dict(zip(images.column("image_id").to_pylist(), images.column("path").to_pylist()))
    for row in (r for r in rows if r["subject"] == "local"):
        rgb = np.asarray(Image.open(paths[row["image_id"]]).convert("RGB"))
        mine = backend.describe([Stimulus(row["image_id"], "full", rgb, study.prompt)])[0]
        assert (row["text"], row["model_version"]) == (mine.text, mine.model_version), row
    scores = folder.read("scores")
    assert set(pa.compute.unique(scores.column("subject")).to_pylist()) >= {"gpt", "served", "local"}


def test_validate_asks_the_endpoint_what_it_serves(served, tmp_path):
    from typer.testing import CliRunner

    from vlm_decade.cli import app

    path = study_file(tmp_path, served, [served_model(served)])
    done = CliRunner().invoke(app, ["validate", str(path)])
    assert done.exit_code == 0, done.output
    raw = yaml.safe_load(path.read_text())
    raw["models"][0]["model_id"] = served.vlm + "-other"
    path.write_text(yaml.safe_dump(raw))
    done = CliRunner().invoke(app, ["validate", str(path)])
    text = " ".join(done.output.split())
    assert done.exit_code == 2, done.output
    assert f"endpoint '{ENDPOINT}' at {served.url} does not serve '{served.vlm}-other'" in text, text
    assert "models[0].model_id" in text and served.vlm in text.split("it serves:", 1)[1]
