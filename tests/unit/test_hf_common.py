"""hf_common: batch splitting on failure, weight resolution and its messages, options, placement."""

from __future__ import annotations

import json

import pytest

from vlm_decade.core.config import ModelConfig
from vlm_decade.models.backends import backend_class, entry_problems, hf_common, parsed_options


def model(backend="hf-captioner", **kw) -> ModelConfig:
    return ModelConfig(**{"name": "m", "backend": backend, "model_id": "org/some-model", "era": "pre-mllm", **kw})


def test_a_failing_item_is_narrowed_down_by_halves_and_fails_alone():
    calls = []

    def fn(items):
        calls.append(list(items))
        if 5 in items:
            raise ValueError("bad item")
        return [i * 10 for i in items]

    out = hf_common.run_split(fn, range(8))
    assert out[:5] + out[6:] == [0, 10, 20, 30, 40, 60, 70]
    assert isinstance(out[5], ValueError)
    assert calls == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7], [4, 5], [4], [5], [6, 7]]


def test_a_batch_too_big_for_memory_runs_in_halves():
    def fn(items):  # like a CUDA OOM: anything over two items at once fails
        if len(items) > 2:
            raise RuntimeError("CUDA out of memory")
        return [str(i) for i in items]

    assert hf_common.run_split(fn, range(5)) == ["0", "1", "2", "3", "4"]


def test_a_path_that_is_an_empty_folder_says_what_is_missing_and_how_to_get_it(tmp_path):
    (problem,) = hf_common.weight_problems(model(path=tmp_path))
    assert problem.field == "path"
    assert "has no config.json" in problem.message and "hf download org/some-model" in problem.message
    (problem,) = hf_common.weight_problems(model(path=tmp_path / "nowhere"))
    assert "is not a folder" in problem.message


def test_a_missing_weight_file_or_shard_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (problem,) = hf_common.weight_problems(model(path=tmp_path))
    assert "no weight file (model.safetensors or pytorch_model.bin)" in problem.message
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"")
    (problem,) = hf_common.weight_problems(model(path=tmp_path))
    assert "lacks weight shards model-00002-of-00002.safetensors" in problem.message


def test_a_hub_id_missing_from_the_cache_is_an_error_only_when_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (problem,) = hf_common.weight_problems(model(model_id="nobody/no-such-model-here"))
    assert problem.field == "model_id"
    assert "nobody/no-such-model-here is not in the Hugging Face cache and HF_HUB_OFFLINE is set" in problem.message
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    assert hf_common.weight_problems(model(model_id="nobody/no-such-model-here")) == []  # online: downloaded


def test_weights_resolve_path_then_packaged_copy_then_hub(monkeypatch, tmp_path):
    assert hf_common.weight_source(model(path=tmp_path)) == str(tmp_path)
    assert hf_common.weight_source(model()) == "org/some-model"
    monkeypatch.setitem(hf_common.PACKAGED, "org/some-model", ("vlm_decade", "demo"))
    packaged = hf_common.weight_source(model())
    assert packaged.endswith("vlm_decade/demo")
    assert hf_common.weight_source(model(path=tmp_path)) == str(tmp_path)  # an explicit path wins


def test_unknown_or_bad_options_are_problems_before_any_work(tmp_path):
    (problem,) = entry_problems("hf-vlm", {"temprature": 0.2}, ("models", 1))
    assert problem.field == "models[1].options.temprature" and "unknown hf-vlm option 'temprature'" in problem.message
    (problem,) = entry_problems("hf-vlm", {"max_new_tokens": 0}, ("models", 0))
    assert problem.field == "models[0].options.max_new_tokens" and "must be >= 1, got 0" in problem.message
    (problem,) = entry_problems("hf-detector", {"score_threshold": 2}, ("models", 0))
    assert "must be in 0..1, got 2" in problem.message
    with pytest.raises(ValueError, match="options.dtype: Input should be 'auto'"):
        backend_class("hf-vlm")(model("hf-vlm", path=tmp_path, options={"dtype": "float64"}))


def test_greedy_by_default_and_generate_kwargs_pass_through():
    options = parsed_options(model(), backend_class("hf-captioner").Options)
    assert hf_common.generation_kwargs(options) == {"do_sample": False, "num_beams": 1, "max_new_tokens": 40}
    options = parsed_options(
        model(options={"max_new_tokens": 7, "generate": {"num_beams": 3}}), backend_class("hf-captioner").Options
    )
    assert hf_common.generation_kwargs(options) == {"do_sample": False, "num_beams": 3, "max_new_tokens": 7}


def test_placement_is_cpu_float32_without_a_gpu_and_device_map_goes_to_accelerate():
    import torch

    options = parsed_options(model(), hf_common.HFOptions)
    assert hf_common.placement(options) == ("cpu", torch.float32, {})
    options = parsed_options(model(options={"device_map": "auto", "dtype": "bfloat16"}), hf_common.HFOptions)
    assert hf_common.placement(options) == ("cpu", torch.bfloat16, {"device_map": "auto"})
