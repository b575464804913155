"""LLMCad self-adaptive fallback: tree-cumulative confidence vs α (Eq. 3)."""

import math

import pytest
from reference import hf_greedy

from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.decoding import generate_all, update_alpha
from edge_llm_ros.core.engine.drafters import TreeSpec
from edge_llm_ros.core.engine.sampling import Sampler
from edge_llm_ros.core.engine.tree import TokenTree, Verification


def chain(confidences):
    """A chain whose i-th node has draft probability confidences[i]."""
    tree = TokenTree.from_root(0)
    node = 0
    for i, c in enumerate(confidences):
        node = tree.add(node, i + 1, math.log(c))
    return tree


def accepted(tree, n):
    path = list(range(1, n + 1))
    return Verification(path, [tree.tokens[i] for i in path], 99)


def test_all_correct_halves_alpha():
    tree = chain([0.9, 0.8, 0.7])
    assert update_alpha(0.04, tree, accepted(tree, 3)) == pytest.approx(0.02)


def test_error_divides_alpha_by_mean_confidence_after_it():
    tree = chain([0.9, 0.5, 0.4])  # cumulative: 0.9, 0.45, 0.18
    new = update_alpha(0.01, tree, accepted(tree, 1))  # node 2 is the first wrong one
    mean_after = (0.45 + 0.18) / 2
    assert new == pytest.approx(0.01 / mean_after ** (2 / 3))
    assert new > 0.01  # errors make the draft less trusted: verify sooner


def test_nothing_accepted_uses_the_most_confident_branch():
    tree = TokenTree.from_root(0)
    a = tree.add(0, 1, math.log(0.6))
    tree.add(0, 2, math.log(0.3))
    tree.add(a, 3, math.log(0.5))  # best branch: a -> 3, cumulative 0.6, 0.3
    new = update_alpha(0.01, tree, Verification([], [], 7))
    assert new == pytest.approx(0.01 / ((0.6 + 0.3) / 2) ** 1.0)


def test_alpha_is_capped_at_one_and_empty_trees_leave_it():
    tree = chain([0.01, 0.01])
    assert update_alpha(0.9, tree, accepted(tree, 0)) == 1.0
    empty = TokenTree.from_root(5)
    assert update_alpha(0.3, empty, Verification([], [], 1)) == 0.3


def test_tree_growth_stops_when_confidence_falls_below_alpha(tiny_drafters):
    drafter = tiny_drafters["shallow"]
    context = [3, 1, 4, 1, 5]
    for alpha in (0.5, 0.05, 0.005):
        tree = drafter.propose(context, TreeSpec(depth=12, branch=2, expand=2, width=64, stop_below=alpha), Sampler())
        best = {d: max(tree.confidence(n) for n in range(1, len(tree.tokens)) if tree.depths[n] == d)
                for d in range(1, tree.depth + 1)}
        assert all(best[d] >= alpha for d in range(1, tree.depth))  # kept drafting while T_c >= α
        assert tree.depth == 12 or best[tree.depth] < alpha  # fell back once T_c < α


def test_llmcad_alpha_adapts_to_draft_quality(tiny, tiny_drafters):
    config = GenerationConfig(mode="llmcad", max_new_tokens=40, alpha=0.01, overlap_drafting=False)
    good = generate_all(tiny, [1, 2, 3], config, tiny_drafters["self"]).stats
    bad = generate_all(tiny, [1, 2, 3], config, tiny_drafters["independent"]).stats
    assert len(good.alphas) == good.rounds and min(good.alphas) < 0.01  # trusted more: α halves
    assert max(bad.alphas) > 0.01  # errors raise α


@pytest.mark.parametrize("drafter", ["self", "shallow", "independent"])
def test_llmcad_drafts_during_verification_and_stays_lossless(tiny, tiny_drafters, drafter):
    """A tree pre-drafted during verification is used only when its context is the one verification
    left: the text is transformers' greedy text whatever the draft quality (a stale pre-draft used
    would change it), and no round but a later one can use a pre-draft (the first has none)."""
    prompt = [1, 2, 3]
    config = GenerationConfig(mode="llmcad", max_new_tokens=40, overlap_drafting=True)
    result = generate_all(tiny, prompt, config, tiny_drafters[drafter])
    stats = result.stats
    assert result.tokens == hf_greedy(tiny, prompt, 40)
    assert stats.overlapped_draft_time_s > 0 and 0 <= stats.predraft_hits <= stats.rounds - 1
    if drafter == "self":  # the target drafting for itself: every guess of what it accepts is right
        assert stats.predraft_hits > 0
