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

Training ladder (data from :mod:`.training`, shared with ``train draft``):

    generate_responses -> split_dataset -> exit_features (one frozen target pass, cached)
    -> train_exits (KD on the adapters only, checkpointed, resumable) -> evaluate_exits
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .draft_models import CONFIG_FILE, WEIGHTS_FILE, check_target, read_config, read_weights, shipped_path
from .drafters import ModelDrafter
from .models import SWAPPED_HEAD_ROWS, TorchCausalLM
from .training import (
    Sample,
    Stepper,
    _progress,
    collate,
    kd_loss,
    make_batches,
    step_schedule,
    target_identity,
    vocab_index,
)

EXITS_DIR = Path(__file__).resolve().parents[1] / "data" / "exits"
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

    Raises :class:`~edge_llm_ros.core.draft_models.DraftMismatchError` for another target.
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


# -- training data: the frozen target's hidden states at the exits ---------------------------------


@dataclass
class ExitFeatures:
    """One row per response position of a dataset: what each exit sees, and what it should say.

    hidden[l] [N, E] fp16: decoder layer l's output at the position predicting the response
    token; teacher_ids [N, k] int32 token ids and teacher_p [N, k] fp16: the target's recorded
    top-k, renormalised; greedy [N]: the target's argmax token id.
    """

    hidden: dict[int, torch.Tensor]
    teacher_ids: torch.Tensor
    teacher_p: torch.Tensor
    greedy: torch.Tensor

    def __len__(self) -> int:
        return int(self.greedy.numel())

    def teacher(self, idx: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows ``idx`` over a draft vocabulary (``index``: token id -> subset index, -1 outside):
        teacher ids [n, k] (-1 outside), p renormalised over the kept ids, greedy index [n]."""
        ids = index[self.teacher_ids[idx].long()]
        p = self.teacher_p[idx].float().masked_fill(ids < 0, 0.0)
        p = p / p.sum(-1, keepdim=True).clamp(min=1e-12)
        return ids, p, index[self.greedy[idx]]


def _features_header(target: TorchCausalLM, samples: Sequence[Sample], layers: Sequence[int]) -> dict:
    digest = hashlib.sha256()
    for s in samples:
        digest.update(f"{s.key}:{s.temperature}:{len(s.prompt_ids)}:{len(s.response_ids)};".encode())
    return {"format": FEATURES_FORMAT, "target": target_identity(target), "layers": sorted(layers),
            "samples": len(samples), "data_sha256": digest.hexdigest()}


@torch.inference_mode()
def exit_features(
    target: TorchCausalLM,
    samples: Sequence[Sample],
    layers: Sequence[int],
    batch_tokens: int = 4096,
    cache_path: str | os.PathLike | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> ExitFeatures:
    """One pass of the frozen target (layers 0..max(layers) only, through the engine's own
    ``run_layers``) over right-padded batches; keeps the response positions, in dataset order
    (sample by sample, response token by token). Cached in
    ``cache_path`` (recomputed if the target, the layers or the samples differ)."""
    if any(s.teacher_ids is None for s in samples):
        raise ValueError("exit training needs the target's recorded top-k with every sample (generate_responses)")
    header = _features_header(target, samples, layers)
    path = Path(cache_path) if cache_path is not None else None
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=True)
        if saved.get("header") == header:
            return ExitFeatures({int(k): v for k, v in saved["hidden"].items()}, *saved["teacher"])
        if log:
            log(f"{path} holds features of other data or layers; recomputing")
    run = range(target.layer_ids[0], max(layers) + 1)
    identity = vocab_index(target.vocab_size, None)
    lengths = [len(s.response_ids) for s in samples]
    offsets = [0] + torch.tensor(lengths).cumsum(0).tolist()  # rows of sample i: offsets[i]:offsets[i + 1]
    n, k = offsets[-1], samples[0].teacher_ids.shape[1] if samples else 0
    features = ExitFeatures(
        {layer: torch.empty(n, target.config.hidden_size, dtype=torch.float16) for layer in layers},
        torch.empty(n, k, dtype=torch.int32), torch.empty(n, k, dtype=torch.float16), torch.empty(n, dtype=torch.long),
    )
    bar = _progress(total=len(samples), initial=0, desc="features", unit="sample", enabled=progress)
    for idx in make_batches(samples, batch_tokens):  # batched by length; rows go back to dataset order
        batch = collate([samples[i] for i in idx], identity)
        b, t = batch.ids.shape
        cache = target.new_cache(t, layers=run, batch=b)
        _, out = target.run_layers(target.embed(batch.ids), torch.arange(t), None, cache, run, collect=layers)
        dest = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in idx])  # [N] (collate keeps idx order)
        for layer in layers:
            features.hidden[layer][dest] = out[layer][batch.rows, batch.cols].to(torch.float16)  # [N, E]
        features.teacher_ids[dest] = batch.teacher_ids.to(torch.int32)
        features.teacher_p[dest] = batch.teacher_p.to(torch.float16)
        features.greedy[dest] = batch.greedy
        bar.update(len(idx))
    bar.close()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"header": header, "hidden": features.hidden,
                    "teacher": (features.teacher_ids, features.teacher_p, features.greedy)}, tmp)
        os.replace(tmp, path)
    return features


# -- training: KD on the adapters only ------------------------------------------------------------------


@dataclass
class ExitTrainConfig:
    """KD settings. ``batch_positions``: response positions per optimizer step (every exit sees them)."""

    epochs: float = 4.0
    lr: float = 1e-2
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.0
    batch_positions: int = 1024
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        if self.epochs <= 0 or self.lr <= 0 or self.batch_positions <= 0 or self.checkpoint_every <= 0:
            raise ValueError("epochs, lr, batch_positions and checkpoint_every must be > 0")


@dataclass
class ExitTrainResult:
    steps: int
    losses: list[float] = field(default_factory=list)  # per step, summed over exits
    evals: list[dict] = field(default_factory=list)  # {"step", "exits": {layer: {...}}}
    resumed_from: int = 0
    train_s: float = 0.0


def _frozen(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in module.named_parameters()}


def _train_logits(target: TorchCausalLM, adapter: ExitAdapter, hidden: torch.Tensor, head: torch.Tensor,
                  norm_params: dict) -> torch.Tensor:
    """z^(l) over the draft vocabulary with autograd through the adapter only (norm and head frozen)."""
    x = torch.func.functional_call(target.norm, norm_params, (adapter(hidden),))
    return F.linear(x, head)  # [n, V_d]


def _head_weight(target: TorchCausalLM, vocab_ids: torch.Tensor | None) -> torch.Tensor:
    weight = target.lm_head.weight.detach()
    return weight if vocab_ids is None else weight[vocab_ids].contiguous()


@torch.no_grad()
def evaluate_exits(
    target: TorchCausalLM, exits: ExitSet, features: ExitFeatures, batch_positions: int = 1024
) -> dict[int, dict]:
    """Per exit: held-out KL over the exits' vocabulary, and top-1 agreement with the target's argmax,
    over that vocabulary (``agreement``: what the exit drafter proposes, ≈ its greedy acceptance)
    and over the full vocabulary (``agreement_full``: what a verifier's exit would emit)."""
    index = vocab_index(target.vocab_size, exits.vocab_ids)
    sub_head, full_head = _head_weight(target, exits.vocab_ids), _head_weight(target, None)
    norm = _frozen(target.norm)
    stats = {layer: {"loss": 0.0, "agreement": 0.0, "agreement_full": 0.0} for layer in exits.layers}
    n = len(features)
    for start in range(0, n, batch_positions):
        idx = torch.arange(start, min(n, start + batch_positions))
        ids, p, greedy = features.teacher(idx, index)
        for layer in exits.layers:
            adapted = exits.adapter(layer)(features.hidden[layer][idx].float())
            x = torch.func.functional_call(target.norm, norm, (adapted,))
            logits = F.linear(x, sub_head)
            s = stats[layer]
            s["loss"] += float(kd_loss(logits, ids, p)) * len(idx)
            s["agreement"] += float((logits.argmax(-1) == greedy).sum())
            s["agreement_full"] += float((F.linear(x, full_head).argmax(-1) == features.greedy[idx]).sum())
    return {layer: {**{k: v / n for k, v in s.items()}, "positions": n} for layer, s in stats.items()}


def train_exits(
    target: TorchCausalLM,
    exits: ExitSet,
    features: ExitFeatures,
    config: ExitTrainConfig = ExitTrainConfig(),
    heldout: ExitFeatures | None = None,
    checkpoint: str | os.PathLike | None = None,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> ExitTrainResult:
    """Distil the target's final distribution into every exit (the target stays frozen).

    Each step takes ``batch_positions`` cached positions and sums the exits' KD losses,
    L = sum_l mean_t KL(p_t || softmax(z_t^(l))) over the exits' vocabulary; the exits share
    no weights, so each adapter gets exactly its own gradient (the paper's per-exit loss).
    AdamW, warm-up + cosine schedule, gradient clipping. Every ``checkpoint_every`` steps the
    adapters, optimizer and counters go to ``checkpoint``; ``resume`` continues at that step
    with the same batch order. Deterministic for a seed.
    """
    if len(features) == 0:
        raise ValueError("no training positions")
    missing = [layer for layer in exits.layers if layer not in features.hidden]
    if missing:
        raise ValueError(f"the features hold no hidden states for exit layers {missing}")
    torch.manual_seed(config.seed)
    params = exits.parameters()
    index = vocab_index(target.vocab_size, exits.vocab_ids)
    head, norm = _head_weight(target, exits.vocab_ids), _frozen(target.norm)
    order = torch.randperm(len(features), generator=torch.Generator().manual_seed(config.seed))
    batches = list(order.split(config.batch_positions))
    schedule = step_schedule(len(batches), config)
    result = ExitTrainResult(steps=len(schedule))
    run = {"config": asdict(config), "positions": len(features), "layers": list(exits.layers),
           "bottleneck": exits.config.bottleneck, "vocab": None if exits.vocab_ids is None else len(exits.vocab_ids)}
    stepper = Stepper(params, config, result, run, checkpoint, resume, log)
    started = time.perf_counter()
    for p in params:
        p.requires_grad_(True)
    bar = _progress(total=len(schedule), initial=stepper.start, desc="exits", unit="step", enabled=progress)
    try:
        for step in range(stepper.start, len(schedule)):
            idx = batches[schedule[step]]
            ids, p, _ = features.teacher(idx, index)
            loss = sum(
                kd_loss(_train_logits(target, exits.adapter(layer), features.hidden[layer][idx].float(), head, norm),
                        ids, p)
                for layer in exits.layers
            )
            stepper.step(step, loss)
            bar.update(1)
            bar.set_postfix(loss=f"{result.losses[-1] / len(exits.layers):.3f}")
            stepper.checkpoint_if_due(step + 1)
    finally:
        bar.close()
        for p in params:
            p.requires_grad_(False)
    result.train_s = time.perf_counter() - started
    if heldout is not None and len(heldout):
        result.evals.append({"step": len(schedule), "exits": evaluate_exits(target, exits, heldout)})
    return result
