"""Early exits on the target: adapters that read an intermediate layer through the target's own head.

Contract: token ids and tensors in, logits out; nothing here imports ROS. An exit turns the
hidden state of one decoder layer into next-token logits, so a verifier can emit tokens
before the last layer (edge-cloud early exits) and the first layers of the target become a
self-drafter (:class:`ExitDrafter`, no second model to load).

Edge-cloud early exits (Venkatesha et al. 2025, §3 "Early Exit Training"): an adapter after
chosen decoder layers feeds the shared LM head; only the adapters train, the target stays
frozen. With h^(l) the output of decoder layer l (Eq. 3):

    a_l(h) = h + rms(h) · W_up · SiLU(W_down · RMSNorm(h))   W_down [b, E], W_up [E, b] (zero-initialised)
    z^(l)  = LMHead(FinalNorm(a_l(h^(l))))                  the target's own final norm and head
    S^(l)  = max softmax(z^(l))                             exit confidence (Eq. 4)

The adapter is stateless per position (no attention), so exiting at l needs no KV cache
beyond the target's own; and W_up = 0 makes an untrained exit the logit lens. The update is
scaled by the hidden state's own RMS: the final norm is scale-invariant, so the adapter then
works entirely on h / rms(h), and one learning rate suits every exit although the residual
stream grows with depth (median RMS on SmolLM2: 3.7 after layer 4, 18.7 after layer 24). On
SmolLM2 (150 training responses, 3 epochs) this raised held-out agreement at layers 4/8/16/24
from 0.25/0.25/0.29/0.66 (unscaled, best lr) to 0.28/0.30/0.34/0.69.

Layer convention: an exit is keyed by the 0-based index l of the decoder layer whose output
feeds it (what ``TorchCausalLM.run_layers(collect=[l])`` returns), so it sees l + 1 layers.
The self-drafter over the first K layers uses the exit at layer K - 1 (``--draft exit:K``).

On disk, a directory:

    config.json         format, exit layers, bottleneck width, norm eps, vocabulary subset
                        size, the target's identity (as for draft files), training metadata
    model.safetensors   "exits.<l>.norm.weight", "exits.<l>.down.weight", "exits.<l>.up.weight"
                        (fp16), "vocab_ids" (int32, the drafting subset; optional)

Training: core/training/exits.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from edge_llm_ros import DATA

from ..engine.drafters import ModelDrafter
from ..engine.models import SWAPPED_HEAD_ROWS, TorchCausalLM, target_identity
from .draft_models import CONFIG_FILE, WEIGHTS_FILE, check_target, read_config, read_weights, shipped_path

EXITS_DIR = DATA / "exits"
DEFAULT_EXITS = "smollm2-135m-instruct"
EXITS_FORMAT = "edge_llm_ros.exits/1"
FEATURES_FORMAT = "edge_llm_ros.exit-features/1"
DEFAULT_BOTTLENECK = 512


# -- the adapter ----------------------------------------------------------------------------------


class ExitAdapter(torch.nn.Module):
    """h + rms(h) · W_up · SiLU(W_down · RMSNorm(h)), per position; W_up starts at zero (identity map)."""

    def __init__(self, hidden_size: int, bottleneck: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        self.down = torch.nn.Linear(hidden_size, bottleneck, bias=False)
        self.up = torch.nn.Linear(bottleneck, hidden_size, bias=False)
        torch.nn.init.zeros_(self.up.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., E] -> [..., E]."""
        rms = hidden.float().pow(2).mean(-1, keepdim=True).sqrt().to(hidden.dtype)  # [..., 1]
        return hidden + rms * self.up(F.silu(self.down(self.norm(hidden))))


@dataclass(frozen=True)
class ExitConfig:
    """Where the exits sit (0-based decoder layers whose output feeds them) and their shape."""

    layers: tuple[int, ...]
    bottleneck: int
    hidden_size: int
    eps: float = 1e-5

    def __post_init__(self) -> None:
        layers = tuple(sorted({int(layer) for layer in self.layers}))
        if not layers or layers[0] < 0:
            raise ValueError(f"exit layers must be non-empty and >= 0, got {list(self.layers)}")
        if self.bottleneck <= 0:
            raise ValueError(f"bottleneck must be > 0, got {self.bottleneck}")
        object.__setattr__(self, "layers", layers)


class ExitSet:
    """The exits of one target: layer -> :class:`ExitAdapter`, their config, a drafting vocabulary."""

    def __init__(
        self,
        config: ExitConfig,
        adapters: torch.nn.ModuleDict | None = None,
        vocab_ids: torch.Tensor | None = None,
        training: dict | None = None,
        name: str = "exits",
    ) -> None:
        self.config = config
        self.adapters = adapters if adapters is not None else torch.nn.ModuleDict(
            {str(layer): ExitAdapter(config.hidden_size, config.bottleneck, config.eps) for layer in config.layers}
        )
        self.vocab_ids = vocab_ids
        self.training = training or {}
        self.name = name
        self._subset_heads: dict = {}  # (head weight, version, ids) -> [V_sub, E] rows of the head

    @property
    def layers(self) -> tuple[int, ...]:
        return self.config.layers

    def adapter(self, layer: int) -> ExitAdapter:
        if layer not in self.config.layers:
            raise ValueError(f"no exit at layer {layer}; exits at layers {', '.join(map(str, self.layers))}")
        return self.adapters[str(layer)]

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.adapters.parameters())

    def to(self, device=None, dtype=None) -> ExitSet:
        self.adapters.to(device=device, dtype=dtype)
        return self

    @torch.inference_mode()
    def exit_logits(
        self, target: TorchCausalLM, layer: int, hidden: torch.Tensor, vocab_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """z^(l) [..., V] from decoder layer ``layer``'s output ``hidden`` [..., E]: the adapter, then
        the target's final norm and head; with ``vocab_ids`` only those ids are scored (-inf elsewhere)."""
        x = self.adapter(layer)(hidden)
        if vocab_ids is None:
            return target.head(x)
        normed, head = target.norm(x), self._subset_head(target, vocab_ids)
        rows = normed.numel() // normed.shape[-1]
        if 1 < rows <= SWAPPED_HEAD_ROWS:  # a verified tree's rows: the form MKL runs fast (models.py)
            sub = (head @ normed.reshape(rows, -1).t()).t().reshape(*normed.shape[:-1], -1)
        else:
            sub = F.linear(normed, head)  # [..., V_sub]
        full = sub.new_full((*sub.shape[:-1], target.vocab_size), float("-inf"))
        full[..., vocab_ids] = sub
        return full

    def _subset_head(self, target: TorchCausalLM, vocab_ids: torch.Tensor) -> torch.Tensor:
        """The head's rows ``vocab_ids``, copied once per (head, subset) rather than per call."""
        weight = target.lm_head.weight
        key = (weight.data_ptr(), weight._version, vocab_ids.data_ptr(), vocab_ids.numel())
        if key not in self._subset_heads:
            self._subset_heads = {key: weight.detach()[vocab_ids].contiguous()}
        return self._subset_heads[key]

    def drafter(self, target: TorchCausalLM, num_layers: int) -> ExitDrafter:
        """The self-drafter over the first ``num_layers`` layers (exit at layer num_layers - 1)."""
        return ExitDrafter(target, self, num_layers, self.vocab_ids)


def exit_confidence(logits: torch.Tensor) -> torch.Tensor:
    """S = max softmax(z) over the last dimension (Eq. 4), in float32."""
    return logits.float().softmax(-1).amax(-1)


def build_exits(
    target: TorchCausalLM,
    layers: Iterable[int],
    bottleneck: int = DEFAULT_BOTTLENECK,
    vocab_ids: torch.Tensor | None = None,
    name: str = "exits",
    seed: int = 0,
) -> ExitSet:
    """Fresh (logit-lens) exits after decoder layers ``layers`` of ``target``, in its dtype and device."""
    total = target.config.num_hidden_layers
    layers = list(layers)
    bad = [layer for layer in layers if not 0 <= layer < total - 1]
    if bad:
        raise ValueError(
            f"exit layers must be in [0, {total - 2}] (the output of layer {total - 1} is the target's own), "
            f"got {bad}"
        )
    eps = float(getattr(target.config, "rms_norm_eps", 1e-5))
    config = ExitConfig(tuple(layers), bottleneck, int(target.config.hidden_size), eps)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        exits = ExitSet(config, vocab_ids=vocab_ids, name=name)
    return exits.to(target.device, target.dtype)


# -- the self-drafter ------------------------------------------------------------------------------


class ExitDrafter(ModelDrafter):
    """Drafts with the target's first K layers (a view sharing its weights, with its own KV cache),
    the exit adapter at layer K - 1, and the target's final norm and head (optionally a vocabulary
    subset). Tree decoding and the Drafter contract are :class:`ModelDrafter`'s."""

    def __init__(
        self, target: TorchCausalLM, exits: ExitSet, num_layers: int, vocab_ids: torch.Tensor | None = None
    ) -> None:
        first = target.layer_ids[0]
        layer = first + num_layers - 1
        if not 1 <= num_layers <= len(target.layer_ids):
            raise ValueError(f"an exit drafter needs 1..{len(target.layer_ids)} layers, got {num_layers}")
        super().__init__(target.truncated(num_layers), vocab_ids, adapter=exits.adapter(layer))
        self.exit_layer = layer


# -- files ----------------------------------------------------------------------------------------


def save_exits(exits: ExitSet, path: str | os.PathLike, target: TorchCausalLM) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (fp16 adapters) into directory ``path`` (created)."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    state = {f"exits.{k}": v.detach().to(torch.float16).contiguous() for k, v in exits.adapters.state_dict().items()}
    if exits.vocab_ids is not None:
        state["vocab_ids"] = exits.vocab_ids.to(torch.int32).contiguous()
    config = {
        "format": EXITS_FORMAT,
        "name": exits.name,
        "layers": list(exits.layers),
        "layer_convention": "0-based index of the decoder layer whose output feeds the exit",
        "bottleneck": exits.config.bottleneck,
        "eps": exits.config.eps,
        "vocab_subset": None if exits.vocab_ids is None else int(len(exits.vocab_ids)),
        "target": target_identity(target),
        "training": exits.training,
    }
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": EXITS_FORMAT})
    (folder / WEIGHTS_FILE).chmod(0o644)  # safetensors writes 0600; a shipped file must be readable
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder


def load_exits(target: TorchCausalLM, path: str | os.PathLike | None = None) -> ExitSet:
    """Load an exits directory (default: the shipped exits for SmolLM2-135M-Instruct) onto ``target``.

    Raises :class:`~edge_llm_ros.core.drafts.draft_models.DraftMismatchError` for another target.
    """
    folder = default_exits_path() if path is None else Path(path)
    config = read_config(folder, EXITS_FORMAT, "exits")
    check_target(config, target, where=f"exits {folder}")
    exits = build_exits(target, config["layers"], config["bottleneck"], name=config.get("name", folder.name))
    expected = {f"exits.{k}" for k in exits.adapters.state_dict()}
    state, vocab_ids = read_weights(folder, expected, target.vocab_size, "exits")
    with torch.no_grad():
        exits.adapters.load_state_dict({k[len("exits.") :]: v for k, v in state.items()})
    exits.vocab_ids, exits.training = vocab_ids, config.get("training", {})
    return exits


def default_exits_path(name: str = DEFAULT_EXITS) -> Path:
    return shipped_path(EXITS_DIR, name, "exits", "train them with: edge-llm-ros train exits")


def load_exit_drafter(target: TorchCausalLM, num_layers: int, path: str | os.PathLike | None = None) -> ExitDrafter:
    """An :class:`ExitDrafter` over the first ``num_layers`` layers with the exits in ``path``
    (None: the shipped exits for SmolLM2); an error names the exits available."""
    exits = load_exits(target, path)
    if num_layers - 1 not in exits.layers:
        usable = ", ".join(f"exit:{layer + 1}" for layer in exits.layers)
        raise ValueError(
            f"no exit at layer {num_layers - 1} (the output of the first {num_layers} layers); "
            f"exits at layers {', '.join(map(str, exits.layers))}: use {usable}"
        )
    return exits.drafter(target, num_layers)
