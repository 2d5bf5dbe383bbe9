"""Tiny random-weight builds of the image-text families the `hf-vlm` backend runs, saved with
`save_pretrained` as their checkpoints are: model, tokenizer, processor settings and a chat template
mirroring the family's own (PaliGemma: none, it takes a plain prompt). Processors whose family has a
video processor record it as their checkpoints do, so loading meets what a real checkpoint meets.

`VLM_FAMILIES` maps a family's name to its builder; each builder takes a folder and returns it.
Widths 32, one or two layers, images cut into 8-pixel patches: a batch runs in well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.hf_tiny import _seeded, _tokenizer

QWEN_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _text(tok, **overrides) -> dict:
    return {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 512,
        "initializer_range": 1.0,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        **overrides,
    }


def _with_video(folder: Path, video_processor: str) -> None:
    """Record the family's video processor in processor_config.json, as its checkpoints do."""
    path = folder / "processor_config.json"
    settings = json.loads(path.read_text())
    video = {k: v for k, v in settings["image_processor"].items() if k != "image_processor_type"}
    settings["video_processor"] = {**video, "video_processor_type": video_processor}
    path.write_text(json.dumps(settings, indent=2))


def _save(folder: Path, build, processor) -> Path:
    _seeded(build, 0).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def _images_only(family):
    from vlm_decade.models.backends.hf_vlm import _images_only

    return _images_only(family)


def _qwen(folder: Path, config_cls, model_cls, processor_cls, images, vision: dict, video: str, **text) -> Path:
    tok = _tokenizer(QWEN_TOKENS)
    ids = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "mrope_section": [2, 2, 4], "rope_theta": 10000.0}
    config = config_cls(
        text_config=_text(tok, rope_parameters=rope, **text),
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    processor = _images_only(processor_cls)(
        image_processor=images, tokenizer=tok, video_processor=None, chat_template=QWEN_TEMPLATE
    )
    _save(folder, lambda: model_cls(config), processor)
    _with_video(folder, video)
    return folder


def save_qwen2_vl(folder: Path) -> Path:
    import transformers as t

    images = t.Qwen2VLImageProcessorPil(
        patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16, max_pixels=64 * 64
    )
    vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, patch_size=8, initializer_range=1.0)
    return _qwen(
        folder,
        t.Qwen2VLConfig,
        t.Qwen2VLForConditionalGeneration,
        t.Qwen2VLProcessor,
        images,
        vision,
        "Qwen2VLVideoProcessor",
    )


def save_qwen2_5_vl(folder: Path) -> Path:
    import transformers as t

    images = t.Qwen2VLImageProcessorPil(
        patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16, max_pixels=64 * 64
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=32,
        patch_size=8,
        window_size=32,
        fullatt_block_indexes=[1],
        initializer_range=1.0,
    )
    return _qwen(
        folder,
        t.Qwen2_5_VLConfig,
        t.Qwen2_5_VLForConditionalGeneration,
        t.Qwen2_5_VLProcessor,
        images,
        vision,
        "Qwen2VLVideoProcessor",
    )


def save_qwen3_vl(folder: Path) -> Path:
    import transformers as t

    images = t.Qwen2VLImageProcessorPil(
        patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16, max_pixels=64 * 64
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=32,
        patch_size=8,
        num_position_embeddings=64,
        deepstack_visual_indexes=[1],
        initializer_range=1.0,
    )
    return _qwen(
        folder,
        t.Qwen3VLConfig,
        t.Qwen3VLForConditionalGeneration,
        t.Qwen3VLProcessor,
        images,
        vision,
        "Qwen3VLVideoProcessor",
    )


_SIGLIP_VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8
)
# A user turn as Idefics2 / Idefics3 write it.
IDEFICS_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>{% else %} {{ c['text'] }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def save_paligemma(folder: Path) -> Path:
    """PaliGemma (SigLIP + Gemma): no chat template; the processor puts the image tokens and BOS
    before the plain prompt and ends it with a newline."""
    import transformers as t

    tok = _tokenizer(("<image>",))
    config = t.PaliGemmaConfig(
        vision_config=dict(_SIGLIP_VISION, projection_dim=32),
        text_config=_text(tok, model_type="gemma"),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        projection_dim=32,
        hidden_size=32,
        vocab_size=len(tok),
    )
    images = t.SiglipImageProcessorPil(size={"height": 32, "width": 32})
    images.image_seq_length = 16
    return _save(folder, lambda: t.PaliGemmaForConditionalGeneration(config), t.PaliGemmaProcessor(images, tok))


def save_idefics2(folder: Path) -> Path:
    """Idefics2 (SigLIP-like vision, perceiver resampler, Mistral) without image splitting."""
    import transformers as t

    tok = _tokenizer(("<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>"))
    config = t.Idefics2Config(
        vision_config=_SIGLIP_VISION,
        perceiver_config=dict(
            hidden_size=32,
            resampler_n_latents=4,
            resampler_depth=1,
            resampler_n_heads=2,
            resampler_head_dim=16,
            num_key_value_heads=2,
        ),
        text_config=_text(tok, model_type="mistral"),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )
    images = t.Idefics2ImageProcessorPil(size={"shortest_edge": 32, "longest_edge": 32}, do_image_splitting=False)
    processor = t.Idefics2Processor(images, tok, image_seq_len=4, chat_template=IDEFICS_TEMPLATE)
    return _save(folder, lambda: t.Idefics2ForConditionalGeneration(config), processor)


VLM_FAMILIES = {
    "PaliGemma": save_paligemma,
    "Idefics2": save_idefics2,
    "Qwen2-VL": save_qwen2_vl,
    "Qwen2.5-VL": save_qwen2_5_vl,
    "Qwen3-VL": save_qwen3_vl,
}
