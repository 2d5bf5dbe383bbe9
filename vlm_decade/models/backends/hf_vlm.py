"""The `hf-vlm` backend: vision-language models through AutoModelForImageTextToText and the
processor's chat template (Qwen2-VL / Qwen2.5-VL / Qwen3-VL, InternVL-hf, LLaVA-1.5 / NeXT /
OneVision, Idefics2, SmolVLM / Idefics3, Gemma 3, Mllama, and Llama 4 where torchvision is
installed), or the plain prompt for a processor without one (PaliGemma, whose processor places the
image tokens itself).

Each row is one user turn: its image, then its prompt. Rows of a batch are left-padded (these are
decoder-only language models: right padding would put pad tokens between the prompt and the
answer), so a batch gives the same answers as the rows one by one.

A checkpoint that ships its own code loads with `trust_remote_code` at a pinned `revision` when that
code keeps the same contract (an AutoModelForImageTextToText class in its `auto_map`, a processor with
a chat template, `generate`); validate refuses one that answers through its own `chat` method.

Several families' processors carry a video processor, which transformers builds only with
torchvision; the CPU torch of the set-up has no torchvision that fits it. Such a processor is
built without its video part (`load_processor`): images need none of it.
"""

from __future__ import annotations

import numpy as np

from vlm_decade.models.backends.hf_common import GenerationOptions, HFBackend, generation_kwargs


class _NoVideo:
    """Where a family's video processor would be: what its image path reads of one (SmolVLM's chat
    template asks for frame settings), and a clear error if a video ever comes."""

    num_frames = None
    fps = None

    def __call__(self, *args, **kwargs):
        raise RuntimeError("videos need torchvision, which is not installed")


def _images_only(family: type) -> type:
    """`family` (a processor class) with its video processor left out of the parts it loads and
    checks; its own __init__ takes video_processor=None."""
    parts = [part for part in family.get_attributes() if "video" not in part]
    return type(
        family.__name__,
        (family,),
        {"get_attributes": classmethod(lambda cls: parts), "video_processor": _NoVideo()},
    )


def load_processor(source: str, **kwargs):
    """AutoProcessor's processor for `source`, or, where its video processor needs torchvision that
    is not installed, the same family's processor without it."""
    from transformers import AutoConfig, AutoProcessor
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    try:
        return AutoProcessor.from_pretrained(source, **kwargs)
    except ImportError as exc:
        if "torchvision" not in str(exc).lower():
            raise
    hub = {k: v for k, v in kwargs.items() if k in ("revision", "trust_remote_code", "local_files_only")}
    family = PROCESSOR_MAPPING[type(AutoConfig.from_pretrained(source, **hub))]
    return _images_only(family).from_pretrained(source, video_processor=None, **kwargs)


class HFVLM(HFBackend):
    """Options: `max_new_tokens` (40), `generate` (extra generate kwargs; greedy unless they say
    otherwise), `dtype`, `device`, `device_map`, `processor` (kwargs for AutoProcessor, e.g.
    Qwen2-VL's `max_pixels`), `revision` and `trust_remote_code`."""

    Options = GenerationOptions
    # The class a checkpoint's own code must provide (its auto_map) for this backend to load it.
    auto_class = "AutoModelForImageTextToText"

    @classmethod
    def processors(cls, source: str, options: dict, **hub):
        return load_processor(source, **options["processor"], **hub)

    def _load(self, source: str, **kwargs):
        import transformers

        self.processor = self.processors(source, self.options, **self.hub)
        self.processor.tokenizer.padding_side = "left"
        self.generation = generation_kwargs(self.options)
        if self.processor.tokenizer.pad_token_id is None:
            self.generation.setdefault("pad_token_id", self.processor.tokenizer.eos_token_id)
        return getattr(transformers, self.auto_class).from_pretrained(source, **kwargs)

    def chat_text(self, prompt: str) -> str:
        """The text for one user turn holding an image and `prompt`: the chat template's, or the
        prompt itself where the processor has no template (PaliGemma)."""
        if self.processor.chat_template is None:
            return prompt
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _run(self, items: list[tuple[np.ndarray, str]]) -> list[str]:
        from PIL import Image

        inputs = self.processor(
            # PIL images (Idefics2 refuses arrays), one per row (Idefics3 needs the nesting)
            images=[[Image.fromarray(rgb)] for rgb, _ in items],
            text=[self.chat_text(prompt) for _, prompt in items],
            padding=True,
            return_tensors="pt",
        ).to(self.input_device, dtype=self.dtype)  # casts only the floating tensors (pixels)
        out = self.net.generate(**inputs, **self.generation)
        new = out[:, inputs["input_ids"].shape[1] :]
        return [text.strip() for text in self.processor.batch_decode(new, skip_special_tokens=True)]
