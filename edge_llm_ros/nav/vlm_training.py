"""Training the navigation adapter (nav/vlm.py) on the simulator, its teacher.

    collect_samples (seeded worlds, the camera expert's rollouts + perturbed poses, cached)
      + learner_samples (DAgger: the states an adapter's own decisions lead to, labelled by the
        teacher; fine-tuning from that adapter)
      -> pretrain_encoder (the CNN alone learns what each frame shows: per target kind, the
         teacher's action, where the object is and how far; milliseconds a step)
      -> train_adapter (projectors + LoRA on both LMs learn to write the teacher's answer, the
         encoder slower; checkpointed, resumable)
      -> evaluate (held-out frames: the constrained greedy answer's action against the teacher's;
         the evaluation worlds and a second held-out range: closed loop as the node runs it,
         nav/evaluation.py)

The teacher is nav/expert.camera_expert: every action follows from what the frame shows
(search left while the target is out of view, turn toward it, head for it), in worlds where that
gets there (worldgen's ``clear_path``). It stops only within ``stop_m`` of the target, a margin
inside the 0.5 m reach (:data:`TEACHER`: 0.4 m), so a learner that stops a frame early still
stops within reach. Frames come from its rollouts in the training worlds and
from poses pushed off them (a random turn and shift, DAgger-style, so the learned policy has seen
how to recover). The answers are learned by cross-entropy under teacher forcing, the action line's
tokens weighted up; the draft's projector and LoRA learn the same answers, so it drafts what the
target will say. Knows nothing about ROS.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge_llm_ros.core.engine.models import TorchCausalLM
from edge_llm_ros.nav.actions import ACTION_PREFIX, ACTIONS, parse
from edge_llm_ros.nav.camera import Camera
from edge_llm_ros.nav.expert import SEARCH, WHERE, ExpertConfig, camera_expert, rollout, where_seen
from edge_llm_ros.nav.vlm import NavAdapter
from edge_llm_ros.nav.world import Pose, World, body_gap
from edge_llm_ros.nav.worldgen import GenerateConfig, generate

TRAIN_TARGETS = ("red chair", "silver bottle", "blue chair", "yellow cone")
TRAIN_SEED_BASE = 10_000  # training worlds: TRAIN_SEED_BASE, TRAIN_SEED_BASE + 1, ...
HELDOUT_SEEDS = range(TRAIN_SEED_BASE - 8, TRAIN_SEED_BASE)  # the held-out frames' worlds
TEACHER = ExpertConfig(stop_m=0.4)  # the camera expert as the adapter learns it: stops 0.1 m inside the reach
DISTANCES = 9  # "under 1 m", "1 m" .. "8 m"


@dataclass
class Sample:
    frame: np.ndarray  # [H, W, 3] uint8
    instruction: str
    answer: str  # the teacher's answer text (reason, then action)
    # [len(TRAIN_TARGETS), 3] per target kind: the teacher's action (ACTIONS index), where it is seen
    # (WHERE index), its distance (0: under 1 m .. 8), for the encoder's pretraining
    labels: np.ndarray = field(default_factory=lambda: np.zeros((len(TRAIN_TARGETS), 3), dtype=np.int64))


def instruction_for(target: str) -> str:
    return f"go to the {target}"


def decoys_for(target: str) -> tuple[str, ...]:
    """The decoys of a world whose target is ``target``: the other TRAIN_TARGETS."""
    return tuple(t for t in TRAIN_TARGETS if t != target)


def world_for(seed: int, target: str, decoys: bool = False) -> World:
    """A clear-path training world; with ``decoys``, the other TRAIN_TARGETS stand where searching
    from the start shows one of them before the target (worldgen.GenerateConfig.decoys)."""
    return generate(seed, GenerateConfig(target=target, clear_path=True, decoys=decoys_for(target) if decoys else ()))


def frame_labels(world: World, pose: Pose, config: ExpertConfig = TEACHER) -> np.ndarray:
    """[len(TRAIN_TARGETS), 3] what the frame at ``pose`` shows of each target kind (see Sample);
    a kind absent from the world is out of view, and the teacher searches for it."""
    names = {o.name for o in world.objects}
    labels = np.zeros((len(TRAIN_TARGETS), 3), dtype=np.int64)
    for k, name in enumerate(TRAIN_TARGETS):
        if name not in names:
            labels[k] = (ACTIONS.index(SEARCH.action), 0, 0)
            continue
        obj = world.object(name)
        labels[k] = (ACTIONS.index(camera_expert(world, pose, name, config).action),
                     WHERE.index(where_seen(world, pose, obj, config)), min(max(round(body_gap(pose, obj)), 0), 8))
    return labels


def target_for(seed: int) -> str:
    """A training world's target: cycling through TRAIN_TARGETS with the seed."""
    return TRAIN_TARGETS[seed % len(TRAIN_TARGETS)]


def labelled(world: World, pose: Pose, target: str, camera: Camera, teacher: ExpertConfig) -> Sample:
    """The frame at ``pose`` with the teacher's answer and the encoder's labels."""
    return Sample(camera.render(world, pose), instruction_for(target), camera_expert(world, pose, config=teacher).text(),
                  frame_labels(world, pose, teacher))


def collect_samples(seeds: Sequence[int], camera: Camera, perturb: int = 2, rng_seed: int = 0,
                    progress: Callable[[int], None] | None = None, teacher: ExpertConfig = TEACHER,
                    decoys: bool = False) -> list[Sample]:
    """The camera expert's frames in each seed's world (its target cycling through TRAIN_TARGETS;
    ``decoys``: the other targets seen first, world_for): every pose of its rollout, and ``perturb``
    poses pushed off each (turned up to 60 degrees, shifted up to 0.4 m, where the robot fits)."""
    rng = random.Random(rng_seed)
    samples = []
    for n, seed in enumerate(seeds):
        target = target_for(seed)
        world = world_for(seed, target, decoys)
        poses = [pose for pose, _ in rollout(world, lambda w, p: camera_expert(w, p, config=teacher)).steps]
        for pose in list(poses):
            for _ in range(perturb):
                moved = Pose(pose.x + rng.uniform(-0.4, 0.4), pose.y + rng.uniform(-0.4, 0.4),
                             pose.yaw + rng.uniform(-math.pi / 3, math.pi / 3))
                if not world.touching(moved.x, moved.y):
                    poses.append(moved)
        samples += [labelled(world, pose, target, camera, teacher) for pose in poses]
        if progress is not None:
            progress(n + 1)
    return samples


def learner_samples(navigator, seeds: Sequence[int], camera: Camera, teacher: ExpertConfig = TEACHER,
                    max_steps: int = 40, progress: Callable[[int], None] | None = None) -> list[Sample]:
    """DAgger (Ross et al. 2011, one iteration): the states the learner's own decisions lead to,
    each labelled with the teacher's answer. In each seed's world the navigator (nav/navigator:
    constrained greedy) drives, its actions executed as discrete motions (expert.rollout); where it
    says stop and the teacher does not (stopped short, or not facing the target), the teacher's
    action is executed instead, so the states after a premature stop are visited too. Every visited
    pose is a sample, the premature stops among them (labelled with what the teacher does there)."""
    samples = []
    for n, seed in enumerate(seeds):
        target = target_for(seed)
        world = world_for(seed, target)
        instruction = instruction_for(target)

        def policy(w: World, pose: Pose, instruction=instruction, target=target):
            command = navigator.decide(camera.render(w, pose), instruction).command
            if command.verb == "stop":
                taught = camera_expert(w, pose, target, teacher)
                return command if taught.verb == "stop" else taught
            return command

        episode = rollout(world, policy, max_steps=max_steps)
        samples += [labelled(world, pose, target, camera, teacher) for pose, _ in episode.steps]
        if progress is not None:
            progress(n + 1)
    return samples


def save_samples(samples: Sequence[Sample], path: Path) -> None:
    np.savez_compressed(path, frames=np.stack([s.frame for s in samples]),
                        instructions=np.array([s.instruction for s in samples]),
                        answers=np.array([s.answer for s in samples]), labels=np.stack([s.labels for s in samples]))


def load_samples(path: Path) -> list[Sample]:
    data = np.load(path)
    return [Sample(f, str(i), str(a), lab) for f, i, a, lab in zip(data["frames"], data["instructions"],
                                                                   data["answers"], data["labels"])]


# -- the encoder alone ---------------------------------------------------------------------------------


class SightHead(nn.Module):
    """Pretraining head on the encoder's 8 rows: per target kind, logits for the teacher's action,
    where it is seen and how far (discarded after pretraining)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.sizes = (len(ACTIONS), len(WHERE), DISTANCES)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(8 * channels, 256), nn.GELU(),
                                 nn.Linear(256, len(TRAIN_TARGETS) * sum(self.sizes)))

    def loss(self, rows: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the summed cross-entropy, [B, targets] whether the action is right) for labels [B, T, 3]."""
        logits = self.net(rows).view(len(rows), len(TRAIN_TARGETS), sum(self.sizes))
        parts = logits.split(self.sizes, dim=-1)  # action, where, distance
        total = sum(nn.functional.cross_entropy(part.reshape(-1, part.shape[-1]), labels[..., j].reshape(-1))
                    for j, part in enumerate(parts))
        return total, parts[0].argmax(-1) == labels[..., 0]


def pretrain_encoder(adapter: NavAdapter, samples: Sequence[Sample], steps: int, batch_size: int = 64,
                     lr: float = 2e-3, seed: int = 0, heldout: Sequence[Sample] = (),
                     progress: Callable[[int, int, float], None] | None = None) -> dict:
    """Train the encoder (with a SightHead) to tell, from the frame alone, each target kind's
    teacher action, bearing class and distance. Returns the final loss and, on ``heldout``, the
    share of target kinds whose action the head gets right."""
    head = SightHead(adapter.config.channels)
    params = [*adapter.encoder.parameters(), *head.parameters()]
    optim = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    images = adapter.preprocess([s.frame for s in samples])
    labels = torch.from_numpy(np.stack([s.labels for s in samples]))
    generator = torch.Generator().manual_seed(seed)
    started, losses = time.perf_counter(), []
    adapter.train()
    for step in range(steps):
        for group in optim.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        pick = torch.randint(len(samples), (batch_size,), generator=generator)
        loss, _ = head.loss(adapter.encoder(images[pick]), labels[pick])
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses.append(loss.item())
        if progress is not None:
            progress(step + 1, steps, losses[-1])
    adapter.eval()
    result = {"steps": steps, "final_loss": float(np.mean(losses[-20:])), "train_s": time.perf_counter() - started}
    if heldout:
        with torch.no_grad():
            _, right = head.loss(adapter.encoder(adapter.preprocess([s.frame for s in heldout])),
                                 torch.from_numpy(np.stack([s.labels for s in heldout])))
        instructed = torch.tensor([TRAIN_TARGETS.index(s.instruction.removeprefix("go to the ")) for s in heldout])
        result["heldout_action_accuracy"] = float(right[torch.arange(len(heldout)), instructed].float().mean())
    return result


# -- teacher-forced batches ---------------------------------------------------------------------------


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T] prompt + answer + EOS, right-padded
    labels: torch.Tensor  # [B, T] the next token where it is an answer token, else -100
    weights: torch.Tensor  # [B, T] each label's weight in the loss (the action line's are heavier)
    images: torch.Tensor  # [B, 3, h, w]


def answer_tokens(tokenizer, answer: str) -> tuple[list[int], int]:
    """(the answer's tokens, the index of the first one of its action line)."""
    encoded = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
    line = answer.index("\n" + ACTION_PREFIX) + 1
    first = next((i for i, (begin, end) in enumerate(encoded["offset_mapping"]) if end > line),
                 len(encoded["input_ids"]))
    return list(encoded["input_ids"]), first


def make_batch(adapter: NavAdapter, tokenizer, samples: Sequence[Sample], action_weight: float = 1.0) -> Batch:
    rows, labels, weights = [], [], []
    for s in samples:
        prompt = adapter.prompt_ids(tokenizer, s.instruction)
        tokens, first = answer_tokens(tokenizer, s.answer)
        answer = tokens + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * (len(prompt) - 1) + answer + [-100])  # label[t] = the token after t
        weights.append([0.0] * (len(prompt) - 1) + [1.0] * first + [action_weight] * (len(answer) - first) + [0.0])
    width = max(len(r) for r in rows)
    pad = lambda r, v: r + [v] * (width - len(r))  # noqa: E731
    return Batch(torch.tensor([pad(r, 0) for r in rows]), torch.tensor([pad(lab, -100) for lab in labels]),
                 torch.tensor([pad(w, 0.0) for w in weights]), adapter.preprocess([s.frame for s in samples]))


def embeddings(lm: TorchCausalLM, adapter: NavAdapter, batch: Batch, model: str) -> torch.Tensor:
    """The input rows [B, T, E]: token embeddings, the image's rows at the reserved ids."""
    hidden = lm.embed_tokens(batch.ids)
    rows = adapter.rows(batch.images, model)  # [B, 8, E]
    for k, token in enumerate(adapter.config.reserved_ids):
        hit = (batch.ids == token).unsqueeze(-1)  # [B, T, 1]
        hidden = torch.where(hit, rows[:, k : k + 1].to(hidden.dtype), hidden)
    return hidden


def answer_loss(lm: TorchCausalLM, adapter: NavAdapter, batch: Batch, model: str) -> torch.Tensor:
    """The weighted cross-entropy of the answer tokens, the head run only on the rows that predict
    them. ``lm``: the model as the adapter trains it (NavAdapter.attach(..., trainable=True))."""
    inner = lm.hf.model
    # Right padding under a causal mask: no real row sees a pad, so no attention mask is needed.
    hidden = inner(inputs_embeds=embeddings(lm, adapter, batch, model), use_cache=False).last_hidden_state
    where = batch.labels != -100
    logits = lm.hf.lm_head(hidden[where])  # [N, V]
    losses = torch.nn.functional.cross_entropy(logits.float(), batch.labels[where], reduction="none")
    weights = batch.weights[where]
    return (losses * weights).sum() / weights.sum()


# -- training ------------------------------------------------------------------------------------------


@dataclass
class NavTrainConfig:
    epochs: int = 3
    batch_size: int = 16
    lr: float = 2e-3
    encoder_lr_scale: float = 0.1  # the pretrained encoder learns this much slower
    action_weight: float = 3.0  # the action line's tokens weigh this much more than the reason's
    draft_weight: float = 0.5
    max_steps: int = 0  # stop after this many steps (0: the epochs' worth)
    warmup_steps: int = 0  # the rate rises linearly over these first steps (fine-tuning a trained adapter:
    #                        a fresh AdamW's first steps move every weight by about lr, undoing it)
    checkpoint_every: int = 25
    seed: int = 0


def train_adapter(adapter: NavAdapter, target: TorchCausalLM, draft: TorchCausalLM | None, tokenizer,
                  samples: Sequence[Sample], config: NavTrainConfig, checkpoint: Path | None = None,
                  progress: Callable[[int, int, float], None] | None = None) -> dict:
    """Train the adapter's projectors and LoRA updates, and its encoder at ``encoder_lr_scale``
    (the language models' own weights frozen); resumes from ``checkpoint`` if it holds a state, and
    writes it every ``checkpoint_every`` steps."""
    for lm in (target, draft):
        if lm is not None:
            for p in lm.hf.parameters():
                p.requires_grad_(False)
    models = {"target": adapter.attach(target, "target", trainable=True)}
    if draft is not None:
        models["draft"] = adapter.attach(draft, "draft", trainable=True)
    named = [(name, p) for name, p in adapter.named_parameters()
             if draft is not None or not name.startswith(("projectors.draft", "lora.draft"))]
    groups = [{"params": [p for n, p in named if n.startswith("encoder.")], "scale": config.encoder_lr_scale},
              {"params": [p for n, p in named if not n.startswith("encoder.")], "scale": 1.0}]
    params = [p for _, p in named]
    optim = torch.optim.AdamW(groups, lr=config.lr, weight_decay=0.01)
    order = list(range(len(samples)))
    steps_per_epoch = math.ceil(len(order) / config.batch_size)
    total = steps_per_epoch * config.epochs
    total = min(total, config.max_steps) if config.max_steps else total
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
            if done < step or done >= total:
                continue  # resumed past it, or past the last step
            warm = min(1.0, (done + 1) / config.warmup_steps) if config.warmup_steps else 1.0
            for group in optim.param_groups:  # linear warmup, then cosine decay
                group["lr"] = warm * group["scale"] * config.lr * 0.5 * (1 + math.cos(math.pi * done / total))
            batch = make_batch(adapter, tokenizer, [samples[j] for j in order[i * config.batch_size:
                                                                               (i + 1) * config.batch_size]],
                               config.action_weight)
            loss = answer_loss(models["target"], adapter, batch, "target")
            if draft is not None:
                loss = loss + config.draft_weight * answer_loss(models["draft"], adapter, batch, "draft")
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
    """The share of held-out frames whose decision (nav/navigator.Navigator: the constrained
    greedy answer, as navigator_node makes it) is a valid answer with the expert's action."""
    hits = 0
    for s in samples:
        decision = navigator.decide(s.frame, s.instruction)
        hits += decision.valid and decision.command.action == parse(s.answer).action
    return hits / max(len(samples), 1)


# -- the verifier's early exits for the navigation task ----------------------------------------------


@torch.inference_mode()
def nav_exit_features(adapter: NavAdapter, target: TorchCausalLM, samples: Sequence[Sample], layers: Sequence[int],
                      grammar, batch_size: int = 16, top_k: int = 8,
                      progress: Callable[[int], None] | None = None):
    """core/drafts/exits.ExitFeatures of the navigation task (the adapter's target, conditioned on each
    sample's frame): decoder layers ``layers``' outputs at every position predicting an answer token
    (the teacher's answer and EOS, teacher-forced), and what an exit should say there: the
    constrained target's distribution (``grammar`` after the answer so far; its top ``top_k``) and
    its argmax. Positions where the grammar refuses the answer's token are left out."""
    from edge_llm_ros.core.engine.constraint import constrain
    from edge_llm_ros.core.training.exits import ExitFeatures

    model = adapter.attach(target, "target")
    tokenizer = target.tokenizer
    hidden: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    ids, probs, greedy = [], [], []
    for start in range(0, len(samples), batch_size):
        chunk = samples[start: start + batch_size]
        batch = make_batch(adapter, tokenizer, chunk)
        out = model.hf.model(inputs_embeds=embeddings(model, adapter, batch, "target"), output_hidden_states=True,
                             use_cache=False)
        for b, s in enumerate(chunk):
            prompt = adapter.prompt_ids(tokenizer, s.instruction)
            answer = answer_tokens(tokenizer, s.answer)[0] + [tokenizer.eos_token_id]
            rows = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(answer))
            allowed = torch.stack([grammar.allowed(answer[:j]) for j in range(len(answer))])  # [A, V]
            keep = allowed[torch.arange(len(answer)), torch.tensor(answer)]
            logits = constrain(model.hf.lm_head(out.last_hidden_state[b, rows]).float(), allowed)[keep]
            p = torch.softmax(logits, -1)
            top = p.topk(top_k, -1)
            ids.append(top.indices.to(torch.int32))
            probs.append((top.values / top.values.sum(-1, keepdim=True)).to(torch.float16))
            greedy.append(logits.argmax(-1))
            for layer in layers:  # hidden_states[i + 1]: decoder layer i's output
                hidden[layer].append(out.hidden_states[layer + 1][b, rows][keep].to(torch.float16))
        if progress is not None:
            progress(len(chunk))
    return ExitFeatures({layer: torch.cat(h) for layer, h in hidden.items()}, torch.cat(ids), torch.cat(probs),
                        torch.cat(greedy))


NAV_EXIT_LAYERS = (4, 8, 16, 24)  # the shipped text exits' layers: every verifier_node exit setting finds its own
NAV_EXITS_DIR = "exits"  # inside the adapter's folder (nav/navigator.nav_exits reads it)


def train_nav_exits(adapter: NavAdapter, target: TorchCausalLM, samples: Sequence[Sample],
                    heldout: Sequence[Sample], layers: Sequence[int] = NAV_EXIT_LAYERS, bottleneck: int = 256,
                    config=None, progress: bool = True, log: Callable[[str], None] | None = None):
    """Early exits for the navigation task (EE §3: KD of the final distribution into each exit, the
    model frozen), on the adapter's target conditioned on each frame and constrained to the answer
    grammar: (the ExitSet, core/training/exits.train_exits' result). Their vocabulary is every token the
    constrained target puts in its top-k over the training answers, and EOS."""
    from edge_llm_ros.core.drafts.exits import build_exits
    from edge_llm_ros.core.training.exits import ExitTrainConfig, train_exits
    from edge_llm_ros.nav.navigator import answer_grammar

    grammar = answer_grammar(target.tokenizer, target.vocab_size)
    grammar.warm()
    model = adapter.attach(target, "target")
    features = nav_exit_features(adapter, target, samples, layers, grammar)
    held = nav_exit_features(adapter, target, heldout, layers, grammar)
    vocab = torch.unique(torch.cat([features.teacher_ids.flatten().long(),
                                    torch.tensor([target.tokenizer.eos_token_id])]))
    if log:
        log(f"{len(features)} answer positions from {len(samples)} frames ({len(held)} held out); "
            f"exit vocabulary {len(vocab)} tokens")
    exits = build_exits(model, layers, bottleneck, vocab_ids=vocab, name="smollm2-nav")
    result = train_exits(model, exits, features, config or ExitTrainConfig(epochs=6, batch_positions=512),
                         heldout=held, progress=progress, log=log)
    exits.training = {"frames": len(samples), "positions": len(features), "heldout_frames": len(heldout),
                      "steps": result.steps, "train_s": round(result.train_s, 1),
                      "heldout": {str(layer): {k: round(v, 4) for k, v in stats.items()}
                                  for layer, stats in result.evals[-1]["exits"].items()} if result.evals else {}}
    return exits, result
