"""Vision-language models whose language half the engine drives: Qwen2-VL and Qwen2.5-VL.

Contract: :class:`MRopeLM` is a :class:`~edge_llm_ros.core.engine.models.TorchCausalLM` over such a
model's language model (its embedding, decoder layers, final norm and head), so every decoding
mode runs on it unchanged. An image enters through :meth:`MRopeLM.with_image`: a view in which the
prompt's image rows embed as the model's own vision tower's output, and whose positions follow
the model's multimodal rotary embedding.

M-RoPE (Qwen2-VL, Wang et al. 2024, §2.1 "Multimodal Rotary Position Embedding"): each position is
three numbers (time, height, width) and the rotary frequencies are split into three sections, one
per component. A text row has all three equal; an image row has the image's start position plus
its (t, h, w) cell; the text after an image continues from the largest image position + 1. The
engine addresses rows by their cache index p, as for any model; a conditioned view maps p to its
three components:

    p < P:   table[:, p]        (transformers' get_rope_index over the prompt up to the image's end)
    p >= P:  p + delta, thrice  (delta = table.max() + 1 - P: transformers' ``rope_deltas``)

so a speculative row, a tree row or a re-verified row gets the position the model's own
``generate`` would give the same token. Knows nothing about prompts (nav/qwen_vl.py builds
them with the model's processor and qwen-vl-utils) and nothing about ROS.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import torch

from .models import TorchCausalLM

VL_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")


@dataclass(frozen=True)
class ImagePlacement:
    """Where one image sits in a prompt, and the positions the prompt's first ``len(table[0])``
    rows take: ``rows`` [K, E] at prompt indices ``at`` [K]; ``table`` [3, P]; ``delta``."""

    at: torch.Tensor
    rows: torch.Tensor
    table: torch.Tensor
    delta: int


class MRopeLM(TorchCausalLM):
    """The language model of a Qwen2-VL / Qwen2.5-VL checkpoint under the engine's loop (see the
    module docstring). ``hf_model``: the whole ``*ForConditionalGeneration`` (its vision tower makes
    the image rows); unconditioned, it is a text model whose positions are plain."""

    supported_model_types = VL_MODEL_TYPES
    image: ImagePlacement | None = None

    @staticmethod
    def decoder_of(hf_model: Any) -> tuple[Any, Any]:
        return hf_model.model.language_model, hf_model.config.get_text_config()

    @property
    def image_token_id(self) -> int:
        return int(self.hf.config.image_token_id)

    # -- an image -----------------------------------------------------------------------------

    @torch.inference_mode()
    def image_rows(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """One image's rows in this model's embedding space, [N, E]: its own vision tower over the
        processor's patches (``pixel_values`` [patches, C * T * P * P], ``grid_thw`` [1, 3])."""
        out = self.hf.model.get_image_features(pixel_values, image_grid_thw=grid_thw)
        return out.pooler_output[0].to(self.dtype)

    @torch.inference_mode()
    def with_image(self, prompt: list[int], pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> MRopeLM:
        """A view conditioned on one image: ``prompt``'s image tokens (the processor expanded them,
        one per merged patch) embed as :meth:`image_rows`, and positions follow M-RoPE. Only the
        prompt's part up to its last image token fixes the placement, so any text may follow it.
        ValueError if the prompt's image tokens and the image's rows differ in number."""
        ids = torch.tensor([prompt], dtype=torch.long)  # [1, T]
        at = (ids[0] == self.image_token_id).nonzero().flatten()  # [K]
        rows = self.image_rows(pixel_values, grid_thw)  # [N, E]
        if len(at) != rows.shape[0]:
            raise ValueError(f"the prompt holds {len(at)} image tokens, the image makes {rows.shape[0]} rows "
                             f"(grid {grid_thw.tolist()}): build the prompt from the same image size")
        end = int(at[-1]) + 1
        kinds = (ids[:, :end] == self.image_token_id).int()  # [1, P]: 1 = image, 0 = text
        table, deltas = self.hf.model.get_rope_index(ids[:, :end], kinds, image_grid_thw=grid_thw)  # [3, 1, P]
        view = copy.copy(self)
        view.image = ImagePlacement(at, rows, table[:, 0].to(self.device), int(deltas.flatten()[0]))
        return view

    # -- the steps the engine calls -------------------------------------------------------------

    def embed(self, token_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = super().embed(token_ids)  # [B, T, E]
        if self.image is None:
            return hidden
        hits = token_ids == self.image_token_id  # [B, T]
        if not bool(hits.any()):
            return hidden
        if position_ids is None:
            raise ValueError("image tokens need their positions to find their rows")
        positions = position_ids.expand_as(token_ids)  # [B, T] cache indices
        slot = torch.searchsorted(self.image.at, positions).clamp(max=len(self.image.at) - 1)  # [B, T]
        placed = hits & (self.image.at[slot] == positions)  # an image token at one of the image's indices
        stray = hits & ~placed & (positions < self.image.table.shape[1])
        if bool(stray.any()):  # a prompt laid out otherwise than the one the image was placed in
            raise ValueError(f"an image token at prompt position {int(positions[stray][0])}, where the image has "
                             "no row: the prompt and the image's placement come from different templates or sizes")
        return torch.where(placed.unsqueeze(-1), self.image.rows[slot], hidden)

    def rotary_embeddings(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, D] for cache indices ``position_ids`` [B, T] (see the module docstring)."""
        positions = position_ids.unsqueeze(0).expand(3, *position_ids.shape)  # [3, B, T]
        if self.image is not None:
            table, delta = self.image.table, self.image.delta
            inside = positions < table.shape[1]
            from_table = table[:, positions[0].clamp(max=table.shape[1] - 1)]  # [3, B, T]
            positions = torch.where(inside, from_table, positions + delta)
        return self.rotary(hidden, positions)


def load_vision_lm(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32,
                   device: str = "cpu") -> tuple[MRopeLM, Any]:
    """(the model, its processor) from a local Qwen2-VL / Qwen2.5-VL folder (a checkpoint as its
    authors publish it: config.json, weights, tokenizer and preprocessor files); never downloads."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    folder = os.fspath(path)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise FileNotFoundError(f"no vision-language model in {folder!r} (no config.json): give the folder of a "
                                f"local Qwen2-VL or Qwen2.5-VL checkpoint")
    model_type = AutoConfig.from_pretrained(folder, local_files_only=True).model_type
    if model_type not in VL_MODEL_TYPES:
        raise ValueError(f"{folder}: model type {model_type!r}; the navigator's VLM backend runs "
                         f"{', '.join(VL_MODEL_TYPES)}")
    processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    hf = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype, local_files_only=True,
                                                     attn_implementation="sdpa")
    return MRopeLM(hf.to(device).eval(), processor.tokenizer), processor


# A chat template in Qwen's form (system-free): images as <|vision_start|><|image_pad|><|vision_end|>,
# which the processor expands to one <|image_pad|> per merged patch. Real checkpoints ship their own.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def save_tiny_vlm(folder: str | os.PathLike, model_type: str = "qwen2_vl", *, hidden: int = 32, layers: int = 2,
                  seed: int = 0, init_range: float = 0.3, vocab_padding: int = 0) -> str:
    """Write a random Qwen2-VL (or Qwen2.5-VL) checkpoint with small dims into ``folder``, laid out
    as a published one (config, safetensors, tokenizer, image and video processor configs, chat
    template), for tests and examples: SmolLM2's tokenizer plus Qwen's four vision tokens, a one-block
    vision tower. ``init_range`` as in models.tiny_llama: peaked distributions, no greedy ties.
    ``vocab_padding``: head rows beyond the tokenizer's (real checkpoints pad: 2B and 7B differ)."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    from .models import load_tokenizer

    if model_type not in VL_MODEL_TYPES:
        raise ValueError(f"model_type must be one of {', '.join(VL_MODEL_TYPES)}, got {model_type!r}")
    folder = os.fspath(folder)
    tokenizer = load_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.save_pretrained(folder)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    heads = 4
    text = dict(vocab_size=len(tokenizer) + vocab_padding, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=1024,
                initializer_range=init_range, tie_word_embeddings=True, bos_token_id=None,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=None,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": _mrope_section(hidden // heads)})
    vision: dict[str, Any]
    if model_type == "qwen2_vl":
        vision = dict(depth=1, embed_dim=32, hidden_size=hidden, num_heads=2, mlp_ratio=2)
    else:
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                      fullatt_block_indexes=[0], window_size=56)
    config = AutoConfig.for_model(model_type, text_config=text, vision_config=vision,
                                  image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                                  vision_start_token_id=ids["<|vision_start|>"],
                                  vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)
    torch.manual_seed(seed)
    AutoModelForImageTextToText.from_config(config).eval().save_pretrained(folder)
    _tiny_processor(model_type, AutoTokenizer.from_pretrained(folder)).save_pretrained(folder)
    return folder


def _mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL's split of the rotary frequencies (head_dim / 2 of them) over (t, h, w): 16, 24, 24
    of 64 at full size; the same shares, rounded, for a small head."""
    half = head_dim // 2
    t = max(1, half // 4)
    h = (half - t) // 2
    return [t, h, half - t - h]


def _tiny_processor(model_type: str, tokenizer):
    """The model type's own processor class over Qwen2-VL's image and video processors."""
    import importlib

    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    module = importlib.import_module(f"transformers.models.{model_type}.processing_{model_type}")
    pixels = {"shortest_edge": 4 * 28 * 28, "longest_edge": 1024 * 28 * 28}
    return getattr(module, PROCESSOR_MAPPING_NAMES[model_type])(
        image_processor=Qwen2VLImageProcessor(size=pixels), video_processor=Qwen2VLVideoProcessor(size=pixels),
        tokenizer=tokenizer, chat_template=TINY_CHAT_TEMPLATE)
