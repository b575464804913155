"""The server side (EE Algorithm 2): the target, its early exits and one KV cache per request.

Contract: :class:`EarlyExitVerifier` takes DraftRequests and yields VerifyOutcomes (early ones as
each exit is reached, the final one last); it holds at most ``max_requests`` requests and never
evicts one to make room: a newcomer beyond that is refused as busy (:class:`RequestLimitError`).
A request of a :class:`VerifierTask` (DraftRequest.task) is verified with that task's model,
conditioned on the image its round 0 carries, and constrained to the task's grammar.

Knows nothing about ROS.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ..drafts.exits import ExitSet
from ..engine.constraint import TokenGrammar, constrain
from ..engine.decoding import prefill, tree_allowed
from ..engine.kv_cache import KVCache
from ..engine.models import TorchCausalLM, causal_mask
from ..engine.sampling import Sampler, make_generator
from ..engine.tree import TokenTree, Verification
from ..engine.verifier import verify, verify_greedy
from .records import DraftError, DraftRequest, RequestLimitError, SpeculationMissed, VerifyOutcome, _check_ids, _ints


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


@dataclass(frozen=True)
class VerifierTask:
    """A kind of request the verifier serves with a model of its own (DraftRequest.task names it).

    ``model``: a view of the verifier's target (the same layers; e.g. an adapter's LoRA merged and
    a vocabulary view). ``grammar``: constrains every row verified, at exits too (None: free
    text); the robot masks its draft alike, so the output is the constrained model's.
    ``condition(model, image_features)``: the request's view, conditioned on the image its round 0
    carries; raises ValueError for features it cannot read (None: the task reads no image).
    ``example``: a round 0 of the task that :meth:`EarlyExitVerifier.warm_up` verifies once, so
    that torch's slow first passes through the task's model are not a robot's first request.
    ``exits``: the task's own early exits, trained on its model (every exit layer the verifier
    uses; None: the verifier's, trained on the plain target)."""

    model: TorchCausalLM
    grammar: TokenGrammar | None = None
    condition: Callable[[TorchCausalLM, list[float]], TorchCausalLM] | None = None
    example: DraftRequest | None = None
    exits: ExitSet | None = None


@dataclass
class _ServedRequest:
    tokens: list[int]  # committed tokens; all but the last (the next root) are in the cache
    cache: KVCache
    model: TorchCausalLM  # the target, or its task's view conditioned on the request's image
    prompt_len: int = 0
    grammar: TokenGrammar | None = None
    exits: ExitSet | None = None  # the task's own, else the verifier's
    round: int = 0  # the round expected next
    generator: torch.Generator | None = None  # sampled verification, seeded by the first sampled draft
    busy: bool = False
    last_new: list[int] = field(default_factory=list)  # what the last round committed
    cloud: DraftRequest | None = None  # cloud autoregressive: the round-0 request (its sampling fields)
    cloud_left: int = 0  # tokens the verifier still generates by itself
    followed: int = -1  # the round whose follow-up was last given out (one per round)
    last_used: float = field(default_factory=time.monotonic)  # when its last round ended (or it started)
    answered: tuple[DraftRequest, VerifyOutcome] | None = None  # the last round verified, and its final outcome


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

    Admission: at most ``max_requests`` requests at once. A live request is never evicted to make
    room; a newcomer beyond that is refused as busy (:class:`RequestLimitError`, message starting
    "busy:"). A request whose robot vanished without a release is ended by :meth:`expire_idle`
    once it has been idle (no round verified) longer than the node's idle timeout.

    Cloud requests (``cloud_tokens``): after each round, :meth:`follow_up` gives the next round's
    (empty) draft until the tokens are generated or one of ``eos_ids`` came; the node queues it
    behind other requests' drafts. Speculative drafts that assumed another result raise
    :class:`SpeculationMissed` (drop them; no answer).

    ``tasks``: the named :class:`VerifierTask` s served besides the plain target (task '').

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
        tasks: Mapping[str, VerifierTask] | None = None,
    ) -> None:
        if not target.exposes_layers:
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
        self.min_confidence, self.max_requests = min_confidence, max_requests
        self.final_layer = last
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.tasks = dict(tasks or {})
        for name, task in self.tasks.items():
            if not name or task.model.layer_ids != target.layer_ids:
                raise ValueError(f"task {name!r}: a task has a name and a view of the target's layers "
                                 f"{list(target.layer_ids)}")
            lacking = [layer for layer in chosen if task.exits is not None and layer not in task.exits.layers]
            if lacking:
                raise ValueError(f"task {name!r}: its exits have no exit at layers {lacking} (they are at "
                                 f"{list(task.exits.layers)}; the verifier exits at {list(chosen)})")
        self.stats = VerifierStats()
        self._requests: dict[str, _ServedRequest] = {}

    # -- requests ---------------------------------------------------------------------------------

    @property
    def requests(self) -> list[str]:
        return list(self._requests)

    def start(self, request_id: str, prompt_ids: Sequence[int], task: str = "",
              image_features: Sequence[float] = ()) -> None:
        """Prefill the prompt (all but its last token, the first round's root) into a new cache,
        with ``task``'s model conditioned on ``image_features`` (DraftError naming the field)."""
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
            raise RequestLimitError(f"busy: the verifier is serving {len(self._requests)} of max_requests="
                                    f"{self.max_requests} requests; retry when one ends")
        model, task_of = self._model(task, image_features)
        cache = model.new_cache(len(prompt) + 64)
        with torch.inference_mode():
            prefill(model, cache, prompt)
        exits = task_of.exits if task_of is not None and task_of.exits is not None else self.exits
        self._requests[request_id] = _ServedRequest(prompt, cache, model, len(prompt),
                                                    task_of.grammar if task_of is not None else None, exits=exits)

    def _model(self, name: str, image_features: Sequence[float]) -> tuple[TorchCausalLM, VerifierTask | None]:
        """The request's model (conditioned on its image) and its task (None: the plain target)."""
        if not name:
            if image_features:
                raise DraftError("image_features", "an image needs a task that reads it (task is empty)")
            return self.target, None
        task = self.tasks.get(name)
        if task is None:
            served = ", ".join(repr(t) for t in self.tasks) or "none"
            raise DraftError("task", f"this verifier serves no task {name!r} (tasks: {served})")
        if task.condition is None:
            if image_features:
                raise DraftError("image_features", f"task {name!r} reads no image")
            return task.model, task
        if not image_features:
            raise DraftError("image_features", f"task {name!r} needs the frame's image features in round 0")
        try:
            return task.condition(task.model, list(image_features)), task
        except ValueError as exc:
            raise DraftError("image_features", str(exc)) from None

    def warm_up(self) -> float:
        """Make each task's grammar masks and verify its example round once (then forget it): the
        seconds it took."""
        start = time.perf_counter()
        for name, task in self.tasks.items():
            if task.grammar is not None:
                task.grammar.warm()
            if task.example is not None:
                request_id = f"warm-up-{name}"
                self.verify_all(dataclasses.replace(task.example, request_id=request_id))
                self.end(request_id)
        return time.perf_counter() - start

    def end(self, request_id: str) -> bool:
        """Forget a request and free its cache; False if it was not active."""
        return self._requests.pop(request_id, None) is not None

    def active(self, request_id: str) -> bool:
        """Whether ``request_id`` is being served (safe to call from another thread)."""
        return request_id in self._requests

    def served(self) -> int:
        """How many requests are being served now (safe to call from another thread)."""
        return len(self._requests)

    def expire_idle(self, max_idle_s: float, now: float | None = None) -> list[str]:
        """End the requests that verified no round for longer than ``max_idle_s`` (their robot
        vanished without a release); returns their ids. A request being verified is never idle."""
        now = time.monotonic() if now is None else now
        idle = [rid for rid, state in list(self._requests.items())
                if not state.busy and now - state.last_used > max_idle_s]
        for rid in idle:
            self.end(rid)
        return idle

    def follow_up(self, request_id: str) -> DraftRequest | None:
        """A cloud request's next round (an empty draft: one more token), or None when it is done
        (its cloud_tokens generated, an EOS token, the context window full), not a cloud request, or
        already given out for this round (a repeated draft answered again asks a second time)."""
        state = self._requests.get(request_id)
        if state is None or state.cloud is None or state.cloud_left <= 0 or state.busy or state.followed == state.round:
            return None
        if state.tokens[-1] in self.eos_ids or len(state.tokens) >= self.target.max_context:
            return None
        state.followed = state.round
        return dataclasses.replace(state.cloud, round=state.round, context_ids=[], prefix_len=len(state.tokens),
                                   cloud_tokens=0, task="", image_features=[])

    # -- verification -----------------------------------------------------------------------------

    def verify(self, draft: DraftRequest) -> Iterator[VerifyOutcome]:
        """Check ``draft`` now (DraftError / RequestLimitError), then stream its outcomes: early
        ones in layer order as each exit is reached, the final one last. Nothing is committed
        unless the stream reaches the final outcome. A draft equal to the one just verified, not
        speculative (a robot resends round 0 that nothing answered: its first copy may have reached
        no verifier), gets that round's final outcome again, and nothing else happens."""
        draft.check(self.target.vocab_size)
        state = self._requests.get(draft.request_id)
        if (state is not None and not draft.speculative and not state.busy and state.answered is not None
                and state.answered[0] == draft):
            return iter([state.answered[1]])
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
                raise DraftError("request_id", f"unknown request {rid!r} (round 0 starts a request; this one "
                                 "ended, was never started, or the verifier restarted)")
            committed, pending = len(draft.context_ids), []
        elif state.busy:
            raise DraftError("round", f"request {rid!r} is still verifying round {state.round}")
        elif draft.round != state.round:
            when = "stale" if draft.round < state.round else "ahead of the verifier"
            raise DraftError("round", f"round {draft.round} of request {rid!r} is {when}; expected {state.round}")
        elif draft.round == 0 and (draft.task or draft.image_features):
            raise DraftError("task", f"request {rid!r} was started with start(), which set its task")
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
            self.start(rid, draft.context_ids, draft.task, draft.image_features)
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
            state.last_used = time.monotonic()

    def _layers_and_exits(self, state: _ServedRequest, draft: DraftRequest, tree: TokenTree, pending: list[int]):
        start, paused = time.perf_counter(), 0.0  # paused: time the consumer spent per early outcome
        cache = state.cache
        hidden, rope, mask, rows = self._tree_rows(state, tree, pending)
        allowed = None
        if state.grammar is not None:  # each tree row's allowed tokens after the committed answer and its path
            allowed = tree_allowed(tree, state.grammar.bind(state.tokens[state.prompt_len:] + pending))
        hypotheses: dict[int, tuple] = {}
        sent: set[tuple] = set()
        exits = self.exit_layers if draft.early_exits else ()
        for layer in cache.layers:
            hidden = self._layer(state.model, layer, hidden, rope, mask, cache)
            if layer in exits:
                outcome = self._exit_outcome(state, draft, tree, layer, hidden[0, rows:], allowed)
                hypotheses[layer] = outcome.hypothesis
                if outcome.hypothesis in sent or outcome.confidence < self.min_confidence:
                    self.stats.suppressed[layer] += 1
                    continue
                sent.add(outcome.hypothesis)
                self.stats.sent[layer] += 1
                before = time.perf_counter()
                yield outcome  # the node sends it while the remaining layers run
                paused += time.perf_counter() - before
        final = self._final_outcome(state.model, draft, tree, hidden[0, rows:], allowed)
        self._commit(state, tree, pending, final)
        final.verify_time_s = time.perf_counter() - start - paused
        self._record(hypotheses, final, final.verify_time_s)
        state.answered = (draft, final)
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
        hidden = state.model.embed(torch.tensor([rows + tree.tokens]), positions)  # [1, P + T, E]
        rope = state.model.rotary_embeddings(hidden, positions.unsqueeze(0))
        mask = None if mask is None else mask.to(hidden.dtype)
        return hidden, rope, mask, p

    @staticmethod
    @torch.inference_mode()
    def _layer(model: TorchCausalLM, layer: int, hidden: torch.Tensor, rope, mask, cache: KVCache) -> torch.Tensor:
        return model.decoder_layer(layer, hidden, rope, mask, cache)

    @torch.inference_mode()
    def _exit_outcome(self, state: _ServedRequest, draft: DraftRequest, tree: TokenTree, layer: int,
                      hidden: torch.Tensor, allowed: torch.Tensor | None) -> VerifyOutcome:
        """EE Eq. 5: greedy verification of the tree with exit ``layer``'s logits z^(l) = LMHead(a_l(h^(l)))
        (the request's exits; constrained as the final layer's, if the request has a grammar)."""
        logits = state.exits.exit_logits(state.model, layer, hidden, state.exits.vocab_ids)  # [T, V]
        if allowed is not None:
            logits = constrain(logits, allowed)
        result = verify_greedy(tree, logits)
        return self._outcome(draft, result, logits, layer, final=False)

    @torch.inference_mode()
    def _final_outcome(self, model: TorchCausalLM, draft: DraftRequest, tree: TokenTree, hidden: torch.Tensor,
                       allowed: torch.Tensor | None) -> VerifyOutcome:
        logits = model.head(hidden.unsqueeze(0))[0]  # [T, V]
        if allowed is not None:
            logits = constrain(logits, allowed)
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


