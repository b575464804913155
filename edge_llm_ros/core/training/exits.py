"""Training early exits (core/drafts/exits.py), EE §3's KD: the target frozen, only the adapters learn.

    generate_responses -> split_dataset -> exit_features (one frozen target pass, cached)
    -> train_exits (KD on the adapters only, checkpointed, resumable) -> evaluate_exits

The data is core/training/distill.py's, shared with ``train draft``. Knows nothing about ROS.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..drafts.exits import FEATURES_FORMAT, ExitAdapter, ExitSet
from ..engine.models import TorchCausalLM, target_identity
from .distill import (
    Sample,
    Stepper,
    _progress,
    collate,
    kd_loss,
    make_batches,
    step_schedule,
    vocab_index,
)

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
