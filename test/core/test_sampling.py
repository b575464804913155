"""Lossless sampling: each mode's empirical token distribution matches the target's.

Vocabulary of 8, a draft whose distribution differs a lot from the target's, fixed
seeds. A deliberately wrong rejection rule (resampling from p instead of the residual)
must fail the same test, which shows the sample size has the power to catch it.
"""

import importlib
import itertools

import pytest
import torch

from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter, PromptLookupDrafter
from edge_llm_ros.core.engine.models import tiny_llama
from edge_llm_ros.core.engine.sampling import Sampler

verify_module = importlib.import_module("edge_llm_ros.core.engine.verifier")

PROMPT = [1, 2, 3, 4]
REPETITIVE = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]  # prompt lookup finds continuations (one-hot proposals)
SAMPLES = 600
VOCAB = 8


@pytest.fixture(scope="module")
def pair():
    dims = dict(vocab_size=VOCAB, hidden_size=16, num_heads=2, num_kv_heads=1, init_range=0.5)
    target = tiny_llama(num_layers=2, seed=3, **dims)
    draft = tiny_llama(num_layers=1, seed=11, **dims)
    return target, ModelDrafter(draft)


def exact_marginals(target, sampler, steps=3, prompt=PROMPT):
    """p(x_1) and the marginal of x_steps, enumerating every earlier continuation."""
    def probs(seq):
        with torch.inference_mode():
            return sampler.probs(target.hf(torch.tensor([seq])).logits[0, -1])

    first = probs(prompt)
    last = torch.zeros(VOCAB)
    for prefix in itertools.product(range(VOCAB), repeat=steps - 1):
        weight = 1.0
        for i, tok in enumerate(prefix):
            weight *= float(probs(prompt + list(prefix[:i]))[tok])
        if weight > 0:
            last += weight * probs(prompt + list(prefix))
    return first, last


def chi_square_pvalue(counts, expected_probs):
    """Pearson chi-square goodness of fit; cells with expectation < 5 are pooled."""
    n = counts.sum()
    expected = expected_probs.double() * n
    if (counts[expected_probs == 0] > 0).any():
        return 0.0
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = torch.tensor(float(len(obs) - 1))
    return float(torch.special.gammaincc(df / 2, stat / 2))


def empirical(target, drafter, config, prompt=PROMPT):
    firsts, lasts = torch.zeros(VOCAB), torch.zeros(VOCAB)
    for seed in range(SAMPLES):
        tokens = generate_all(target, prompt, config.with_overrides(seed=seed), drafter).tokens
        firsts[tokens[0]] += 1
        lasts[tokens[2]] += 1
    return firsts, lasts


SHAPES = dict(max_new_tokens=3, gamma=3, tree_depth=2, tree_branch=3, tree_expand=2, tree_width=6, branch_prob=0.0)
CASES = {
    "ar": GenerationConfig(mode="ar", temperature=1.0, **SHAPES),
    "sd": GenerationConfig(mode="sd", temperature=1.0, **SHAPES),
    "tree": GenerationConfig(mode="tree", temperature=1.0, **SHAPES),
    "llmcad": GenerationConfig(mode="llmcad", temperature=1.0, alpha=0.05, **SHAPES),
    "tree-warped": GenerationConfig(mode="tree", temperature=0.7, top_k=5, top_p=0.9, **SHAPES),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mode_samples_follow_the_target_distribution(pair, case):
    target, drafter = pair
    config = CASES[case]
    p_first, p_last = exact_marginals(target, Sampler(config.temperature, config.top_k, config.top_p))
    firsts, lasts = empirical(target, drafter, config)
    assert chi_square_pvalue(firsts, p_first) > 1e-3
    assert chi_square_pvalue(lasts, p_last) > 1e-3


def test_prompt_lookup_one_hot_proposals_stay_exact(pair):
    target, _ = pair
    config = CASES["tree"]
    drafter = PromptLookupDrafter()
    assert len(drafter.propose(REPETITIVE, config.tree_spec(), Sampler(1.0))) >= 2
    p_first, p_last = exact_marginals(target, Sampler(1.0), prompt=REPETITIVE)
    firsts, lasts = empirical(target, drafter, config, prompt=REPETITIVE)
    assert chi_square_pvalue(firsts, p_first) > 1e-3
    assert chi_square_pvalue(lasts, p_last) > 1e-3


def test_wrong_residual_rule_is_detected(pair, monkeypatch):
    """Negative control: after a rejection, drawing from p instead of norm(max(0, p - q)) is biased."""
    target, drafter = pair
    monkeypatch.setattr(verify_module, "residual", lambda p, q: p)
    config = CASES["sd"]
    p_first, _ = exact_marginals(target, Sampler(1.0), steps=1)
    firsts, _ = empirical(target, drafter, config)
    assert chi_square_pvalue(firsts, p_first) < 1e-6


def test_same_seed_same_tokens_different_seed_differs(pair):
    target, drafter = pair
    config = GenerationConfig(mode="tree", temperature=1.0, max_new_tokens=12, seed=7)
    a = generate_all(target, PROMPT, config, drafter).tokens
    b = generate_all(target, PROMPT, config, drafter).tokens
    others = [generate_all(target, PROMPT, config.with_overrides(seed=s), drafter).tokens for s in range(8, 12)]
    assert a == b and len(a) == 12
    assert any(o != a for o in others)


def test_feature_head_proposals_stay_exact(pair):
    """An EAGLE-style head (random, so it disagrees with the target) drafting trees from features."""
    from edge_llm_ros.core.drafts.draft_models import build_heads

    target, _ = pair
    torch.manual_seed(5)
    head = build_heads(target)
    with torch.no_grad():
        head.fc.weight.normal_(0.0, 0.3)  # far from the target: many rejections to get right
    config = CASES["tree"]
    p_first, p_last = exact_marginals(target, Sampler(1.0))
    firsts, lasts = empirical(target, head.drafter(), config)
    assert chi_square_pvalue(firsts, p_first) > 1e-3
    assert chi_square_pvalue(lasts, p_last) > 1e-3
