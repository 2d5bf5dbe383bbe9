"""The hf-zero-shot backend on tiny random-weight CLIP and SigLIP models saved to a folder: it picks
what the model's own logits pick, called directly through transformers; a batch gives what its rows
give one by one; template ensembling is the normalised mean worked out by hand; a row without a
class list, or with a bad image, fails alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests import hf_tiny
from vlm_decade.core.config import ModelConfig
from vlm_decade.core.errors import InputError
from vlm_decade.models.backends import Stimulus, backend_class, entry_problems
from vlm_decade.models.backends.hf_zero_shot import NO_CLASSES, class_prompts, ensemble, top_classes

ANIMALS = ("cat", "dog", "person")
THINGS = ("cup", "car", "tree", "table", "bowl", "sky", "water")
TEMPLATES = ["a photo of a {}.", "a picture of the {}.", "an image of a red {} on the table."]
# How each model's processor pads texts in its own documentation: SigLIP to full length.
PADDING = {"hf-clip": True, "hf-siglip": "max_length"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero_shot")
    return {"hf-clip": hf_tiny.save_clip(root / "clip"), "hf-siglip": hf_tiny.save_siglip(root / "siglip")}


def config(path, **options) -> ModelConfig:
    return ModelConfig(
        name="tiny", backend="hf-zero-shot", model_id="tiny/zero-shot", era="mllm", path=path, options=options
    )


@pytest.fixture(scope="module")
def backends(folders):
    return {kind: backend_class("hf-zero-shot")(config(folder)) for kind, folder in folders.items()}


def images(n=8):
    """Colour fields with a block of another colour, of different sizes: random noise would embed
    alike after resizing, and a tiny model would then pick one class for every image."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        h, w = 30 + 9 * i, 60 - 5 * i
        image = rng.integers(0, 256, 3) + rng.integers(-40, 40, (h, w, 3))
        image[: h // 2, : w // (i % 3 + 1)] = rng.integers(0, 256, 3)
        out.append(np.clip(image, 0, 255).astype(np.uint8))
    return out


def stimuli(classes=THINGS, n=8):
    return [Stimulus(f"i{i}", "full", image, "ignored", classes) for i, image in enumerate(images(n))]


# -- the pure part -----------------------------------------------------------------------------------


def test_ensemble_is_the_renormalised_mean_of_normalised_embeddings():
    # two templates, two classes, 2-d: by hand
    embeddings = np.array([[[3.0, 4.0], [0.0, 2.0]], [[0.0, 5.0], [1.0, 0.0]]])
    # class 0: (0.6, 0.8) and (0, 1) -> mean (0.3, 0.9) -> /sqrt(0.9); class 1: (0, 1), (1, 0) -> (1, 1)/sqrt(2)
    np.testing.assert_allclose(ensemble(embeddings), [[0.3 / 0.9**0.5, 0.9 / 0.9**0.5], [2**-0.5, 2**-0.5]])
    # one template: just the normalised embeddings
    np.testing.assert_allclose(ensemble(embeddings[:1]), [[0.6, 0.8], [0.0, 1.0]])


def test_top_class_is_the_highest_cosine_not_the_highest_dot_product():
    classes = ("near", "long")
    class_embeddings = np.array([[1.0, 0.1], [10.0, -10.0]])  # "long" has the larger dot product with (1, 0)
    assert top_classes(np.array([[1.0, 0.0], [0.0, -2.0]]), class_embeddings, classes) == ["near", "long"]
    assert top_classes(np.array([[1.0, 1.0]]), np.array([[1.0, 0.0], [0.0, 1.0]]), classes) == ["near"]  # a tie: first


def test_prompts_are_template_major_and_keep_names_verbatim():
    assert class_prompts(("cat", "sea lion"), ("a {}.", "the {} here")) == [
        "a cat.",
        "a sea lion.",
        "the cat here",
        "the sea lion here",
    ]


@pytest.mark.parametrize(
    "templates, fragment",
    [
        ([], "non-empty list"),
        ("a {}", "valid list"),
        (["a photo"], "exactly one {}"),
        (["{} {}"], "exactly one {}"),
    ],
)
def test_bad_templates_are_refused_before_loading(folders, templates, fragment):
    cfg = config(folders["hf-clip"], templates=templates)
    (problem,) = entry_problems("hf-zero-shot", cfg.options, ("models", 0))
    assert fragment in problem.message and problem.field == "models[0].options.templates"
    with pytest.raises(ValueError, match=fragment):
        backend_class("hf-zero-shot")(cfg)


def test_unknown_option_and_missing_weights_are_found_by_check(folders, tmp_path):
    (problem,) = entry_problems("hf-zero-shot", {"template": ["a {}"]}, ("models", 0))
    assert "unknown hf-zero-shot option 'template' (did you mean 'templates'?)" in problem.message
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="has no config.json"):
        backend_class("hf-zero-shot")(config(tmp_path / "empty"))


# -- against transformers called directly ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["hf-clip", "hf-siglip"])
def test_choice_equals_argmax_of_the_models_own_logits(folders, backends, kind):
    from transformers import AutoModel, AutoProcessor

    net, processor = AutoModel.from_pretrained(folders[kind]).eval(), AutoProcessor.from_pretrained(folders[kind])
    texts = [f"a photo of a {name}." for name in THINGS]
    expected = []
    for image in images():
        with torch.no_grad():
            out = net(**processor(text=texts, images=[image], padding=PADDING[kind], return_tensors="pt"))
        # CLIP's softmax and SigLIP's sigmoid do not move the argmax
        probabilities = out.logits_per_image.softmax(-1) if kind == "hf-clip" else out.logits_per_image.sigmoid()
        expected.append(THINGS[int(probabilities.argmax())])
    got = backends[kind].describe(stimuli())
    assert [d.text for d in got] == expected
    assert len(set(expected)) >= 3  # the choice varies with the image
    assert {d.status for d in got} == {"ok"} and got[0].model_version == "tiny/zero-shot"


@pytest.mark.parametrize("kind", ["hf-clip", "hf-siglip"])
def test_template_ensemble_equals_a_hand_computation(folders, kind):
    from transformers import AutoModel, AutoProcessor

    net, processor = AutoModel.from_pretrained(folders[kind]).eval(), AutoProcessor.from_pretrained(folders[kind])
    backend = backend_class("hf-zero-shot")(config(folders[kind], templates=TEMPLATES))

    def unit(x):
        return x / x.norm(dim=-1, keepdim=True)

    with torch.no_grad():
        per_template = [
            unit(
                net.get_text_features(
                    **processor(text=[t.format(c) for c in THINGS], padding=PADDING[kind], return_tensors="pt")
                ).pooler_output
            )
            for t in TEMPLATES
        ]
        hand = unit(torch.stack(per_template).mean(0))
        pictures = unit(net.get_image_features(**processor(images=images(), return_tensors="pt")).pooler_output)
    np.testing.assert_allclose(backend.class_embeddings(THINGS), hand.numpy(), atol=1e-5)
    expected = [THINGS[int(i)] for i in (pictures @ hand.T).argmax(-1)]
    first_template_only = [THINGS[int(i)] for i in (pictures @ per_template[0].T).argmax(-1)]
    assert [d.text for d in backend.describe(stimuli())] == expected
    assert expected != first_template_only  # the ensemble changes some answers, so the test can tell


@pytest.mark.parametrize("kind", ["hf-clip", "hf-siglip"])
def test_a_batch_of_two_datasets_gives_what_its_rows_give_one_by_one(backends, kind):
    backend = backends[kind]
    mixed = [
        s if i % 2 else Stimulus(s.image_id, s.variant, s.image, s.prompt, ANIMALS) for i, s in enumerate(stimuli())
    ]
    batch = backend.describe(mixed)
    assert [d.text for d in batch] == [backend.describe([s])[0].text for s in mixed]
    assert all(d.text in (ANIMALS if i % 2 == 0 else THINGS) for i, d in enumerate(batch))


def test_class_embeddings_are_computed_once_per_class_list(folders, monkeypatch):
    backend = backend_class("hf-zero-shot")(config(folders["hf-clip"]))
    calls = []
    embed = backend.net.get_text_features
    monkeypatch.setattr(
        backend.net, "get_text_features", lambda **kw: calls.append(kw["input_ids"].shape[0]) or embed(**kw)
    )
    first = backend.describe(stimuli())
    assert backend.describe(stimuli()) == first
    backend.describe(stimuli(ANIMALS, 2))
    assert calls == [len(THINGS), len(ANIMALS)]


def test_a_row_without_classes_or_with_a_bad_image_fails_alone(backends):
    backend = backends["hf-clip"]
    good = stimuli(n=3)
    no_classes = Stimulus("open", "full", images(1)[0], "ignored")
    bad_image = Stimulus("bad", "full", np.zeros((0, 4, 3), np.uint8), "ignored", THINGS)
    got = backend.describe([good[0], no_classes, good[1], bad_image, good[2]])
    assert [d.status for d in got] == ["ok", "error", "ok", "error", "ok"]
    assert got[1].error == NO_CLASSES and "closed-world" in got[1].error and "class list" in got[1].error
    assert "unusable image: image is empty" in got[3].error
    assert [got[i].text for i in (0, 2, 4)] == [d.text for d in backend.describe(good)]


def test_it_is_registered_as_closed_world():
    assert backend_class("hf-zero-shot").closed_world is True
