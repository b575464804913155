"""Drafters: whatever proposes candidate tokens for the target to verify.

Contract (two methods, like transformers' CandidateGenerator):

* ``propose(context, spec, sampler) -> TokenTree`` drafts a tree (a chain is a
  tree of width 1) under the root ``context[-1]``; ``context`` is every
  committed token id, prompt included. Sampled children must record the
  distribution they were drawn from (``TokenTree.proposals``) so the verifier
  stays exact; deterministic children need nothing.
* ``update(tree, verification)`` learns from what the target accepted
  (adaptive drafters; a no-op for the ones here).

Drafters subclass :class:`Drafter`, which declares the rest with defaults (read as plain
attributes, never probed): ``vocab_size`` and ``tokenizer`` (None: no vocabulary of its own, any
target's will do), ``max_context`` (None: no window of its own), and ``needs_features``: the
drafter drafts from the target's hidden states, which the engine hands to its ``observe`` after
prefill and after every verification (EAGLE-style heads; the target must provide them).

A drafter owns its state (e.g. its KV cache) and re-synchronises it from
``context`` on every ``propose``, so callers never roll it back explicitly.
Drafters here: :class:`ModelDrafter` (an independent small causal LM with the
target's tokenizer, or a shallow view of the target, optionally through an
early-exit adapter: :class:`~edge_llm_ros.core.drafts.exits.ExitDrafter`) and
:class:`PromptLookupDrafter` (n-gram lookup, training-free). Early-exit and
Medusa/EAGLE heads plug in behind the same two methods. Knows nothing about ROS.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import torch

from .constraint import constrain
from .models import CausalLM, TorchCausalLM, drives_layers
from .sampling import Sampler
from .tree import TokenTree, Verification


@dataclass(frozen=True)
class TreeSpec:
    """Shape budget of one draft.

    depth: maximum depth; branch: children proposed per expanded node; expand:
    nodes expanded per level (highest cumulative confidence first); width: nodes
    kept for verification (W); min_branch_prob: a child beyond the first needs
    this draft probability (LLMCad §3.1 branches only above a confidence, 0 = off);
    stop_below: stop growing once the tree-cumulative confidence T_c of the newest
    level drops below it (LLMCad §3.3 fallback threshold α, 0 = off);
    allowed: constrained decoding (core/engine/constraint.py): the bool mask [V] of the tokens
    allowed after a node, given the tokens of its path below the root; None = any.
    """

    depth: int
    branch: int = 1
    expand: int = 1
    width: int = 1
    min_branch_prob: float = 0.0
    stop_below: float = 0.0
    allowed: Callable[[list[int]], torch.Tensor] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def chain(cls, length: int) -> TreeSpec:
        return cls(depth=length, branch=1, expand=1, width=length)

    def capped(self, max_depth: int) -> TreeSpec:
        return replace(self, depth=max(0, min(self.depth, max_depth)))

    def constrained(self, allowed: Callable[[list[int]], torch.Tensor] | None) -> TreeSpec:
        return self if allowed is None else replace(self, allowed=allowed)


def draft_children(logits: torch.Tensor, spec: TreeSpec, sampler: Sampler):
    """(tokens, their draft log-probs, the proposal q or None) for one expanded node."""
    if sampler.greedy:
        probs = logits.float().softmax(-1)
        tokens, proposal = torch.topk(probs, min(spec.branch, probs.shape[-1])).indices.tolist(), None
    else:
        probs = sampler.probs(logits)
        tokens, proposal = sampler.draw_distinct(probs, spec.branch), probs
    # Extra branches need min_branch_prob; stop at the first miss so that sampled
    # children stay a prefix of their draw order (see TokenTree.select).
    kept = tokens[:1]
    for t in tokens[1:]:
        if float(probs[t]) < spec.min_branch_prob or float(probs[t]) <= 0.0:  # 0: masked by a grammar
            break
        kept.append(t)
    return kept, [math.log(max(float(probs[t]), 1e-30)) for t in kept], proposal


@runtime_checkable
class Drafter(Protocol):
    """What proposes drafts (see the module docstring): two methods, and capabilities with defaults."""

    vocab_size: int | None = None
    tokenizer: Any = None
    max_context: int | None = None
    needs_features: bool = False

    def propose(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> TokenTree: ...

    def update(self, tree: TokenTree, verification: Verification) -> None: ...

    def observe(self, start: int, hidden: torch.Tensor) -> None:
        """The target's features [T, E] of context tokens start..start+T-1; called only on a drafter
        that ``needs_features`` (nothing to do here)."""
        return None


class WrappedDrafter(Drafter):
    """A drafter around another one (to count or time its drafts): the inner drafter's
    capabilities, ``update`` and ``observe``; subclasses wrap ``propose``."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.vocab_size, self.tokenizer = drafter.vocab_size, drafter.tokenizer
        self.max_context, self.needs_features = drafter.max_context, drafter.needs_features

    def propose(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> TokenTree:
        return self.drafter.propose(context, spec, sampler)

    def update(self, tree: TokenTree, verification: Verification) -> None:
        self.drafter.update(tree, verification)

    def observe(self, start: int, hidden: torch.Tensor) -> None:
        self.drafter.observe(start, hidden)


class ModelDrafter(Drafter):
    """Drafts with a small causal LM by tree decoding (LLMCad §3.2 / EAGLE-2 dynamic trees).

    Each level expands the ``spec.expand`` most confident frontier nodes in one
    forward pass whose mask isolates the branches; children are the top
    ``spec.branch`` tokens (greedy) or drawn without replacement from the
    warped draft distribution q (sampling). ``vocab_ids`` restricts the draft
    head to a subset of the vocabulary (cheaper head; still exact, since q is
    then zero outside the subset and the verifier uses q as it is). ``adapter``
    maps the last layer's hidden states [B, T, E] before the final norm and head
    (an early-exit adapter, see :mod:`.exits`); it must be stateless per position. Both need a
    model whose layers the engine runs (``exposes_layers``); any other CausalLM (llama.cpp) drafts
    through its ``forward``.
    """

    def __init__(
        self,
        model: CausalLM,
        vocab_ids: torch.Tensor | None = None,
        adapter: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        layered = model if drives_layers(model) else None
        if layered is None and (vocab_ids is not None or adapter is not None):
            raise ValueError(f"a vocabulary subset or an exit adapter needs a model whose layers the engine runs "
                             f"(a torch model), not {type(model).__name__}")
        self.model: CausalLM = model
        self.adapter = adapter
        self.vocab_size = model.vocab_size
        self.tokenizer = model.tokenizer
        self.max_context = model.max_context
        self.cache = model.new_cache(256)
        self.cached: list[int] = []  # tokens in cache slots [0, len)
        self._tree: TokenTree | None = None  # last tree, whose fed nodes sit after the cached slots
        self._slots: dict[int, int] = {}  # node -> cache slot of the last tree's fed nodes
        self.vocab_ids: torch.Tensor | None = None
        if layered is not None and vocab_ids is not None:
            self.vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.long)
            layered = layered.with_vocabulary(self.vocab_ids)
            self.model = layered
        self.layered = layered  # the model again, when the engine runs its layers itself; else None

    # -- steps ----------------------------------------------------------------------------------

    def _logits(self, token_ids: list[int], positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Run the draft over new rows; logits [T, V] (-inf outside ``vocab_ids``)."""
        if self.layered is None:  # a backend that gives logits only (llama.cpp)
            logits = self.model.forward(torch.tensor(token_ids), positions, mask, self.cache)
            assert logits is not None  # every row's logits asked for
            return logits
        with torch.inference_mode():
            hidden = self._rows(self.layered.embed(torch.tensor(token_ids), positions), positions, mask)[None]
            if self.adapter is not None:
                hidden = self.adapter(hidden)
            return self._head(hidden)

    def _driven(self) -> TorchCausalLM:
        """The model whose layers this drafter runs itself; RuntimeError if it has none."""
        if self.layered is None:
            raise RuntimeError(f"{type(self).__name__} runs a model's layers, and {type(self.model).__name__} "
                               "does not expose them")
        return self.layered

    def _rows(self, inputs: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Run the draft's layers over row inputs [T, E] into its cache; their outputs [T, E]."""
        with torch.inference_mode():
            hidden, _ = self._driven().run_layers(inputs[None], positions, mask, self.cache)
        return hidden[0]

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + head over [1, T, E] -> logits [T, V] (-inf outside ``vocab_ids``)."""
        return self._driven().head(hidden)[0]

    def _reuse_last_tree(self, context: list[int]) -> None:
        """Keep the last tree's fed nodes that ``context`` went on to accept; drop the rest."""
        n = len(self.cached)
        keep, node = [], 0
        if self._tree is not None and context[:n] == self.cached:
            for tok in context[n:]:
                node = next((c for c in self._tree.children[node] if self._tree.tokens[c] == tok), -1)
                if node not in self._slots:
                    break
                keep.append(self._slots[node])
        self.cache.keep(list(range(n)) + keep)
        self.cached = self.cached + context[n : n + len(keep)]
        self._tree, self._slots = None, {}

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Bring the cache to ``context`` and return the draft logits [V] after its last token."""
        self._reuse_last_tree(context)
        common = 0
        for a, b in zip(self.cached, context):
            if a != b:
                break
            common += 1
        common = min(common, len(context) - 1)  # always feed at least the root to get its logits
        self.cache.truncate(common)
        new = context[common:]
        self.cache.ensure_capacity(len(context) + 1)
        logits = self._logits(new, torch.arange(common, len(context)), None)
        self.cached = list(context)
        return logits[-1]

    def _feed(self, tree: TokenTree, nodes: list[int], root_slot: int) -> torch.Tensor:
        """Tree-decode ``nodes`` in one pass: each row sees the context and its own ancestors."""
        mask, positions = self._tree_rows(tree, nodes, root_slot)
        return self._logits([tree.tokens[n] for n in nodes], positions, mask)

    def _tree_rows(self, tree: TokenTree, nodes: list[int], root_slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Give ``nodes`` the next cache slots; their mask (context up to ``root_slot`` + own ancestors)
        and position ids (``root_slot`` + depth)."""
        start = self.cache.length
        self.cache.ensure_capacity(start + len(nodes))
        mask = torch.full((len(nodes), start + len(nodes)), float("-inf"))
        mask[:, : root_slot + 1] = 0.0
        for row, node in enumerate(nodes):
            for anc in tree.path(node)[:-1]:
                mask[row, self._slots[anc]] = 0.0
            mask[row, start + row] = 0.0
            self._slots[node] = start + row
        positions = torch.tensor([root_slot + tree.depths[n] for n in nodes])
        return mask, positions

    # -- the interface --------------------------------------------------------------------------

    def propose(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> TokenTree:
        tree = TokenTree.from_root(context[-1])
        root_logits = self._sync(context)
        self._tree, self._slots = tree, {}
        root_slot = len(context) - 1
        frontier = [(0, root_logits)]
        for level in range(1, spec.depth + 1):
            new_nodes = []
            for node, logits in frontier:
                if spec.allowed is not None:  # the draft masked as the target is
                    logits = constrain(logits, spec.allowed([tree.tokens[n] for n in tree.path(node)]))
                tokens, logps, proposal = draft_children(logits, spec, sampler)
                tree.proposals[node] = proposal
                new_nodes += [tree.add(node, t, lp) for t, lp in zip(tokens, logps)]
            # LLMCad §3.3: fall back to verification once T_c = max_i C_i < α.
            if level == spec.depth or max(tree.confidence(n) for n in new_nodes) < spec.stop_below:
                break
            chosen = sorted(new_nodes, key=lambda n: -tree.logscores[n])[: spec.expand]
            frontier = list(zip(chosen, self._feed(tree, chosen, root_slot)))
        return tree.select(spec.width)

    def update(self, tree: TokenTree, verification: Verification) -> None:
        """Nothing to learn; the cache follows the accepted path on the next ``propose``."""


class PromptLookupDrafter(Drafter):
    """Prompt-lookup decoding: continue the text after the latest earlier match of its last n-gram.

    Training-free and model-free. Up to ``spec.branch`` distinct continuations
    (most recent match first, longest n-gram first) form the tree's branches.
    Proposals are deterministic, so the verifier treats each as one-hot. No vocabulary, tokenizer
    or window of its own (the :class:`Drafter` defaults).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def continuations(self, context: list[int], depth: int, limit: int) -> list[list[int]]:
        found: list[list[int]] = []
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            pattern = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):
                if context[start : start + n] == pattern:
                    cont = context[start + n : start + n + depth]
                    if cont and all(cont[:1] != f[:1] for f in found):
                        found.append(cont)
                        if len(found) == limit:
                            return found
        return found

    def propose(self, context: list[int], spec: TreeSpec, sampler: Sampler) -> TokenTree:
        tree = TokenTree.from_root(context[-1])
        for rank, cont in enumerate(self.continuations(context, spec.depth, spec.branch)):
            node = 0
            for i, tok in enumerate(cont):
                # Rank branches by match order; a small per-token decay prefers shallow nodes.
                node = tree.add(node, tok, (-math.log(rank + 1) if i == 0 else 0.0) - 0.01)
        return tree.select(spec.width)

    def update(self, tree: TokenTree, verification: Verification) -> None:
        """Stateless."""
