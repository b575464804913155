import math

import torch

from edge_llm_ros.core.engine.sampling import Sampler
from edge_llm_ros.core.engine.tree import TokenTree
from edge_llm_ros.core.engine.verifier import verify_greedy


def sample_tree():
    """root(9) -> a(1) -> c(3)
                     -> d(4)
               -> b(2) -> e(5)"""
    t = TokenTree.from_root(9)
    a = t.add(0, 1, math.log(0.6))
    b = t.add(0, 2, math.log(0.3))
    c = t.add(a, 3, math.log(0.5))
    d = t.add(a, 4, math.log(0.4))
    e = t.add(b, 5, math.log(0.9))
    return t, (a, b, c, d, e)


def test_structure_depths_positions_and_scores():
    t, (a, b, c, d, e) = sample_tree()
    assert len(t) == 5 and t.depth == 2
    assert t.parents == [-1, 0, 0, a, a, b]
    assert t.position_ids(10).tolist() == [10, 11, 11, 12, 12, 12]
    assert math.isclose(t.confidence(c), 0.3) and math.isclose(t.confidence(e), 0.27)
    assert t.path(e) == [b, e] and t.best_leaf() == c
    assert t.add(0, 1, 0.0) == a  # a twin token under the same parent is not added twice


def test_attention_mask_sees_prefix_and_ancestors_only():
    t, (a, b, c, d, e) = sample_tree()
    mask = t.attention_mask(prefix_len=3)
    assert mask.shape == (6, 9)
    visible = (mask == 0).int()
    assert visible[:, :3].all()  # everyone sees the cached prefix
    expected = [
        [1, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0],  # a
        [1, 0, 1, 0, 0, 0],  # b
        [1, 1, 0, 1, 0, 0],  # c: root, a, c
        [1, 1, 0, 0, 1, 0],  # d: root, a, d (not its sibling c)
        [1, 0, 1, 0, 0, 1],  # e: root, b, e
    ]
    assert visible[:, 3:].tolist() == expected
    assert torch.isneginf(mask[visible == 0]).all()


def test_select_keeps_best_nodes_closed_under_parents_and_earlier_siblings():
    t, _ = sample_tree()
    best = t.select(3)  # scores: a .6, b .3, c .3, d .24, e .27 -> a, then b/c tie, ...
    assert len(best) == 3
    for node in range(1, len(best.tokens)):
        assert best.parents[node] < node
    kept = {best.tokens[n] for n in range(1, 4)}
    assert 1 in kept and kept <= {1, 2, 3, 5}
    # d (token 4) needs its earlier sibling c first
    assert 4 not in {best.tokens[n] for n in range(1, len(best.tokens))}
    assert t.select(10) is t


def logits_choosing(choices, vocab=10):
    """Target logits whose argmax after row i is choices[i]."""
    logits = torch.zeros(len(choices), vocab)
    logits[torch.arange(len(choices)), torch.tensor(choices)] = 5.0
    return logits


def test_greedy_verification_longest_path_and_bonus():
    t, (a, b, c, d, e) = sample_tree()
    # rows: root->2 (b), a->0, b->5 (e), c->0, d->0, e->7: accept b, e, bonus 7
    res = verify_greedy(t, logits_choosing([2, 0, 5, 0, 0, 7]))
    assert res.path == [b, e] and res.tokens == [2, 5] and res.bonus == 7
    # root->1 (a), a->4 (d), d->8: accept a, d, bonus 8
    res = verify_greedy(t, logits_choosing([1, 4, 0, 0, 8, 0]))
    assert res.path == [a, d] and res.new_tokens == [1, 4, 8]
    # nothing accepted: the bonus is the target's own token
    res = verify_greedy(t, logits_choosing([6, 0, 0, 0, 0, 0]))
    assert res.path == [] and res.new_tokens == [6]


def test_chain_records_proposals_and_scores():
    q = torch.tensor([0.1, 0.2, 0.7])
    t = TokenTree.chain(0, [2, 1], [q, q])
    assert t.tokens == [0, 2, 1] and t.depths == [0, 1, 2]
    assert t.proposals[0] is q and t.proposals[1] is q
    assert math.isclose(t.confidence(2), 0.14, rel_tol=1e-6)


def test_sampler_warps_like_transformers():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    s = Sampler(temperature=1.0, top_k=3)
    p = s.probs(logits)
    assert (p[3:] == 0).all() and math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)
    full = logits.softmax(-1)
    s = Sampler(temperature=1.0, top_p=float(full[0] + full[1]) - 1e-4)  # needs the top two
    assert (s.probs(logits) > 0).tolist() == [True, True, False, False, False]
    s = Sampler(temperature=0.5)
    assert torch.allclose(s.probs(logits), (logits / 0.5).softmax(-1))
    assert Sampler(temperature=0.0).probs(logits).tolist() == [1.0, 0, 0, 0, 0]


def test_draw_distinct_is_without_replacement_and_seeded():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    draws = Sampler(1.0, generator=torch.Generator().manual_seed(3)).draw_distinct(p, 5)
    assert sorted(draws) == [0, 1, 2]  # zero-probability token never drawn, capped at support
    again = Sampler(1.0, generator=torch.Generator().manual_seed(3)).draw_distinct(p, 5)
    assert draws == again
