"""The `hf-captioner` backend: image-to-text models through transformers' `generate`.

VisionEncoderDecoder models (e.g. nlpconnect/vit-gpt2-image-captioning), BLIP and GIT: the families
transformers loads with AutoModelForImageTextToText that caption from pixels alone. transformers 5
has no `pipeline("image-to-text")`, so this calls `model.generate` itself. Captioners ignore the
study's MLLM prompt unless `use_prompt: true`; then the prompt is the text the caption continues
(BLIP's "a picture of", an OFA-style "Describe image"), and it is cut from the answer.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from vlm_decade.models.backends.hf_common import GenerationOptions, HFBackend, generation_kwargs


class HFCaptioner(HFBackend):
    """Options: `use_prompt` (default false), `max_new_tokens` (40), `generate` (extra generate
    kwargs; greedy unless they say otherwise), `dtype`, `device`, `device_map`, `processor` (kwargs
    for the image processor)."""

    class Options(GenerationOptions):
        use_prompt: bool = Field(
            False, description="true: the model's prompt is the text the caption continues (cut from the answer)"
        )

    @classmethod
    def processors(cls, source: str, options: dict, **hub):
        """(image processor, tokenizer), loaded separately: a VisionEncoderDecoder folder has no
        processor class that joins them (AutoProcessor returns just the tokenizer there)."""
        from transformers import AutoImageProcessor, AutoTokenizer

        return AutoImageProcessor.from_pretrained(source, **options["processor"], **hub), AutoTokenizer.from_pretrained(
            source, **hub
        )

    def _load(self, source: str, **kwargs):
        from transformers import AutoModelForImageTextToText

        self.image_processor, self.tokenizer = self.processors(source, self.options, **self.hub)
        net = AutoModelForImageTextToText.from_pretrained(source, **kwargs)
        self.generation = generation_kwargs(self.options)
        if self.tokenizer.pad_token_id is None:  # GPT-2 decoders have none; pad finished rows with EOS
            self.generation.setdefault("pad_token_id", self.tokenizer.eos_token_id)
        return net

    def _prompt_inputs(self, prompt: str, n: int) -> tuple[dict, str]:
        """Inputs that make the caption continue `prompt`, and the prompt as the model writes it back."""
        torch = self._torch
        config = self.net.config
        if config.is_encoder_decoder:  # VisionEncoderDecoder: the prompt starts the decoder
            ids = [config.decoder_start_token_id] + self.tokenizer(prompt, add_special_tokens=False).input_ids
            inputs = {"decoder_input_ids": torch.tensor([ids] * n, device=self.input_device)}
        elif config.model_type == "git":  # GIT continues [CLS] + prompt; a [SEP] would end the text
            ids = [self.tokenizer.cls_token_id] + self.tokenizer(prompt, add_special_tokens=False).input_ids
            inputs = {"input_ids": torch.tensor([ids] * n, device=self.input_device)}
        else:  # BLIP takes the tokenizer's own [CLS] ... [SEP] form and swaps in its BOS itself
            encoded = self.tokenizer([prompt] * n, return_tensors="pt").to(self.input_device)
            inputs = {"input_ids": encoded.input_ids, "attention_mask": encoded.attention_mask}
        echo = self.tokenizer.decode(
            self.tokenizer(prompt, add_special_tokens=False).input_ids, skip_special_tokens=True
        )
        return inputs, echo.strip()

    def _run(self, items: list[tuple[np.ndarray, str]]) -> list[str]:
        texts: list[str | None] = [None] * len(items)
        # One generate call per distinct prompt (in a study all rows of a model share one), so no
        # prompt needs padding.
        groups: dict[str, list[int]] = {}
        for i, (_, prompt) in enumerate(items):
            groups.setdefault(prompt if self.options["use_prompt"] else "", []).append(i)
        for prompt, rows in groups.items():
            pixels = self.image_processor(images=[items[i][0] for i in rows], return_tensors="pt").pixel_values
            inputs, echo = self._prompt_inputs(prompt, len(rows)) if prompt else ({}, "")
            out = self.net.generate(pixel_values=pixels.to(self.input_device, self.dtype), **inputs, **self.generation)
            for i, text in zip(rows, self.tokenizer.batch_decode(out, skip_special_tokens=True)):
                text = text.strip()
                texts[i] = text[len(echo) :].strip() if echo and text.startswith(echo) else text
        return texts
