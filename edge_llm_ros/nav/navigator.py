"""The navigator's decision: a camera frame and an instruction in, one action of the grammar out.

Contract: :class:`Navigator` holds the VLM (the target with the navigation adapter, and the draft
with its own projector) and the answer grammar's vocabulary masks. :meth:`Navigator.decide`
conditions both models on the frame (the image's rows in the prompt's reserved slots), generates
the answer in the configured mode with target and draft masked alike by the grammar (core/
constraint.py), so the answer is always a sentence of the grammar (or a prefix of one if the
token limit ends it; then it does not parse and the action is stop) and is the constrained
target's answer in every lossless mode. The confidence is the target's probability of the action
line's tokens under the same masks, as the engine verified them (no second pass). Knows nothing
about ROS.

Edge-cloud (:class:`EdgeCloudNavigator`, the robot's half): the robot holds the draft and the
adapter's encoder, the server the target (:func:`nav_task`: the adapter's target, its image
projector and the grammar, served by an EarlyExitVerifier as task "nav"). Round 0 carries the
frame's encoder features (2 kB) with the prompt; the verifier conditions the target on them and
verifies under the grammar, the robot drafts under it, so the answer is the same constrained
target's answer as on one device, in every edge mode; the task's own early exits
(:func:`nav_exits`) make pre-drafting (fsd, ee) hit.

Pipeline (:class:`PipelineNavigator`, the robot as FlowSpec's D0): the target's layers on stages
that each run :func:`nav_stage_task` (the adapter's LoRA in their layers; the first conditioned
on the frame's features, the last masking each row by the grammar state D0 sends with it), in
every lossless pipeline mode with the same answer again.

Overlap (no stop-and-go, as in EE's pre-drafting and LiveVLN): the node asks for the next
decision on the newest frame while the robot still executes the current one; :class:`Waiting`
accounts the time the robot stood still waiting for the model.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from edge_llm_ros.core.drafts.exits import ExitSet
from edge_llm_ros.core.edge_cloud import EDGE_MODES, DraftRequest, FinalStep, VerifierTask, VerifyOutcome
from edge_llm_ros.core.engine.config import GenerationConfig, GenerationStats
from edge_llm_ros.core.engine.constraint import TokenGrammar
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter, TreeSpec
from edge_llm_ros.core.engine.models import TorchCausalLM
from edge_llm_ros.core.engine.sampling import Sampler
from edge_llm_ros.core.pipeline.schedulers import LOSSLESS_PIPELINE_MODES, make_scheduler
from edge_llm_ros.core.pipeline.stages import StageTask
from edge_llm_ros.nav.actions import ACTION_PREFIX, ANSWER, Magnitudes, NavCommand, parse_or_stop
from edge_llm_ros.nav.vlm import NavAdapter

MAX_ANSWER_TOKENS = 64  # "reason: " + 80 characters + the action line: well inside this
NAV_TASK = "nav"  # DraftRequest.task of a navigation decision

# rounds(request_id, prompt, config, **start) -> (step, final) per round: an edge-cloud transport
# (core.edge_cloud.edge_cloud_rounds bound to a verifier, or a node's link); ``start`` as
# EarlyExitDrafter.start's keywords
Rounds = Callable[..., Iterator[tuple[FinalStep, VerifyOutcome]]]


def answer_grammar(tokenizer, vocab_size: int) -> TokenGrammar:
    """The action grammar (nav/actions.py) over ``tokenizer``'s tokens, ended by its EOS."""
    return TokenGrammar.for_tokenizer(ANSWER, tokenizer, vocab_size, [tokenizer.eos_token_id])


def answer_vocabulary(grammar: TokenGrammar) -> list[int]:
    """Every token an answer can hold: the grammar's candidates and EOS (the heads score those only)."""
    return [*grammar.candidates, *grammar.eos_ids]


def nav_exits(adapter: NavAdapter, target: TorchCausalLM) -> ExitSet | None:
    """The navigation task's own early exits, if its adapter's folder holds them (``exits/``, made
    by ``edge-llm-ros train nav-exits``); None otherwise."""
    from edge_llm_ros.core.drafts.exits import load_exits

    folder = adapter.folder / "exits" if adapter.folder is not None else None
    return load_exits(target, folder) if folder is not None and (folder / "config.json").is_file() else None


def nav_task(adapter: NavAdapter, target: TorchCausalLM, grammar: TokenGrammar | None = None,
             exits: ExitSet | None = None) -> VerifierTask:
    """The server's half of an edge-cloud navigator: ``target`` with the adapter (its LoRA merged,
    scoring the answer's vocabulary), conditioned per request on the image features round 0
    carries, and constrained to the action grammar; ``exits``: the task's own (:func:`nav_exits`),
    or None for the verifier's."""
    grammar = grammar or answer_grammar(target.tokenizer, target.vocab_size)
    model = adapter.attach(target, "target").with_vocabulary(answer_vocabulary(grammar))
    prompt = adapter.prompt_ids(target.tokenizer, "go to the red chair")
    blank = adapter.features(np.zeros((adapter.config.height, adapter.config.width, 3), np.uint8))
    example = DraftRequest("warm-up", 0, prompt, len(prompt), [], [], [], early_exits=False, task=NAV_TASK,
                           image_features=blank.flatten().tolist())
    return VerifierTask(model, grammar, lambda lm, features: adapter.condition_on(lm, features, "target"), example,
                        exits)


def nav_stage_task(adapter: NavAdapter, model: TorchCausalLM, *, first: bool, last: bool,
                   grammar: TokenGrammar | None = None) -> StageTask:
    """A pipeline stage's share of the navigation task (core/pipeline/stages.StageTask): ``model`` (the
    stage's layers) with the adapter's LoRA merged into them; at the first stage conditioned on
    each request's image features, at the last scoring the answer's vocabulary and masking each row
    by the grammar state D0 sent with it (``model.tokenizer`` makes the grammar)."""
    view = adapter.attach(model, "target")
    if last:
        grammar = grammar or answer_grammar(model.tokenizer, model.vocab_size)
        grammar.warm()
        view = view.with_vocabulary(answer_vocabulary(grammar))
    condition = (lambda lm, features: adapter.condition_on(lm, features, "target")) if first else None
    return StageTask(view, condition, grammar if last else None)


@dataclass
class Decision:
    command: NavCommand
    text: str
    error: str  # why the text did not parse ('' if it did)
    confidence: float
    decide_s: float
    stats: GenerationStats

    @property
    def valid(self) -> bool:
        return not self.error


class Navigator:
    """See the module docstring. ``draft``: the draft LM (None: no speculative modes)."""

    def __init__(self, adapter: NavAdapter, target: TorchCausalLM, draft: TorchCausalLM | None = None,
                 config: GenerationConfig | None = None, magnitudes: Magnitudes | None = None) -> None:
        self._setup(adapter, target, draft, config, magnitudes)
        self.target = adapter.attach(target, "target").with_vocabulary(answer_vocabulary(self.grammar))

    def _setup(self, adapter: NavAdapter, lm: TorchCausalLM, draft: TorchCausalLM | None,
               config: GenerationConfig | None, magnitudes: Magnitudes | None) -> None:
        """What both halves share: the grammar over ``lm``'s tokens, the draft view, the checks."""
        self.adapter, self.tokenizer = adapter, lm.tokenizer
        self.grammar = answer_grammar(lm.tokenizer, lm.vocab_size)
        # no token outside the grammar's candidates (and EOS) is ever allowed: the heads score those only
        vocabulary = answer_vocabulary(self.grammar)
        self.draft = None if draft is None else adapter.attach(draft, "draft").with_vocabulary(vocabulary)
        self.config = config or GenerationConfig(mode="ar", max_new_tokens=MAX_ANSWER_TOKENS)
        if self.config.mode != "ar" and draft is None:
            raise ValueError(f"mode {self.config.mode!r} needs a draft model")
        if self.config.temperature != 0.0:
            raise ValueError("the navigator decides greedily (temperature 0): the same frame, the same action")
        self.magnitudes = magnitudes or Magnitudes()
        self._prompts: dict[str, list[int]] = {}

    def warm_up(self, frame: np.ndarray, instruction: str) -> float:
        """Make the grammar's masks and draft once on ``frame`` here (torch's first pass is slow),
        without the target (the robot's half of a split deployment); seconds."""
        start = time.perf_counter()
        self.grammar.warm()
        if self.draft is not None:
            drafter = ModelDrafter(self.adapter.condition(self.draft, frame, "draft"))
            spec = TreeSpec.chain(self.config.gamma).constrained(self.grammar.bind([]))
            drafter.propose(self.prompt(instruction), spec, Sampler(0.0))
        return time.perf_counter() - start

    def prompt(self, instruction: str) -> list[int]:
        if instruction not in self._prompts:
            self._prompts[instruction] = self.adapter.prompt_ids(self.tokenizer, instruction)
        return self._prompts[instruction]

    def decide(self, frame: np.ndarray, instruction: str) -> Decision:
        """The answer to one frame (RGB uint8 [H, W, 3])."""
        start = time.perf_counter()
        tokens, stats = self.answer(frame, self.prompt(instruction))
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        command, error = parse_or_stop(text)
        confidence = action_confidence(tokens, stats.token_probs, self.grammar) if not error else 0.0
        return Decision(command, text, error, confidence, time.perf_counter() - start, stats)

    def answer(self, frame: np.ndarray, prompt: list[int]) -> tuple[list[int], GenerationStats]:
        """The answer's tokens to ``prompt`` on ``frame``, and how they were made."""
        view = self.adapter.condition(self.target, frame, "target")
        drafter = None
        if self.config.mode != "ar":
            drafter = ModelDrafter(self.adapter.condition(self.draft, frame, "draft"))
        result = generate_all(view, prompt, self.config, drafter, grammar=self.grammar)
        return result.tokens, result.stats


class EdgeCloudNavigator(Navigator):
    """The robot's half of an edge-cloud navigator (see the module docstring): ``draft`` and the
    adapter here, the target behind ``rounds``. ``mode``: an edge mode (ar: cloud decoding, sd,
    tree, fsd, ee: core.edge_cloud.EDGE_MODES); ``config``'s mode follows it."""

    def __init__(self, adapter: NavAdapter, draft: TorchCausalLM, rounds: Rounds, mode: str = "sd",
                 config: GenerationConfig | None = None, magnitudes: Magnitudes | None = None) -> None:
        if mode not in EDGE_MODES:
            raise ValueError(f"edge mode must be one of {' | '.join(EDGE_MODES)}, got {mode!r}")
        base = config or GenerationConfig(max_new_tokens=MAX_ANSWER_TOKENS)
        self._setup(adapter, draft, draft, base.with_overrides(mode=EDGE_MODES[mode][0]), magnitudes)
        self.edge_mode, self.rounds = mode, rounds

    def request(self, frame: np.ndarray) -> dict:
        """A decision's keywords for the edge-cloud rounds (robot_rounds' ``start``): the mode's
        early exits and sending ahead, drafters conditioned on ``frame``'s encoder features (two
        where early outcomes are pre-drafted from, so a miss never waits behind a pre-draft), the
        grammar, the task and the features that go up with round 0."""
        features = self.adapter.features(frame)
        _, early_exits, send_ahead = EDGE_MODES[self.edge_mode]
        drafters = []
        if self.config.mode != "ar":
            view = self.adapter.condition_on(self.draft, features, "draft")
            drafters = [ModelDrafter(view) for _ in range(2 if early_exits else 1)]
        return {"early_exits": early_exits, "send_ahead": send_ahead, "own_drafters": drafters, "grammar": self.grammar,
                "task": NAV_TASK, "image_features": features.flatten().tolist()}

    def answer(self, frame: np.ndarray, prompt: list[int]) -> tuple[list[int], GenerationStats]:
        start = time.perf_counter()
        stats = GenerationStats(mode=self.edge_mode, prompt_tokens=len(prompt))
        tokens: list[int] = []
        for step, final in self.rounds(f"nav-{uuid.uuid4().hex[:12]}", prompt, self.config, **self.request(frame)):
            tokens += step.tokens
            stats.rounds += 1
            stats.accepted.append(len(final.accepted_ids))
            stats.verify_time_s += final.verify_time_s
            stats.token_probs += final.probs[: len(step.tokens)]
            stats.ttft_s = stats.ttft_s or time.perf_counter() - start
            stats.finish_reason = step.finish_reason
        stats.new_tokens, stats.total_time_s = len(tokens), time.perf_counter() - start
        return tokens, stats


class PipelineNavigator(Navigator):
    """The robot as D0 of a stage pipeline (FlowSpec): the draft and the adapter's encoder here, the
    target's layers in stages serving task nav (:func:`nav_stage_task`). ``run(scheduler)`` drives
    one request through the stages and yields the tokens each answer commits (nodes/stage_client's
    StageClient.run; core.sim.pipeline in tests). ``mode``: ar | chunk_pp | flowspec (every one lossless;
    outline is not offered: it would change the answer). ``pipeline``: make_scheduler's segment,
    in_flight, prefill_chunk and shape."""

    def __init__(self, adapter: NavAdapter, draft: TorchCausalLM, run: Callable, mode: str = "flowspec",
                 config: GenerationConfig | None = None, magnitudes: Magnitudes | None = None,
                 **pipeline) -> None:
        if mode not in LOSSLESS_PIPELINE_MODES:
            raise ValueError(f"pipeline mode must be one of {' | '.join(LOSSLESS_PIPELINE_MODES)}, got {mode!r}")
        base = config or GenerationConfig(max_new_tokens=MAX_ANSWER_TOKENS)
        self._setup(adapter, draft, draft, base.with_overrides(mode="ar" if mode == "ar" else "sd"), magnitudes)
        self.pipeline_mode, self.run = mode, run
        self.pipeline = {"segment": 8, "in_flight": 2, "prefill_chunk": 0, **pipeline}

    def scheduler(self, frame: np.ndarray, prompt: list[int]):
        """One decision's core.pipeline scheduler: the frame's features go to the first stage with
        the prompt, every draft and every row's choice masked by the grammar."""
        features = self.adapter.features(frame)
        drafter = None
        if self.pipeline_mode != "ar":
            drafter = ModelDrafter(self.adapter.condition_on(self.draft, features, "draft"))
        return make_scheduler(self.pipeline_mode, f"nav-{uuid.uuid4().hex[:12]}", prompt, drafter,
                              max_new_tokens=self.config.max_new_tokens, eos=[self.tokenizer.eos_token_id],
                              task=NAV_TASK, grammar=self.grammar, image=features, **self.pipeline)

    def answer(self, frame: np.ndarray, prompt: list[int]) -> tuple[list[int], GenerationStats]:
        start = time.perf_counter()
        scheduler = self.scheduler(frame, prompt)
        stats = GenerationStats(mode=self.pipeline_mode, prompt_tokens=len(prompt))
        for _ in self.run(scheduler):
            stats.ttft_s = stats.ttft_s or time.perf_counter() - start
        tokens = scheduler.generated
        stats.new_tokens, stats.rounds, stats.total_time_s = len(tokens), scheduler.rounds, time.perf_counter() - start
        stats.token_probs, stats.finish_reason = list(scheduler.token_probs), scheduler.finished
        return list(tokens), stats


def action_confidence(answer: list[int], probs: list[float], grammar: TokenGrammar) -> float:
    """The constrained target's probability of the action line's tokens (those from the token that
    completes "\\naction: " on): the product of their ``probs``, the target's probability of each
    answer token as the engine verified it (GenerationStats.token_probs)."""
    texts = grammar.texts
    written, first = "", len(answer)
    for i, token in enumerate(answer):
        written += texts[token] if 0 <= token < len(texts) else ""
        if "\n" + ACTION_PREFIX in written:
            first = i + 1
            break
    if first >= len(answer) or len(probs) < len(answer):
        return 0.0
    return math.prod(probs[first: len(answer)])


@dataclass
class Waiting:
    """Time the robot stood still waiting for a decision, per episode: from the moment it became
    idle with nothing to do until the next action was handed over."""

    total_s: float = 0.0
    rounds: int = 0
    waited_rounds: int = 0
    since: float | None = None
    first_motion_s: float | None = None
    started: float = field(default_factory=time.monotonic)

    def idle(self, now: float) -> None:
        """The robot finished its action and nothing is queued: it waits from now."""
        if self.since is None:
            self.since = now

    def handed_over(self, now: float) -> None:
        """An action went to the robot."""
        self.rounds += 1
        if self.first_motion_s is None:
            self.first_motion_s = now - self.started
        if self.since is not None:
            waited = now - self.since
            self.total_s += waited
            self.waited_rounds += waited > 0.05
            self.since = None
