"""Token trees: the draft's candidates, verified by the target in one pass.

Contract: node 0 is the root, the last committed token (already decided, not
yet in the target's cache). Every other node is a drafted token whose parent
is an earlier node. A node's children are kept in proposal order; when the
draft sampled them, ``proposals[parent]`` holds the distribution q they were
drawn from without replacement (``None``: chosen deterministically, i.e. each
child was proposed with probability one). The verifier needs both for exact
multi-candidate rejection sampling (see :mod:`edge_llm_ros.core.engine.verifier`).

LLMCad §3.2 "tree decoder": the tree is fed as one batch of rows whose
attention mask lets each row see the committed prefix and its own ancestors
only, so branches never see each other. Knows nothing about ROS.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import torch


@dataclass
class TokenTree:
    """Parents, depths and cumulative draft log-scores of drafted tokens under a root token."""

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    logscores: list[float] = field(default_factory=lambda: [0.0])
    children: list[list[int]] = field(default_factory=lambda: [[]])
    proposals: list[torch.Tensor | None] = field(default_factory=lambda: [None])

    @classmethod
    def from_root(cls, root_token: int) -> TokenTree:
        return cls(tokens=[int(root_token)])

    @classmethod
    def chain(cls, root_token: int, tokens: list[int], proposals: list[torch.Tensor | None] | None = None):
        """A linear draft: root -> tokens[0] -> tokens[1] ...; proposals[i] is q for tokens[i]."""
        tree = cls.from_root(root_token)
        node = 0
        for i, tok in enumerate(tokens):
            q = proposals[i] if proposals is not None else None
            if q is not None:
                tree.proposals[node] = q
            logp = math.log(max(float(q[tok]), 1e-30)) if q is not None else 0.0
            node = tree.add(node, tok, logp)
        return tree

    def __len__(self) -> int:
        """Number of drafted nodes (the root excluded)."""
        return len(self.tokens) - 1

    def add(self, parent: int, token: int, logprob: float) -> int:
        """Append a child of ``parent``; returns its node index (or the existing twin's)."""
        token = int(token)
        for c in self.children[parent]:
            if self.tokens[c] == token:
                return c
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.logscores.append(self.logscores[parent] + float(logprob))
        self.children.append([])
        self.proposals.append(None)
        self.children[parent].append(len(self.tokens) - 1)
        return len(self.tokens) - 1

    @property
    def depth(self) -> int:
        return max(self.depths)

    def confidence(self, node: int) -> float:
        """Cumulative draft confidence C of the branch ending at ``node`` (product of probabilities)."""
        return math.exp(self.logscores[node])

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node``."""
        out = []
        while node > 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def descendants(self, node: int) -> list[int]:
        """``node`` and every node below it."""
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(self.children[n])
        return out

    def leaves(self) -> list[int]:
        return [i for i in range(1, len(self.tokens)) if not self.children[i]]

    def best_leaf(self) -> int:
        """The leaf of the most confident branch (LLMCad T_c's argmax); 0 if the tree is empty."""
        leaves = self.leaves()
        return max(leaves, key=lambda i: (self.logscores[i], self.depths[i])) if leaves else 0

    def position_ids(self, root_position: int) -> torch.Tensor:
        """[N+1] positions: a node at depth d sits at root_position + d."""
        return torch.tensor(self.depths, dtype=torch.long) + root_position

    def ancestor_matrix(self) -> torch.Tensor:
        """[N+1, N+1] bool: entry (i, j) is True when j is i or an ancestor of i."""
        n = len(self.tokens)
        anc = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):  # parents precede children, so row parents[i] is complete
            if self.parents[i] >= 0:
                anc[i] = anc[self.parents[i]]
            anc[i, i] = True
        return anc

    def attention_mask(self, prefix_len: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Additive mask [N+1, prefix_len + N+1] for verifying root + nodes in one pass.

        Row i sees the ``prefix_len`` cached slots and the rows of its ancestors and itself.
        """
        n = len(self.tokens)
        mask = torch.zeros(n, prefix_len + n, dtype=dtype)
        mask[:, prefix_len:].masked_fill_(~self.ancestor_matrix(), float("-inf"))
        return mask

    def select(self, width: int) -> TokenTree:
        """The best ``width`` nodes by cumulative log-score, as a new tree.

        Eligibility keeps the tree exact for sampling: a node may be taken only
        after its parent and its earlier siblings (children are a prefix of the
        proposal order). Best-first over that frontier (EAGLE-2 re-ranking).
        """
        if len(self) <= width:
            return self
        out = TokenTree.from_root(self.tokens[0])
        new_id = {0: 0}
        heap: list[tuple[float, int, int]] = []  # (-score, node, sibling index)
        if self.children[0]:
            heapq.heappush(heap, (-self.logscores[self.children[0][0]], self.children[0][0], 0))
        while heap and len(out) < width:
            _, node, k = heapq.heappop(heap)
            parent = self.parents[node]
            out.proposals[new_id[parent]] = self.proposals[parent]
            new_id[node] = out.add(new_id[parent], self.tokens[node], self.logscores[node] - self.logscores[parent])
            siblings = self.children[parent]
            if k + 1 < len(siblings):
                heapq.heappush(heap, (-self.logscores[siblings[k + 1]], siblings[k + 1], k + 1))
            if self.children[node]:
                heapq.heappush(heap, (-self.logscores[self.children[node][0]], self.children[node][0], 0))
        return out


@dataclass
class Verification:
    """Outcome of verifying a tree: the accepted path (node indices) and the target's bonus token;
    ``probs``, where the verifier filled it in: the target's probability of each new token (its
    logits as they were verified, constrained if they were, at temperature 1)."""

    path: list[int]
    tokens: list[int]
    bonus: int
    probs: list[float] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return len(self.path)

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens + [self.bonus]
