"""Tree verification: which drafted tokens the target accepts, and its bonus token.

Contract: given a :class:`TokenTree` and the target's logits for every tree
row (row i = the target's next-token logits after node i), return the
accepted path and one more token from the target. Greedy output equals the
target's greedy output; sampled output is distributed exactly as the target's
warped distribution p, whatever the draft proposed. Knows nothing about ROS.
"""

from __future__ import annotations

import torch

from .sampling import Sampler
from .tree import TokenTree, Verification


def verify_greedy(tree: TokenTree, logits: torch.Tensor) -> Verification:
    """Walk from the root, following the child equal to the target's argmax (LLMCad §3.2).

    Children of a node are distinct tokens, so the walk finds the longest accepted path.
    """
    # [N+1] the target's greedy token after each node. On the CPU through numpy: torch's argmax over a
    # 49k vocabulary wakes its OpenMP threads, whose spinning then slowed llama.cpp's next decode
    # (0.24 ms a token in the profile of `ar` on llama.cpp, against 0.02 ms). Both take the first maximum.
    choice = (logits.detach().numpy() if logits.device.type == "cpu" else logits).argmax(-1).tolist()
    node = 0
    path: list[int] = []  # the accepted nodes, root excluded
    while True:
        nxt = next((c for c in tree.children[node] if tree.tokens[c] == choice[node]), None)
        if nxt is None:
            return Verification(path, [tree.tokens[i] for i in path], choice[node])
        path.append(nxt)
        node = nxt


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Leviathan et al. 2023 (Alg. 1): after rejecting x ~ q, draw from norm(max(0, p - q))."""
    r = (p - q).clamp_(min=0.0)
    total = r.sum()
    # Only reachable with p == q up to rounding, where rejection has probability ~0.
    return r / total if total > 0 else p


def candidate_proposals(tree: TokenTree, node: int) -> list[torch.Tensor | int]:
    """The distribution each child of ``node`` was drawn from, in proposal order.

    Sampled without replacement from q: child i was drawn from q with children
    1..i-1 removed and renormalised. Deterministic children: a one-hot at the
    child's token (returned as the token id, to avoid building [V] vectors).
    """
    q = tree.proposals[node]
    kids = tree.children[node]
    if q is None:
        return [tree.tokens[c] for c in kids]
    out: list[torch.Tensor | int] = []
    q = q.clone()
    for c in kids:
        out.append(q / q.sum())
        q[tree.tokens[c]] = 0.0
    return out


def verify_sampled(tree: TokenTree, probs: torch.Tensor, sampler: Sampler) -> Verification:
    """Multi-candidate speculative sampling over a tree (SpecInfer, Miao et al. 2023, §4.2 MSS).

    At node u with target distribution p (probs[u]) and children x_1..x_k drawn from q_1..q_k:
        for i = 1..k:  accept x_i with probability min(1, p(x_i) / q_i(x_i));
                       on rejection  p <- norm(max(0, p - q_i))   (the residual)
        if all rejected: the bonus token ~ p (the last residual) and the round ends;
        if x_i accepted: move to x_i with p = probs[x_i] and repeat.
    Each step is one Leviathan accept/residual step whose proposal is fixed given
    the history, so by induction the emitted token is distributed as p. With
    q_i = q minus the earlier siblings (sampling without replacement, Jeon et al.
    2024 "recursive rejection sampling"), a rejected x_i has p(x_i) <= q_i(x_i),
    so the residual gives it zero mass and it can never be drawn twice.
    """
    node = 0
    path: list[int] = []  # the accepted nodes, root excluded
    while True:
        p = probs[node]
        accepted = None
        for child, q in zip(tree.children[node], candidate_proposals(tree, node), strict=True):
            x = tree.tokens[child]
            if isinstance(q, int):  # deterministic proposal: q_i = one-hot(x)
                if sampler.uniform() < float(p[x]):
                    accepted = child
                    break
                p = p.clone()
                p[x] = 0.0
                p = p / p.sum() if p.sum() > 0 else probs[node]
            else:
                if sampler.uniform() < min(1.0, float(p[x]) / float(q[x])):
                    accepted = child
                    break
                p = residual(p, q)
        if accepted is None:
            return Verification(path, [tree.tokens[i] for i in path], sampler.draw(p))
        path.append(accepted)
        node = accepted


def verify(tree: TokenTree, logits: torch.Tensor, sampler: Sampler) -> Verification:
    """Greedy or sampled verification of ``tree`` from the target's logits [N+1, V]."""
    if sampler.greedy:
        return verify_greedy(tree, logits)
    return verify_sampled(tree, sampler.probs(logits), sampler)
