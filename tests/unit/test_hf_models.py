"""The three HF backends on tiny random-weight models saved to a folder: each gives what the same
model gives called directly through transformers; a batch gives what its rows give one by one;
bad images and missing weights fail clearly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests import hf_tiny
from vlm_decade.core.config import ModelConfig
from vlm_decade.core.errors import InputError
from vlm_decade.models.backends import Stimulus, backend_class
from vlm_decade.models.backends.detection import Detection
from vlm_decade.models.backends.ssd_template import template_sentence

PROMPTS = ["describe this image", "what", "what is in the scene ?", "describe", "a"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {
        "hf-captioner": hf_tiny.save_captioner(root / "captioner"),
        "hf-vlm": hf_tiny.save_vlm(root / "vlm"),
        "hf-detector": hf_tiny.save_detector(root / "detector"),
    }


OPTIONS = {
    "hf-captioner": {"max_new_tokens": 8},
    "hf-vlm": {"max_new_tokens": 8},
    "hf-detector": {"score_threshold": 0.98},
}


def config(backend, path, **options) -> ModelConfig:
    return ModelConfig(
        name="tiny",
        backend=backend,
        model_id=f"tiny/{backend}",
        era="mllm",
        path=path,
        options={**OPTIONS[backend], **options},
    )


@pytest.fixture(scope="module")
def backends(folders):
    return {name: backend_class(name)(config(name, folder)) for name, folder in folders.items()}


def images(n=5):
    """Photos of different sizes and aspect ratios, so processors resize and pad differently."""
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, (30 + 9 * i, 60 - 5 * i, 3), dtype=np.uint8) for i in range(n)]


def stimuli(n=5):
    return [Stimulus(f"i{i}", "full", image, PROMPTS[i % len(PROMPTS)]) for i, image in enumerate(images(n))]


def test_captioner_equals_direct_generate(folders, backends):
    from transformers import AutoTokenizer, VisionEncoderDecoderModel, ViTImageProcessor

    folder = folders["hf-captioner"]
    net = VisionEncoderDecoderModel.from_pretrained(folder).eval()
    processor, tokenizer = ViTImageProcessor.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    expected = []
    for image in images():
        with torch.no_grad():
            out = net.generate(
                pixel_values=processor(images=image, return_tensors="pt").pixel_values,
                max_new_tokens=8,
                do_sample=False,
            )
        expected.append(tokenizer.decode(out[0], skip_special_tokens=True).strip())
    got = backends["hf-captioner"].describe(stimuli())
    assert [d.text for d in got] == expected
    assert len(set(expected)) > 1 and all(1 <= len(t.split()) <= 8 for t in expected)  # max_new_tokens holds
    assert {d.status for d in got} == {"ok"} and got[0].model_version == "tiny/hf-captioner"


def test_captioner_continues_its_prompt_when_asked_and_cuts_it_from_the_answer(folders):
    from transformers import AutoTokenizer, VisionEncoderDecoderModel, ViTImageProcessor

    folder = folders["hf-captioner"]
    backend = backend_class("hf-captioner")(config("hf-captioner", folder, use_prompt=True))
    net = VisionEncoderDecoderModel.from_pretrained(folder).eval()
    processor, tokenizer = ViTImageProcessor.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    image = images(1)[0]
    start = [[net.config.decoder_start_token_id] + tokenizer("a photo of", add_special_tokens=False).input_ids]
    with torch.no_grad():
        out = net.generate(
            pixel_values=processor(images=image, return_tensors="pt").pixel_values,
            decoder_input_ids=torch.tensor(start),
            max_new_tokens=8,
            do_sample=False,
        )
    full = tokenizer.decode(out[0], skip_special_tokens=True)
    assert full.startswith("a photo of ")
    (got,) = backend.describe([Stimulus("i0", "full", image, "a photo of")])
    assert got.text == full[len("a photo of ") :].strip()


def test_vlm_equals_direct_generate_through_the_chat_template(folders, backends):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    folder = folders["hf-vlm"]
    net = LlavaForConditionalGeneration.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    expected = []
    for stim in stimuli():
        text = f"user : <image> {stim.prompt} assistant :"
        assert backends["hf-vlm"].chat_text(stim.prompt) == text
        inputs = processor(images=[stim.image], text=[text], return_tensors="pt")
        with torch.no_grad():
            out = net.generate(**inputs, max_new_tokens=8, do_sample=False)
        expected.append(processor.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip())
    got = backends["hf-vlm"].describe(stimuli())  # one left-padded batch of prompts of different lengths
    assert [d.text for d in got] == expected and len(set(expected)) > 1


def test_detector_equals_direct_detr_and_describes_with_the_template(folders, backends):
    from transformers import DetrForObjectDetection, DetrImageProcessor

    folder = folders["hf-detector"]
    net = DetrForObjectDetection.from_pretrained(folder).eval()
    processor = DetrImageProcessor.from_pretrained(folder)
    backend = backends["hf-detector"]
    found = backend.detect(images())
    for image, dets in zip(images(), found):
        with torch.no_grad():
            out = net(**processor(images=[image], return_tensors="pt"))
        (r,) = processor.post_process_object_detection(out, threshold=0.98, target_sizes=[image.shape[:2]])
        h, w = image.shape[:2]
        direct = sorted(
            (
                Detection(
                    net.config.id2label[int(label)], float(score), tuple(np.clip(np.array(box) / [w, h, w, h], 0, 1))
                )
                for label, score, box in zip(r["labels"], r["scores"].tolist(), r["boxes"].tolist())
            ),
            key=lambda d: -d.score,
        )
        assert [d.label for d in dets] == [d.label for d in direct]
        np.testing.assert_allclose([d.score for d in dets], [d.score for d in direct], rtol=1e-5)
        np.testing.assert_allclose([d.box for d in dets], [d.box for d in direct], atol=1e-5)
    assert len({len(d) for d in found}) > 1  # the counts vary with the image
    assert [d.text for d in backend.describe(stimuli())] == [template_sentence(d) for d in found]


@pytest.mark.parametrize("name", ["hf-captioner", "hf-vlm", "hf-detector"])
def test_a_batch_gives_what_its_rows_give_one_by_one(backends, name):
    backend = backends[name]
    batch = backend.describe(stimuli())
    assert [d.text for d in batch] == [backend.describe([s])[0].text for s in stimuli()]


@pytest.mark.parametrize("name", ["hf-captioner", "hf-vlm", "hf-detector"])
def test_a_bad_image_fails_its_row_only(backends, name):
    backend = backends[name]
    good = stimuli(3)
    bad = Stimulus("bad", "full", np.zeros((0, 4, 3), np.uint8), "what")
    got = backend.describe([good[0], bad, good[1], good[2]])
    assert got[1].status == "error" and "unusable image: image is empty" in got[1].error
    assert [d.text for d in got[:1] + got[2:]] == [d.text for d in backend.describe(good)]


def test_an_image_the_model_chokes_on_fails_alone_after_the_batch_is_split(folders, monkeypatch):
    backend = backend_class("hf-captioner")(config("hf-captioner", folders["hf-captioner"]))
    good = stimuli(4)
    expected = [d.text for d in backend.describe(good)]
    poison = images(6)[5]
    processor = backend.image_processor

    def choke(images, **kw):  # e.g. an image that breaks the processor or runs out of memory
        if any(im.shape == poison.shape for im in images):
            raise RuntimeError("CUDA out of memory")
        return processor(images=images, **kw)

    monkeypatch.setattr(backend, "image_processor", choke)
    got = backend.describe(good[:2] + [Stimulus("p", "full", poison, "")] + good[2:])
    assert got[2].status == "error" and got[2].error == "RuntimeError: CUDA out of memory"
    assert [d.text for d in got[:2] + got[3:]] == expected


def test_missing_weights_stop_the_backend_with_the_check_message(folders, tmp_path):
    import shutil

    broken = shutil.copytree(folders["hf-vlm"], tmp_path / "vlm")
    (broken / "model.safetensors").unlink()
    cfg = config("hf-vlm", broken)
    (problem,) = backend_class("hf-vlm").check(cfg, set(), ["full"])
    assert "has config.json but no weight file" in problem.message
    with pytest.raises(InputError, match="has config.json but no weight file"):
        backend_class("hf-vlm")(cfg)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="has no config.json"):
        backend_class("hf-detector")(config("hf-detector", empty))
