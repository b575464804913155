"""Feature heads (EAGLE style) on tiny models: lossless in every mode, features handed over by
the engine, training raises agreement, files round-trip; and the engine's refusals."""

import pytest
import torch
from toy import PROMPTS, VOCAB

from edge_llm_ros.core.drafts.draft_models import FeatureDrafter, build_heads, load_draft, load_drafter, save_draft
from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import TreeSpec
from edge_llm_ros.core.engine.models import CausalLM
from edge_llm_ros.core.engine.sampling import Sampler
from edge_llm_ros.core.training.distill import TrainConfig, generate_responses
from edge_llm_ros.core.training.heads import cached_features, evaluate_heads, target_features, train_heads

MODES = [
    GenerationConfig(mode="sd", gamma=3, max_new_tokens=40),
    GenerationConfig(mode="tree", tree_depth=4, tree_branch=2, tree_expand=2, tree_width=6, max_new_tokens=40),
    GenerationConfig(mode="llmcad", tree_depth=4, tree_branch=2, tree_expand=2, tree_width=6, max_new_tokens=40),
]


@pytest.fixture(scope="module")
def trained(target, dataset, tmp_path_factory):
    head = build_heads(target)
    train, heldout = dataset[:12], dataset[12:]
    feats = cached_features(target, dataset, tmp_path_factory.mktemp("f") / "features.pt", progress=False)
    config = TrainConfig(epochs=40, lr=3e-3, warmup_steps=5, batch_tokens=128, seed=0)
    before = evaluate_heads(head, train, feats[:12], config)
    result = train_heads(head, train, feats[:12], config, heldout, feats[12:], progress=False)
    return head, before, evaluate_heads(head, train, feats[:12], config), result


def test_features_are_the_targets_last_layer(target, dataset):
    sample = dataset[0]
    ids = sample.prompt_ids + sample.response_ids
    feats = target_features(target, [sample], progress=False)[0]
    cache = target.new_cache(len(ids))
    _, hidden = target.forward_features(torch.tensor(ids), torch.arange(len(ids)), None, cache)
    assert feats.shape == hidden.shape
    assert torch.allclose(feats.float(), hidden, atol=1e-2, rtol=1e-2)  # stored fp16


@pytest.mark.parametrize("config", MODES, ids=lambda c: c.mode)
def test_untrained_head_is_lossless(target, config):
    drafter = build_heads(target).drafter()
    assert isinstance(drafter, FeatureDrafter)
    for prompt in ([5], [3, 17, 9, 40, 2], list(range(1, 30))):
        ref = generate_all(target, prompt, GenerationConfig(max_new_tokens=40)).tokens
        assert generate_all(target, prompt, config, drafter=drafter).tokens == ref


def test_training_raises_agreement_and_tau(target, dataset, trained):
    head, before, after, result = trained
    assert after["loss"] < 0.5 * before["loss"]
    assert after["agreement"] > before["agreement"] + 0.2
    assert result.evals[-1]["positions"] == sum(len(s.response_ids) for s in dataset[12:])
    config = GenerationConfig(mode="sd", gamma=4, max_new_tokens=24)
    taus = {}
    for name, drafter in (("untrained", build_heads(target).drafter()), ("trained", head.drafter())):
        accepted = []
        for sample in dataset[:12]:
            out = generate_all(target, sample.prompt_ids, config, drafter=drafter)
            assert out.tokens == sample.response_ids[: len(out.tokens)]  # lossless
            accepted += out.stats.accepted
        taus[name] = 1 + sum(accepted) / len(accepted)
    # τ as measured by decoding follows the head's first-step agreement (deeper steps read predicted features)
    assert taus["trained"] > taus["untrained"] + 0.25
    assert taus["trained"] > 0.8 * after["expected_tau"]


@pytest.mark.parametrize("config", MODES, ids=lambda c: c.mode)
def test_trained_head_is_lossless_across_requests(target, dataset, trained, config):
    drafter = trained[0].drafter()  # one drafter, many requests: no state leaks between them
    for sample in dataset[12:]:
        ref = generate_all(target, sample.prompt_ids, GenerationConfig(max_new_tokens=40)).tokens
        assert generate_all(target, sample.prompt_ids, config, drafter=drafter).tokens == ref


def test_round_trip(target, trained, tmp_path):
    head = trained[0]
    save_draft(head, tmp_path, target)
    loaded = load_draft(target, tmp_path)
    assert loaded.kind == "heads" and loaded.init_layers == head.init_layers
    for a, b in zip(head.fc.state_dict().values(), loaded.fc.state_dict().values()):
        assert torch.equal(a.half().float(), b)
    assert isinstance(load_drafter(target, tmp_path), FeatureDrafter)


def test_without_features_the_drafter_refuses(target):
    drafter = build_heads(target).drafter()
    with pytest.raises(RuntimeError, match="needs the target's features"):
        drafter.propose([1, 2, 3, 4], TreeSpec.chain(3), Sampler())


def test_a_target_without_features_is_refused_before_generation(target):
    class TokensOnly(CausalLM):  # a backend that returns logits only (llama.cpp-like): provides_features False
        vocab_size, max_context, tokenizer = VOCAB, 128, None

        def new_cache(self, capacity):
            return target.new_cache(capacity)

        def forward(self, *args, **kwargs):
            return target.forward(*args, **kwargs)

    with pytest.raises(ValueError, match="hidden states"):
        generate_all(TokensOnly(), [1, 2, 3], MODES[0], drafter=build_heads(target).drafter())


def test_short_prompts_cannot_train(target, dataset):
    short = [s for s in dataset[:2]]
    short[0] = type(short[0])(**{**short[0].__dict__, "prompt_ids": short[0].prompt_ids[:1]})
    with pytest.raises(ValueError, match="at least 2 tokens"):
        train_heads(build_heads(target), short, target_features(target, short, progress=False), progress=False)


def test_feature_cache_tells_responses_of_one_prompt_apart(target, dataset, tmp_path):
    sampled = generate_responses(target, PROMPTS[:4], 24, batch_size=4, topk=16, temperature=1.5, seed=3,
                                 progress=False)
    both = list(dataset[:4]) + sampled
    assert [s.key for s in sampled] == [s.key for s in dataset[:4]]  # same prompts, other responses
    first = cached_features(target, both, tmp_path / "f.pt", progress=False)
    again = cached_features(target, both[::-1], tmp_path / "f.pt", progress=False)  # all from the cache
    for sample, feats, cached in zip(both, first, again[::-1]):
        assert feats.shape[0] == len(sample) and torch.equal(feats, cached)


def test_feature_head_is_lossless_on_smollm2(smollm2):
    """The real target hands its features to a head (untrained here: losslessness must not depend on it)."""
    from edge_llm_ros.core.engine.models import chat_prompt

    drafter = build_heads(smollm2).drafter()
    for text in ("Walk to the kitchen and tell me what is on the table.", "def add(a, b):"):
        prompt = chat_prompt(smollm2.tokenizer, text)
        ar = generate_all(smollm2, prompt, GenerationConfig(mode="ar", max_new_tokens=32)).tokens
        for config in (GenerationConfig(mode="sd", gamma=3, max_new_tokens=32),
                       GenerationConfig(mode="tree", tree_depth=3, tree_branch=2, tree_expand=2, tree_width=6,
                                        max_new_tokens=32)):
            assert generate_all(smollm2, prompt, config, drafter=drafter).tokens == ar
