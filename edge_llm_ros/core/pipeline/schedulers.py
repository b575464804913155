"""Decoding across pipeline stages: what the draft side (FlowSpec's D0) sends, and what it makes of
what comes back. One scheduler per request; no I/O and no clock.

Contract: :meth:`Scheduler.start` and :meth:`Scheduler.on_output` return :class:`Actions`: rows to
inject into the first stage (token ids, :class:`~edge_llm_ros.core.pipeline.stages.Rows`), prunes for every
stage, the tokens committed by this event, and the finish reason once the request ended (the
caller then releases it on every stage). An :class:`Output` is the last stage's answer for rows it
ran: the target's greedy token after each row, with the rows' step, prefix_len and first_row as
they left the last stage. The nodes (the draft node as D0, stage_node) and the simulator run this
same code; they differ in what carries the rows and what a step costs.

Modes, all lossless for greedy decoding (every committed token is the target's choice after a row
whose visible context is exactly the committed tokens before it):

* :class:`PipelineAR`: the naive pipeline; one row in flight, every stage but one idle.
* :class:`ChunkPP`: FlowSpec's baseline: a draft tree sent through every stage as chunks back
  to back (the segment's size, as FlowSpec's §V-A sets every method alike), verified once all
  are back, then the next round.
* :class:`FlowSpec` (§III): score-ordered draft segments in flight back to back. Each returning
  segment is a continuous SD step: accept what the target confirmed, keep the new root and its
  subtree (prune, §III-C), expand the tree (context-aware with a new tree from the new root when
  tokens were accepted, score-aware one level deeper when not, §III-D) and send the next segment.
  The round ends when the target's token is not in the tree (the continuous condition, Eq. 2).

Prefill is pipelined (Jupiter §IV-A): the prompt enters as chunks (core/planning/partition.plan_sequence)
back to back. Metrics: ALT = tokens committed per pipeline turn (an answer from the last stage
while decoding), ALR = tokens per SD round.

Rows cross stages in order on one topic, prunes on another; a Rows carries ``after_prune``, the
step of the last prune sent before it, so a stage runs it only once that prune is applied.

A request of a task (``task``, ``grammar``, ``image``: the navigator's, nav/navigator.py)
drafts under the grammar and sends each row's grammar state with it (Rows.states), so the last
stage answers with the constrained target's choice; the answer carries the target's probability
of each choice, and ``token_probs`` keeps those of the committed tokens (the navigator's
confidence). Knows nothing about ROS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..engine.constraint import TokenGrammar
from ..engine.drafters import Drafter, TreeSpec
from ..engine.sampling import Sampler
from ..engine.tree import TokenTree
from .stages import Prune, Rows, prune_rows

LOSSLESS_PIPELINE_MODES = ("ar", "chunk_pp", "flowspec")
PIPELINE_MODES = (*LOSSLESS_PIPELINE_MODES, "outline")  # outline: core/pipeline/outline.py, NOT lossless by design


@dataclass
class Output:
    """The last stage's answer: the target's greedy token after each of the rows it ran, and the
    target's probability of it (None: not sent)."""

    request_id: str
    step: int
    prefix_len: int
    first_row: int
    choices: list[int]
    probs: list[float] | None = None


def greedy_choices(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """What the last stage answers for its rows' logits [T, V]: the target's greedy token after each
    row and the target's probability of it."""
    probs = torch.softmax(logits.float(), -1)
    best = probs.max(-1)
    return best.indices.tolist(), best.values.tolist()


@dataclass
class Actions:
    inject: list[Rows] = field(default_factory=list)
    prunes: list[Prune] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finished: str = ""  # eos | length: release the request on every stage


class Scheduler:
    """The common part: pipelined prefill, committing tokens, steps, prunes and turns. ``drafter``:
    what drafts for the request (None: a mode without drafts)."""

    mode = ""
    drafter: Drafter | None = None

    def __init__(self, request_id: str, prompt: Sequence[int], *, max_new_tokens: int, eos: Sequence[int] = (),
                 prefill_chunks: Sequence[int] = (), fork_from: str = "", cached: int = 0, task: str = "",
                 grammar: TokenGrammar | None = None, image: torch.Tensor | None = None) -> None:
        if not prompt:
            raise ValueError("prompt is empty")
        if not 0 <= cached < len(prompt) or bool(cached) != bool(fork_from):
            raise ValueError(f"a forked request reuses 0 < cached < {len(prompt)} prompt rows of fork_from; got "
                             f"cached {cached}, fork_from {fork_from!r}")
        chunks = [c for c in prefill_chunks if c > 0] or [len(prompt) - cached]
        if sum(chunks) != len(prompt) - cached:
            raise ValueError(f"prefill chunks {chunks} do not add up to the prompt's {len(prompt) - cached} "
                             f"uncached tokens")
        self.request_id, self.prompt, self.chunks = request_id, list(prompt), chunks
        self.fork_from, self.cached = fork_from, cached
        self.max_new_tokens, self.eos = max_new_tokens, tuple(eos)
        self.generated: list[int] = []
        self.token_probs: list[float] = []  # the target's probability of each generated token (nan: not sent)
        self.task, self.grammar, self.image = task, grammar, image
        self.step = 1  # the next message's step (rows and prunes share the counter; 0 = "no prune")
        self.last_prune = 0  # step of the last prune sent (0: none)
        self.prunes: list[Prune] = []  # sent, to renumber answers that were on their way
        self.prefilling = len(chunks)
        self.turns = self.rounds = 0
        self.per_turn: list[int] = []  # tokens committed by each answer while decoding
        self.finished = ""

    @property
    def context(self) -> list[int]:
        return self.prompt + self.generated

    @property
    def alt(self) -> float:
        """Tokens committed per pipeline turn while decoding (the first token, from prefill, excluded)."""
        return (len(self.generated) - 1) / self.turns if self.turns else 0.0

    @property
    def alr(self) -> float:
        """Tokens committed per SD round (the first token excluded)."""
        return (len(self.generated) - 1) / self.rounds if self.rounds else 0.0

    @property
    def committed_in_cache(self) -> int:
        """Committed tokens that every stage's cache holds once the request ended and its answers are
        in (what another request may fork)."""
        return len(self.context) - 1

    def start(self) -> Actions:
        """The prompt's chunks, back to back (after the fork of a shared prompt, if any)."""
        actions, at = Actions(), self.cached
        if self.fork_from:
            fork = Prune(self.request_id, self.step, self.cached, fork_from=self.fork_from)
            self.step += 1
            self.last_prune = fork.step
            actions.prunes.append(fork)
        for i, size in enumerate(self.chunks):
            ids = self.prompt[at:at + size]
            # the prompt's last row chooses the first token: the grammar's start state masks it
            states = self.states([None] * (size - 1) + [[] if i == len(self.chunks) - 1 else None])
            actions.inject.append(self.rows(torch.tensor(ids), torch.arange(at, at + size), at, states=states))
            at += size
        return actions

    def on_output(self, out: Output) -> Actions:
        actions = Actions()
        if self.finished:
            return actions
        rows = self.renumbered(out)
        if rows is None:  # every row of it was pruned on the way
            return actions
        probs = ([float(out.probs[i]) for i in rows.positions.tolist()] if out.probs is not None
                 else [math.nan] * len(rows))
        if self.prefilling:
            self.prefilling -= 1
            if not self.prefilling:  # the prompt's last row: the first token
                self.commit([int(rows.data[-1])], actions, probs[-1:])
                if not self.finished:
                    self.begin(actions)
            return actions
        self.turns += 1
        self.decode(rows, actions, out.step, probs)
        self.per_turn.append(len(actions.tokens))
        return actions

    # -- for the modes -----------------------------------------------------------------------------

    def begin(self, actions: Actions) -> None:
        """Decoding starts: the first token is committed (the root of the first round)."""
        raise NotImplementedError

    def decode(self, rows: Rows, actions: Actions, step: int, probs: list[float]) -> None:
        """An answer while decoding to the rows sent at ``step``: ``rows.data`` holds the target's
        choices, the rows renumbered to now, ``probs`` the target's probability of each."""
        raise NotImplementedError

    def rows(self, ids: torch.Tensor, positions: torch.Tensor, prefix_len: int, first_row: int = 0,
             visible: torch.Tensor | None = None, states: torch.Tensor | None = None) -> Rows:
        """The next message's rows; the request's task with every message, its image with the first."""
        rows = Rows(self.request_id, self.step, prefix_len, first_row, positions, ids, visible, self.last_prune,
                    self.task, states, self.image if self.step == 1 else None)
        self.step += 1
        return rows

    def states(self, paths: Sequence[Sequence[int] | None]) -> torch.Tensor | None:
        """Each row's grammar state for the last stage's mask (None: no grammar): after the generated
        tokens and the row's draft path (its token included, the committed root's not); a None path:
        a row whose choice is not used (-1, unmasked)."""
        if self.grammar is None:
            return None
        g = self.grammar
        return torch.tensor([-1 if path is None else g.state_id(g.state_after([*self.generated, *path]))
                             for path in paths], dtype=torch.long)

    def constrained(self, spec: TreeSpec) -> TreeSpec:
        """``spec`` masked by the grammar after the generated tokens (drafts stay in the grammar)."""
        return spec if self.grammar is None else spec.constrained(self.grammar.bind(self.generated))

    def prune(self, prefix_len: int, keep: Sequence[int], committed: int, actions: Actions) -> Prune:
        prune = Prune(self.request_id, self.step, prefix_len, tuple(keep), committed)
        self.step += 1
        self.last_prune = prune.step
        self.prunes.append(prune)
        actions.prunes.append(prune)
        return prune

    def renumbered(self, out: Output) -> Rows | None:
        """The answer's rows after every prune sent since they left (None: all pruned); their
        ``positions`` are their indices in the answer."""
        rows = Rows(out.request_id, out.step, out.prefix_len, out.first_row, torch.arange(len(out.choices)),
                    torch.tensor(out.choices, dtype=torch.long))
        for prune in self.prunes:
            if prune.step > rows.step:
                rows = prune_rows(rows, prune)
                if rows is None:
                    return None
        return rows

    def commit(self, tokens: Sequence[int], actions: Actions, probs: Sequence[float]) -> None:
        """Append the target's tokens (``probs``: its probability of each), up to the token limit or EOS."""
        for token, p in zip(tokens, probs, strict=True):
            self.generated.append(int(token))
            self.token_probs.append(float(p))
            actions.tokens.append(int(token))
            if token in self.eos or len(self.generated) >= self.max_new_tokens:
                self.finished = actions.finished = "eos" if token in self.eos else "length"
                return


class PipelineAR(Scheduler):
    """One token per pass through every stage."""

    mode = "ar"

    def begin(self, actions: Actions) -> None:
        self.send_last(actions)

    def decode(self, rows: Rows, actions: Actions, step: int, probs: list[float]) -> None:
        self.commit([int(rows.data[-1])], actions, probs[-1:])
        if not self.finished:
            self.send_last(actions)

    def send_last(self, actions: Actions) -> None:
        at = len(self.context) - 1
        actions.inject.append(self.rows(torch.tensor(self.context[-1:]), torch.tensor([at]), at,
                                        states=self.states([[]])))


def path_to(tokens: Sequence[int], parents: Sequence[int], node: int) -> list[int]:
    """The tokens from the root's child down to ``node`` (the root, row 0, is committed already)."""
    path = []
    while node > 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def walk(tokens: Sequence[int], children: Sequence[Sequence[int]], choices: Sequence[int | None]) -> tuple[list[int], int]:
    """Greedy acceptance (LLMCad §3.2) over rows whose target choices may be pending (None): the
    accepted rows below the root (row 0) and the row where the walk stopped, either because its
    choice is pending or because no child holds it (then that choice is the bonus token)."""
    node, path = 0, []
    while choices[node] is not None:
        nxt = next((c for c in children[node] if tokens[c] == choices[node]), None)
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return path, node


class ChunkPP(Scheduler):
    """FlowSpec's baseline (§V-A; Sarathi's chunking): each round's draft tree (``spec``), root
    first, goes through the stages as chunks of ``chunk`` rows sent back to back (0: the whole tree
    in one message). Nothing is pruned or added while they are on their way; once every chunk is
    back the accepted path is committed, the rest pruned, and the next round drafted. Every chunk's
    answer is a pipeline turn."""

    mode = "chunk_pp"
    drafter: Drafter

    def __init__(self, request_id: str, prompt: Sequence[int], drafter: Drafter, spec: TreeSpec, chunk: int = 0,
                 **kwargs) -> None:
        super().__init__(request_id, prompt, **kwargs)
        if chunk < 0:
            raise ValueError(f"chunk must be >= 0 rows (0: the whole tree), got {chunk}")
        self.drafter, self.spec, self.chunk = drafter, spec, chunk
        self.tree: TokenTree | None = None
        self.choices: list[int | None] = []  # the target's token after each row of the round, as answered
        self.probs: list[float] = []  # and its probability
        self.due = 0  # chunks of the round not answered yet
        self.round_prefix = 0

    def begin(self, actions: Actions) -> None:
        self.draft(actions)

    @property
    def committed_in_cache(self) -> int:
        return self.round_prefix  # the last round's rows were run, but no prune kept them

    def draft(self, actions: Actions) -> None:
        self.tree = tree = self.drafter.propose(self.context, self.constrained(self.spec), Sampler(0.0))
        self.rounds += 1
        at = self.round_prefix = len(self.context) - 1
        n = len(tree.tokens)
        size = self.chunk or n
        positions, visible = tree.position_ids(at), tree.ancestor_matrix()  # parents precede children
        states = self.states([path_to(tree.tokens, tree.parents, node) for node in range(n)])
        self.choices, self.probs, self.due = [None] * n, [math.nan] * n, -(-n // size)
        for first in range(0, n, size):
            end = min(first + size, n)
            actions.inject.append(self.rows(torch.tensor(tree.tokens[first:end]), positions[first:end], at, first,
                                            visible[first:end, :end],
                                            None if states is None else states[first:end]))

    def decode(self, rows: Rows, actions: Actions, step: int, probs: list[float]) -> None:
        for offset, choice in enumerate(rows.data.tolist()):
            self.choices[rows.first_row + offset] = int(choice)
            self.probs[rows.first_row + offset] = probs[offset]
        self.due -= 1
        if self.due:
            return
        tree = self.tree
        path, stop = walk(tree.tokens, tree.children, self.choices)
        at = len(self.context) - 1
        # each committed token is the target's choice after the row before it on the path
        self.commit([tree.tokens[n] for n in path] + [self.choices[stop]], actions,
                    [self.probs[n] for n in [0, *path]])
        if not self.finished:
            self.prune(at, [0, *path], 1 + len(path), actions)
            self.draft(actions)


@dataclass(frozen=True)
class FlowSpecShape:
    """FlowSpec's tree parameters (§IV-A): the initial tree (depth, size, ``branch`` = top-k), the
    context-aware expansion's new tree, the score-aware expansion (levels added, nodes taken; 0
    nodes: none, the unsent rows go on), the segment length and the segments in flight at most
    (the stage count fills the pipeline). The defaults suit this CPU, where every row costs compute;
    :data:`PAPER_SHAPE` is the paper's setting for memory-bound edge GPUs."""

    init_depth: int = 6
    init_size: int = 24
    branch: int = 4
    expand_depth: int = 4
    expand_size: int = 8
    deeper_levels: int = 1
    deeper_size: int = 4
    segment: int = 8
    in_flight: int = 2

    def tree(self, depth: int, size: int) -> TreeSpec:
        return TreeSpec(depth=depth, branch=self.branch, expand=self.branch, width=size)


# FlowSpec's evaluation setting (its reference code, config/run_config.py, mode "eval", which
# produced Table I; flowspec.txt Appendix A-C): an initial tree of 80 nodes, top-10, depth 6,
# verified in segments of 16; context-aware expansion by a new tree of 64 nodes, depth 6; no
# score-aware expansion (none_expand False). The same tree and segments for Chunk-PP (§V-A: one
# setting for every method). in_flight: set to the stage count by whoever runs it.
PAPER_SHAPE = FlowSpecShape(init_depth=6, init_size=80, branch=10, expand_depth=6, expand_size=64,
                            deeper_levels=0, deeper_size=0, segment=16)


class FlowSpec(Scheduler):
    """FlowSpec's D0 for one request (see the module docstring). Round rows are the draft sequence in
    the order sent: row 0 is the round's root (committed, not yet in the stages' caches)."""

    mode = "flowspec"
    drafter: Drafter

    def __init__(self, request_id: str, prompt: Sequence[int], drafter: Drafter, shape: FlowSpecShape = FlowSpecShape(),
                 **kwargs) -> None:
        super().__init__(request_id, prompt, **kwargs)
        self.drafter, self.shape = drafter, shape
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.children: list[list[int]] = []
        self.depths: list[int] = []
        self.choices: list[int | None] = []
        self.probs: list[float] = []  # the target's probability of each row's choice
        self.sent = 0  # rows [0, sent) were injected
        self.flying: dict[int, tuple[int, int]] = {}  # step -> (first row, rows) of answers still due
        self.prefix_len = 0

    @property
    def committed_in_cache(self) -> int:
        return self.prefix_len  # rows of the round beyond it may hold drafts nobody pruned

    def begin(self, actions: Actions) -> None:
        self.new_round(actions)

    # -- the tree as round rows ----------------------------------------------------------------------

    def add_row(self, parent: int, token: int) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.children.append([])
        self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        self.choices.append(None)
        self.probs.append(math.nan)
        if parent >= 0:
            self.children[parent].append(len(self.tokens) - 1)
        return len(self.tokens) - 1

    def merge(self, tree: TokenTree, limit: int) -> int:
        """Append ``tree``'s nodes (rooted at row 0's token) that are new, best cumulative score first,
        at most ``limit``; matched by path (FlowSpec's path table). Returns how many were added."""
        rows = {0: 0}
        added = 0
        for j in sorted(range(1, len(tree.tokens)), key=lambda j: (-tree.logscores[j], j)):  # parents first
            parent = rows.get(tree.parents[j])
            if parent is None:
                continue
            twin = next((c for c in self.children[parent] if self.tokens[c] == tree.tokens[j]), None)
            if twin is not None:
                rows[j] = twin
            elif added < limit:
                rows[j] = self.add_row(parent, tree.tokens[j])
                added += 1
        return added

    def keep_rows(self, keep: list[int], committed: int) -> None:
        """Renumber to ``keep[committed:]`` (the new round: its root first), as every stage does."""
        new = {old: i for i, old in enumerate(keep[committed:])}
        base = self.depths[keep[committed]] if len(keep) > committed else 0
        self.tokens = [self.tokens[o] for o in new]
        self.parents = [new.get(self.parents[o], -1) for o in new]
        self.depths = [self.depths[o] - base for o in new]
        self.choices = [self.choices[o] for o in new]
        self.probs = [self.probs[o] for o in new]
        self.children = [[new[c] for c in self.children[o] if c in new] for o in new]
        self.sent = sum(1 for o in new if o < self.sent)
        flying = {}
        for step, (first, count) in self.flying.items():
            mine = [new[o] for o in range(first, first + count) if o in new]
            if mine:
                flying[step] = (mine[0], len(mine))
        self.flying = flying

    def subtree(self, row: int) -> list[int]:
        out, stack = [], [row]
        while stack:
            r = stack.pop()
            out.append(r)
            stack.extend(self.children[r])
        return sorted(out)

    # -- the protocol ------------------------------------------------------------------------------

    def new_round(self, actions: Actions) -> None:
        """Draft initialization (§III-B): root = the last committed token, the initial tree in score
        order, its segments sent back to back."""
        self.rounds += 1
        self.prefix_len = len(self.context) - 1
        self.tokens, self.parents, self.children, self.depths, self.choices, self.probs = [], [], [], [], [], []
        self.sent = 0
        self.add_row(-1, self.context[-1])
        shape = self.shape
        self.merge(self.drafter.propose(self.context, self.constrained(shape.tree(shape.init_depth, shape.init_size)),
                                        Sampler(0.0)), shape.init_size)
        self.send(actions)

    def decode(self, rows: Rows, actions: Actions, step: int, probs: list[float]) -> None:
        for offset, choice in enumerate(rows.data.tolist()):
            self.choices[rows.first_row + offset] = int(choice)
            self.probs[rows.first_row + offset] = probs[offset]
        self.flying.pop(step, None)
        path, stop = walk(self.tokens, self.children, self.choices)
        if self.choices[stop] is not None:  # the target's token is not in the tree: the round ends
            self.commit([self.tokens[r] for r in path] + [self.choices[stop]], actions,
                        [self.probs[r] for r in [0, *path]])
            if not self.finished:
                keep = [0, *path]
                self.prune(self.prefix_len, keep, len(keep), actions)
                self.flying = {}  # nothing in flight survives: every answer still due is pruned
                self.new_round(actions)
            return
        shape = self.shape
        if path:  # accepted up to `stop`, whose answer is pending: it is the new root (§III-C)
            self.commit([self.tokens[r] for r in path], actions, [self.probs[r] for r in [0, *path[:-1]]])
            if self.finished:
                return
            keep = [0, *path[:-1], *self.subtree(stop)]
            committed = len(path)
            self.prune(self.prefix_len, keep, committed, actions)
            self.prefix_len += committed
            self.keep_rows(keep, committed)
            self.merge(self.drafter.propose(self.context, self.constrained(shape.tree(shape.expand_depth,
                                                                                      shape.expand_size)),
                                            Sampler(0.0)), shape.expand_size)  # context-aware expansion
        elif shape.deeper_size:  # nothing new: grow the tree one level deeper (score-aware expansion)
            depth = max(self.depths) + shape.deeper_levels
            self.merge(self.drafter.propose(self.context, self.constrained(shape.tree(
                depth, len(self.tokens) + shape.deeper_size)), Sampler(0.0)), shape.deeper_size)
        self.send(actions)

    def send(self, actions: Actions) -> None:
        """Segments of unsent rows while fewer than ``shape.in_flight`` answers are due."""
        while len(self.flying) < self.shape.in_flight and self.sent < len(self.tokens):
            first, end = self.sent, min(self.sent + self.shape.segment, len(self.tokens))
            visible = torch.zeros(end - first, end, dtype=torch.bool)
            for r in range(first, end):
                node = r
                while node >= 0:
                    visible[r - first, node] = True
                    node = self.parents[node]
            states = self.states([path_to(self.tokens, self.parents, r) for r in range(first, end)])
            rows = self.rows(torch.tensor(self.tokens[first:end]),
                             torch.tensor(self.depths[first:end]) + self.prefix_len, self.prefix_len, first, visible,
                             states)
            self.flying[rows.step] = (first, end - first)
            self.sent = end
            actions.inject.append(rows)


def make_scheduler(mode: str, request_id: str, prompt: list[int], drafter: Drafter | None, *, max_new_tokens: int,
                   eos: Sequence[int], segment: int, in_flight: int, prefill_chunk: int, fork_from: str = "",
                   cached: int = 0, shape: FlowSpecShape | None = None, **task) -> Scheduler:
    """The core.pipeline scheduler of ``mode`` for one request: the prompt (its first ``cached``
    tokens forked from request ``fork_from``) in chunks of ``prefill_chunk`` tokens (0: one chunk);
    FlowSpec with ``segment`` rows a segment and up to ``in_flight`` segments on their way;
    Chunk-PP sending FlowSpec's initial tree in chunks of ``segment`` rows (FlowSpec §V-A: one
    setting for every method). ``shape``: the trees (a FlowSpecShape, whose segment and in_flight
    these arguments replace; default: this CPU's). ``task``: a task's keywords (task, grammar,
    image: see :class:`Scheduler`)."""
    from dataclasses import replace

    rest = len(prompt) - cached
    size = prefill_chunk or rest
    chunks = [min(size, rest - at) for at in range(0, rest, size)]
    common = dict(max_new_tokens=max_new_tokens, eos=eos, prefill_chunks=chunks, fork_from=fork_from, cached=cached,
                  **task)
    shape = replace(shape or FlowSpecShape(), segment=segment, in_flight=in_flight)
    if mode == "flowspec":
        return FlowSpec(request_id, prompt, drafter, shape, **common)
    if mode == "chunk_pp":
        return ChunkPP(request_id, prompt, drafter, shape.tree(shape.init_depth, shape.init_size), segment, **common)
    return PipelineAR(request_id, prompt, **common)
