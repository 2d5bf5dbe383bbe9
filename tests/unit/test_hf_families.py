"""Each family the HF backends name (`hf-vlm`'s chat VLMs, captioners, detectors, zero-shot models), as a tiny random build saved like its checkpoints: it
loads through the backend, answers three images of different sizes and aspect ratios with three
prompts, gives in a batch what it gives row by row (greedy), and answers a batch of one."""

from __future__ import annotations

import numpy as np
import pytest

from tests.hf_families import CAPTIONER_FAMILIES, DETECTOR_FAMILIES, VLM_FAMILIES, ZERO_SHOT_FAMILIES
from vlm_decade.core.config import ModelConfig
from vlm_decade.models.backends import Stimulus, backend_class

PROMPTS = ["describe this image", "what", "what is in the scene ?"]
SHAPES = [(30, 60), (64, 24), (40, 40)]


@pytest.fixture(scope="session")
def family_root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


def stimuli(prompts=PROMPTS) -> list[Stimulus]:
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for shape in SHAPES]
    classes = ("cat", "dog", "cup")
    return [Stimulus(f"i{i}", "full", image, p, classes) for i, (image, p) in enumerate(zip(images, prompts))]


def answers_alike(backend, batch_of: list[Stimulus]) -> list[str]:
    """The batch's answers, having checked each is ok and equals its row's answer alone."""
    batch = backend.describe(batch_of)
    assert [(d.status, d.error) for d in batch] == [("ok", "")] * len(batch_of)
    assert [d.text for d in batch] == [backend.describe([s])[0].text for s in batch_of]
    return [d.text for d in batch]


def load(backend: str, family: str, folder, **options):
    model = ModelConfig(
        name=family, backend=backend, model_id=f"tiny/{family}", era="mllm", path=folder, options=options
    )
    return backend_class(backend)(model)


@pytest.mark.parametrize("family", list(CAPTIONER_FAMILIES))
@pytest.mark.parametrize("use_prompt", [False, True])
def test_captioner_family_answers_alike_with_and_without_a_prompt(family, use_prompt, family_root):
    folder = family_root / f"captioner-{family}"
    if not folder.exists():
        CAPTIONER_FAMILIES[family](folder)
    backend = load("hf-captioner", family, folder, max_new_tokens=6, use_prompt=use_prompt)
    assert all(answers_alike(backend, stimuli(["a photo of"] * 3)))


@pytest.mark.parametrize("family", list(DETECTOR_FAMILIES))
def test_detector_family_answers_alike(family, family_root):
    folder = DETECTOR_FAMILIES[family](family_root / f"detector-{family}")
    queries = {"queries": ["cat", "dog"]} if family.startswith("OWL") else {}
    answers_alike(load("hf-detector", family, folder, score_threshold=0.1, **queries), stimuli())


@pytest.mark.parametrize("family", list(ZERO_SHOT_FAMILIES))
def test_zero_shot_family_answers_alike(family, family_root):
    folder = ZERO_SHOT_FAMILIES[family](family_root / f"zero-shot-{family}")
    assert set(answers_alike(load("hf-zero-shot", family, folder), stimuli())) <= {"cat", "dog", "cup"}


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_sentence_encoder_pooling_embeds_alike_in_a_batch_and_alone(pooling, family_root):
    from tests.hf_tiny import save_sentence_encoder
    from vlm_decade.core.config import EncoderConfig
    from vlm_decade.models.encoders.sbert import SentenceTransformerEncoder

    folder = save_sentence_encoder(family_root / f"encoder-{pooling}", dim=16, pooling=pooling)
    encoder = SentenceTransformerEncoder(EncoderConfig(name="SIM", path=folder, batch_size=3))
    texts = ["a cat on a table", "two dogs", "a red car in the street at night"]
    batch = encoder.encode(texts)
    assert batch.shape == (3, 16) and np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    assert np.allclose(batch, np.concatenate([encoder.encode([t]) for t in texts]), atol=1e-5)
    assert not np.allclose(batch[0], batch[1])


@pytest.mark.parametrize("family", list(VLM_FAMILIES))
def test_vlm_family_answers_alike_in_a_batch_and_alone(family, family_root):
    folder = VLM_FAMILIES[family](family_root / family)
    answers_alike(load("hf-vlm", family, folder, max_new_tokens=6), stimuli())


PINNED = {"trust_remote_code": True, "revision": "0123456789abcdef0123456789abcdef01234567"}


def test_a_remote_code_vlm_loads_its_own_code_and_answers_as_its_native_twin(family_root):
    """A checkpoint whose classes are in its own folder (a tiny LLaVA under another model type) loads
    with trust_remote_code at a pinned revision, through the folder's code, and answers as the same
    weights do through transformers' own LLaVA."""
    from tests.hf_remote import save_remote_code_vlm
    from tests.hf_tiny import save_vlm

    remote = load("hf-vlm", "remote", save_remote_code_vlm(family_root / "remote-code"), max_new_tokens=6, **PINNED)
    assert type(remote.net).__module__.startswith("transformers_modules.")
    assert type(remote.processor).__name__ == "TinyRemoteProcessor"
    native = load("hf-vlm", "native", save_vlm(family_root / "remote-code-native"), max_new_tokens=6)
    assert answers_alike(remote, stimuli()) == [d.text for d in native.describe(stimuli())]
