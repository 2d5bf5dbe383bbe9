"""A tiny checkpoint that ships its own code, laid out as hub repositories that need
`trust_remote_code` lay theirs out: config.json's `auto_map` names classes in Python files beside
the weights (configuration_*.py, modeling_*.py, processing_*.py), and transformers imports them from
the folder. Its classes are a tiny LLaVA's under their own names and model type (unknown to
transformers), so only the folder's code can load it, and it keeps the processor + chat template +
`generate` contract that `hf-vlm` drives.

Checkpoints whose code answers through its own `chat` method instead (InternVL2, MiniCPM-V) name no
AutoModelForImageTextToText class in their `auto_map`; `REMOTE_CHAT_AUTO_MAP` is such a map.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.hf_tiny import save_vlm

MODEL_TYPE = "tiny_remote_llava"
FILES = {
    "configuration_tiny_remote.py": f'''from transformers import LlavaConfig


class TinyRemoteConfig(LlavaConfig):
    model_type = "{MODEL_TYPE}"
''',
    "modeling_tiny_remote.py": """from transformers import LlavaForConditionalGeneration

from .configuration_tiny_remote import TinyRemoteConfig


class TinyRemoteForConditionalGeneration(LlavaForConditionalGeneration):
    config_class = TinyRemoteConfig
""",
    "processing_tiny_remote.py": """from transformers import LlavaProcessor


class TinyRemoteProcessor(LlavaProcessor):
    pass
""",
}
AUTO_MAP = {
    "AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
    "AutoModelForImageTextToText": "modeling_tiny_remote.TinyRemoteForConditionalGeneration",
}
# InternVL2's: a config, and a model driven through its own `chat(tokenizer, pixel_values, question)`.
REMOTE_CHAT_AUTO_MAP = {
    "AutoConfig": "configuration_internvl_chat.InternVLChatConfig",
    "AutoModel": "modeling_internvl_chat.InternVLChatModel",
    "AutoModelForCausalLM": "modeling_internvl_chat.InternVLChatModel",
}


def _edit(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}, indent=2))


def save_remote_code_vlm(folder: Path, seed: int = 0) -> Path:
    """`save_vlm`'s model and processor, saved as a checkpoint whose code is in the folder."""
    from safetensors.torch import save_model
    from transformers import LlavaForConditionalGeneration

    save_vlm(folder, seed)
    # LLaVA saves its weights under its legacy names, which transformers renames back on load only
    # for model type `llava`; the folder's own classes read them under the module names.
    model = LlavaForConditionalGeneration.from_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for name, code in FILES.items():
        (folder / name).write_text(code)
    _edit(folder / "config.json", model_type=MODEL_TYPE, architectures=["TinyRemoteForConditionalGeneration"])
    _edit(
        folder / "processor_config.json",
        processor_class="TinyRemoteProcessor",
        auto_map={"AutoProcessor": "processing_tiny_remote.TinyRemoteProcessor"},
    )
    _edit(folder / "config.json", auto_map=AUTO_MAP)
    return folder
