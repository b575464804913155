"""Greedy decoding in every mode is token-identical to transformers' greedy generate."""

import pytest
import torch
from reference import hf_greedy

from edge_llm_ros.core.engine.config import MODES, GenerationConfig, preset
from edge_llm_ros.core.engine.decoding import generate, generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter, PromptLookupDrafter
from edge_llm_ros.core.engine.models import tiny_llama


def prompt_of(length, seed=0, vocab=64):
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("drafter_name", ["self", "shallow", "independent"])
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_and_drafter_matches_hf(tiny, tiny_drafters, mode, drafter_name):
    drafter = tiny_drafters[drafter_name]
    for length in (1, 9):
        prompt = prompt_of(length, seed=length)
        ref = hf_greedy(tiny, prompt, 30)
        result = generate_all(tiny, prompt, GenerationConfig(mode=mode, max_new_tokens=30), drafter)
        assert result.tokens == ref
        assert result.stats.new_tokens == 30 and result.stats.finish_reason == "length"
        if mode != "ar" and drafter_name == "self":
            assert result.stats.tau > 2.0  # a perfect draft is accepted in long runs


SHAPES = [
    dict(mode="sd", gamma=1),
    dict(mode="sd", gamma=3),
    dict(mode="sd", gamma=8),
    dict(mode="tree", tree_depth=1, tree_branch=4, tree_expand=1, tree_width=4),
    dict(mode="tree", tree_depth=3, tree_branch=2, tree_expand=2, tree_width=6),
    dict(mode="tree", tree_depth=8, tree_branch=3, tree_expand=3, tree_width=24),
    dict(mode="tree", tree_depth=5, tree_branch=1, tree_expand=1, tree_width=5),
    dict(mode="llmcad", tree_depth=10, alpha=0.5, branch_prob=0.05),
    dict(mode="llmcad", tree_depth=4, alpha=0.001, branch_prob=0.0, overlap_drafting=False),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_tree_shapes_and_gamma_match_hf(tiny, tiny_drafters, shape):
    prompt = prompt_of(6, seed=3)
    ref = hf_greedy(tiny, prompt, 40)
    for name in ("self", "shallow"):
        tokens = generate_all(tiny, prompt, GenerationConfig(max_new_tokens=40, **shape), tiny_drafters[name]).tokens
        assert tokens == ref, name


@pytest.mark.parametrize("mode", MODES)
def test_prompts_near_the_context_limit(mode):
    """Context 32: generation stops at the window; drafts are capped to fit it."""
    model = tiny_llama(vocab_size=64, hidden_size=32, max_context=32, seed=4)
    for length in (20, 30, 31):
        prompt = prompt_of(length, seed=length)
        result = generate_all(model, prompt, GenerationConfig(mode=mode, max_new_tokens=50), ModelDrafter(model))
        assert len(result.tokens) == 32 - length and result.stats.finish_reason == "length"
        assert result.tokens == hf_greedy(model, prompt, 32 - length)


def test_prompt_lookup_drafter_matches_hf_and_accepts_repetitions(tiny):
    prompt = prompt_of(8, seed=9) * 3
    ref = hf_greedy(tiny, prompt, 40)
    for mode in ("sd", "tree", "llmcad"):
        result = generate_all(tiny, prompt, GenerationConfig(mode=mode, max_new_tokens=40), PromptLookupDrafter())
        assert result.tokens == ref
    assert PromptLookupDrafter().continuations([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], depth=2, limit=2) == [[7, 1], [9, 1]]


def test_generate_streams_tokens_before_finishing(tiny, tiny_drafters):
    stream = generate(tiny, [1, 2, 3], GenerationConfig(mode="tree", max_new_tokens=20), tiny_drafters["shallow"])
    first = next(stream)
    assert first == hf_greedy(tiny, [1, 2, 3], 1)[0]
    rest = list(stream)
    assert [first] + rest == hf_greedy(tiny, [1, 2, 3], 20)


def test_stats_are_consistent(tiny, tiny_drafters):
    result = generate_all(tiny, [5, 6], GenerationConfig(mode="sd", gamma=4, max_new_tokens=40), tiny_drafters["shallow"])
    s = result.stats
    assert s.new_tokens == 40 and s.rounds == len(s.accepted)
    assert sum(s.accepted) + s.rounds >= 40  # the last round may overshoot the budget
    assert 0.0 < s.acceptance_rate <= 1.0 and s.drafted <= 4 * s.rounds
    assert s.tau == pytest.approx((sum(s.accepted) + s.rounds) / s.rounds)
    assert 0 < s.ttft_s <= s.total_time_s and s.draft_time_s > 0 and s.verify_time_s > 0
    assert set(s.as_dict()) >= {"tau", "acceptance_rate", "tokens_per_s", "accepted", "draft_time_s"}


def test_speculative_modes_default_to_prompt_lookup_and_presets(tiny):
    prompt = prompt_of(6, seed=2) * 2
    config = preset("tree", max_new_tokens=20)
    assert (config.tree_depth, config.tree_width) == (4, 7) and config.mode == "tree"
    result = generate_all(tiny, prompt, config)  # no drafter given: prompt lookup
    assert result.tokens == hf_greedy(tiny, prompt, 20) and result.stats.drafted > 0


@pytest.mark.parametrize("mode", ["ar", "sd", "tree"])
def test_each_tokens_probability_is_the_targets_as_verified(tiny, tiny_drafters, mode):
    """stats.token_probs: the target's probability of every generated token, read off the logits the
    engine verified with (what the navigator's confidence uses instead of a second pass)."""
    prompt = [1, 2, 3, 4]
    result = generate_all(tiny, prompt, preset(mode, max_new_tokens=12),
                          tiny_drafters["shallow"] if mode != "ar" else None)
    ids = prompt + result.tokens
    with torch.inference_mode():
        logits = tiny.forward(torch.tensor(ids[:-1]), torch.arange(len(ids) - 1), None, tiny.new_cache(32),
                              logits_rows=slice(len(prompt) - 1, None))
    want = logits.float().softmax(-1).gather(-1, torch.tensor(result.tokens)[:, None])[:, 0]
    assert len(result.stats.token_probs) >= len(result.tokens)
    assert torch.allclose(torch.tensor(result.stats.token_probs[: len(result.tokens)]), want, atol=1e-4)
