"""Each image-text family `hf-vlm` names, as a tiny random build saved like its checkpoints: it
loads through the backend, answers three images of different sizes and aspect ratios with three
prompts, gives in a batch what it gives row by row (greedy), and answers a batch of one."""

from __future__ import annotations

import numpy as np
import pytest

from tests.hf_families import VLM_FAMILIES
from vlm_decade.core.config import ModelConfig
from vlm_decade.models.backends import Stimulus, backend_class

PROMPTS = ["describe this image", "what", "what is in the scene ?"]
SHAPES = [(30, 60), (64, 24), (40, 40)]


@pytest.fixture(scope="session")
def family_root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


def stimuli() -> list[Stimulus]:
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for shape in SHAPES]
    return [Stimulus(f"i{i}", "full", image, prompt) for i, (image, prompt) in enumerate(zip(images, PROMPTS))]


@pytest.mark.parametrize("family", list(VLM_FAMILIES))
def test_vlm_family_answers_alike_in_a_batch_and_alone(family, family_root):
    folder = VLM_FAMILIES[family](family_root / family)
    model = ModelConfig(
        name=family,
        backend="hf-vlm",
        model_id=f"tiny/{family}",
        era="mllm",
        path=folder,
        options={"max_new_tokens": 6},
    )
    backend = backend_class("hf-vlm")(model)
    batch = backend.describe(stimuli())
    assert [(d.status, d.error) for d in batch] == [("ok", "")] * 3
    alone = [backend.describe([s])[0] for s in stimuli()]
    assert [d.text for d in batch] == [d.text for d in alone]
