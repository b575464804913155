"""What the command-line tools add to core's loading (:mod:`edge_llm_ros.core.drafts.loading`: targets and
the drafters that ``--draft SPEC`` names): the same draft inside transformers' assisted generation
(for ``bench``), the draft-shape flags, and :class:`ToolError`. Only ``edge_llm_ros.core`` is
imported from the package; no ROS anywhere.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from edge_llm_ros.core.drafts.loading import NamedDrafter
from edge_llm_ros.core.engine.drafters import ModelDrafter, PromptLookupDrafter
from edge_llm_ros.core.engine.models import TorchCausalLM

# transformers' prompt lookup: how many tokens it copies per round (its documented example value).
HF_PROMPT_LOOKUP_TOKENS = 10


class ToolError(Exception):
    """Bad input to a tool, reported as one ``error: ...`` line with exit status 2."""


# -- the same draft inside transformers' assisted generation -------------------------------------


class SubsetHead(torch.nn.Module):
    """An LM head scoring token ids ``vocab_ids`` only; -inf elsewhere (what ModelDrafter does)."""

    def __init__(self, weight: torch.Tensor, vocab_ids: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.register_buffer("weight_sub", weight.detach()[vocab_ids].clone(), persistent=False)
        self.register_buffer("vocab_ids", vocab_ids.clone(), persistent=False)
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = torch.nn.functional.linear(hidden, self.weight_sub)  # [B, T, V_sub]
        full = hidden.new_full((*hidden.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.vocab_ids] = sub
        return full


def hf_view(model: TorchCausalLM, vocab_ids: torch.Tensor | None = None, adapter: torch.nn.Module | None = None
            ) -> torch.nn.Module:
    """A transformers model of the same class whose modules are ``model``'s (shared, not copied):
    embedding, the view's layers, final norm (after ``adapter``, an early exit), rotary and head.
    For a shallow view this is the draft as transformers can run it (``assistant_model=``)."""
    hf = model.hf
    ids = model.layer_ids
    if ids[0] != 0:
        raise ToolError(f"a draft over layers {ids.start}..{ids.stop - 1} does not start at layer 0")
    config = copy.deepcopy(hf.config)
    config.num_hidden_layers = len(ids)
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[: len(ids)]
    with torch.device("meta"):
        view = type(hf)(config)
    view.model.embed_tokens = hf.model.embed_tokens
    view.model.layers = torch.nn.ModuleList(hf.model.layers[i] for i in ids)
    view.model.norm = hf.model.norm if adapter is None else torch.nn.Sequential(adapter, hf.model.norm)
    view.model.rotary_emb = hf.model.rotary_emb
    view.lm_head = hf.lm_head if vocab_ids is None else SubsetHead(hf.lm_head.weight, vocab_ids, model.vocab_size)
    view.generation_config = copy.deepcopy(hf.generation_config)
    left = [n for n, t in [*view.named_parameters(), *view.named_buffers()] if t.device.type == "meta"]
    if left:
        raise RuntimeError(f"shallow transformers view has unset tensors: {left[:5]}")
    return view.eval()


@dataclass
class HFAssist:
    """How transformers runs our draft: ``generate(**kwargs)``, and a description (or why not)."""

    kwargs: dict | None
    description: str
    assistant: torch.nn.Module | None = None


def hf_assist_for(draft: NamedDrafter) -> HFAssist:
    drafter = draft.drafter
    if isinstance(drafter, PromptLookupDrafter):
        kwargs = {"prompt_lookup_num_tokens": HF_PROMPT_LOOKUP_TOKENS, "max_matching_ngram_size": drafter.max_ngram}
        return HFAssist(kwargs, f"transformers prompt lookup ({HF_PROMPT_LOOKUP_TOKENS} tokens, n-gram <= {drafter.max_ngram})")
    if drafter.needs_features:  # drafts from the target's features: no HF counterpart
        return HFAssist(None, f"no transformers equivalent of {type(drafter).__name__} (drafts from target features)")
    model = drafter.model if isinstance(drafter, ModelDrafter) else None
    if isinstance(drafter, ModelDrafter) and isinstance(model, TorchCausalLM):
        assistant = hf_view(model, drafter.vocab_ids, drafter.adapter)
        cfg = assistant.generation_config
        return HFAssist(
            {"assistant_model": assistant},
            f"transformers assisted generation, assistant = the same {len(model.layer_ids)}-layer draft "
            f"(num_assistant_tokens={cfg.num_assistant_tokens or 20}, "
            f"confidence threshold={cfg.assistant_confidence_threshold or 0.4}: transformers defaults)",
            assistant,
        )
    return HFAssist(None, f"no transformers equivalent of {type(drafter).__name__}")


SHAPE_FLAGS = {
    "gamma": "sd: drafted tokens per round",
    "tree_depth": "tree/llmcad: draft levels",
    "tree_width": "tree/llmcad: drafted nodes verified per round (W)",
    "tree_branch": "tree/llmcad: children per expanded node",
    "tree_expand": "tree/llmcad: nodes expanded per level",
}


def add_shape_arguments(parser) -> None:
    """``--gamma``, ``--tree-depth``, ... : override the mode presets' draft shape."""
    for name, what in SHAPE_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None, metavar="N",
                            help=f"{what} (default: the mode's preset)")


def shape_overrides(args) -> dict:
    """The shape flags given on the command line, as GenerationConfig fields (checked by it)."""
    shape = {name: getattr(args, name) for name in SHAPE_FLAGS if getattr(args, name, None) is not None}
    for name, value in shape.items():
        if value < 1:
            raise ToolError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return shape

