"""Each local backend family's plain transformers loop on one device: images (or judgements) per
second by batch size and dtype. It needs only torch and transformers, no Ray and no vlm_decade, so it
runs on any GPU machine as it is:

    python benchmarks/gpu_backends.py                 # cuda if there is one, bf16 there
    python benchmarks/gpu_backends.py --quick         # tiny shapes: a minute on a CPU, to check it runs

The models are built from configs with random weights (no download: GPU machines are often
offline), at the shapes of the models the studies name: ViT-base/16 + GPT-2 small
(nlpconnect/vit-gpt2-image-captioning, `hf-captioner`), Study B's first three LMMs through `hf-vlm`:
LLaVA-1.5-7B (CLIP ViT-L/14-336 + a 7B Llama), Qwen2-VL-7B (its 675M ViT + Qwen2-7B, a 448x448 image
as 256 tokens) and InternVL3-8B-hf (InternViT-300M + Qwen2.5-7B, one 448x448 tile as 256 tokens),
DETR-ResNet-50 (`hf-detector`), CLIP ViT-L/14 against 1,000 class names
(`hf-zero-shot`) and Llama-3.2-3B answering short judge prompts (`hf-judge`). Throughput does not
depend on the weights' values when the work per item is fixed, so generation is forced to exactly
`--new-tokens` tokens (min = max) and the inputs are synthetic tensors of the real sizes. Each
figure is the best of `--repeats` timed batches after one warm-up batch, with the device
synchronised around each. Prints one JSON object per line; the last is the summary.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


@dataclass(frozen=True)
class Family:
    name: str
    backend: str
    build: Callable[[bool], torch.nn.Module]  # quick -> model
    step: Callable[[torch.nn.Module, int, bool, str, torch.dtype, int], None]  # one batch, end to end


def _llama(quick: bool, vocab: int, **full):
    from transformers import LlamaConfig

    if quick:
        return LlamaConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=1024,
        )
    return LlamaConfig(vocab_size=vocab, max_position_embeddings=4096, **full)


def build_captioner(quick: bool):
    from transformers import GPT2Config, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig

    if quick:
        encoder = ViTConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=64
        )
        decoder = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0)
    else:  # nlpconnect/vit-gpt2-image-captioning
        encoder, decoder = ViTConfig(image_size=224, patch_size=16), GPT2Config()
    decoder.add_cross_attention = decoder.is_decoder = True
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = config.pad_token_id = config.eos_token_id = decoder.eos_token_id or 0
    return VisionEncoderDecoderModel(config)


def step_captioner(net, batch: int, quick: bool, device: str, dtype, new_tokens: int) -> None:
    size = net.config.encoder.image_size
    pixels = torch.randn(batch, 3, size, size, device=device, dtype=dtype)
    net.generate(pixel_values=pixels, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)


IMAGE_TOKEN = 32000


def build_vlm(quick: bool):
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    if quick:
        vision = CLIPVisionConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=56
        )
    else:  # llava-hf/llava-1.5-7b-hf: CLIP ViT-L/14 at 336 px, 576 image tokens
        vision = CLIPVisionConfig(
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            image_size=336,
            patch_size=14,
            projection_dim=768,
        )
    text = _llama(quick, IMAGE_TOKEN + 64)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=IMAGE_TOKEN)
    return LlavaForConditionalGeneration(config)


def step_vlm(net, batch: int, quick: bool, device: str, dtype, new_tokens: int) -> None:
    vision = net.config.vision_config
    tokens = (vision.image_size // vision.patch_size) ** 2  # the "default" strategy drops the CLS token
    prompt = torch.randint(1, 1000, (batch, 40), device=device)
    image = torch.full((batch, tokens), IMAGE_TOKEN, device=device)
    ids = torch.cat([prompt[:, :5], image, prompt[:, 5:]], dim=1)
    pixels = torch.randn(batch, 3, vision.image_size, vision.image_size, device=device, dtype=dtype)
    net.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        pixel_values=pixels,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
    )


# Qwen2-VL's special tokens (Qwen/Qwen2-VL-7B-Instruct's ids; the quick vocabulary's last ones).
QWEN_VOCAB = {False: 152064, True: 1000}


def _qwen_ids(quick: bool) -> dict:
    top = QWEN_VOCAB[quick]
    start, end, image, video = (990, 991, 992, 993) if quick else (151652, 151653, 151655, 151656)
    return dict(vision_start_token_id=start, vision_end_token_id=end, image_token_id=image, video_token_id=video) | {
        "vocab": top
    }


def _qwen2_text(quick: bool, vocab: int, mrope: list[int] | None = None) -> dict:
    rope = {"rope_type": "default", "rope_theta": 1e6} | ({"mrope_section": mrope} if mrope else {})
    if quick:
        return dict(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            rope_parameters=rope,
            bos_token_id=1,
            eos_token_id=2,
        )
    # Qwen2-7B / Qwen2.5-7B
    return dict(
        vocab_size=vocab,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rope_parameters=rope,
    )


def build_qwen2_vl(quick: bool):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    ids = _qwen_ids(quick)
    if quick:
        vision = dict(depth=2, embed_dim=64, hidden_size=64, num_heads=4, patch_size=8)
    else:  # Qwen/Qwen2-VL-7B-Instruct: a 32-layer ViT of width 1280, patches of 14, 2x2 merged
        vision = dict(depth=32, embed_dim=1280, hidden_size=3584, num_heads=16, patch_size=14)
    mrope = [2, 2, 4] if quick else [16, 24, 24]  # halves of the head width, as the checkpoint's
    config = Qwen2VLConfig(text_config=_qwen2_text(quick, ids.pop("vocab"), mrope), vision_config=vision, **ids)
    return Qwen2VLForConditionalGeneration(config)


def _prompt_with_image(batch: int, device: str, image: list[int]) -> torch.Tensor:
    """40 prompt tokens per row with the image's tokens after the first five (a chat template's place)."""
    prompt = torch.randint(1, 900, (batch, 40), device=device)
    image = torch.tensor(image, device=device).expand(batch, -1)
    return torch.cat([prompt[:, :5], image, prompt[:, 5:]], dim=1)


def _generate(net, ids: torch.Tensor, new_tokens: int, **images) -> None:
    net.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        **images,
    )


def step_qwen2_vl(net, batch: int, quick: bool, device: str, dtype, new_tokens: int) -> None:
    config, vision = net.config, net.config.vision_config
    side = 32 if quick else 448  # the image's side in pixels: (side / patch)^2 patches
    grid = side // vision.patch_size
    tokens = grid * grid // vision.spatial_merge_size**2
    image = [config.vision_start_token_id, *[config.image_token_id] * tokens, config.vision_end_token_id]
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    pixels = torch.randn(batch * grid * grid, width, device=device, dtype=dtype)
    thw = torch.tensor([[1, grid, grid]] * batch, device=device)
    _generate(net, _prompt_with_image(batch, device, image), new_tokens, pixel_values=pixels, image_grid_thw=thw)


def build_internvl(quick: bool):
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    if quick:
        vision = dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
        )
    else:  # OpenGVLab/InternVL3-8B-hf: InternViT-300M at 448 px
        vision = dict(
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            image_size=448,
            patch_size=14,
        )
    side = vision["image_size"] // vision["patch_size"]
    vocab = 1000 if quick else 151674
    config = InternVLConfig(
        vision_config=vision,
        text_config=dict(_qwen2_text(quick, vocab), model_type="qwen2"),
        image_token_id=vocab - 7 if quick else 151667,
        image_seq_length=side * side // 4,  # pixel shuffle at downsample ratio 0.5
        tie_word_embeddings=False,  # as Qwen2.5-7B's
    )
    return InternVLForConditionalGeneration(config)


def step_internvl(net, batch: int, quick: bool, device: str, dtype, new_tokens: int) -> None:
    config = net.config
    side = config.vision_config.image_size
    side = side if isinstance(side, int) else side[0]
    image = [config.image_token_id] * config.image_seq_length
    pixels = torch.randn(batch, 3, side, side, device=device, dtype=dtype)  # one tile per image
    _generate(net, _prompt_with_image(batch, device, image), new_tokens, pixel_values=pixels)


def build_detector(quick: bool):
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    if quick:
        backbone = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], out_features=["stage2"])
        config = DetrConfig(
            use_timm_backbone=False,
            backbone_config=backbone,
            use_pretrained_backbone=False,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
        )
    else:  # facebook/detr-resnet-50
        backbone = ResNetConfig(out_features=["stage4"])
        config = DetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False)
    return DetrForObjectDetection(config)


def step_detector(net, batch: int, quick: bool, device: str, dtype, new_tokens: int) -> None:
    side = 128 if quick else 800  # DetrImageProcessor's shortest edge
    net(pixel_values=torch.randn(batch, 3, side, side, device=device, dtype=dtype))


CLASSES = 1000


def build_zero_shot(quick: bool):
    from transformers import CLIPConfig, CLIPModel

    if quick:
        small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
        config = CLIPConfig(text_config=small, vision_config={**small, "image_size": 64}, projection_dim=64)
    else:  # openai/clip-vit-large-patch14
        config = CLIPConfig(
            text_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
            vision_config=dict(
                hidden_size=1024,
                intermediate_size=4096,
                num_hidden_layers=24,
                num_attention_heads=16,
                image_size=224,
                patch_size=14,
            ),
            projection_dim=768,
        )
    net = CLIPModel(config)
    net.class_features = None  # the class names' features, encoded once per run as the backend does
    return net


def _features(out) -> torch.Tensor:
    # transformers 5 returns the projected features as the output's pooler_output; 4 the tensor itself
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def step_zero_shot(net, batch: int, quick: bool, device: str, dtype, new_tokens: int) -> None:
    if net.class_features is None:
        names = torch.randint(1, 1000, (CLASSES, 12), device=device)
        net.class_features = torch.nn.functional.normalize(_features(net.get_text_features(input_ids=names)), dim=-1)
    size = net.config.vision_config.image_size
    images = _features(
        net.get_image_features(pixel_values=torch.randn(batch, 3, size, size, device=device, dtype=dtype))
    )
    (torch.nn.functional.normalize(images, dim=-1) @ net.class_features.T).argmax(dim=-1)


def build_judge(quick: bool):
    from transformers import LlamaForCausalLM

    # meta-llama/Llama-3.2-3B-Instruct
    config = _llama(
        quick,
        128256 if not quick else 1000,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def step_judge(net, batch: int, quick: bool, device: str, dtype, new_tokens: int) -> None:
    ids = torch.randint(1, 1000, (batch, 120), device=device)  # the LI prompt with label and answer
    net.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4)


FAMILIES = (
    Family("vit-gpt2 captioner", "hf-captioner", build_captioner, step_captioner),
    Family("llava-1.5-7b", "hf-vlm", build_vlm, step_vlm),
    Family("qwen2-vl-7b", "hf-vlm", build_qwen2_vl, step_qwen2_vl),
    Family("internvl3-8b-hf", "hf-vlm", build_internvl, step_internvl),
    Family("detr-resnet-50", "hf-detector", build_detector, step_detector),
    Family("clip-vit-l-14, 1000 classes", "hf-zero-shot", build_zero_shot, step_zero_shot),
    Family("llama-3.2-3b judge", "hf-judge", build_judge, step_judge),
)


def synchronise(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(family: Family, args, device: str, dtype) -> dict:
    started = time.perf_counter()
    with torch.device(device):
        torch.manual_seed(0)
        net = family.build(args.quick).to(dtype).eval()
    synchronise(device)
    built = time.perf_counter() - started
    rates = {}
    for batch in args.batch_sizes:
        try:
            with torch.inference_mode():
                family.step(net, batch, args.quick, device, dtype, args.new_tokens)  # warm-up
                best = float("inf")
                for _ in range(args.repeats):
                    synchronise(device)
                    start = time.perf_counter()
                    family.step(net, batch, args.quick, device, dtype, args.new_tokens)
                    synchronise(device)
                    best = min(best, time.perf_counter() - start)
            rates[batch] = round(batch / best, 3)
        except torch.OutOfMemoryError:
            rates[batch] = "out of memory"
            torch.cuda.empty_cache()
    figure = {
        "family": family.name,
        "backend": family.backend,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "parameters_m": round(sum(p.numel() for p in net.parameters()) / 1e6, 1),
        "build_s": round(built, 2),
        "per_s_by_batch": rates,
    }
    del net
    if device.startswith("cuda"):
        figure["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, to check the script on a CPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda (as the backends), else float32")
    parser.add_argument("--batch-sizes", type=lambda s: [int(b) for b in s.split(",")], default=None)
    parser.add_argument("--new-tokens", type=int, default=20, help="tokens generated per description")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=None, help="comma-separated backends (hf-vlm,hf-judge,...)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    args.batch_sizes = args.batch_sizes or ([1, 4] if args.quick else [1, 8, 32])
    chosen = [f for f in FAMILIES if args.only is None or f.backend in args.only.split(",")]
    started = time.perf_counter()
    figures = []
    for family in chosen:
        figures.append(measure(family, args, args.device, dtype))
        emit(**figures[-1])
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    emit(
        summary=True,
        device_name=name,
        torch=torch.__version__,
        quick=args.quick,
        new_tokens=args.new_tokens,
        best_per_s={
            f["family"]: max((v for v in f["per_s_by_batch"].values() if isinstance(v, float)), default=None)
            for f in figures
        },
        total_seconds=round(time.perf_counter() - started, 1),
    )


if __name__ == "__main__":
    main()
