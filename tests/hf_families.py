"""Tiny random-weight builds of the image-text families the `hf-vlm` backend runs, saved with
`save_pretrained` as their checkpoints are: model, tokenizer, processor settings and a chat template
mirroring the family's own (PaliGemma: none, it takes a plain prompt). Processors whose family has a
video processor record it as their checkpoints do, so loading meets what a real checkpoint meets.

`VLM_FAMILIES` (and `CAPTIONER_FAMILIES`, `DETECTOR_FAMILIES`, `ZERO_SHOT_FAMILIES` for the other
HF backends) map a family's name to its builder; each builder takes a folder and returns it.
Widths 32, one or two layers, images cut into 8-pixel patches: a batch runs in well under a second.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tests.hf_tiny import (
    CHAT_TEMPLATE,
    CLIP_VISION,
    DETECTOR_LABELS,
    TOWER,
    VISION,
    _save,
    _tokenizer,
    _widened,
    decoder_config,
    save_captioner,
    save_clip,
    save_detector,
    save_owlvit,
    save_siglip,
    save_vlm,
    text_config,
)

QWEN_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _with_video(folder: Path, video_processor: str) -> None:
    """Record the family's video processor in processor_config.json, as its checkpoints do."""
    path = folder / "processor_config.json"
    settings = json.loads(path.read_text())
    video = {k: v for k, v in settings["image_processor"].items() if k != "image_processor_type"}
    settings["video_processor"] = {**video, "video_processor_type": video_processor}
    path.write_text(json.dumps(settings, indent=2))


def _images_only(family):
    from vlm_decade.models.backends.hf_vlm import _images_only

    return _images_only(family)


def _qwen(family: str, video: str, **vision):
    """The builder of a Qwen-VL generation: transformers' `{family}Config`, `...ForConditionalGeneration`
    and `...Processor`, Qwen2-VL's image processor, its `video` processor and `vision` tower settings."""

    def save(folder: Path) -> Path:
        import transformers as t

        tok = _tokenizer(QWEN_TOKENS)
        ids = tok.convert_tokens_to_ids
        rope = {"rope_type": "default", "mrope_section": [2, 2, 4], "rope_theta": 10000.0}
        config = getattr(t, f"{family}Config")(
            text_config=decoder_config(tok, rope_parameters=rope),
            vision_config=dict(vision, hidden_size=32, num_heads=2, patch_size=8, initializer_range=1.0),
            image_token_id=ids("<|image_pad|>"),
            video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"),
            vision_end_token_id=ids("<|vision_end|>"),
        )
        images = t.Qwen2VLImageProcessorPil(
            patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16, max_pixels=64 * 64
        )
        processor = _images_only(getattr(t, f"{family}Processor"))(
            image_processor=images, tokenizer=tok, video_processor=None, chat_template=QWEN_TEMPLATE
        )
        _save(folder, lambda: getattr(t, f"{family}ForConditionalGeneration")(config), processor)
        _with_video(folder, video)
        return folder

    return save


_QWEN2_5_VISION = dict(depth=2, intermediate_size=64, out_hidden_size=32)
save_qwen2_vl = _qwen("Qwen2VL", "Qwen2VLVideoProcessor", depth=1, embed_dim=32)
save_qwen2_5_vl = _qwen(
    "Qwen2_5_VL", "Qwen2VLVideoProcessor", **_QWEN2_5_VISION, window_size=32, fullatt_block_indexes=[1]
)
save_qwen3_vl = _qwen(
    "Qwen3VL", "Qwen3VLVideoProcessor", **_QWEN2_5_VISION, num_position_embeddings=64, deepstack_visual_indexes=[1]
)


_SIGLIP_VISION = dict(VISION, num_hidden_layers=1)
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
        text_config=decoder_config(tok, model_type="gemma"),
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
        text_config=decoder_config(tok, model_type="mistral"),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )
    images = t.Idefics2ImageProcessorPil(size={"shortest_edge": 32, "longest_edge": 32}, do_image_splitting=False)
    processor = t.Idefics2Processor(images, tok, image_seq_len=4, chat_template=IDEFICS_TEMPLATE)
    return _save(folder, lambda: t.Idefics2ForConditionalGeneration(config), processor)


def _with_roles(tok, **roles):
    """`tok` again, its special tokens kept, with more `roles` for special tokens."""
    from transformers import PreTrainedTokenizerFast

    specials = {k: getattr(tok, k) for k in ("pad_token", "bos_token", "eos_token", "unk_token")}
    return PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, **specials, **roles)


def _named_tokenizer(named: dict[str, str]):
    """The shared word-level tokenizer with special tokens the processor finds by name
    (`tok.start_image_token`, `tok.start_image_token_id`, ...)."""
    return _with_roles(_tokenizer(tuple(named.values())), extra_special_tokens=named)


# InternVL-hf's turn: the image is one <IMG_CONTEXT>, which the processor widens to its tiles' tokens.
INTERNVL_TEMPLATE = QWEN_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<IMG_CONTEXT>\n")


def save_internvl(folder: Path) -> Path:
    """InternVL in transformers' own (-hf) form: InternViT + Qwen2, images cut into up to two tiles."""
    import transformers as t

    tok = _named_tokenizer(
        {
            "im_start": "<|im_start|>",
            "im_end": "<|im_end|>",
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        }
    )
    config = t.InternVLConfig(
        vision_config=dict(_SIGLIP_VISION, initializer_range=1.0),
        text_config=decoder_config(tok, model_type="qwen2"),
        image_token_id=tok.context_image_token_id,
        image_seq_length=4,
    )
    images = t.GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=True, max_patches=2)
    processor = _images_only(t.InternVLProcessor)(
        image_processor=images, tokenizer=tok, video_processor=None, image_seq_length=4, chat_template=INTERNVL_TEMPLATE
    )
    _save(folder, lambda: t.InternVLForConditionalGeneration(config), processor)
    _with_video(folder, "InternVLVideoProcessor")
    return folder


def _idefics3(folder: Path, config_cls, model_cls, processor, images) -> Path:

    tok = _tokenizer(("<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>"))
    config = config_cls(
        vision_config=_SIGLIP_VISION,
        text_config=decoder_config(tok, model_type="llama"),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        scale_factor=2,
    )
    return _save(folder, lambda: model_cls(config), processor(images, tok, chat_template=IDEFICS_TEMPLATE))


def save_idefics3(folder: Path) -> Path:
    import transformers as t

    images = t.Idefics3ImageProcessorPil(
        size={"longest_edge": 32}, max_image_size={"longest_edge": 32}, do_image_splitting=False
    )
    processor = lambda i, tok, **kw: t.Idefics3Processor(i, tok, image_seq_len=4, **kw)  # noqa: E731
    return _idefics3(folder, t.Idefics3Config, t.Idefics3ForConditionalGeneration, processor, images)


def save_smolvlm(folder: Path) -> Path:
    import transformers as t

    images = t.SmolVLMImageProcessorPil(
        size={"longest_edge": 32}, max_image_size={"longest_edge": 32}, do_image_splitting=False
    )
    family = _images_only(t.SmolVLMProcessor)
    processor = lambda i, tok, **kw: family(i, tok, None, image_seq_len=4, **kw)  # noqa: E731
    _idefics3(folder, t.SmolVLMConfig, t.SmolVLMForConditionalGeneration, processor, images)
    _with_video(folder, "SmolVLMVideoProcessor")
    return folder


_PINPOINTS = [[32, 32], [32, 64], [64, 32]]


def save_llava_next(folder: Path) -> Path:
    """LLaVA-NeXT: a CLIP tower over the base image and the tiles of its best-fitting grid."""
    import transformers as t

    tok = _tokenizer(("<image>",))
    config = t.LlavaNextConfig(
        vision_config=CLIP_VISION,
        text_config=decoder_config(tok),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=_PINPOINTS,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    images = t.LlavaNextImageProcessorPil(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, image_grid_pinpoints=_PINPOINTS
    )
    processor = t.LlavaNextProcessor(
        images,
        tok,
        patch_size=8,
        vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE,
        num_additional_image_tokens=1,
    )
    return _save(folder, lambda: t.LlavaNextForConditionalGeneration(config), processor)


def save_llava_onevision(folder: Path) -> Path:
    """LLaVA-OneVision: a SigLIP tower, any-resolution tiles, Qwen2."""
    import transformers as t

    tok = _tokenizer(("<|im_start|>", "<|im_end|>", "<image>", "<video>"))
    config = t.LlavaOnevisionConfig(
        vision_config=dict(_SIGLIP_VISION, model_type="siglip_vision_model"),
        text_config=decoder_config(tok, model_type="qwen2"),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=_PINPOINTS,
        vision_feature_layer=-1,
    )
    images = t.LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32}, image_grid_pinpoints=_PINPOINTS)
    template = QWEN_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>\n")
    processor = _images_only(t.LlavaOnevisionProcessor)(
        images, tok, None, num_image_tokens=16, vision_feature_select_strategy="full", chat_template=template
    )
    _save(folder, lambda: t.LlavaOnevisionForConditionalGeneration(config), processor)
    _with_video(folder, "LlavaOnevisionVideoProcessor")
    return folder


def save_gemma3(folder: Path) -> Path:
    """Gemma 3: a SigLIP tower pooled to 4 tokens an image, Gemma 3's text model."""
    import transformers as t

    named = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}
    tok = _named_tokenizer({"start_of_turn": "<start_of_turn>", "end_of_turn": "<end_of_turn>", **named})
    tok.add_tokens(["model"])  # Gemma's assistant role
    config = t.Gemma3Config(
        vision_config=_SIGLIP_VISION,
        text_config=decoder_config(tok, model_type="gemma3_text", sliding_window=64),
        mm_tokens_per_image=4,
        boi_token_index=tok.boi_token_id,
        eoi_token_index=tok.eoi_token_id,
        image_token_index=tok.image_token_id,
        tie_word_embeddings=False,  # tied, a random model repeats its last token
    )
    template = (
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<start_of_image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
        "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )
    images = t.Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    processor = t.Gemma3Processor(images, tok, chat_template=template, image_seq_length=4)
    return _save(folder, lambda: t.Gemma3ForConditionalGeneration(config), processor)


def save_mllama(folder: Path) -> Path:
    """Mllama (Llama 3.2 Vision): tiled images read through a cross-attention layer."""
    import transformers as t

    tok = _tokenizer(("<|image|>", "<|python_tag|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"))
    ratios = [[1, 1], [1, 2], [2, 1]]
    config = t.MllamaConfig(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_global_layers=1,
            attention_heads=2,
            vision_output_dim=64,
            image_size=32,
            patch_size=8,
            max_num_tiles=2,
            intermediate_layers_indices=[0],
            supported_aspect_ratios=ratios,
            initializer_range=1.0,
        ),
        text_config=decoder_config(
            tok, cross_attention_layers=[1], rope_parameters={"rope_type": "default", "rope_theta": 1e4}
        ),
        image_token_index=tok.convert_tokens_to_ids("<|image|>"),
    )
    template = (
        "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<|image|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|eot_id|>"
        "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )
    images = t.MllamaImageProcessorPil(size={"height": 32, "width": 32}, max_image_tiles=2)
    return _save(
        folder, lambda: t.MllamaForConditionalGeneration(config), t.MllamaProcessor(images, tok, chat_template=template)
    )


AYA_TEMPLATE = (
    "{% for m in messages %}<|START_OF_TURN_TOKEN|>{{ '<|USER_TOKEN|>' if m['role'] == 'user' else '<|CHATBOT_TOKEN|>' }}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
    "<|END_OF_TURN_TOKEN|>{% endfor %}{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"
)


def save_aya_vision(folder: Path) -> Path:
    """Aya Vision: a SigLIP tower, pixel-shuffled 2x2, Cohere 2; images cut into up to two tiles and a
    global view. Its processor's patch size is the vision patch times the shuffle (8 x 2), as its
    checkpoints record it (their processor's own downsample factor stays 1)."""
    import transformers as t

    turns = ("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>")
    image = ("<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>")
    tok = _tokenizer(turns + image + ("TILE_1", "TILE_GLOBAL"))
    config = t.AyaVisionConfig(
        vision_config=dict(_SIGLIP_VISION, model_type="siglip_vision_model"),
        text_config=decoder_config(tok, model_type="cohere2", sliding_window=64),
        downsample_factor=2,
        image_token_index=tok.convert_tokens_to_ids("<|IMG_PATCH|>"),
        tie_word_embeddings=False,
    )
    images = t.GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=True, max_patches=2)
    processor = t.AyaVisionProcessor(images, tok, patch_size=16, img_size=32, chat_template=AYA_TEMPLATE)
    return _save(folder, lambda: t.AyaVisionForConditionalGeneration(config), processor)


GLM_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def save_glm4v(folder: Path) -> Path:
    """GLM-4.1V: a Qwen2-VL-like tower (8-pixel patches merged 2x2) and GLM-4 with 3-D rotary
    positions over half of each head."""
    import transformers as t

    image = ("<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>")
    tok = _tokenizer(("[gMASK]", "<sop>", "<|user|>", "<|assistant|>", *image, "<|video|>"))
    ids = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, image_size=32, patch_size=8)
    config = t.Glm4vConfig(
        text_config=decoder_config(tok, model_type="glm4v_text", rope_parameters=rope),
        vision_config=dict(vision, out_hidden_size=32, initializer_range=1.0),
        image_token_id=ids("<|image|>"),
        video_token_id=ids("<|video|>"),
        image_start_token_id=ids("<|begin_of_image|>"),
        image_end_token_id=ids("<|end_of_image|>"),
        video_start_token_id=ids("<|begin_of_video|>"),
        video_end_token_id=ids("<|end_of_video|>"),
    )
    images = t.Glm4vImageProcessorPil(
        patch_size=8, merge_size=2, temporal_patch_size=2, size={"shortest_edge": 32 * 32, "longest_edge": 64 * 64}
    )
    processor = _images_only(t.Glm4vProcessor)(
        image_processor=images, tokenizer=tok, video_processor=None, chat_template=GLM_TEMPLATE
    )
    _save(folder, lambda: t.Glm4vForConditionalGeneration(config), processor)
    _with_video(folder, "Glm4vVideoProcessor")
    return folder


def save_instructblip(folder: Path) -> Path:
    """InstructBLIP (Vicuna form: a Llama decoder): a Q-Former reads the image with the prompt in its
    own BERT-like tokens; no chat template, so the prompt goes plain after the 4 query tokens."""
    import transformers as t

    tok, qformer_tok = _tokenizer(("<image>",)), _bert_like_tokenizer()
    qformer = dict(TOWER, num_hidden_layers=1, encoder_hidden_size=32, cross_attention_frequency=1)
    config = t.InstructBlipConfig(
        vision_config=dict(_SIGLIP_VISION, initializer_range=1.0),
        qformer_config=dict(
            qformer, vocab_size=len(qformer_tok), max_position_embeddings=64, pad_token_id=qformer_tok.pad_token_id
        ),
        text_config=decoder_config(tok),
        num_query_tokens=4,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
    )
    images = t.BlipImageProcessorPil(size={"height": 32, "width": 32})
    processor = t.InstructBlipProcessor(images, tok, qformer_tok, num_query_tokens=4)
    return _save(folder, lambda: t.InstructBlipForConditionalGeneration(config), processor)


# Not here, as their processors need torchvision (docs/models.md): Llama 4 (its image processor
# exists only in torchvision form) and Mistral 3 / Pixtral (PixtralProcessor requires it).
VLM_FAMILIES = {
    "Qwen2-VL": save_qwen2_vl,
    "Qwen2.5-VL": save_qwen2_5_vl,
    "Qwen3-VL": save_qwen3_vl,
    "InternVL": save_internvl,
    "LLaVA-1.5": save_vlm,
    "LLaVA-NeXT": save_llava_next,
    "LLaVA-OneVision": save_llava_onevision,
    "Idefics2": save_idefics2,
    "Idefics3": save_idefics3,
    "SmolVLM": save_smolvlm,
    "Gemma 3": save_gemma3,
    "PaliGemma": save_paligemma,
    "Mllama": save_mllama,
    "Aya Vision": save_aya_vision,
    "GLM-4V": save_glm4v,
    "InstructBLIP": save_instructblip,
}


def _bert_like_tokenizer():
    """The shared words with BERT's [CLS] / [SEP] roles (BLIP and GIT start and end texts with them)."""
    return _with_roles(_tokenizer(), cls_token="<s>", sep_token="</s>")


def _bert_like_text(tok, **overrides) -> dict:
    """A BERT-like text decoder's settings: texts end with [SEP]."""
    return text_config(
        tok, max_position_embeddings=64, initializer_range=1.0, eos_token_id=tok.sep_token_id, **overrides
    )


def save_blip(folder: Path) -> Path:
    """A BLIP captioner (ViT + BERT-like decoder) on 32x32 images."""
    import transformers as t

    tok = _bert_like_tokenizer()
    text = _bert_like_text(tok, encoder_hidden_size=32, projection_dim=32, sep_token_id=tok.sep_token_id)
    vision = dict(_SIGLIP_VISION, projection_dim=32, initializer_range=1.0)
    config = t.BlipConfig(text_config=text, vision_config=vision, projection_dim=32, image_text_hidden_size=32)
    images = t.BlipImageProcessorPil(size={"height": 32, "width": 32})
    return _save(folder, lambda: t.BlipForConditionalGeneration(config), t.BlipProcessor(images, tok))


def save_git(folder: Path) -> Path:
    """A GIT captioner (CLIP-like vision + BERT-like decoder) on 32x32 images."""
    import transformers as t

    tok = _bert_like_tokenizer()
    text = _bert_like_text(tok, bos_token_id=tok.cls_token_id)
    config = t.GitConfig(vision_config=dict(_SIGLIP_VISION, initializer_range=1.0), **text)
    images = t.CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return _save(folder, lambda: t.GitForCausalLM(config), t.GitProcessor(images, tok))


CAPTIONER_FAMILIES = {"ViT-GPT2": save_captioner, "BLIP": save_blip, "GIT": save_git}


def save_owlv2(folder: Path) -> Path:
    """An OWLv2 open-vocabulary detector on 32x32 images (its processor pads images square)."""
    import transformers as t

    tok = _tokenizer()
    config = t.Owlv2Config(
        text_config=text_config(tok, max_position_embeddings=16), vision_config=VISION, projection_dim=32
    )
    images = t.Owlv2ImageProcessorPil(size={"height": 32, "width": 32})
    return _save(folder, lambda: _widened(t.Owlv2ForObjectDetection(config)), t.Owlv2Processor(images, tok))


# SigLIP 2's characters: lower-case (its tokenizer lower-cases), digits, the templates' punctuation.
SIGLIP2_CHARS = ("\u2581", *string.ascii_lowercase, *string.digits, *".,?:'-")


def save_siglip2(folder: Path) -> Path:
    """A SigLIP 2 (NaFlex: each image cut into at most 256 patches of 16 pixels at its own aspect
    ratio, the settings `Siglip2Processor` applies over its image processor's). AutoTokenizer loads a siglip2 checkpoint's tokenizer as `Siglip2Tokenizer` (Gemma's BPE
    with lower-casing), whatever tokenizer.json holds, so the tiny one is a `Siglip2Tokenizer` itself,
    over single characters (no merges)."""
    import transformers as t

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    vocab = {piece: i for i, piece in enumerate(specials + list(SIGLIP2_CHARS))}
    tok = t.Siglip2Tokenizer(vocab=vocab, merges=[], model_max_length=64)
    vision = dict(TOWER, patch_size=16, num_patches=256)
    config = t.Siglip2Config(text_config=text_config(tok, max_position_embeddings=64), vision_config=vision)
    processor = t.Siglip2Processor(t.Siglip2ImageProcessorPil(patch_size=16, max_num_patches=256), tok)
    return _save(folder, lambda: _widened(t.Siglip2Model(config)), processor)


ZERO_SHOT_FAMILIES = {"CLIP": save_clip, "SigLIP": save_siglip, "SigLIP2": save_siglip2}


def save_rt_detr(folder: Path) -> Path:
    """An RT-DETR with a small ResNet backbone (three stages, as its hybrid encoder takes) on images
    resized to 64x64, with the DETR test's labels."""
    import transformers as t

    backbone = t.RTDetrResNetConfig(
        embedding_size=8,
        hidden_sizes=[8, 16, 16, 16],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    config = t.RTDetrConfig(
        backbone_config=backbone,
        encoder_in_channels=[16, 16, 16],
        encoder_hidden_dim=16,
        encoder_ffn_dim=32,
        encoder_attention_heads=2,
        d_model=16,
        decoder_ffn_dim=32,
        decoder_layers=1,
        decoder_attention_heads=2,
        num_queries=12,
        num_denoising=0,
        decoder_in_channels=[16, 16, 16],
        eval_size=None,
        anchor_image_size=None,
        id2label=DETECTOR_LABELS,
        label2id={v: k for k, v in DETECTOR_LABELS.items()},
    )
    images = t.RTDetrImageProcessorPil(size={"height": 64, "width": 64})
    return _save(folder, lambda: t.RTDetrForObjectDetection(config), images)


DETECTOR_FAMILIES = {
    "DETR": save_detector,
    "RT-DETR": save_rt_detr,
    "OWL-ViT": save_owlvit,
    "OWLv2": save_owlv2,
}
