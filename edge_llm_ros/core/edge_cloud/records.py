"""The wire records of edge-cloud decoding and their checks.

Contract: two plain records that map field for field onto the wire messages, so a node only copies
fields; every check on a received draft that needs no request state lives here.

    DraftRequest   <->  msg/DraftTree.msg      robot -> server, one per round
    VerifyOutcome  <->  msg/VerifyResult.msg   server -> robot, early outcomes then the final one

Knows nothing about ROS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from edge_llm_ros.errors import Busy, PeerGone, Status, status_of

from ..engine.config import GenerationConfig
from ..engine.tree import TokenTree

ROW_SUM_TOLERANCE = 1e-3  # |sum(top-k row) - 1| allowed (float32 rows of a softmax)
MAX_TOPK = 4096  # largest proposal support DraftRequest.from_tree will put on the wire
PROPOSAL_TOP_K = 64  # a sampled draft's proposal support: 64 ids + probs per node (512 B) on the wire
MAX_REQUEST_ID = 128  # characters; a request id is a key the verifier holds, so it is bounded
MAX_TASK = 64  # characters of a task name
MAX_IMAGE_FEATURES = 1 << 20  # values of one round-0 image (the nav adapter sends 8 x 64; a Qwen VLM the
#                              resized frame, 336 x 252 x 3 by default: nav/qwen_vl.py)


class DraftError(ValueError):
    """A malformed or out-of-sequence draft; ``field`` names the DraftTree field at fault."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


class RequestLimitError(Busy):
    """More concurrent requests than ``max_requests``."""


class SpeculationMissed(Exception):
    """A speculative draft whose assumed tokens are not what the previous round committed: the
    verifier drops it without an answer (the robot drafts that round again)."""


class DraftRejectedError(PeerGone):
    """The verifier answered a draft with an error (VerifyResult.error); its code is the verifier's
    (VerifyResult.status: a busy verifier makes the request BUSY), PEER_GONE when it gave none."""


# -- the wire records ---------------------------------------------------------------------------


def _ints(name: str, values) -> list[int]:
    out = []
    for v in values:
        try:
            integral = not isinstance(v, (bool, str)) and float(v).is_integer()
        except (TypeError, ValueError):
            integral = False
        if not integral:
            raise DraftError(name, f"expected integers, got {v!r}")
        out.append(int(v))
    return out


def _check_ids(name: str, ids: list[int], vocab_size: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise DraftError(name, f"token ids must be in [0, {vocab_size}), got {bad[:5]}")


@dataclass
class DraftRequest:
    """One round's draft: DraftTree.msg without the header (field for field).

    ``context_ids``: committed tokens the verifier has not seen (round 0: the prompt; later rounds
    usually empty, the verifier knows what it committed). ``prefix_len``: committed tokens before
    the tree, context included; the last of them is the tree's root. Node i is ``token_ids[i]``
    with parent ``parents[i]`` (-1 = the root), drafted with probability ``draft_probs[i]``.
    ``topk > 0``: row i of ``topk_ids``/``topk_probs`` is the proposal distribution node i was
    drawn from (its parent's q, sparse; siblings repeat it) — needed for exact sampled
    verification; ``topk == 0``: children were chosen deterministically. ``top_p == 0`` means off
    (a message's default value), as does ``top_k == 0``.

    How the round uses the link (see :data:`EDGE_MODES`): ``early_exits`` false asks for the final
    outcome only (plain edge-cloud SD). ``cloud_tokens > 0`` (round 0, no draft) is cloud
    autoregressive decoding: the verifier generates up to that many tokens itself, one final
    outcome per round. ``speculative``: sent ahead from an early outcome before the previous
    round's final; verified only if that final commits exactly ``assumed_ids`` (its accepted ids
    and next token), otherwise dropped without an answer.

    ``task`` (round 0): '' is the verifier's plain target; another name is a task the verifier
    serves with a model and a grammar of its own (:class:`~.server.VerifierTask`; "nav": the
    navigation VLM, answers constrained to the action grammar), conditioned on the
    ``image_features`` the round carries (the robot's vision encoder's output, row-major).
    """

    request_id: str
    round: int
    context_ids: list[int]
    prefix_len: int
    token_ids: list[int]
    parents: list[int]
    draft_probs: list[float]
    topk: int = 0
    topk_ids: list[int] = field(default_factory=list)
    topk_probs: list[float] = field(default_factory=list)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    early_exits: bool = True
    cloud_tokens: int = 0
    speculative: bool = False
    assumed_ids: list[int] = field(default_factory=list)
    task: str = ""
    image_features: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise DraftError("request_id", f"must be a non-empty string, got {self.request_id!r}")
        if len(self.request_id) > MAX_REQUEST_ID:
            raise DraftError("request_id", f"has {len(self.request_id)} characters, at most {MAX_REQUEST_ID}")
        for name in ("round", "prefix_len", "topk", "top_k", "seed", "cloud_tokens"):
            value = _ints(name, [getattr(self, name)])[0]
            if value < 0:
                raise DraftError(name, f"must be >= 0, got {value}")
            setattr(self, name, value)
        for name in ("context_ids", "token_ids", "parents", "topk_ids", "assumed_ids"):
            setattr(self, name, _ints(name, getattr(self, name)))
        self.draft_probs = [float(p) for p in self.draft_probs]
        self.topk_probs = [float(p) for p in self.topk_probs]
        self.image_features = [float(v) for v in self.image_features]
        if not isinstance(self.task, str):
            raise DraftError("task", f"must be a string, got {self.task!r}")
        self.temperature, self.top_p = float(self.temperature), float(self.top_p)
        self.early_exits, self.speculative = bool(self.early_exits), bool(self.speculative)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check(self, vocab_size: int) -> None:
        """Every field on its own (no request state): raises :class:`DraftError` naming the field."""
        n = len(self.token_ids)
        _check_ids("context_ids", self.context_ids, vocab_size)
        _check_ids("token_ids", self.token_ids, vocab_size)
        if len(self.parents) != n:
            raise DraftError("parents", f"has {len(self.parents)} entries for {n} token_ids")
        children: dict[int, dict[int, int]] = {}
        for i, (tok, parent) in enumerate(zip(self.token_ids, self.parents)):
            if not -1 <= parent < i:
                raise DraftError("parents", f"node {i} has parent {parent}; a parent must be -1 (the root) or an "
                                 "earlier node (topological order)")
            twin = children.setdefault(parent, {}).setdefault(tok, i)
            if twin != i:
                raise DraftError("token_ids", f"node {i} repeats token {tok} of its sibling node {twin}")
        if len(self.draft_probs) != n:
            raise DraftError("draft_probs", f"has {len(self.draft_probs)} entries for {n} token_ids")
        bad = [p for p in self.draft_probs if not 0.0 <= p <= 1.0]  # NaN fails too
        if bad:
            raise DraftError("draft_probs", f"probabilities must be in [0, 1], got {bad[:5]}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise DraftError("temperature", f"must be a finite number >= 0, got {self.temperature}")
        if not 0.0 <= self.top_p <= 1.0:
            raise DraftError("top_p", f"must be in [0, 1] (0 = off), got {self.top_p}")
        if self.cloud_tokens and (n or self.round):
            raise DraftError("cloud_tokens", "a cloud request (cloud_tokens > 0) is round 0 and carries no draft")
        _check_ids("assumed_ids", self.assumed_ids, vocab_size)
        self._check_task()
        if self.speculative != bool(self.assumed_ids) or (self.speculative and self.round == 0):
            raise DraftError("assumed_ids", "a speculative draft (round > 0) names the tokens it assumes; others none")
        self._check_topk(vocab_size)

    def _check_task(self) -> None:
        if len(self.task) > MAX_TASK:
            raise DraftError("task", f"has {len(self.task)} characters, at most {MAX_TASK}")
        if self.round and (self.task or self.image_features):
            raise DraftError("task" if self.task else "image_features", "only round 0 names the task and carries "
                             "the image (the verifier keeps them for the request)")
        if len(self.image_features) > MAX_IMAGE_FEATURES:
            raise DraftError("image_features", f"has {len(self.image_features)} values, at most {MAX_IMAGE_FEATURES}")
        if not all(math.isfinite(v) for v in self.image_features):
            raise DraftError("image_features", "must be finite numbers")
        if self.image_features and not self.task:
            raise DraftError("image_features", "an image needs a task that reads it (task is empty)")

    def _check_topk(self, vocab_size: int) -> None:
        n, k = len(self.token_ids), self.topk
        if k == 0:
            if self.topk_ids or self.topk_probs:
                raise DraftError("topk", "is 0 but topk_ids / topk_probs are not empty")
            return
        for name in ("topk_ids", "topk_probs"):
            if len(getattr(self, name)) != n * k:
                raise DraftError(name, f"has {len(getattr(self, name))} entries, expected {n} nodes x topk {k}")
        _check_ids("topk_ids", self.topk_ids, vocab_size)
        probs = torch.tensor(self.topk_probs, dtype=torch.float64).view(n, k)
        if bool(((probs < 0) | (probs > 1) | probs.isnan()).any()):
            raise DraftError("topk_probs", "probabilities must be in [0, 1]")
        sums = probs.sum(-1)
        off = (sums - 1).abs() > ROW_SUM_TOLERANCE
        if bool(off.any()):
            i = int(off.nonzero()[0])
            raise DraftError("topk_probs", f"row {i} sums to {float(sums[i]):.6f}, rows must sum to 1")
        ids = torch.tensor(self.topk_ids).view(n, k)
        for i, tok in enumerate(self.token_ids):
            if float(probs[i][ids[i] == tok].sum()) <= 0:
                raise DraftError("topk_ids", f"node {i}'s token {tok} has no mass in its top-k row (it cannot "
                                 "have been drawn from it)")

    # -- trees <-> records ------------------------------------------------------------------------

    @classmethod
    def from_tree(
        cls,
        request_id: str,
        round: int,
        tree: TokenTree,
        prefix_len: int,
        context_ids: Sequence[int] = (),
        config: GenerationConfig | None = None,
        max_topk: int = MAX_TOPK,
    ) -> DraftRequest:
        """The record of ``tree`` (root = the last of ``prefix_len`` committed tokens).

        Sampled children (``tree.proposals[parent]`` set) put their proposal's support on the wire
        as top-k rows; a support wider than ``max_topk`` cannot be sent exactly (sample the draft
        from its top-k, as DESIGN.md asks) and raises ValueError.
        """
        nodes = range(1, len(tree.tokens))
        parents = [tree.parents[n] - 1 for n in nodes]
        probs = [min(1.0, math.exp(tree.logscores[n] - tree.logscores[tree.parents[n]])) for n in nodes]
        topk, topk_ids, topk_probs = 0, [], []
        if any(tree.proposals[tree.parents[n]] is not None for n in nodes):
            rows = []
            for n in nodes:
                q = tree.proposals[tree.parents[n]]
                if q is None:
                    rows.append(([tree.tokens[n]], [1.0]))
                else:
                    support = q.nonzero().flatten()
                    rows.append((support.tolist(), q[support].tolist()))
            topk = max(len(ids) for ids, _ in rows)
            if topk > max_topk:
                raise ValueError(f"a proposal has {topk} tokens with mass (max_topk {max_topk}); sample the draft "
                                 "from its top-k so the verifier gets the exact proposal")
            for ids, ps in rows:
                pad = topk - len(ids)
                topk_ids += ids + [ids[0]] * pad  # padding: probability 0, any valid id
                topk_probs += ps + [0.0] * pad
        config = config or GenerationConfig()
        return cls(
            request_id, round, list(context_ids), prefix_len, tree.tokens[1:], parents, probs, topk, topk_ids,
            topk_probs, config.temperature, config.top_p, config.top_k, config.seed or 0,
        )

    def to_tree(self, root_token: int, vocab_size: int) -> TokenTree:
        """The :class:`TokenTree` under ``root_token`` (call :meth:`check` first); node i -> tree node i + 1."""
        tree = TokenTree.from_root(root_token)
        for tok, parent, p in zip(self.token_ids, self.parents, self.draft_probs):
            tree.add(parent + 1, tok, math.log(max(p, 1e-30)))
        if self.topk:
            n, k = len(self.token_ids), self.topk
            ids = torch.tensor(self.topk_ids).view(n, k)
            probs = torch.tensor(self.topk_probs, dtype=torch.float32).view(n, k)
            for parent, kids in enumerate(tree.children):
                rows = [c - 1 for c in kids]
                if not rows or all(float(probs[r][ids[r] == self.token_ids[r]].sum()) >= 1 - 1e-6 for r in rows):
                    continue  # deterministic children (one-hot rows): proposal None
                q = torch.zeros(vocab_size).index_put_((ids[rows[0]],), probs[rows[0]], accumulate=True)
                tree.proposals[parent] = q / q.sum()
        return tree


@dataclass
class VerifyOutcome:
    """One verification outcome: VerifyResult.msg without the header (field for field).

    ``accepted_nodes`` index DraftRequest.token_ids; ``probs`` hold the target's probability (at
    that exit) of each emitted token, accepted ones then ``next_token``; ``confidence`` is S, the
    max softmax of the next-token distribution (EE Eq. 4). ``error`` non-empty: the draft was
    rejected and nothing else is meaningful.
    """

    request_id: str
    round: int
    final: bool
    exit_layer: int
    confidence: float
    accepted_nodes: list[int]
    accepted_ids: list[int]
    next_token: int
    probs: list[float] = field(default_factory=list)
    error: str = ""
    verify_time_s: float = 0.0  # the verifier's time for the round (final outcomes)
    status: int = 0  # a rejection's code (edge_llm_ros.errors.Status): BUSY, INACTIVE, INVALID or FAILED

    @property
    def new_tokens(self) -> list[int]:
        return self.accepted_ids + [self.next_token]

    @property
    def hypothesis(self) -> tuple[tuple[int, ...], int]:
        return tuple(self.accepted_nodes), self.next_token

    @classmethod
    def rejection(cls, request_id: str, round: int, error: Exception | str, status: int | None = None) -> VerifyOutcome:
        """The final answer to a draft that could not be verified (the node publishes it); ``status``
        defaults to the exception's code (errors.status_of), FAILED for a bare reason."""
        code = status if status is not None else status_of(error) if isinstance(error, BaseException) else Status.FAILED
        return cls(request_id, round, True, 0, 0.0, [], [], -1, [], str(error) or type(error).__name__, 0.0, int(code))


# -- wire sizes: what a record weighs as its message (the emulated and simulated links send these) ------

HEADER_BYTES = 20  # CDR encapsulation + std_msgs/Header (stamp, empty frame_id)


def _string_bytes(text: str) -> int:
    return 4 + len(text.encode()) + 1


def draft_bytes(draft: DraftRequest) -> int:
    """DraftTree.msg's payload: 4 bytes per 32-bit scalar (7), 8 for the seed, 1 per bool (2),
    4 + 4 n per array (8: context, tokens, parents, probs, top-k ids and probs, assumed, image
    features), two strings (request id, task); no padding."""
    entries = (len(draft.context_ids) + 3 * len(draft.token_ids) + 2 * len(draft.topk_ids) + len(draft.assumed_ids)
               + len(draft.image_features))
    return (HEADER_BYTES + _string_bytes(draft.request_id) + _string_bytes(draft.task) + 7 * 4 + 8 + 2 + 8 * 4
            + 4 * entries)


def outcome_bytes(outcome: VerifyOutcome) -> int:
    """VerifyResult.msg's payload: 5 32-bit scalars, a bool, 3 arrays, 2 strings (as draft_bytes)."""
    entries = len(outcome.accepted_nodes) + len(outcome.accepted_ids) + len(outcome.probs)
    return (HEADER_BYTES + _string_bytes(outcome.request_id) + _string_bytes(outcome.error) + 5 * 4 + 1 + 3 * 4
            + 4 * entries)
