"""Edge-cloud speculative decoding with early exits (EE: Venkatesha et al. 2025), middleware-free.

Contract: token ids, trees and outcomes in and out; nothing here imports ROS or Zenoh. The two
halves live in different processes and talk only through two plain records that map field for
field onto the wire messages, so a node only copies fields:

    DraftRequest   <->  msg/DraftTree.msg      robot -> server, one per round
    VerifyOutcome  <->  msg/VerifyResult.msg   server -> robot, early outcomes then the final one

Server (EE Algorithm 2): :class:`EarlyExitVerifier` runs the target's layers over the tree rows
and, at every exit on the way up, verifies the tree greedily with that exit's logits and yields
the outcome at once (a node sends it while the remaining layers run). Only the last layer's
outcome commits. :class:`OutcomeSendQueue` orders the outcomes waiting for the link.

Robot (EE Algorithm 1): :class:`EarlyExitDrafter` keeps each request's context and round. Every
early outcome of round r hypothesises round r's result; the next draft is pre-drafted from the
hypothesised context on worker threads, most confident first (:class:`PreDraftCache`). When the
final outcome arrives, a pre-draft made from exactly the final context is served at once (hit);
otherwise the next draft is made now (miss).

:func:`stream_edge_cloud` / :func:`run_edge_cloud` run both halves in one process with a pluggable
link, for tests and the bench. Every emitted token is verified at the final layer, so the output
is the target's: greedy token for token, sampled distributed as the target's.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from .config import GenerationConfig
from .decoding import StopStrings, draft_step, finish_reason, prefill
from .drafters import Drafter, TreeSpec
from .exits import ExitSet
from .kv_cache import KVCache
from .models import TorchCausalLM, causal_mask
from .sampling import Sampler, make_generator
from .tree import TokenTree, Verification
from .verifier import verify, verify_greedy

ROW_SUM_TOLERANCE = 1e-3  # |sum(top-k row) - 1| allowed (float32 rows of a softmax)
MAX_TOPK = 4096  # largest proposal support DraftRequest.from_tree will put on the wire


class DraftError(ValueError):
    """A malformed or out-of-sequence draft; ``field`` names the DraftTree field at fault."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


class RequestLimitError(RuntimeError):
    """More concurrent requests than ``max_requests``."""


class SpeculationMissed(Exception):
    """A speculative draft whose assumed tokens are not what the previous round committed: the
    verifier drops it without an answer (the robot drafts that round again)."""


class DraftRejectedError(RuntimeError):
    """The verifier answered a draft with an error (VerifyResult.error)."""


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

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise DraftError("request_id", f"must be a non-empty string, got {self.request_id!r}")
        for name in ("round", "prefix_len", "topk", "top_k", "seed", "cloud_tokens"):
            value = _ints(name, [getattr(self, name)])[0]
            if value < 0:
                raise DraftError(name, f"must be >= 0, got {value}")
            setattr(self, name, value)
        for name in ("context_ids", "token_ids", "parents", "topk_ids", "assumed_ids"):
            setattr(self, name, _ints(name, getattr(self, name)))
        self.draft_probs = [float(p) for p in self.draft_probs]
        self.topk_probs = [float(p) for p in self.topk_probs]
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
        if self.speculative != bool(self.assumed_ids) or (self.speculative and self.round == 0):
            raise DraftError("assumed_ids", "a speculative draft (round > 0) names the tokens it assumes; others none")
        self._check_topk(vocab_size)

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

    @property
    def new_tokens(self) -> list[int]:
        return self.accepted_ids + [self.next_token]

    @property
    def hypothesis(self) -> tuple[tuple[int, ...], int]:
        return tuple(self.accepted_nodes), self.next_token

    @classmethod
    def rejection(cls, request_id: str, round: int, error: Exception | str) -> VerifyOutcome:
        """The final answer to a draft that could not be verified (the node publishes it)."""
        return cls(request_id, round, True, 0, 0.0, [], [], -1, [], str(error) or type(error).__name__)


# -- server: the verifier with early exits ------------------------------------------------------


@dataclass
class VerifierStats:
    """Per exit layer: rounds seen, early outcomes sent / suppressed, and agreement with the final
    outcome (same accepted path and next token: exactly when a pre-draft from it would hit)."""

    rounds: int = 0
    verify_s: float = 0.0
    exit_rounds: Counter = field(default_factory=Counter)
    sent: Counter = field(default_factory=Counter)
    suppressed: Counter = field(default_factory=Counter)
    agreed: Counter = field(default_factory=Counter)

    def agreement(self) -> dict[int, float]:
        return {layer: self.agreed[layer] / n for layer, n in sorted(self.exit_rounds.items()) if n}

    def as_dict(self) -> dict:
        out = {k: dict(v) if isinstance(v, Counter) else v for k, v in vars(self).items()}
        out["agreement"] = self.agreement()
        return out


@dataclass
class _ServedRequest:
    tokens: list[int]  # committed tokens; all but the last (the next root) are in the cache
    cache: KVCache
    round: int = 0  # the round expected next
    generator: torch.Generator | None = None  # sampled verification, seeded by the first sampled draft
    busy: bool = False
    last_new: list[int] = field(default_factory=list)  # what the last round committed
    cloud: DraftRequest | None = None  # cloud autoregressive: the round-0 request (its sampling fields)
    cloud_left: int = 0  # tokens the verifier still generates by itself


class EarlyExitVerifier:
    """The server side: the target, its early exits and one KV cache per request.

    A node calls ``verify(draft)`` for every DraftRequest and sends each outcome as it is yielded
    (early ones through :class:`OutcomeSendQueue`); round 0 starts the request from its
    ``context_ids`` (or call :meth:`start` first); ``end(request_id)`` frees it.

    Every exit verifies the tree greedily with its own logits (a hypothesis); the final layer's
    verification alone commits. Sampled drafts are verified (rejection sampling) at the final
    layer only; their early outcomes are still the exits' greedy verification, i.e. hints the
    robot may pre-draft from, never tokens. ``layers`` selects exits (default all);
    ``min_confidence`` withholds early outcomes with S below it (EE Eq. 4's threshold);
    duplicates of an earlier early outcome of the same round are suppressed. An outcome's
    confidence is S of Eq. 4 at the row that chose ``next_token`` (Algorithm 2 line 6 writes
    max(q_{1:δ+1}); we read it as Eq. 4 applied to the next-token distribution).

    Cloud requests (``cloud_tokens``): after each round, :meth:`follow_up` gives the next round's
    (empty) draft until the tokens are generated or one of ``eos_ids`` came; the node queues it
    behind other requests' drafts. Speculative drafts that assumed another result raise
    :class:`SpeculationMissed` (drop them; no answer).

    One verify stream at a time per verifier (the target is shared): the node serialises calls.
    """

    def __init__(
        self,
        target: TorchCausalLM,
        exits: ExitSet | None,
        *,
        layers: Sequence[int] | None = None,
        min_confidence: float = 0.0,
        max_requests: int = 8,
        eos_ids: Sequence[int] = (),
    ) -> None:
        if not hasattr(target, "decoder_layer"):
            raise ValueError(f"early exits need a torch target whose layers we drive; got {type(target).__name__}")
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        available = exits.layers if exits is not None else ()
        chosen = tuple(sorted(set(available if layers is None else layers)))
        missing = [layer for layer in chosen if layer not in available]
        if missing:
            raise ValueError(f"no exit at layers {missing}; exits at {list(available)}")
        last = target.layer_ids[-1]
        if any(not target.layer_ids[0] <= layer < last for layer in chosen):
            raise ValueError(f"exit layers must lie before the target's last layer {last}, got {list(chosen)}")
        self.target, self.exits, self.exit_layers = target, exits, chosen
        self.vocab_ids = exits.vocab_ids if exits is not None else None
        self.min_confidence, self.max_requests = min_confidence, max_requests
        self.final_layer = last
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.stats = VerifierStats()
        self._requests: dict[str, _ServedRequest] = {}

    # -- requests ---------------------------------------------------------------------------------

    @property
    def requests(self) -> list[str]:
        return list(self._requests)

    def start(self, request_id: str, prompt_ids: Sequence[int]) -> None:
        """Prefill the prompt (all but its last token, the first round's root) into a new cache."""
        if not isinstance(request_id, str) or not request_id:
            raise DraftError("request_id", f"must be a non-empty string, got {request_id!r}")
        if request_id in self._requests:
            raise DraftError("request_id", f"request {request_id!r} is already started; end it first")
        prompt = _ints("context_ids", prompt_ids)
        if not prompt:
            raise DraftError("context_ids", "round 0 must carry the prompt (at least one token)")
        _check_ids("context_ids", prompt, self.target.vocab_size)
        if len(prompt) >= self.target.max_context:
            raise DraftError("context_ids", f"prompt of {len(prompt)} tokens leaves no room in the context window "
                             f"{self.target.max_context}")
        if len(self._requests) >= self.max_requests:
            raise RequestLimitError(f"verifier is serving {len(self._requests)} requests (max_requests="
                                    f"{self.max_requests}); end one with end(request_id) or raise max_requests")
        cache = self.target.new_cache(len(prompt) + 64)
        with torch.inference_mode():
            prefill(self.target, cache, prompt)
        self._requests[request_id] = _ServedRequest(prompt, cache)

    def end(self, request_id: str) -> bool:
        """Forget a request and free its cache; False if it was not active."""
        return self._requests.pop(request_id, None) is not None

    def follow_up(self, request_id: str) -> DraftRequest | None:
        """A cloud request's next round (an empty draft: one more token), or None when it is done
        (its cloud_tokens generated, an EOS token, the context window full) or not a cloud request."""
        state = self._requests.get(request_id)
        if state is None or state.cloud is None or state.cloud_left <= 0 or state.busy:
            return None
        if state.tokens[-1] in self.eos_ids or len(state.tokens) >= self.target.max_context:
            return None
        return dataclasses.replace(state.cloud, round=state.round, context_ids=[], prefix_len=len(state.tokens),
                                   cloud_tokens=0)

    # -- verification -----------------------------------------------------------------------------

    def verify(self, draft: DraftRequest) -> Iterator[VerifyOutcome]:
        """Check ``draft`` now (DraftError / RequestLimitError), then stream its outcomes: early
        ones in layer order as each exit is reached, the final one last. Nothing is committed
        unless the stream reaches the final outcome."""
        draft.check(self.target.vocab_size)
        state, pending = self._admit(draft)
        root = (state.tokens + pending)[-1]
        tree = draft.to_tree(root, self.target.vocab_size)
        return self._verify(state, draft, tree, pending)

    def verify_all(self, draft: DraftRequest) -> list[VerifyOutcome]:
        """Blocking wrapper: every outcome of one round, the final one last."""
        return list(self.verify(draft))

    def _admit(self, draft: DraftRequest) -> tuple[_ServedRequest, list[int]]:
        """Request id, round and prefix checks; round 0 starts the request. Returns the request and
        the context tokens to feed before the tree. Nothing changes unless every check passes."""
        rid, state = draft.request_id, self._requests.get(draft.request_id)
        if draft.speculative and (state is None or state.busy or draft.round != state.round
                                  or draft.assumed_ids != state.last_new):
            raise SpeculationMissed(f"round {draft.round} of request {rid!r} assumed {draft.assumed_ids}")
        if state is None:
            if draft.round != 0:
                raise DraftError("request_id", f"unknown request {rid!r} (round 0 starts a request; active: "
                                 f"{self.requests})")
            committed, pending = len(draft.context_ids), []
        elif state.busy:
            raise DraftError("round", f"request {rid!r} is still verifying round {state.round}")
        elif draft.round != state.round:
            when = "stale" if draft.round < state.round else "ahead of the verifier"
            raise DraftError("round", f"round {draft.round} of request {rid!r} is {when}; expected {state.round}")
        elif draft.round == 0:  # started with start(): round 0 may repeat the prompt or leave it out
            if draft.context_ids not in ([], state.tokens):
                raise DraftError("context_ids", f"round 0 of request {rid!r} carries another prompt than the one "
                                 "it was started with")
            committed, pending = len(state.tokens), []
        else:
            committed, pending = len(state.tokens) + len(draft.context_ids), list(draft.context_ids)
        if draft.prefix_len != committed:
            raise DraftError("prefix_len", f"draft assumes {draft.prefix_len} committed tokens, the verifier has "
                             f"{committed} for request {rid!r}")
        depth = max(_depths(draft.parents), default=0)
        if committed - 1 + depth >= self.target.max_context:
            raise DraftError("token_ids", f"a tree of depth {depth} after {committed} tokens passes the context "
                             f"window {self.target.max_context}")
        if state is None:
            self.start(rid, draft.context_ids)
            state = self._requests[rid]
            if draft.cloud_tokens:
                state.cloud, state.cloud_left = draft, draft.cloud_tokens
        return state, pending

    def _verify(self, state: _ServedRequest, draft: DraftRequest, tree: TokenTree, pending: list[int]):
        state.busy = True
        try:
            yield from self._layers_and_exits(state, draft, tree, pending)
        finally:
            state.busy = False

    def _layers_and_exits(self, state: _ServedRequest, draft: DraftRequest, tree: TokenTree, pending: list[int]):
        start, paused = time.perf_counter(), 0.0  # paused: time the consumer spent per early outcome
        cache = state.cache
        hidden, rope, mask, rows = self._tree_rows(state, tree, pending)
        hypotheses: dict[int, tuple] = {}
        sent: set[tuple] = set()
        exits = self.exit_layers if draft.early_exits else ()
        for layer in cache.layers:
            hidden = self._layer(layer, hidden, rope, mask, cache)
            if layer in exits:
                outcome = self._exit_outcome(draft, tree, layer, hidden[0, rows:])
                hypotheses[layer] = outcome.hypothesis
                if outcome.hypothesis in sent or outcome.confidence < self.min_confidence:
                    self.stats.suppressed[layer] += 1
                    continue
                sent.add(outcome.hypothesis)
                self.stats.sent[layer] += 1
                before = time.perf_counter()
                yield outcome  # the node sends it while the remaining layers run
                paused += time.perf_counter() - before
        final = self._final_outcome(draft, tree, hidden[0, rows:])
        self._commit(state, tree, pending, final)
        final.verify_time_s = time.perf_counter() - start - paused
        self._record(hypotheses, final, final.verify_time_s)
        yield final

    # -- the steps of one round -------------------------------------------------------------------

    @torch.inference_mode()
    def _tree_rows(self, state: _ServedRequest, tree: TokenTree, pending: list[int]):
        """Embeddings, rotary, mask for [pending context rows + tree rows]; pending rows are causal,
        tree rows see the cache, every pending row and their own ancestors (LLMCad §3.2 tree mask)."""
        cache, p = state.cache, len(pending)
        rows = ([state.tokens[-1]] + pending[:-1]) if pending else []  # the old root joins the prefix
        length = cache.length
        cache.ensure_capacity(length + p + len(tree.tokens))
        positions = torch.cat([torch.arange(length, length + p), tree.position_ids(length + p)])
        mask = None
        if p + len(tree) > 0:
            mask = causal_mask(length, p + len(tree.tokens))
            mask[p:] = tree.attention_mask(length + p)  # [T, length + p + T]
        hidden = self.target.embed(torch.tensor([rows + tree.tokens]))  # [1, P + T, E]
        rope = self.target.rotary_embeddings(hidden, positions.unsqueeze(0))
        mask = None if mask is None else mask.to(hidden.dtype)
        return hidden, rope, mask, p

    @torch.inference_mode()
    def _layer(self, layer: int, hidden: torch.Tensor, rope, mask, cache: KVCache) -> torch.Tensor:
        return self.target.decoder_layer(layer, hidden, rope, mask, cache)

    @torch.inference_mode()
    def _exit_outcome(self, draft: DraftRequest, tree: TokenTree, layer: int, hidden: torch.Tensor) -> VerifyOutcome:
        """EE Eq. 5: greedy verification of the tree with exit ``layer``'s logits z^(l) = LMHead(a_l(h^(l)))."""
        logits = self.exits.exit_logits(self.target, layer, hidden, self.vocab_ids)  # [T, V]
        result = verify_greedy(tree, logits)
        return self._outcome(draft, result, logits, layer, final=False)

    @torch.inference_mode()
    def _final_outcome(self, draft: DraftRequest, tree: TokenTree, hidden: torch.Tensor) -> VerifyOutcome:
        logits = self.target.head(hidden.unsqueeze(0))[0]  # [T, V]
        sampler = self._sampler(draft)
        result = verify(tree, logits, sampler)
        return self._outcome(draft, result, logits, self.final_layer, final=True, sampler=sampler)

    def _sampler(self, draft: DraftRequest) -> Sampler:
        state = self._requests[draft.request_id]
        if draft.greedy:
            return Sampler(0.0)
        if state.generator is None:
            state.generator = make_generator(draft.seed)
        return Sampler(draft.temperature, draft.top_k, draft.top_p or 1.0, state.generator)

    @staticmethod
    def _outcome(draft, result: Verification, logits, layer, final, sampler: Sampler | None = None):
        """The record of ``result``; probabilities from the (warped, when sampling) distribution of each kept row."""
        rows = [0] + result.path
        sampled = sampler is not None and not sampler.greedy
        dist = sampler.probs(logits[rows]) if sampled else logits[rows].float().softmax(-1)  # [len(path) + 1, V]
        emitted = torch.tensor(result.new_tokens)
        probs = dist.gather(-1, emitted.unsqueeze(-1)).squeeze(-1)  # [len(path) + 1]
        return VerifyOutcome(
            draft.request_id, draft.round, final, layer, float(dist[-1].max()),  # S = max softmax (EE Eq. 4)
            [n - 1 for n in result.path], result.tokens, result.bonus, probs.tolist(),
        )

    @staticmethod
    def _commit(state: _ServedRequest, tree: TokenTree, pending: list[int], final: VerifyOutcome) -> None:
        """Keep prefix + pending context + root + accepted path, compacted (as decoding.verify_step)."""
        cache = state.cache
        length = cache.length
        cache.commit(len(pending) + len(tree.tokens))
        base = length + len(pending)
        cache.keep(list(range(base)) + [base] + [base + n + 1 for n in final.accepted_nodes])
        state.tokens = state.tokens + pending + final.new_tokens
        state.last_new = final.new_tokens
        state.cloud_left = max(0, state.cloud_left - len(final.new_tokens))
        state.round += 1

    def _record(self, hypotheses: dict[int, tuple], final: VerifyOutcome, seconds: float) -> None:
        self.stats.rounds += 1
        self.stats.verify_s += seconds
        for layer, hypothesis in hypotheses.items():
            self.stats.exit_rounds[layer] += 1
            self.stats.agreed[layer] += hypothesis == final.hypothesis


def _depths(parents: list[int]) -> list[int]:
    """Depth of every node of a record's (topological) parents list; the root's children are at 1."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


# -- server: what waits for the link --------------------------------------------------------------


class OutcomeSendQueue:
    """EE Algorithm 2's queue Q_e between the verifier (producer) and the link's sender (consumer).

    Interpretation (the paper's Sender pops Q_e by confidence while the Listener keeps verifying):
    when the link is busy, outcomes pile up here and leave in this order:

    * a final outcome first (finals among themselves in arrival order); putting it drops the
      pending early outcomes of its request and round (and older rounds): the robot has no use for
      hypotheses once the final is out (Algorithm 2, line 10: Q_e.reset());
    * then early outcomes, highest confidence S first (ties: arrival order);
    * an early outcome of a round whose final was already put is dropped at once.

    Thread-safe; ``get`` blocks (with a timeout) and returns None once closed and drained.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple] = []
        self._seq = itertools.count()
        self._finished: dict[str, int] = {}  # request id -> newest round whose final was put
        self._closed = False
        self.dropped = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap)

    def put(self, outcome: VerifyOutcome) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("put on a closed OutcomeSendQueue")
            done = self._finished.get(outcome.request_id, -1)
            if outcome.final:
                self._finished[outcome.request_id] = max(done, outcome.round)
                kept = [e for e in self._heap if not self._obsolete(e[-1], outcome.request_id, outcome.round)]
                self.dropped += len(self._heap) - len(kept)
                self._heap = kept
                heapq.heapify(self._heap)
                heapq.heappush(self._heap, (0, 0.0, next(self._seq), outcome))
            elif outcome.round <= done:
                self.dropped += 1
                return
            else:
                heapq.heappush(self._heap, (1, -outcome.confidence, next(self._seq), outcome))
            self._cond.notify()

    @staticmethod
    def _obsolete(pending: VerifyOutcome, request_id: str, round: int) -> bool:
        return not pending.final and pending.request_id == request_id and pending.round <= round

    def get(self, timeout: float | None = None) -> VerifyOutcome | None:
        """The next outcome to send; None on timeout or once closed and empty."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._heap or self._closed, timeout):
                return None
            return heapq.heappop(self._heap)[-1] if self._heap else None

    def forget(self, request_id: str) -> None:
        """Drop a finished request's bookkeeping and anything of it still pending."""
        with self._cond:
            kept = [e for e in self._heap if e[-1].request_id != request_id]
            self.dropped += len(self._heap) - len(kept)
            self._heap = kept
            heapq.heapify(self._heap)
            self._finished.pop(request_id, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


# -- robot: the pre-draft cache -------------------------------------------------------------------

CacheKey = tuple[str, int, tuple[int, ...]]  # (request id, round r, hypothesised context after r)


@dataclass
class PreDraft:
    """A pre-drafted tree served from the cache, with where it came from and what it cost."""

    tree: TokenTree
    exit_layer: int
    confidence: float
    draft_s: float  # its drafting time
    wait_s: float  # how long the final outcome waited for it (0 if it was ready)
    ready: bool  # finished before the final outcome asked for it
    inline: bool  # still queued when asked, so drafted then (on the critical path)


@dataclass(eq=False)
class _Job:
    key: CacheKey
    context: list[int]
    spec: TreeSpec
    warp: tuple[float, int, float]  # temperature, top_k, top_p of the request's sampler
    confidence: float
    exit_layer: int
    future: Future = field(default_factory=Future)
    state: str = "queued"  # queued -> running -> done, or cancelled
    draft_s: float = 0.0
    on_ready: Callable[[CacheKey], None] | None = None


class PreDraftCache:
    """Pre-drafts keyed by (request id, round, hypothesised context), drafted on worker threads,
    highest confidence first (EE Algorithm 1's Q_p and C).

    ``workers`` threads (default: one per drafter); a drafter is used by one thread at a time
    (its KV cache is its own), and the critical-path drafts of :meth:`draft_now` borrow an idle
    one too. With more drafters than workers a miss never waits behind a pre-draft it cannot
    use (a running draft cannot be stopped).
    """

    def __init__(self, drafters: Sequence[Drafter], seed: int | None = None, workers: int | None = None) -> None:
        if not drafters:
            raise ValueError("PreDraftCache needs at least one drafter")
        workers = len(drafters) if workers is None else workers
        if not 1 <= workers <= len(drafters):
            raise ValueError(f"workers must be in 1..{len(drafters)} (the drafters), got {workers}")
        self._idle: queue.Queue = queue.Queue()
        for i, d in enumerate(drafters):
            self._idle.put((d, make_generator(None if seed is None else seed + i)))
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Job]] = []
        self._jobs: dict[CacheKey, _Job] = {}
        self._seq = itertools.count()
        self._closed = False
        self._running = 0
        self._workers = [threading.Thread(target=self._work, name=f"edge-llm-predraft-{i}", daemon=True)
                         for i in range(workers)]
        for w in self._workers:
            w.start()

    def __contains__(self, key: CacheKey) -> bool:
        with self._cond:
            return key in self._jobs

    def keys(self) -> list[CacheKey]:
        with self._cond:
            return list(self._jobs)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no pre-draft is queued or being drafted (its on_ready done too); False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._running == 0 and all(job.state != "queued" for _, _, job in self._heap), timeout)

    def schedule(self, key: CacheKey, spec: TreeSpec, sampler: Sampler, confidence: float, exit_layer: int,
                 on_ready: Callable[[CacheKey], None] | None = None) -> bool:
        """Queue a pre-draft from context ``key[2]``; False if that key is already cached.
        ``on_ready(key)`` is called on the worker thread once it is drafted (its drafter is idle
        again by then), not if it was cancelled or failed."""
        with self._cond:
            if self._closed or key in self._jobs:
                return False
            job = _Job(key, list(key[2]), spec, (sampler.temperature, sampler.top_k, sampler.top_p), confidence,
                       exit_layer, on_ready=on_ready)
            self._jobs[key] = job
            heapq.heappush(self._heap, (-confidence, next(self._seq), job))
            self._cond.notify()
            return True

    def take(self, key: CacheKey) -> PreDraft | None:
        """The pre-draft for ``key`` (removed from the cache), waiting for it if it is being drafted
        and drafting it now if it was still queued; None on a miss."""
        with self._cond:
            job = self._jobs.pop(key, None)
            if job is None:
                return None
            queued = job.state == "queued"
            if queued:
                job.state = "cancelled"
        start = time.perf_counter()
        if queued:
            tree, seconds = self.draft_now(job.context, job.spec, Sampler(*job.warp))
            return PreDraft(tree, job.exit_layer, job.confidence, seconds, seconds, False, True)
        ready = job.future.done()
        tree = job.future.result()
        return PreDraft(tree, job.exit_layer, job.confidence, job.draft_s, time.perf_counter() - start, ready, False)

    def discard(self, request_id: str, round: int | None = None) -> tuple[int, int]:
        """Forget the request's entries (of ``round`` only, if given): returns (cancelled before
        starting, already started or done — drafting spent for nothing)."""
        cancelled = started = 0
        with self._cond:
            for key in [k for k in self._jobs if k[0] == request_id and (round is None or k[1] == round)]:
                job = self._jobs.pop(key)
                if job.state == "queued":
                    job.state = "cancelled"
                    cancelled += 1
                else:
                    started += 1
        return cancelled, started

    def draft_now(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> tuple[TokenTree, float]:
        """Draft on the caller's thread with an idle drafter (waiting for one); (tree, seconds incl. waiting)."""
        start = time.perf_counter()
        drafter, generator = self._idle.get()
        try:
            warped = Sampler(sampler.temperature, sampler.top_k, sampler.top_p, generator)
            tree = draft_step(drafter, context, spec, warped)
        finally:
            self._idle.put((drafter, generator))
        return tree, time.perf_counter() - start

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._heap or self._closed)
                if self._closed:
                    return
                job = heapq.heappop(self._heap)[-1]
                if job.state != "queued":
                    continue
                job.state = "running"
                self._running += 1
            drafter, generator = self._idle.get()
            start = time.perf_counter()
            try:
                tree = draft_step(drafter, job.context, job.spec, Sampler(*job.warp, generator))
                job.draft_s = time.perf_counter() - start
                job.future.set_result(tree)
            except Exception as exc:  # surfaces in take(); the worker goes on
                job.future.set_exception(exc)
            finally:
                job.state = "done"
                self._idle.put((drafter, generator))
            try:
                if job.on_ready is not None and job.future.exception() is None:
                    job.on_ready(job.key)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for job in self._jobs.values():
                if job.state == "queued":
                    job.state = "cancelled"
            self._jobs.clear()
            self._cond.notify_all()
        for w in self._workers:
            w.join(timeout=30)


# -- robot: the drafter side -----------------------------------------------------------------------


@dataclass
class EdgeCloudStats:
    """Robot-side counters of one request (EE Appendix B's τ and miss rate r, and where drafting time went)."""

    rounds: int = 0
    new_tokens: int = 0
    accepted: list[int] = field(default_factory=list)
    hits: int = 0
    misses: int = 0
    hit_layers: list[int] = field(default_factory=list)  # exit layer whose outcome scheduled each hit
    predrafts: int = 0  # pre-drafts scheduled
    predrafts_cancelled: int = 0  # dropped before they started
    predrafts_unused: int = 0  # drafted (or being drafted) for a hypothesis the final did not confirm
    sent_ahead: int = 0  # hits whose draft had gone to the verifier before the final arrived
    hidden_draft_s: float = 0.0  # drafting done off the critical path and used
    critical_draft_s: float = 0.0  # drafting (and waiting for pre-drafts) between a final outcome and the next draft
    verify_s: float = 0.0  # the verifier's own time for the finals (VerifyResult.verify_time_s)
    ignored: Counter = field(default_factory=Counter)  # outcomes ignored: stale, duplicate, invalid, error
    finish_reason: str = ""

    @property
    def tau(self) -> float:
        """Tokens per verification round (accepted + 1)."""
        return (sum(self.accepted) + len(self.accepted)) / len(self.accepted) if self.accepted else 0.0

    @property
    def miss_rate(self) -> float:
        """r: misses / cache lookups (every round after the first)."""
        lookups = self.hits + self.misses
        return self.misses / lookups if lookups else 0.0

    @property
    def mean_hit_layer(self) -> float:
        return sum(self.hit_layers) / len(self.hit_layers) if self.hit_layers else float("nan")

    def as_dict(self) -> dict:
        out = {k: dict(v) if isinstance(v, Counter) else v for k, v in vars(self).items()}
        out.update(tau=self.tau, miss_rate=self.miss_rate, mean_hit_layer=self.mean_hit_layer)
        return out


@dataclass
class FinalStep:
    """What a final outcome did: the tokens it committed and the next round's draft to send. No
    draft and no ``finish_reason``: the next round is already with the verifier (a draft sent
    ahead, or cloud decoding); wait for its final."""

    round: int
    tokens: list[int]
    draft: DraftRequest | None
    hit: bool | None  # None when no next draft was needed
    finish_reason: str = ""


@dataclass
class _Robot:
    """One request on the robot side."""

    config: GenerationConfig
    spec: TreeSpec | None
    prompt_len: int
    context: list[int]
    limit: int
    window: int
    eos: set[int]
    stops: StopStrings
    sampler: Sampler
    early_exits: bool = True
    send_ahead: bool = False
    round: int = 0  # the round of the draft in flight
    tree: TokenTree | None = None  # the draft in flight
    exits_seen: set[int] = field(default_factory=set)
    ahead: dict[tuple[int, ...], PreDraft] = field(default_factory=dict)  # context -> next round's draft, sent
    early_next: list[VerifyOutcome] = field(default_factory=list)  # next round's early outcomes, held
    stats: EdgeCloudStats = field(default_factory=EdgeCloudStats)

    @property
    def cloud(self) -> bool:
        return self.spec is None

    @property
    def generated(self) -> list[int]:
        return self.context[self.prompt_len :]

    def spec_for(self, context: list[int]) -> TreeSpec | None:
        """This round's draft budget for ``context`` (a function of the context alone, so a
        pre-draft and a draft made now from the same context have the same shape)."""
        room = min(self.limit - (len(context) - self.prompt_len), self.window - len(context))
        return self.spec.capped(room) if self.spec is not None else None

    def extend(self, context: list[int], new_tokens: list[int]) -> tuple[list[int], list[int], str]:
        """(context after committing ``new_tokens``, the tokens kept, finish reason) — cut at EOS,
        stop strings and the length limit as decoding._stream does."""
        context, kept, reason = list(context), [], ""
        for token in new_tokens:
            if len(context) - self.prompt_len >= self.limit:
                break
            context.append(token)
            kept.append(token)
            reason = finish_reason(context[self.prompt_len :], self.limit, self.eos, self.stops)
            if reason:
                break
        return context, kept, reason


EDGE_MODES: dict[str, tuple[str, bool, bool]] = {
    # name: (what the robot drafts: a GenerationConfig mode, early exits, pre-drafts sent ahead)
    "ar": ("ar", False, False),  # cloud autoregressive: the prompt goes up, the verifier generates every token
    "sd": ("sd", False, False),  # edge-cloud SD: a chain of γ per round, final outcomes only
    "tree": ("tree", False, False),  # edge-cloud SD with a token tree
    "fsd": ("sd", True, False),  # EE's fast SD (Algorithm 1): pre-draft from early outcomes, serve on the final
    "ee": ("sd", True, True),  # fsd, and a finished pre-draft goes to the verifier before the final arrives
}


class EarlyExitDrafter:
    """The robot side (EE Algorithm 1): request state, pre-drafting from early outcomes, the next
    draft on each final outcome.

    A node calls ``start(request_id, prompt_ids, config)`` and sends the returned round-0 draft;
    hands every received outcome to ``on_outcome`` (early ones return None; a final one returns a
    :class:`FinalStep` whose ``draft`` goes out next); ``end(request_id)`` when done.
    ``drafters``: any core Drafters drafting from tokens alone; ``workers`` of them pre-draft on
    threads of their own (default: all), the others serve misses at once.
    Outcomes of another round or request, duplicates, malformed ones and early outcomes overtaken
    by their final are ignored and counted in ``stats(request_id).ignored``.

    Within a round early outcomes may arrive in any order (the server's queue sends the most
    confident first); each distinct hypothesis is pre-drafted once. ``Drafter.update`` is not
    called: pre-drafts of round r + 1 start before round r's final exists.

    ``config.mode`` ``ar`` is cloud decoding (no draft). ``send_ahead`` (needs ``sender``): a
    pre-draft finished before its round's final goes to the verifier at once, through
    ``sender(draft)`` on the worker thread, marked speculative; if the final confirms its
    hypothesis the verifier is already verifying it (the round trip and the drafting leave the
    critical path), otherwise the verifier drops it and the robot drafts as on a miss.
    """

    def __init__(self, drafters: Drafter | Sequence[Drafter], *, max_requests: int = 8, seed: int | None = None,
                 sender: Callable[[DraftRequest], None] | None = None, workers: int | None = None):
        drafters = list(drafters) if isinstance(drafters, (list, tuple)) else [drafters]
        for d in drafters:
            if getattr(d, "observe", None) is not None:
                raise ValueError(f"{type(d).__name__} drafts from the target's features, which stay on the server")
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        self.drafters, self.max_requests, self.sender = drafters, max_requests, sender
        self.cache = PreDraftCache(drafters, seed, workers)
        self.unknown_outcomes = 0  # outcomes for requests not (or no longer) active
        self._requests: dict[str, _Robot] = {}
        self._lock = threading.RLock()

    @property
    def requests(self) -> list[str]:
        return list(self._requests)

    def stats(self, request_id: str) -> EdgeCloudStats:
        return self._requests[request_id].stats

    # -- requests ---------------------------------------------------------------------------------

    def start(self, request_id: str, prompt_ids: Sequence[int], config: GenerationConfig, *,
              early_exits: bool = True, send_ahead: bool = False) -> DraftRequest:
        """Register a request and draft round 0 (on the caller's thread): the DraftRequest to send.
        ``early_exits`` false: plain edge-cloud SD (the verifier sends finals only)."""
        if config.mode not in ("ar", "sd", "tree", "llmcad"):
            raise ValueError(f"edge-cloud decoding needs mode ar, sd, tree or llmcad, got {config.mode!r}")
        cloud = config.mode == "ar"
        early_exits, send_ahead = early_exits and not cloud, send_ahead and early_exits and not cloud
        if send_ahead and self.sender is None:
            raise ValueError("send_ahead needs a sender (EarlyExitDrafter(..., sender=...))")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt is empty: give at least one token")
        vocab = getattr(self.drafters[0], "vocab_size", None)
        if vocab is not None and (min(prompt) < 0 or max(prompt) >= vocab):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        with self._lock:
            if request_id in self._requests:
                raise ValueError(f"request {request_id!r} is already active; end it first")
            if len(self._requests) >= self.max_requests:
                raise RequestLimitError(f"drafting {len(self._requests)} requests (max_requests="
                                        f"{self.max_requests}); end one with end(request_id)")
            window = min(getattr(d, "max_context", None) or 1 << 30 for d in self.drafters)
            if len(prompt) >= window:
                raise ValueError(f"prompt has {len(prompt)} tokens but the context window is {window}")
            tokenizer = getattr(self.drafters[0], "tokenizer", None)
            if config.stop_strings and tokenizer is None:
                raise ValueError("stop_strings need a tokenizer on the drafter")
            eos = set(config.eos_token_ids) if config.eos_token_ids is not None else _eos(tokenizer)
            state = _Robot(config, config.tree_spec(), len(prompt), prompt, min(config.max_new_tokens,
                           window - len(prompt)), window, eos, StopStrings(tokenizer, config.stop_strings),
                           Sampler(config.temperature, config.top_k, config.top_p), early_exits, send_ahead)
            self._requests[request_id] = state
            if cloud:
                return self._send(request_id, state, TokenTree.from_root(prompt[-1]), context_ids=prompt,
                                  cloud_tokens=state.limit)
            tree, seconds = self.cache.draft_now(prompt, state.spec_for(prompt), state.sampler)
            state.stats.critical_draft_s += seconds
            return self._send(request_id, state, tree, context_ids=prompt)

    def end(self, request_id: str) -> EdgeCloudStats | None:
        """Forget a request (its pending pre-drafts too); returns its stats, None if unknown."""
        with self._lock:
            state = self._requests.pop(request_id, None)
            self.cache.discard(request_id)
            return None if state is None else state.stats

    def close(self) -> None:
        self.cache.close()

    # -- outcomes ---------------------------------------------------------------------------------

    def on_outcome(self, outcome: VerifyOutcome) -> FinalStep | None:
        """The Receiver: an early outcome schedules a pre-draft (None), a final one gives the next step."""
        if outcome.final:
            return self.on_final(outcome)
        self.on_early(outcome)
        return None

    def on_early(self, outcome: VerifyOutcome) -> bool:
        """Pre-draft from the context this early outcome hypothesises; False if it was ignored."""
        with self._lock:
            state = self._requests.get(outcome.request_id)
            if state is not None and state.ahead and outcome.round == state.round + 1:
                state.early_next.append(outcome)  # of a draft sent ahead: its final is not here yet
                return True
            state = self._current(outcome)
            if state is None:
                return False
            stats = state.stats
            if outcome.error:
                stats.ignored["error"] += 1
                return False
            if outcome.exit_layer in state.exits_seen:
                stats.ignored["duplicate"] += 1
                return False
            if not _valid_path(state.tree, outcome):
                stats.ignored["invalid"] += 1
                return False
            state.exits_seen.add(outcome.exit_layer)
            context, kept, reason = state.extend(state.context, outcome.new_tokens)
            if reason or len(kept) < len(outcome.new_tokens):
                return True  # this hypothesis ends the request: nothing to pre-draft
            key = (outcome.request_id, outcome.round, tuple(context))
            if not self.cache.schedule(key, state.spec_for(context), state.sampler, outcome.confidence,
                                       outcome.exit_layer, self._send_ahead if state.send_ahead else None):
                stats.ignored["duplicate"] += 1  # an earlier exit already hypothesised this context
                return False
            stats.predrafts += 1
            return True

    def on_final(self, outcome: VerifyOutcome) -> FinalStep | None:
        """Commit the final outcome of the round in flight; serve the next draft from the cache
        (hit) or draft it now (miss). None if the outcome was ignored (stale round, unknown request).
        Raises DraftRejectedError if the verifier rejected the draft, ValueError if the outcome
        does not fit the draft sent."""
        with self._lock:
            state = self._current(outcome)
            if state is None:
                return None
            if outcome.error:
                raise DraftRejectedError(f"request {outcome.request_id!r} round {outcome.round}: {outcome.error}")
            if not _valid_path(state.tree, outcome):
                raise ValueError(f"final outcome of request {outcome.request_id!r} round {outcome.round} does not "
                                 f"fit the draft sent (accepted_nodes {outcome.accepted_nodes}, accepted_ids "
                                 f"{outcome.accepted_ids})")
            stats, rid = state.stats, outcome.request_id
            state.context, kept, reason = state.extend(state.context, outcome.new_tokens)
            stats.rounds += 1
            stats.accepted.append(len(outcome.accepted_ids))
            stats.new_tokens = len(state.generated)
            stats.verify_s += outcome.verify_time_s
            ahead, early_next = state.ahead.pop(tuple(state.context), None), state.early_next
            stats.predrafts_unused += len(state.ahead)  # sent ahead for hypotheses the final did not confirm
            state.ahead, state.early_next = {}, []
            if not reason and len(state.generated) >= state.limit:
                reason = "length"
            if reason:
                stats.finish_reason = reason
                self._count_unused(stats, *self.cache.discard(rid))
                state.tree = None
                return FinalStep(outcome.round, kept, None, None, reason)
            if state.cloud:  # the verifier goes on by itself
                state.round += 1
                state.tree = TokenTree.from_root(state.context[-1])
                return FinalStep(outcome.round, kept, None, None)
            if ahead is not None:  # hit, and the verifier already has the draft
                self._count_unused(stats, *self.cache.discard(rid, outcome.round))
                self._hit(stats, ahead)
                stats.sent_ahead += 1
                state.round += 1
                state.tree, state.exits_seen = ahead.tree, set()
                for early in early_next:
                    self.on_early(early)
                return FinalStep(outcome.round, kept, None, True)
            pre = self.cache.take((rid, outcome.round, tuple(state.context)))
            self._count_unused(stats, *self.cache.discard(rid, outcome.round))
            if pre is not None:  # hit
                self._hit(stats, pre)
                tree = pre.tree
            else:  # miss (plain SD has no pre-draft cache: nothing to count)
                stats.misses += state.early_exits
                tree, seconds = self.cache.draft_now(state.context, state.spec_for(state.context), state.sampler)
                stats.critical_draft_s += seconds
            state.round += 1
            return FinalStep(outcome.round, kept, self._send(rid, state, tree), pre is not None)

    def _send_ahead(self, key: CacheKey) -> None:
        """A pre-draft is ready (worker thread): if its round's final has not come, send it now."""
        rid, round_, context = key
        with self._lock:
            state = self._requests.get(rid)
            if state is None or state.round != round_ or state.tree is None or key not in self.cache:
                return
            pre = self.cache.take(key)  # drafted: returns at once
            state.ahead[context] = pre
            assumed = list(context[len(state.context):])
            draft = DraftRequest.from_tree(rid, round_ + 1, pre.tree, len(context), (), state.config)
            draft = dataclasses.replace(draft, early_exits=state.early_exits, speculative=True, assumed_ids=assumed)
        self.sender(draft)

    # -- helpers ----------------------------------------------------------------------------------

    def _current(self, outcome: VerifyOutcome) -> _Robot | None:
        """The request if ``outcome`` belongs to its round in flight; otherwise count why not."""
        state = self._requests.get(outcome.request_id)
        if state is None:
            self.unknown_outcomes += 1
            return None
        if outcome.round != state.round or state.tree is None:
            state.stats.ignored["stale"] += 1  # an earlier round, a duplicate final, or overtaken by its final
            return None
        return state

    def _send(self, request_id: str, state: _Robot, tree: TokenTree, context_ids: list[int] = (),
              cloud_tokens: int = 0) -> DraftRequest:
        state.tree, state.exits_seen = tree, set()
        draft = DraftRequest.from_tree(request_id, state.round, tree, len(state.context), context_ids, state.config)
        return dataclasses.replace(draft, early_exits=state.early_exits, cloud_tokens=cloud_tokens)

    @staticmethod
    def _hit(stats: EdgeCloudStats, pre: PreDraft) -> None:
        stats.hits += 1
        stats.hit_layers.append(pre.exit_layer)
        stats.critical_draft_s += pre.wait_s
        stats.hidden_draft_s += 0.0 if pre.inline else max(0.0, pre.draft_s - pre.wait_s)

    @staticmethod
    def _count_unused(stats: EdgeCloudStats, cancelled: int, started: int) -> None:
        stats.predrafts_cancelled += cancelled
        stats.predrafts_unused += started


def _eos(tokenizer) -> set[int]:
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def _valid_path(tree: TokenTree | None, outcome: VerifyOutcome) -> bool:
    """accepted_nodes walk down ``tree`` from the root and accepted_ids are their tokens."""
    if tree is None or len(outcome.accepted_nodes) != len(outcome.accepted_ids) or outcome.next_token < 0:
        return False
    node = 0
    for index, token in zip(outcome.accepted_nodes, outcome.accepted_ids):
        child = index + 1
        if not 0 < child < len(tree.tokens) or tree.parents[child] != node or tree.tokens[child] != token:
            return False
        node = child
    return True


# -- one process, both halves: tests and the bench ---------------------------------------------------

Deliver = Callable[[VerifyOutcome], None]
Link = Callable[[VerifyOutcome, Deliver], None]  # link(outcome, deliver): deliver now or later, any thread


def direct_link(outcome: VerifyOutcome, deliver: Deliver) -> None:
    """The ideal link: every outcome arrives the moment it is sent."""
    deliver(outcome)


@dataclass
class EdgeCloudResult:
    tokens: list[int]
    stats: EdgeCloudStats
    wall_s: float


def stream_edge_cloud(
    verifier: EarlyExitVerifier,
    drafter: EarlyExitDrafter,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    *,
    request_id: str = "ee-0",
    link: Link = direct_link,
    timeout_s: float = 120.0,
    stats_out: list | None = None,
    early_exits: bool = True,
    send_ahead: bool = False,
) -> Iterator[int]:
    """Stream one request through both halves: the robot drafts, the server verifies and streams
    outcomes through ``link`` (early and final) to the robot's receiver, which pre-drafts from
    early ones; each final outcome yields its tokens and releases the next draft.
    ``stats_out`` (a list) receives the request's EdgeCloudStats when the stream ends.
    ``early_exits`` / ``send_ahead``: as :meth:`EarlyExitDrafter.start` (``config.mode`` ``ar``:
    cloud decoding); drafts sent ahead go up the same in-order uplink."""
    inbox: queue.Queue = queue.Queue()
    to_server: collections.deque[DraftRequest] = collections.deque()  # the uplink, in order

    def receive(outcome: VerifyOutcome) -> None:  # the robot's Receiver (Algorithm 1)
        if outcome.final:
            inbox.put(outcome)
        else:
            drafter.on_early(outcome)

    sender, drafter.sender = drafter.sender, to_server.append  # this loop is the uplink while it runs
    try:
        to_server.append(drafter.start(request_id, prompt_ids, config, early_exits=early_exits, send_ahead=send_ahead))
        while True:
            while to_server:  # the server: verify what came up, in order
                draft = to_server.popleft()
                try:
                    for outcome in verifier.verify(draft):
                        link(outcome, receive)
                except SpeculationMissed:
                    continue
                follow = verifier.follow_up(draft.request_id)
                if follow is not None:
                    to_server.append(follow)
            step = None
            while step is None:  # a stale or duplicated final is ignored; wait for this round's
                try:
                    final = inbox.get(timeout=timeout_s)
                except queue.Empty:
                    raise TimeoutError(f"no final outcome for {request_id!r} within {timeout_s} s") from None
                step = drafter.on_final(final)
            yield from step.tokens
            if step.finish_reason:
                break
            if step.draft is not None:
                to_server.append(step.draft)
    finally:
        stats = drafter.end(request_id)
        drafter.sender = sender
        verifier.end(request_id)
        if stats_out is not None and stats is not None:
            stats_out.append(stats)


def run_edge_cloud(
    verifier: EarlyExitVerifier,
    drafter: EarlyExitDrafter,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    **kwargs,
) -> EdgeCloudResult:
    """Blocking wrapper of :func:`stream_edge_cloud`: every token, the robot's stats, wall time."""
    start, out = time.perf_counter(), []
    tokens = list(stream_edge_cloud(verifier, drafter, prompt_ids, config, stats_out=out, **kwargs))
    return EdgeCloudResult(tokens, out[0], time.perf_counter() - start)


# -- EE Appendix B ----------------------------------------------------------------------------------


def projected_speedup(gamma: float, c: float, miss_rate: float) -> float:
    """EE Appendix B, Eq. 9 (no communication latency, no thread overhead), speedup over vanilla SD:

        speedup = (γ c + 1) / (r γ c + 1)       c = T_p / T_q (draft / target forward time), r = miss rate

    A hit hides the γ draft passes (γ c target-pass units) behind the verification; a miss pays them.
    """
    if gamma < 1 or c < 0 or not 0.0 <= miss_rate <= 1.0:
        raise ValueError(f"need gamma >= 1, c >= 0 and 0 <= miss_rate <= 1, got {gamma}, {c}, {miss_rate}")
    return (gamma * c + 1) / (miss_rate * gamma * c + 1)
