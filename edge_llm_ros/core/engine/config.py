"""Generation configuration and statistics, as plain dataclasses.

Contract: a node or the CLI maps its parameters onto :class:`GenerationConfig`
once; the engine reads nothing else. :class:`GenerationStats` is returned as
data (and updated live while streaming) for nodes to publish and tests to
check. Knows nothing about ROS.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from .drafters import TreeSpec

# A field is checked as given, whatever its annotation says (a caller may pass a string or a numpy
# scalar); these are functions so that a type checker, which takes the annotation's word, keeps them.


def _is_real(value: object) -> bool:
    """A real number of any kind (int, float, numpy's): what a float field may be given."""
    return isinstance(value, numbers.Real)


def _is_integer(value: object) -> bool:
    """An integer of any kind but a bool: what an int field may be given."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


MODES = ("ar", "sd", "tree", "llmcad")


@dataclass
class GenerationConfig:
    """What to generate and how.

    mode: ``ar`` (target only), ``sd`` (chain of ``gamma`` drafted tokens),
    ``tree`` (dynamic tree: ``tree_depth`` levels, ``tree_expand`` nodes expanded
    per level with ``tree_branch`` children each, best ``tree_width`` verified),
    ``llmcad`` (tree whose growth stops when the tree-cumulative confidence falls
    below the self-adaptive α, initial value ``alpha``; extra branches need
    ``branch_prob``; drafting continues during verification when
    ``overlap_drafting``). ``temperature == 0`` is greedy; otherwise top-k (0 =
    off) and top-p (1 = off) warp the distribution, ``seed`` fixes the draws.
    ``eos_token_ids`` None: the tokenizer's / model's EOS.
    """

    mode: str = "ar"
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    gamma: int = 4
    tree_depth: int = 6
    tree_width: int = 16
    tree_branch: int = 4
    tree_expand: int = 4
    alpha: float = 0.01
    branch_prob: float = 0.3
    overlap_drafting: bool = True
    stop_strings: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; expected one of {', '.join(MODES)}")
        for name in ("max_new_tokens", "top_k", "gamma", "tree_depth", "tree_width", "tree_branch", "tree_expand"):
            value = getattr(self, name)
            if not _is_integer(value):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        if not (_is_real(self.temperature) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (_is_real(self.top_p) and 0.0 < self.top_p <= 1.0):  # NaN fails too
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if self.seed is not None and (not _is_integer(self.seed) or not 0 <= self.seed < 2**64):
            raise ValueError(f"seed must be an integer in [0, 2**64) or None (random), got {self.seed!r}")
        for name in ("gamma", "tree_depth", "tree_width", "tree_branch", "tree_expand"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.alpha <= 1.0:  # NaN fails too
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        given: object = self.stop_strings
        if isinstance(given, str):  # one stop string
            self.stop_strings = (given,)
        self.stop_strings = tuple(s for s in self.stop_strings if s)
        if self.eos_token_ids is not None:
            self.eos_token_ids = tuple(int(t) for t in self.eos_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def tree_spec(self, alpha: float | None = None) -> TreeSpec | None:
        """The draft budget of one round for this mode (None for ``ar``)."""
        if self.mode == "sd":
            return TreeSpec.chain(self.gamma)
        if self.mode == "tree":
            return TreeSpec(self.tree_depth, self.tree_branch, self.tree_expand, self.tree_width)
        if self.mode == "llmcad":
            stop = self.alpha if alpha is None else alpha
            return TreeSpec(
                self.tree_depth, self.tree_branch, self.tree_expand, self.tree_width, self.branch_prob, stop
            )
        return None

    def with_overrides(self, **changes) -> GenerationConfig:
        return replace(self, **changes)


# Shapes for a small target on a CPU (Ghidorah §III-C: verification width per hardware). On the
# 2-core x86 dev machine one SmolLM2 pass costs ~51 ms for 1 row, ~45-50 ms for 2-5 rows, ~65 ms
# for 8 and ~145 ms for 17 (models.SWAPPED_LINEAR_ROWS), while the trained drafts agree with the
# target on ~40% of tokens; measured (3 bench prompts x 128 tokens, 2 threads, shipped draft):
#   sd γ=2/3/4: 19.6/20.4/17.5 tok/s (τ 1.44/1.47/1.50) vs ar 18.9;
#   tree depth 3-4, branch 2, width 6-7: 15.7-16.7 tok/s (τ 1.64-1.67); depth 6, branch 4, width 16: 8.6 (τ 1.90).
# So trees stay within 8 verified rows (root + width 7). A GPU or a larger target wants wider trees.
PRESETS = {
    "ar": GenerationConfig(mode="ar"),
    "sd": GenerationConfig(mode="sd", gamma=3),
    "tree": GenerationConfig(mode="tree", tree_depth=4, tree_width=7, tree_branch=2, tree_expand=2),
    "llmcad": GenerationConfig(mode="llmcad", tree_depth=6, tree_width=7, tree_branch=2, tree_expand=2),
}


def preset(mode: str, **overrides) -> GenerationConfig:
    """A named preset (per mode), with overrides."""
    if mode not in PRESETS:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    return PRESETS[mode].with_overrides(**overrides)


def mean_tau(accepted: Sequence[int], empty: float = 0.0) -> float:
    """Mean accepted length τ: tokens per target verification pass, the drafted tokens ``accepted``
    in each round plus the target's own token, averaged over the rounds; ``empty`` with no round."""
    return (sum(accepted) + len(accepted)) / len(accepted) if accepted else empty


@dataclass
class GenerationStats:
    """Counters of one generation. τ counts tokens per target pass (accepted + bonus)."""

    mode: str = "ar"
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0
    accepted: list[int] = field(default_factory=list)  # drafted tokens accepted per round
    drafted: int = 0  # drafted tokens sent to verification
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    overlapped_draft_time_s: float = 0.0  # drafting hidden behind verification (llmcad)
    predraft_hits: int = 0  # rounds that used the tree drafted during the previous verification
    ttft_s: float = 0.0
    total_time_s: float = 0.0
    alphas: list[float] = field(default_factory=list)  # llmcad threshold after each round
    token_probs: list[float] = field(default_factory=list)  # the target's probability of each token (Verification.probs)
    finish_reason: str = ""

    @property
    def tau(self) -> float:
        """Mean accepted length τ: tokens produced per target verification pass."""
        return mean_tau(self.accepted)

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens / drafted tokens verified."""
        return sum(self.accepted) / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(tau=self.tau, acceptance_rate=self.acceptance_rate, tokens_per_s=self.tokens_per_s)
        return out
