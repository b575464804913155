"""The robot side (EE Algorithm 1): request state, pre-drafting from early outcomes, the next draft
on each final outcome. Every received outcome is checked against the draft it answers; stale,
duplicated and malformed ones are ignored and counted, never applied. Knows nothing about ROS."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..engine.config import GenerationConfig, mean_tau
from ..engine.constraint import TokenGrammar
from ..engine.decoding import StopStrings, eos_ids, finish_reason
from ..engine.drafters import Drafter, TreeSpec
from ..engine.sampling import Sampler
from ..engine.tree import TokenTree
from .predraft import CacheKey, PreDraft, PreDraftCache
from .records import MAX_TOPK, PROPOSAL_TOP_K, DraftRejectedError, DraftRequest, RequestLimitError, VerifyOutcome


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
        return mean_tau(self.accepted)

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
    eos: tuple[int, ...]
    stops: StopStrings
    sampler: Sampler
    cache: PreDraftCache  # the drafter's shared cache, or the request's own (a drafter of its own)
    early_exits: bool = True
    send_ahead: bool = False
    grammar: TokenGrammar | None = None
    task: str = ""
    image_features: list[float] = field(default_factory=list)
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
        if self.spec is None:
            return None
        allowed = self.grammar.bind(context[self.prompt_len:]) if self.grammar is not None else None
        return self.spec.capped(room).constrained(allowed)

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

    Sampled requests draft from the request's warps with top-k capped at ``proposal_top_k``
    (default :data:`PROPOSAL_TOP_K`), so every proposal fits on the wire exactly.

    ``config.mode`` ``ar`` is cloud decoding (no draft). ``send_ahead`` (needs ``sender``): a
    pre-draft finished before its round's final goes to the verifier at once, through
    ``sender(draft)`` on the worker thread, marked speculative; if the final confirms its
    hypothesis the verifier is already verifying it (the round trip and the drafting leave the
    critical path), otherwise the verifier drops it and the robot drafts as on a miss.
    """

    def __init__(self, drafters: Drafter | Sequence[Drafter], *, max_requests: int = 8, seed: int | None = None,
                 sender: Callable[[DraftRequest], None] | None = None, workers: int | None = None,
                 proposal_top_k: int = PROPOSAL_TOP_K):
        drafters = list(drafters) if isinstance(drafters, (list, tuple)) else [drafters]
        if not 1 <= proposal_top_k <= MAX_TOPK:
            raise ValueError(f"proposal_top_k must be in [1, {MAX_TOPK}], got {proposal_top_k}")
        self.proposal_top_k = proposal_top_k
        for d in drafters:
            if d.needs_features:
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
              early_exits: bool = True, send_ahead: bool = False, own_drafters: Sequence[Drafter] = (),
              grammar: TokenGrammar | None = None, task: str = "",
              image_features: Sequence[float] = ()) -> DraftRequest:
        """Register a request and draft round 0 (on the caller's thread): the DraftRequest to send.
        ``early_exits`` false: plain edge-cloud SD (the verifier sends finals only).

        ``own_drafters``: this request's drafters (e.g. conditioned on its image), with a pre-draft
        worker of its own (on the second, if given: then a miss never waits behind a pre-draft);
        else the shared ones. ``grammar`` masks every draft (the verifier's ``task`` is
        constrained to the same grammar); ``task`` and ``image_features`` go up with round 0
        (DraftRequest.task)."""
        if config.mode not in ("ar", "sd", "tree", "llmcad"):
            raise ValueError(f"edge-cloud decoding needs mode ar, sd, tree or llmcad, got {config.mode!r}")
        cloud = config.mode == "ar"
        early_exits, send_ahead = early_exits and not cloud, send_ahead and early_exits and not cloud
        if send_ahead and self.sender is None:
            raise ValueError("send_ahead needs a sender (EarlyExitDrafter(..., sender=...))")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt is empty: give at least one token")
        drafters = list(own_drafters) or self.drafters
        vocab = drafters[0].vocab_size
        if vocab is not None and (min(prompt) < 0 or max(prompt) >= vocab):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        with self._lock:
            if request_id in self._requests:
                raise ValueError(f"request {request_id!r} is already active; end it first")
            if len(self._requests) >= self.max_requests:
                raise RequestLimitError(f"drafting {len(self._requests)} requests (max_requests="
                                        f"{self.max_requests}); end one with end(request_id)")
            window = min(d.max_context or 1 << 30 for d in drafters)
            if len(prompt) >= window:
                raise ValueError(f"prompt has {len(prompt)} tokens but the context window is {window}")
            tokenizer = drafters[0].tokenizer
            if config.stop_strings and tokenizer is None:
                raise ValueError("stop_strings need a tokenizer on the drafter")
            eos = eos_ids(drafters[0], config)
            cache = self.cache if not own_drafters else PreDraftCache(drafters, self.cache.seed, 1)
            state = _Robot(config, config.tree_spec(), len(prompt), prompt, min(config.max_new_tokens,
                           window - len(prompt)), window, eos, StopStrings(tokenizer, config.stop_strings),
                           self._proposal_sampler(config), cache, early_exits, send_ahead, grammar, task,
                           [float(v) for v in image_features])
            self._requests[request_id] = state
            if cloud:
                return self._send(request_id, state, TokenTree.from_root(prompt[-1]), context_ids=prompt,
                                  cloud_tokens=state.limit)
            tree, seconds = state.cache.draft_now(prompt, state.spec_for(prompt), state.sampler)
            state.stats.critical_draft_s += seconds
            return self._send(request_id, state, tree, context_ids=prompt)

    def _proposal_sampler(self, config: GenerationConfig) -> Sampler:
        """What the robot samples drafts from: the request's warps, its top-k capped at
        ``proposal_top_k``. Rejection sampling is exact for any proposal q the verifier knows
        (Leviathan et al. Thm 3.5 holds for every q), and a sampled draft puts q on the wire as
        top-k rows, so q must have a small support: the target's warps (the request's own top_k,
        top_p) stay as asked, only the draft's proposal is truncated."""
        cap = min(config.top_k, self.proposal_top_k) if config.top_k else self.proposal_top_k
        return Sampler(config.temperature, cap, config.top_p)

    def end(self, request_id: str) -> EdgeCloudStats | None:
        """Forget a request (its pending pre-drafts too); returns its stats, None if unknown."""
        with self._lock:
            state = self._requests.pop(request_id, None)
            self.cache.discard(request_id)
        if state is not None and state.cache is not self.cache:
            state.cache.close()  # outside the lock: its worker may be sending a draft ahead
        return None if state is None else state.stats

    def close(self) -> None:
        for request_id in list(self._requests):
            self.end(request_id)
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
            if not state.cache.schedule(key, state.spec_for(context), state.sampler, outcome.confidence,
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
                raise DraftRejectedError(f"request {outcome.request_id!r} round {outcome.round}: {outcome.error}",
                                         outcome.status)
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
                self._count_unused(stats, *state.cache.discard(rid))
                state.tree = None
                return FinalStep(outcome.round, kept, None, None, reason)
            if state.cloud:  # the verifier goes on by itself
                state.round += 1
                state.tree = TokenTree.from_root(state.context[-1])
                return FinalStep(outcome.round, kept, None, None)
            if ahead is not None:  # hit, and the verifier already has the draft
                self._count_unused(stats, *state.cache.discard(rid, outcome.round))
                self._hit(stats, ahead)
                stats.sent_ahead += 1
                state.round += 1
                state.tree, state.exits_seen = ahead.tree, set()
                for early in early_next:
                    self.on_early(early)
                return FinalStep(outcome.round, kept, None, True)
            pre = state.cache.take((rid, outcome.round, tuple(state.context)))
            self._count_unused(stats, *state.cache.discard(rid, outcome.round))
            if pre is not None:  # hit
                self._hit(stats, pre)
                tree = pre.tree
            else:  # miss (plain SD has no pre-draft cache: nothing to count)
                stats.misses += state.early_exits
                tree, seconds = state.cache.draft_now(state.context, state.spec_for(state.context), state.sampler)
                stats.critical_draft_s += seconds
            state.round += 1
            return FinalStep(outcome.round, kept, self._send(rid, state, tree), pre is not None)

    def _send_ahead(self, key: CacheKey) -> None:
        """A pre-draft is ready (worker thread): if its round's final has not come, send it now."""
        rid, round_, context = key
        with self._lock:
            state = self._requests.get(rid)
            if state is None or state.round != round_ or state.tree is None or key not in state.cache:
                return
            pre = state.cache.take(key)  # drafted: returns at once
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
        first = {"task": state.task, "image_features": state.image_features} if state.round == 0 else {}
        return dataclasses.replace(draft, early_exits=state.early_exits, cloud_tokens=cloud_tokens, **first)

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


def robot_rounds(drafter: EarlyExitDrafter, request_id: str, prompt_ids: Sequence[int], config: GenerationConfig,
                 *, send: Callable[[DraftRequest], None], await_final: Callable[[], VerifyOutcome],
                 early_exits: bool = True, send_ahead: bool = False,
                 **start) -> Iterator[tuple[FinalStep, VerifyOutcome]]:
    """The robot's side of one request (EE Algorithm 1), whatever carries the messages: start it,
    ``send`` each round's draft, take finals from ``await_final()`` (which returns the next one, or
    raises when none comes) until one commits this round, and yield (step, its final outcome) for
    each round until one finishes. Stale and duplicated finals are ignored (the drafter returns no
    step for them). The caller ends the request (``drafter.end``) when it is done with it.
    ``start``: the rest of :meth:`EarlyExitDrafter.start`'s keywords (own_drafters, grammar, task, image_features)."""
    draft = drafter.start(request_id, prompt_ids, config, early_exits=early_exits, send_ahead=send_ahead, **start)
    while True:
        if draft is not None:
            send(draft)
        step = final = None
        while step is None:
            final = await_final()
            step = drafter.on_final(final)
        yield step, final
        if step.finish_reason:
            return
        draft = step.draft
