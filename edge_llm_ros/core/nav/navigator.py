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

Overlap (no stop-and-go, as in EE's pre-drafting and LiveVLN): the node asks for the next
decision on the newest frame while the robot still executes the current one; :class:`Waiting`
accounts the time the robot stood still waiting for the model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..config import GenerationConfig, GenerationStats
from ..constraint import TokenGrammar
from ..decoding import generate_all
from ..drafters import ModelDrafter
from ..models import TorchCausalLM
from .actions import ACTION_PREFIX, ANSWER, Magnitudes, NavCommand, parse_or_stop
from .vlm import NavAdapter

MAX_ANSWER_TOKENS = 64  # "reason: " + 80 characters + the action line: well inside this


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
        self.adapter = adapter
        tokenizer = target.tokenizer
        self.grammar = TokenGrammar.for_tokenizer(ANSWER, tokenizer, target.vocab_size, [tokenizer.eos_token_id])
        # no token outside the grammar's candidates (and EOS) is ever allowed: the heads score those only
        vocabulary = [*self.grammar.candidates, *self.grammar.eos_ids]
        self.target = adapter.attach(target, "target").with_vocabulary(vocabulary)  # the adapter's LoRA merged
        self.draft = None if draft is None else adapter.attach(draft, "draft").with_vocabulary(vocabulary)
        self.config = config or GenerationConfig(mode="ar", max_new_tokens=MAX_ANSWER_TOKENS)
        if self.config.mode != "ar" and draft is None:
            raise ValueError(f"mode {self.config.mode!r} needs a draft model")
        if self.config.temperature != 0.0:
            raise ValueError("the navigator decides greedily (temperature 0): the same frame, the same action")
        self.magnitudes = magnitudes or Magnitudes()
        self._prompts: dict[str, list[int]] = {}

    def prompt(self, instruction: str) -> list[int]:
        if instruction not in self._prompts:
            self._prompts[instruction] = self.adapter.prompt_ids(self.target.tokenizer, instruction)
        return self._prompts[instruction]

    def decide(self, frame: np.ndarray, instruction: str) -> Decision:
        """The answer to one frame (RGB uint8 [H, W, 3])."""
        start = time.perf_counter()
        prompt = self.prompt(instruction)
        view = self.adapter.condition(self.target, frame, "target")
        drafter = None
        if self.config.mode != "ar":
            drafter = ModelDrafter(self.adapter.condition(self.draft, frame, "draft"))
        result = generate_all(view, prompt, self.config, drafter, grammar=self.grammar)
        text = result.text or ""
        command, error = parse_or_stop(text)
        confidence = action_confidence(result.tokens, result.stats.token_probs, self.grammar) if not error else 0.0
        return Decision(command, text, error, confidence, time.perf_counter() - start, result.stats)


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
