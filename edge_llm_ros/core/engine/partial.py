"""Loading part of a checkpoint: the tensors one layer range needs, everything else left on the
meta device (no memory). A pipeline stage holds its layers this way, and a robot holds only what
its draft shares of the target (core/drafts/loading.draft_home). Knows nothing about ROS."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from .models import TorchCausalLM


def stage_tensor_names(names: Sequence[str], layers: range, *, first: bool, last: bool) -> list[str]:
    """The checkpoint tensors a stage needs: its layers', plus the embedding (first stage; also the
    last's when the head is tied to it) and the final norm and head (last stage)."""
    wanted = []
    for name in names:
        parts = name.split(".")
        if "layers" in parts:
            at = parts.index("layers")
            if int(parts[at + 1]) in layers:
                wanted.append(name)
        elif name.endswith("embed_tokens.weight"):
            if first or (last and "lm_head.weight" not in names):
                wanted.append(name)
        elif name.endswith("norm.weight") or name.startswith("lm_head."):
            if last:
                wanted.append(name)
    return wanted


def load_stage_model(folder: str | Path, layers: range, *, first: bool, last: bool,
                     dtype: torch.dtype = torch.float32, tokenizer=None) -> TorchCausalLM:
    """A TorchCausalLM holding only what stage ``layers`` needs (see :func:`stage_tensor_names`),
    read from the safetensors files of a Hugging Face folder (models.weights_folder gives one for a
    GGUF); every other module stays on the meta device and takes no memory."""
    from accelerate.utils import set_module_tensor_to_device
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    config = AutoConfig.from_pretrained(str(folder))
    if layers.start < 0 or layers.stop > config.num_hidden_layers or len(layers) == 0:
        raise ValueError(f"layers {layers.start}-{layers.stop - 1} are not a range of the model's "
                         f"{config.num_hidden_layers} layers")
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
    loaded = set()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in stage_tensor_names(list(f.keys()), layers, first=first, last=last):
                tensor = f.get_tensor(name).to(dtype).clone()  # fresh memory: see models._copy_out_of_file
                set_module_tensor_to_device(hf, name, "cpu", value=tensor)
                loaded.add(name)
    if last and not any(n.startswith("lm_head.") for n in loaded):  # a head tied to the embedding
        embed = next(n for n in loaded if n.endswith("embed_tokens.weight"))
        hf.lm_head.weight = hf.get_submodule(embed.rsplit(".", 1)[0]).weight
    with torch.device("cpu"):  # its buffers are computed, not stored
        hf.model.rotary_emb = type(hf.model.rotary_emb)(config=config)
    return TorchCausalLM(hf.eval(), tokenizer, layers, transposed_head=last)
