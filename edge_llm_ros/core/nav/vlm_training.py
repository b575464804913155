"""Training the navigation adapter (core/nav/vlm.py) on the simulator, its teacher.

    collect_samples (seeded worlds, expert rollouts + perturbed poses, cached) -> train_adapter
    (the language models frozen; encoder + projectors learn, checkpointed, resumable) -> evaluate
    (held-out frames: the constrained greedy answer's action against the expert's)

The simulator knows where everything is, so its expert (core/nav/expert.py) gives each frame's
action and a short reason. Frames come from the expert's own rollouts in the training worlds
and from poses pushed off them (a random turn and shift, DAgger-style, so the learned policy
has seen how to recover). The target (SmolLM2) and the draft stay frozen: only the encoder and
the two projectors train, by cross-entropy on the answer's tokens under teacher forcing; the
draft's projector learns the same answers, so it drafts what the target will say.
Knows nothing about ROS.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..models import TorchCausalLM
from .actions import parse
from .camera import Camera
from .expert import expert, rollout
from .vlm import NavAdapter
from .world import Pose, World
from .worldgen import GenerateConfig, generate

TRAIN_TARGETS = ("red chair", "silver bottle", "blue chair", "yellow cone")
EVAL_SEEDS = range(100, 110)  # the evaluation worlds (bench --seeds 100-109): never trained on
TRAIN_SEED_BASE = 10_000


@dataclass
class Sample:
    frame: np.ndarray  # [H, W, 3] uint8
    instruction: str
    answer: str  # the expert's answer text (reason, then action)


def instruction_for(target: str) -> str:
    return f"go to the {target}"


def world_for(seed: int, target: str) -> World:
    return generate(seed, GenerateConfig(target=target))


def collect_samples(seeds: Sequence[int], camera: Camera, perturb: int = 2, rng_seed: int = 0,
                    progress: Callable[[int], None] | None = None) -> list[Sample]:
    """The expert's frames in each seed's world (its target cycling through TRAIN_TARGETS): every
    pose of its rollout, and ``perturb`` poses pushed off each (turned up to 60 degrees, shifted up
    to 0.4 m, where the robot fits)."""
    rng = random.Random(rng_seed)
    samples = []
    for n, seed in enumerate(seeds):
        target = TRAIN_TARGETS[seed % len(TRAIN_TARGETS)]
        world = world_for(seed, target)
        poses = [pose for pose, _ in rollout(world).steps]
        for pose in list(poses):
            for _ in range(perturb):
                moved = Pose(pose.x + rng.uniform(-0.4, 0.4), pose.y + rng.uniform(-0.4, 0.4),
                             pose.yaw + rng.uniform(-math.pi / 3, math.pi / 3))
                if not world.touching(moved.x, moved.y):
                    poses.append(moved)
        for pose in poses:
            samples.append(Sample(camera.render(world, pose), instruction_for(target), expert(world, pose).text()))
        if progress is not None:
            progress(n + 1)
    return samples


def save_samples(samples: Sequence[Sample], path: Path) -> None:
    np.savez_compressed(path, frames=np.stack([s.frame for s in samples]),
                        instructions=np.array([s.instruction for s in samples]),
                        answers=np.array([s.answer for s in samples]))


def load_samples(path: Path) -> list[Sample]:
    data = np.load(path)
    return [Sample(f, str(i), str(a)) for f, i, a in zip(data["frames"], data["instructions"], data["answers"])]


# -- teacher-forced batches ---------------------------------------------------------------------------


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T] prompt + answer + EOS, right-padded
    labels: torch.Tensor  # [B, T] the next token where it is an answer token, else -100
    images: torch.Tensor  # [B, 3, h, w]


def make_batch(adapter: NavAdapter, tokenizer, samples: Sequence[Sample]) -> Batch:
    rows, labels = [], []
    for s in samples:
        prompt = adapter.prompt_ids(tokenizer, s.instruction)
        answer = tokenizer.encode(s.answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        ids = prompt + answer
        rows.append(ids)
        labels.append([-100] * (len(prompt) - 1) + answer + [-100])  # label[t] = the token after t
    width = max(len(r) for r in rows)
    pad = lambda r, v: r + [v] * (width - len(r))  # noqa: E731
    return Batch(torch.tensor([pad(r, 0) for r in rows]), torch.tensor([pad(lab, -100) for lab in labels]),
                 adapter.preprocess([s.frame for s in samples]))


def embeddings(lm: TorchCausalLM, adapter: NavAdapter, batch: Batch, model: str) -> torch.Tensor:
    """The input rows [B, T, E]: token embeddings, the image's rows at the reserved ids."""
    hidden = lm.embed_tokens(batch.ids)
    rows = adapter.rows(batch.images, model)  # [B, 8, E]
    for k, token in enumerate(adapter.config.reserved_ids):
        hit = (batch.ids == token).unsqueeze(-1)  # [B, T, 1]
        hidden = torch.where(hit, rows[:, k : k + 1].to(hidden.dtype), hidden)
    return hidden


def answer_loss(lm: TorchCausalLM, adapter: NavAdapter, batch: Batch, model: str) -> torch.Tensor:
    """Cross-entropy of the answer tokens, the head run only on the rows that predict them."""
    inner = lm.hf.model
    # Right padding under a causal mask: no real row sees a pad, so no attention mask is needed.
    hidden = inner(inputs_embeds=embeddings(lm, adapter, batch, model), use_cache=False).last_hidden_state
    where = batch.labels != -100
    logits = lm.hf.lm_head(hidden[where])  # [N, V]
    return torch.nn.functional.cross_entropy(logits.float(), batch.labels[where])


# -- training ------------------------------------------------------------------------------------------


@dataclass
class NavTrainConfig:
    epochs: int = 3
    batch_size: int = 16
    lr: float = 2e-3
    draft_weight: float = 0.5
    checkpoint_every: int = 25
    seed: int = 0


def train_adapter(adapter: NavAdapter, target: TorchCausalLM, draft: TorchCausalLM | None, tokenizer,
                  samples: Sequence[Sample], config: NavTrainConfig, checkpoint: Path | None = None,
                  progress: Callable[[int, int, float], None] | None = None) -> dict:
    """Train the adapter's encoder and projectors (the language models frozen); resumes from
    ``checkpoint`` if it holds a state, and writes it every ``checkpoint_every`` steps."""
    for lm in (target, draft):
        if lm is not None:
            for p in lm.hf.parameters():
                p.requires_grad_(False)
    params = [p for name, p in adapter.named_parameters() if draft is not None or "projectors.draft" not in name]
    optim = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.01)
    order = list(range(len(samples)))
    steps_per_epoch = math.ceil(len(order) / config.batch_size)
    total = steps_per_epoch * config.epochs
    step, losses, started = 0, [], time.perf_counter()
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        adapter.load_state_dict(state["adapter"])
        optim.load_state_dict(state["optim"])
        step, losses = state["step"], state["losses"]
    adapter.train()
    for epoch in range(config.epochs):
        random.Random(config.seed + epoch).shuffle(order)
        for i in range(steps_per_epoch):
            done = epoch * steps_per_epoch + i
            if done < step:
                continue  # resumed past it
            for group in optim.param_groups:  # cosine decay
                group["lr"] = config.lr * 0.5 * (1 + math.cos(math.pi * done / total))
            batch = make_batch(adapter, tokenizer, [samples[j] for j in order[i * config.batch_size:
                                                                               (i + 1) * config.batch_size]])
            loss = answer_loss(target, adapter, batch, "target")
            if draft is not None:
                loss = loss + config.draft_weight * answer_loss(draft, adapter, batch, "draft")
            optim.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optim.step()
            step = done + 1
            losses.append(loss.item())
            if progress is not None:
                progress(step, total, losses[-1])
            if checkpoint is not None and (step % config.checkpoint_every == 0 or step == total):
                tmp = checkpoint.with_suffix(".tmp")
                torch.save({"adapter": adapter.state_dict(), "optim": optim.state_dict(), "step": step,
                            "losses": losses}, tmp)
                os.replace(tmp, checkpoint)
    adapter.eval()
    return {"steps": step, "final_loss": float(np.mean(losses[-10:])) if losses else math.nan,
            "train_s": time.perf_counter() - started, "config": asdict(config)}


# -- evaluation ----------------------------------------------------------------------------------------


def action_accuracy(navigator, samples: Sequence[Sample]) -> float:
    """The share of held-out frames whose decision (core/nav/navigator.Navigator: the constrained
    greedy answer, as navigator_node makes it) is a valid answer with the expert's action."""
    hits = 0
    for s in samples:
        decision = navigator.decide(s.frame, s.instruction)
        hits += decision.valid and decision.command.action == parse(s.answer).action
    return hits / max(len(samples), 1)


def closed_loop(navigator, camera: Camera, seeds: Sequence[int], target: str = "red chair",
                max_steps: int = 40) -> dict:
    """Each seed's evaluation world driven by the navigator's decisions on rendered frames (the
    discrete actions executed exactly): the rollout per seed (``.success``: reached, nothing touched)."""
    episodes = {}
    for seed in seeds:
        world = world_for(seed, target)
        instruction = instruction_for(target)
        policy = lambda w, pose: navigator.decide(camera.render(w, pose), instruction).command  # noqa: E731
        episodes[seed] = rollout(world, policy, max_steps=max_steps)
    return episodes
