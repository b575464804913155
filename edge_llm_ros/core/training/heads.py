"""Training draft heads on the target's own features (EAGLE style; the head itself and its drafter
are core/drafts/draft_models.py's FeatureDrafter).

The target's features of the self-distillation data are computed once and cached; the head learns
to regress the next feature (smooth L1, as EAGLE) and to match the target's next-token distribution
(KD on the recorded top-k). Knows nothing about ROS.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from ..drafts.draft_models import Draft, head_inputs
from ..engine.models import TorchCausalLM
from .distill import (
    Sample,
    Stepper,
    TrainConfig,
    TrainResult,
    _progress,
    collate,
    kd_loss,
    make_batches,
    step_schedule,
    subset_logits,
    vocab_index,
)

FEATURE_LOSS_WEIGHT = 1.0  # EAGLE weighs regression 1.0 and classification 0.1; we weigh KD 1.0 too (our metric is acceptance)


# -- training --------------------------------------------------------------------------------------


@torch.inference_mode()
def target_features(
    target: TorchCausalLM, samples: Sequence[Sample], batch_tokens: int = 4096, progress: bool = True
) -> list[torch.Tensor]:
    """The target's last-layer features [L, E] (fp16) of every sample's prompt + response."""
    out: list[torch.Tensor | None] = [None] * len(samples)
    batches = make_batches(samples, batch_tokens)
    index = torch.arange(target.vocab_size)
    bar = _progress(total=sum(len(s) for s in samples), initial=0, desc="features", unit="tok", enabled=progress)
    try:
        for idx in batches:
            batch = collate([samples[i] for i in idx], index)
            cache = target.new_cache(batch.ids.shape[1], batch=len(idx))
            hidden, _ = target.run_layers(target.embed(batch.ids), torch.arange(batch.ids.shape[1]), None, cache)
            for row, i in enumerate(idx):
                out[i] = hidden[row, : len(samples[i])].to(torch.float16).clone()
                bar.update(len(samples[i]))
    finally:
        bar.close()
    return out  # type: ignore[return-value]


def cached_features(
    target: TorchCausalLM, samples: Sequence[Sample], path: str | os.PathLike | None, progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> list[torch.Tensor]:
    """:func:`target_features`, kept in ``path`` keyed by sample key (computed only for new samples)."""
    store: dict[str, torch.Tensor] = {}
    file = Path(path) if path is not None else None
    if file is not None and file.exists():
        store = torch.load(file, weights_only=True)
    missing = [s for s in samples if feature_key(s) not in store]
    if missing:
        if log:
            log(f"computing the target's features of {len(missing)} samples ({sum(map(len, missing))} tokens)")
        for s, f in zip(missing, target_features(target, missing, progress=progress)):
            store[feature_key(s)] = f
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            torch.save(store, file.with_suffix(".tmp"))
            os.replace(file.with_suffix(".tmp"), file)
    return [store[feature_key(s)] for s in samples]


def feature_key(sample: Sample) -> str:
    """Names a sample by its tokens (a prompt has a greedy and sampled responses, all different)."""
    tokens = torch.tensor(sample.prompt_ids + sample.response_ids, dtype=torch.int64).numpy().tobytes()
    return f"{sample.key}:{hashlib.sha1(tokens).hexdigest()[:16]}"


def head_parameters(head: Draft) -> list[torch.nn.Parameter]:
    model = head.model
    return list(head.fc.parameters()) + [p for i in model.layer_ids for p in model.layers[i].parameters()] + list(
        model.norm.parameters()
    )


def head_forward(head: Draft, ids: torch.Tensor, features: torch.Tensor, unroll: int = 2) -> list[torch.Tensor]:
    """Training forward with autograd: ids [B, T], features [B, T, E] -> predicted features per step,
    each [B, T-1, E] (row i predicts f_{i+1}); right padding needs no mask (causal rows never see later pads).

    Step 0 reads the target's features, as the first draft step does. Step 1 (``unroll`` 2) reads
    step 0's predictions instead, as the second draft step does: its row i takes (f̂_i, x_{i+1})
    and attends to step-0 rows < i and to itself — the mask a depth-1 tree node has while drafting
    (exact rows before it, then itself). A cheap form of EAGLE-3's "training-time test"; it teaches
    the head to draft on from its own guesses.
    """
    model = head.model
    b, t = ids.shape
    n = t - 1
    positions = torch.arange(1, t).expand(b, -1)
    x = head_inputs(head, features[:, :-1], ids[:, 1:])
    rope = model.rotary_embeddings(x, positions)
    first = _Recorder()
    outs = [_run(model, x, rope, None if n == 1 else _causal(n, x.dtype), first)]
    if unroll > 1 and n > 1:
        guessed = torch.cat([features[:, :1].to(x.dtype), outs[0][:, :-1]], dim=1)  # row i reads row i-1's guess
        x2 = head_inputs(head, guessed, ids[:, 1:])
        mask = torch.cat([torch.full((n, n), float("-inf"), dtype=x.dtype).triu(0),
                          torch.full((n, n), float("-inf"), dtype=x.dtype).fill_diagonal_(0.0)], dim=1)
        outs.append(_run(model, x2, rope, mask, _After(first)))
    return outs


def _run(model: TorchCausalLM, x: torch.Tensor, rope, mask, cache) -> torch.Tensor:
    for i in model.layer_ids:
        x = model.decoder_layer(i, x, rope, mask, cache)
    return x


class _Recorder:
    """Stands in for a KV cache in a training pass: no history; keeps each layer's keys/values
    (with autograd) for a later pass that attends to them."""

    length = 0

    def __init__(self) -> None:
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.kv[layer] = (k, v)
        return k, v


class _After:
    """The keys/values a pass sees: the recorded pass's, then its own (mask columns in that order)."""

    length = 0

    def __init__(self, before: _Recorder) -> None:
        self.before = before

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k0, v0 = self.before.kv[layer]
        return torch.cat([k0, k], dim=2), torch.cat([v0, v], dim=2)


def _causal(t: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((t, t), float("-inf"), dtype=dtype).triu(1)


def head_losses(head: Draft, batch, feats: torch.Tensor, unroll: int = 2) -> dict:
    """Loss terms and top-1 hits of one batch, per unrolled step; feats [B, T, E] the target's features.

    ``loss``: the sum over steps of feature regression (smooth L1, per-row RMS scaled) + KD.
    """
    preds = head_forward(head, batch.ids, feats, unroll)
    valid = torch.zeros(preds[0].shape[:2], dtype=torch.bool)
    valid[batch.rows, batch.cols - 1] = True  # response rows: their inputs are real tokens, not pads
    target = feats[:, 1:][valid].float()
    scale = target.pow(2).mean(-1, keepdim=True).sqrt().clamp(min=1e-6)  # per-row RMS: O(1) errors despite outlier dims
    out = {"loss": 0.0, "feature": [], "kd": [], "hits": []}
    for pred in preds:
        feat_loss = F.smooth_l1_loss(pred[valid].float() / scale, target / scale)
        logits = subset_logits(head.model, head.model.norm(pred[batch.rows, batch.cols - 1]), head.vocab_ids)
        kd = kd_loss(logits, batch.teacher_ids, batch.teacher_p)
        out["loss"] = out["loss"] + FEATURE_LOSS_WEIGHT * feat_loss + kd
        out["feature"].append(feat_loss)
        out["kd"].append(kd)
        out["hits"].append(int((logits.argmax(-1) == batch.greedy).sum()))
    return out


def _batch_features(samples: Sequence[Sample], feats: Sequence[torch.Tensor], idx, width: int) -> torch.Tensor:
    out = torch.zeros(len(idx), width, feats[idx[0]].shape[-1])
    for row, i in enumerate(idx):
        out[row, : len(samples[i])] = feats[i].float()
    return out


def _check_samples(samples: Sequence[Sample]) -> None:
    short = [s.key for s in samples if len(s.prompt_ids) < 2]
    if short:
        raise ValueError(f"feature heads need prompts of at least 2 tokens; too short: {short[:3]}")


def train_heads(
    head: Draft,
    train: Sequence[Sample],
    features: Sequence[torch.Tensor],
    config: TrainConfig = TrainConfig(),
    heldout: Sequence[Sample] = (),
    heldout_features: Sequence[torch.Tensor] = (),
    checkpoint: str | os.PathLike | None = None,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    unroll: int = 2,
) -> TrainResult:
    """Train ``head`` (fc, its layer and norm; embeddings and LM head frozen) on the target's features.

    Samples need the recorded teacher (top-k of the target); ``unroll`` draft steps per row
    (see :func:`head_forward`); AdamW with warm-up + cosine, resumable from ``checkpoint``
    like :func:`~.training.train_draft`.
    """
    if unroll not in (1, 2):
        raise ValueError(f"unroll must be 1 or 2, got {unroll}")
    if not train:
        raise ValueError("no training samples")
    if any(s.teacher_ids is None for s in train):
        raise ValueError("feature heads train on samples with the recorded teacher (generate_responses records it)")
    _check_samples(train)
    torch.manual_seed(config.seed)
    params = head_parameters(head)
    head.model.hf.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    vocab_ids = head.vocab_ids
    index = vocab_index(head.model.vocab_size, vocab_ids)
    batches = make_batches(train, config.batch_tokens)
    schedule = step_schedule(len(batches), config)
    result = TrainResult(steps=len(schedule))
    run = {"config": asdict(config), "samples": len(train), "batches": len(batches), "kind": "heads", "unroll": unroll,
           "vocab": None if vocab_ids is None else len(vocab_ids)}
    stepper = Stepper(params, config, result, run, checkpoint, resume, log)
    bar = _progress(total=len(schedule), initial=stepper.start, desc="heads", unit="step", enabled=progress)
    try:
        for step in range(stepper.start, len(schedule)):
            idx = batches[schedule[step]]
            batch = collate([train[i] for i in idx], index)
            feats = _batch_features(train, features, idx, batch.ids.shape[1])
            terms = head_losses(head, batch, feats, unroll)
            stepper.step(step, terms["loss"])
            bar.update(1)
            bar.set_postfix(feat=f"{terms['feature'][0].item():.3f}", kd=f"{terms['kd'][0].item():.3f}")
            stepper.checkpoint_if_due(step + 1)
    finally:
        bar.close()
        for p in params:
            p.requires_grad_(False)
    if heldout:
        stats = evaluate_heads(head, heldout, heldout_features, config)
        stats["step"] = len(schedule)
        result.evals.append(stats)
        if log:
            log(f"held-out KL {stats['loss']:.3f}, top-1 agreement {stats['agreement']:.3f} (first draft step), "
                f"{stats['agreement_step2']:.3f} (second, from its own guess)")
    return result


@torch.no_grad()
def evaluate_heads(
    head: Draft, samples: Sequence[Sample], features: Sequence[torch.Tensor], config: TrainConfig = TrainConfig(),
    gamma: int = 4,
) -> dict:
    """Held-out KD loss and top-1 agreement with the target of the first draft step (real features
    in) and of the second (the head's own guess in, see :func:`head_forward`).

    ``expected_tau`` is the chain-of-γ estimate with the first step's agreement for the first
    token and the second step's for the rest; τ measured by ``bench`` is the real figure.
    """
    if not samples:
        raise ValueError("no samples to evaluate")
    _check_samples(samples)
    index = vocab_index(head.model.vocab_size, head.vocab_ids)
    total_loss = total = 0.0
    agree = [0.0, 0.0]
    for idx in make_batches(samples, config.batch_tokens):
        batch = collate([samples[i] for i in idx], index)
        feats = _batch_features(samples, features, idx, batch.ids.shape[1])
        terms = head_losses(head, batch, feats, unroll=2)
        total_loss += float(terms["kd"][0]) * batch.positions
        for step, hits in enumerate(terms["hits"]):
            agree[step] += hits
        total += batch.positions
    a1, a2 = agree[0] / total, agree[1] / total
    tau = 1.0 + sum(a1 * a2 ** k for k in range(gamma))
    return {"loss": total_loss / total, "agreement": a1, "agreement_step2": a2, "positions": int(total),
            "expected_tau": tau}
