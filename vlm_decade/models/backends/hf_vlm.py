"""The `hf-vlm` backend: chat vision-language models through AutoModelForImageTextToText and the
processor's chat template (Qwen2-VL / Qwen2.5-VL, InternVL-hf, LLaVA-1.5, LLaVA-OneVision,
SmolVLM / Idefics3).

Each row is one user turn: its image, then its prompt. Rows of a batch are left-padded (these are
decoder-only language models: right padding would put pad tokens between the prompt and the
answer), so a batch gives the same answers as the rows one by one.
"""

from __future__ import annotations

import numpy as np

from vlm_decade.models.backends.hf_common import GenerationOptions, HFBackend, generation_kwargs


class HFVLM(HFBackend):
    """Options: `max_new_tokens` (40), `generate` (extra generate kwargs; greedy unless they say
    otherwise), `dtype`, `device`, `device_map`, `processor` (kwargs for AutoProcessor, e.g.
    Qwen2-VL's `max_pixels`)."""

    Options = GenerationOptions

    def _load(self, source: str, **kwargs):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(source, **self.options["processor"])
        self.processor.tokenizer.padding_side = "left"
        self.generation = generation_kwargs(self.options)
        if self.processor.tokenizer.pad_token_id is None:
            self.generation.setdefault("pad_token_id", self.processor.tokenizer.eos_token_id)
        return AutoModelForImageTextToText.from_pretrained(source, **kwargs)

    def chat_text(self, prompt: str) -> str:
        """The templated text for one user turn holding an image and `prompt`."""
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _run(self, items: list[tuple[np.ndarray, str]]) -> list[str]:
        inputs = self.processor(
            images=[[rgb] for rgb, _ in items],  # one image per row (Idefics3 needs the nesting)
            text=[self.chat_text(prompt) for _, prompt in items],
            padding=True,
            return_tensors="pt",
        ).to(self.input_device, dtype=self.dtype)  # casts only the floating tensors (pixels)
        out = self.net.generate(**inputs, **self.generation)
        new = out[:, inputs["input_ids"].shape[1] :]
        return [text.strip() for text in self.processor.batch_decode(new, skip_special_tokens=True)]
