"""Constrained decoding: the tokens a grammar allows next, for the target and the draft alike.

Contract: a :class:`TokenGrammar` turns a character automaton (a :class:`CharAutomaton`: a start
state, ``step(state, ch)`` -> the next state or None, ``accepting(state)``) and a tokenizer's
token texts into a mask over the vocabulary: ``allowed(generated)`` is a bool tensor [V], True for
each token whose text keeps ``generated``'s text inside the grammar, and True for the EOS tokens
once the text is a complete sentence of it (then only for them). Masks are cached per automaton
state; a new one walks every candidate token at once over a transition table the automaton fills
as it is used (a few milliseconds), and :meth:`TokenGrammar.warm` makes every mask at load.

How the engine uses it (core/engine/decoding.py): every row of the target's logits is masked with the
allowed set after that row's context (the generated tokens and the tree path to the row), and the
drafter masks its own logits at every node the same way (TreeSpec.allowed). The verifier then
checks the draft against the constrained target: greedy output equals the constrained target's
greedy output token for token, sampled output follows the constrained target's distribution, in
every mode. The output is always a prefix of a sentence of the grammar (a complete one unless the
token limit ends it first). Knows nothing about ROS.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

import numpy as np
import torch

MAX_STATES = 100_000  # states numbered (TokenGrammar.reachable) and masks made by warm() at most


class CharAutomaton(Protocol):
    """A deterministic automaton over characters (states are hashable, None is the dead state)."""

    start: Hashable
    alphabet: frozenset[str]

    def step(self, state: Hashable, ch: str) -> Hashable | None: ...

    def accepting(self, state: Hashable) -> bool: ...


def token_texts(tokenizer, vocab_size: int) -> list[str]:
    """Each token id's own text ('' for ids the tokenizer does not know, or that decode to a
    partial character: such tokens are never allowed)."""
    texts = []
    for i in range(vocab_size):
        try:
            text = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except (KeyError, IndexError, ValueError, TypeError):
            text = ""
        texts.append("" if "\ufffd" in text else text)
    return texts


class _Walker:
    """Walks every candidate token from one state at once. Token texts are rows of character ids
    [N, L]; the automaton's transitions fill a table (state id x character id -> state id) as they
    are first taken, so a mask costs one table gather per character position over the tokens still
    alive, not one Python step per character of every token."""

    UNKNOWN, DEAD = -2, -1

    def __init__(self, automaton: CharAutomaton, texts: Sequence[str], candidates: list[int]) -> None:
        self.automaton = automaton
        self.alphabet = sorted(automaton.alphabet)
        index = {c: i for i, c in enumerate(self.alphabet)}
        self.lengths = np.array([len(texts[i]) for i in candidates], dtype=np.int64)
        self.chars = np.zeros((len(candidates), int(self.lengths.max(initial=0))), dtype=np.int64)
        for row, i in enumerate(candidates):
            self.chars[row, : len(texts[i])] = [index[c] for c in texts[i]]
        self.states: list[Hashable] = []
        self.ids: dict[Hashable, int] = {}
        self.table = np.full((64, len(self.alphabet)), self.UNKNOWN, dtype=np.int64)

    def id(self, state: Hashable) -> int:
        if state not in self.ids:
            if len(self.states) == len(self.table):
                grown = np.full((2 * len(self.table), len(self.alphabet)), self.UNKNOWN, dtype=np.int64)
                grown[: len(self.table)] = self.table
                self.table = grown
            self.ids[state] = len(self.states)
            self.states.append(state)
        return self.ids[state]

    def alive(self, state: Hashable) -> np.ndarray:
        """Bool [N]: the candidates whose whole text can be walked from ``state``."""
        n = len(self.lengths)
        current = np.full(n, self.id(state), dtype=np.int64)
        alive = np.ones(n, dtype=bool)
        for k in range(self.chars.shape[1]):
            rows = np.nonzero(alive & (self.lengths > k))[0]
            if len(rows) == 0:
                break
            at, chars = current[rows], self.chars[rows, k]
            after = self.table[at, chars]
            unknown = after == self.UNKNOWN
            if unknown.any():
                for s, c in set(zip(at[unknown].tolist(), chars[unknown].tolist())):
                    step = self.automaton.step(self.states[s], self.alphabet[c])
                    value = self.DEAD if step is None else self.id(step)
                    self.table[s, c] = value  # after id(): the table may have grown
                after = self.table[at, chars]
            dead = after == self.DEAD
            alive[rows[dead]] = False
            current[rows[~dead]] = after[~dead]
        return alive


class TokenGrammar:
    """The vocabulary masks of one automaton for one tokenizer (see the module docstring)."""

    def __init__(self, automaton: CharAutomaton, texts: Sequence[str], eos_ids: Sequence[int],
                 start_text: str = "", _walker: _Walker | None = None) -> None:
        """``start_text``: the sentence's beginning, already written (in the prompt): the generated
        tokens continue it."""
        if not eos_ids:
            raise ValueError("a grammar needs the EOS token ids: they end a complete sentence")
        self.automaton = automaton
        self.texts = list(texts)
        self.vocab_size = len(self.texts)
        self.eos_ids = [int(e) for e in eos_ids]
        # Only tokens spelled in the automaton's alphabet can ever be allowed.
        self.candidates = [i for i, t in enumerate(self.texts) if t and set(t) <= automaton.alphabet]
        self._walker = _walker or _Walker(automaton, self.texts, self.candidates)
        self._candidate_ids = torch.tensor(self.candidates, dtype=torch.long)
        self._masks: dict[Hashable, torch.Tensor] = {}
        self.start = self.walk(automaton.start, start_text)
        if self.start is None:
            raise ValueError(f"start_text {start_text[:80]!r} is not the beginning of a sentence of the grammar")
        self._states: dict[tuple[int, ...], Hashable | None] = {(): self.start}
        self._reachable: list[Hashable] | None = None
        self._state_ids: dict[Hashable, int] = {}

    @classmethod
    def for_tokenizer(cls, automaton: CharAutomaton, tokenizer, vocab_size: int,
                      eos_ids: Sequence[int]) -> TokenGrammar:
        return cls(automaton, token_texts(tokenizer, vocab_size), eos_ids)

    def continuing(self, start_text: str) -> TokenGrammar:
        """The same grammar for tokens that continue ``start_text`` (token texts shared)."""
        return TokenGrammar(self.automaton, self.texts, self.eos_ids, start_text, self._walker)

    def walk(self, state: Hashable | None, text: str) -> Hashable | None:
        step = self.automaton.step
        for ch in text:
            if state is None:
                return None
            state = step(state, ch)
        return state

    def state_after(self, generated: Sequence[int]) -> Hashable | None:
        """The automaton's state after the generated tokens (None: they left the grammar; an EOS
        ends the sentence and nothing follows it)."""
        key = tuple(int(t) for t in generated)
        if key in self._states:
            return self._states[key]
        before = self.state_after(key[:-1])
        last = key[-1]
        if before is None or last in self.eos_ids:
            state = None
        else:
            state = self.walk(before, self.texts[last]) if 0 <= last < self.vocab_size else None
        if len(self._states) > 100_000:  # one request's prefixes and its trees' paths; start afresh
            self._states = {(): self.start}
        self._states[key] = state
        return state

    def mask(self, state: Hashable | None) -> torch.Tensor:
        """Bool [V]: the tokens allowed in ``state`` (none in the dead state)."""
        if state is None:
            return torch.zeros(self.vocab_size, dtype=torch.bool)
        if state not in self._masks:
            allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
            if self.automaton.accepting(state):
                allowed[self.eos_ids] = True  # a complete sentence: it ends here
            else:
                allowed[self._candidate_ids[torch.from_numpy(self._walker.alive(state))]] = True
            self._masks[state] = allowed
        return self._masks[state]

    def reachable(self) -> list[Hashable]:
        """Every state reachable from the automaton's start, character by character, breadth first
        over the sorted alphabet (at most MAX_STATES): the same list in every process that builds
        the same automaton, so an index into it names a state on the wire."""
        if self._reachable is None:
            order: list[Hashable] = []
            seen = {self.automaton.start}
            frontier = collections.deque([self.automaton.start])
            alphabet = sorted(self.automaton.alphabet)
            while frontier and len(order) < MAX_STATES:
                state = frontier.popleft()
                order.append(state)
                for ch in alphabet:
                    after = self.automaton.step(state, ch)
                    if after is not None and after not in seen:
                        seen.add(after)
                        frontier.append(after)
            self._reachable = order
            self._state_ids = {state: i for i, state in enumerate(order)}
        return self._reachable

    def state_id(self, state: Hashable | None) -> int:
        """``state``'s index in :meth:`reachable` (-1: the dead state); what a pipeline row carries
        so that the last stage masks it (:meth:`mask_of`)."""
        if state is None:
            return -1
        reachable = self.reachable()
        if state not in self._state_ids:
            raise ValueError(f"state {state!r} is beyond the first {len(reachable)} reachable states")
        return self._state_ids[state]

    def mask_of(self, state_id: int) -> torch.Tensor:
        """The mask of the state numbered ``state_id`` (:meth:`state_id`; -1: the dead state)."""
        states = self.reachable()
        if not -1 <= state_id < len(states):
            raise ValueError(f"grammar state {state_id} is not one of the {len(states)} numbered states")
        return self.mask(None if state_id < 0 else states[state_id])

    def warm(self, max_states: int = MAX_STATES) -> int:
        """Make the mask of every state reachable from the start (:meth:`reachable`, the first
        ``max_states``); returns how many masks the grammar holds."""
        for state in self.reachable()[:max_states]:
            self.mask(state)
        return len(self._masks)

    def allowed(self, generated: Sequence[int]) -> torch.Tensor:
        return self.mask(self.state_after(generated))

    def complete(self, generated: Sequence[int]) -> bool:
        """Whether the generated text is a whole sentence (with or without its EOS)."""
        ids = list(generated)
        if ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        state = self.state_after(ids)
        return state is not None and self.automaton.accepting(state)

    def rows_allowed(self, generated: Sequence[int], paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """Bool [R, V]: the allowed tokens after ``generated`` + each path."""
        base = list(generated)
        return torch.stack([self.allowed(base + list(path)) for path in paths])

    def bind(self, generated: Sequence[int]) -> Callable[[Sequence[int]], torch.Tensor]:
        """``path -> allowed mask`` after ``generated`` + path (what a drafter calls per node)."""
        base = list(generated)
        return lambda path: self.allowed(base + list(path))


def constrain(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Logits [..., V] with the disallowed tokens at -inf (a row with nothing allowed keeps its
    logits: the grammar is already broken there, and no row of an accepted path is such a row)."""
    allowed = allowed.to(logits.device)
    if allowed.dim() == 1:
        allowed = allowed.expand_as(logits)
    dead = ~allowed.any(-1, keepdim=True)
    return logits.masked_fill(~(allowed | dead), float("-inf"))
