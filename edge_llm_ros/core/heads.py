"""Draft heads on the target's own features (EAGLE style), and their training.

Contract: a feature head drafts from the target's last-layer hidden states
("features", before the final norm) instead of from tokens alone. After Li et al.
2024 (EAGLE, §4.1): row i of the head reads the pair (f_i, e(x_{i+1})) — the
target's feature of token i and the embedding of the token after it — through a
fully connected layer ``fc`` [2E -> E] and one decoder layer of the target's
architecture, and outputs f̂_{i+1}, a prediction of the next feature; the target's
final norm + LM head turn it into the distribution of x_{i+2}. While drafting a
tree, a node's predicted feature stands in for the target's (which does not exist
yet) when its children are drafted. After each verification the engine hands the
drafter the target's real features of the accepted tokens (:meth:`FeatureDrafter.observe`),
and the rows computed from predicted features are dropped.

A head is stored like a draft model (see :mod:`.draft_models`): one layer, a norm,
the vocabulary subset, plus ``fc``; the target's embeddings and head are shared.
Training (``train_heads``): the target's features of the self-distillation data are
computed once and cached; the head learns to regress the next feature (smooth L1,
as EAGLE) and to match the target's next-token distribution (KD on the recorded
top-k). Knows nothing about ROS.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from .draft_models import Draft, build_draft
from .drafters import ModelDrafter, TreeSpec
from .models import TorchCausalLM
from .sampling import Sampler
from .training import (
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
from .tree import TokenTree

FEATURE_LOSS_WEIGHT = 1.0  # EAGLE weighs regression 1.0 and classification 0.1; we weigh KD 1.0 too (our metric is acceptance)


# -- the head --------------------------------------------------------------------------------------


def new_fc(hidden_size: int, dtype: torch.dtype = torch.float32) -> torch.nn.Linear:
    """fc [2E -> E] initialised to f + e: the layer first sees what a decoder layer sees (a residual stream)."""
    fc = torch.nn.Linear(2 * hidden_size, hidden_size, bias=True, dtype=dtype)
    with torch.no_grad():
        eye = torch.eye(hidden_size, dtype=dtype)
        fc.weight.copy_(torch.cat([eye, eye], dim=1))
        fc.bias.zero_()
    fc.requires_grad_(False)
    return fc


def build_heads(
    target: TorchCausalLM, vocab_ids: torch.Tensor | None = None, init_layer: int | None = None, name: str = "heads"
) -> Draft:
    """A fresh feature head: one decoder layer copied from target layer ``init_layer`` (default: the
    last, whose input distribution is closest to a feature's), the target's final norm, and ``fc``."""
    last = target.config.num_hidden_layers - 1
    draft = build_draft(target, 1, layer_ids=[last if init_layer is None else init_layer], vocab_ids=vocab_ids,
                        name=name)
    draft.fc = new_fc(target.config.hidden_size, target.dtype).to(target.device)
    return draft


def head_inputs(head: Draft, features: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
    """fc(cat(f_i, e(x_{i+1}))): features [..., E], next_ids [...] -> [..., E]."""
    with torch.no_grad():
        embeds = head.model.embed_tokens(next_ids)
    return head.fc(torch.cat([features.to(embeds.dtype), embeds], dim=-1))


class FeatureDrafter(ModelDrafter):
    """Drafts trees from the target's features with a trained head (EAGLE-style, see module doc).

    Cache slot i holds row i, the pair (f_i, x_{i+1}); with N + 1 context tokens the
    rows 0..N-1 are exact (their features come from the target) and row N-1 — the
    root's row — predicts the root's children. Tree rows follow and are dropped on the
    next ``propose``. Needs :meth:`observe` from the engine (``generate`` calls it).
    """

    def __init__(self, head: Draft) -> None:
        if getattr(head, "fc", None) is None:
            raise ValueError(f"{head.name} is not a feature head (no fc layer)")
        super().__init__(head.model, head.vocab_ids)
        self.head = head
        self.features = torch.empty(0, head.model.config.hidden_size, dtype=head.model.dtype)
        self.known = 0  # features of context tokens [0, known) are the target's
        self.rows_of: list[int] = []  # the context tokens x_0..x_R the R exact cached rows were built from
        self._hidden: dict[int, torch.Tensor] = {}  # tree node -> its row's output (predicted feature)

    def observe(self, start: int, hidden: torch.Tensor) -> None:
        """The target's features [T, E] of context tokens start..start+T-1 (later ones are forgotten)."""
        end = start + hidden.shape[0]
        if end > self.features.shape[0]:
            grown = torch.empty(max(end, 2 * self.features.shape[0], 256), self.features.shape[1],
                                dtype=self.features.dtype)
            grown[: self.known] = self.features[: self.known]
            self.features = grown
        self.features[start:end] = hidden.detach().to(self.features.dtype)
        self.known = end
        self.rows_of = self.rows_of[: start + 1]  # row i read f_i: rows from ``start`` on are stale

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Rows 0..N-1 exact in the cache; returns the root's draft logits [V]."""
        n = len(context) - 1
        if self.known < n:
            raise RuntimeError(
                f"{type(self).__name__} needs the target's features of the context ({self.known} of {n} known); "
                "drive it through generate(), which passes them on"
            )
        common = 0
        for a, b in zip(self.rows_of, context):
            if a != b:
                break
            common += 1
        rows = max(0, min(len(self.rows_of), common) - 1)
        self.cache.truncate(rows)
        self.cache.ensure_capacity(n + 1)
        with torch.inference_mode():
            inputs = head_inputs(self.head, self.features[rows:n], torch.tensor(context[rows + 1 : n + 1]))
            out = self._rows(inputs, torch.arange(rows + 1, n + 1), None)
        self.rows_of = list(context)
        self._hidden = {0: out[-1]}
        return self._head(out[-1:][None])[0]

    def _feed(self, tree: TokenTree, nodes: list[int], root_slot: int) -> torch.Tensor:
        """Rows for ``nodes``: (parent's predicted feature, own token), at position N + depth."""
        mask, positions = self._tree_rows(tree, nodes, root_slot - 1)  # the root's row is slot N-1
        with torch.inference_mode():
            parents = torch.stack([self._hidden[tree.parents[n]] for n in nodes])
            inputs = head_inputs(self.head, parents, torch.tensor([tree.tokens[n] for n in nodes]))
            out = self._rows(inputs, positions + 1, mask)
        for row, node in enumerate(nodes):
            self._hidden[node] = out[row]
        return self._head(out[None])

    def propose(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> TokenTree:
        if len(context) < 2:  # no feature yet: the first round is a plain decode step
            return TokenTree.from_root(context[-1])
        tree = super().propose(context, spec, sampler)
        self._tree = None  # tree rows are built from predicted features: never reused
        return tree


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
