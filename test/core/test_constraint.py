"""Constrained decoding (core/engine/constraint.py) with the navigator's action grammar: tiny random models
on SmolLM2's tokenizer. Every output is in the grammar, and every mode (target and draft masked
alike) gives the constrained target's greedy output token for token; sampled output follows the
constrained target's distribution."""


import pytest
import torch

from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.constraint import TokenGrammar, constrain
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.models import load_tokenizer, tiny_llama
from edge_llm_ros.nav.actions import ANSWER, parse

MODES = ("ar", "sd", "tree", "llmcad")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def models(tokenizer):
    vocab = len(tokenizer)
    target = tiny_llama(vocab_size=vocab, hidden_size=32, num_layers=2, max_context=256, seed=3)
    target.tokenizer = tokenizer
    draft = tiny_llama(vocab_size=vocab, hidden_size=32, num_layers=1, max_context=256, seed=4)
    draft.tokenizer = tokenizer
    return target, draft


@pytest.fixture(scope="module")
def grammar(tokenizer, models):
    return TokenGrammar.for_tokenizer(ANSWER, tokenizer, models[0].vocab_size, [tokenizer.eos_token_id])


def test_the_masks_follow_the_automaton(grammar, tokenizer):
    ids = tokenizer.encode("reason: red chair ahead\naction: turn_left small", add_special_tokens=False)
    assert grammar.complete(ids) and grammar.complete(ids + [tokenizer.eos_token_id])
    assert grammar.allowed(ids).nonzero().flatten().tolist() == [tokenizer.eos_token_id]
    start = grammar.allowed([])
    assert all(grammar.texts[i] and "reason: ".startswith(grammar.texts[i]) for i in start.nonzero().flatten())
    assert not grammar.allowed(tokenizer.encode("action", add_special_tokens=False)).any()  # left the grammar
    inside = tokenizer.encode("reason: a b", add_special_tokens=False)
    allowed = grammar.allowed(inside)
    assert allowed[tokenizer.encode(" c", add_special_tokens=False)[0]]
    assert not allowed[tokenizer.encode(" C", add_special_tokens=False)[0]]


def test_every_reachable_states_mask_is_what_walking_each_token_gives(tokenizer, models):
    """The masks are made for all candidates at once (a transition table); each equals the plain
    definition: a token is allowed iff its whole text walks from the state (EOS alone once the
    sentence is complete). warm() makes every reachable state's mask; a continuing grammar shares
    the table."""
    grammar = TokenGrammar.for_tokenizer(ANSWER, tokenizer, models[0].vocab_size, [tokenizer.eos_token_id])
    assert grammar.warm() == len(grammar._masks) > 150  # prefix, reason lengths, action prefixes
    for state, mask in list(grammar._masks.items())[::6]:
        want = torch.zeros(grammar.vocab_size, dtype=torch.bool)
        if ANSWER.accepting(state):
            want[grammar.eos_ids] = True
        else:
            for i in grammar.candidates:
                want[i] = grammar.walk(state, grammar.texts[i]) is not None
        assert torch.equal(mask, want), state
    later = grammar.continuing("reason: a chair")
    assert later._walker is grammar._walker and torch.equal(later.allowed([]), grammar.mask(("reason", 7)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_mode_gives_the_constrained_targets_greedy_answer(models, grammar, tokenizer, seed):
    target, draft = models
    prompt = tokenizer.encode(f"Go to the red chair. Frame {seed}.", add_special_tokens=False)
    outputs = {}
    for mode in MODES:
        config = GenerationConfig(mode=mode, max_new_tokens=120, gamma=3, tree_depth=3, tree_width=6)
        drafter = ModelDrafter(draft) if mode != "ar" else None
        outputs[mode] = generate_all(target, prompt, config, drafter, grammar=grammar)
    reference = outputs["ar"].tokens
    for mode, result in outputs.items():
        assert result.tokens == reference, mode
    text = tokenizer.decode(reference, skip_special_tokens=True)
    if outputs["ar"].stats.finish_reason == "eos":
        assert parse(text).verb  # a whole answer
    else:  # the token limit came first: still a prefix of one
        assert grammar.state_after(reference) is not None


def test_the_constrained_greedy_answer_is_the_argmax_over_allowed_tokens(models, grammar, tokenizer):
    """The reference itself, step by step without the engine: argmax of the masked full-model logits."""
    target, _ = models
    prompt = tokenizer.encode("Find the silver bottle.", add_special_tokens=False)
    engine = generate_all(target, prompt, GenerationConfig(mode="ar", max_new_tokens=40), grammar=grammar).tokens
    ids = list(prompt)
    for _ in range(len(engine)):
        cache = target.new_cache(len(ids) + 1)
        logits = target.forward(torch.tensor(ids), torch.arange(len(ids)), None, cache)[-1]
        ids.append(int(constrain(logits, grammar.allowed(ids[len(prompt):])).argmax()))
    assert ids[len(prompt):] == engine


def test_sampled_answers_follow_the_constrained_target(models, grammar, tokenizer):
    """The answer's first two tokens after a reason already in the prompt: sd with a masked draft
    draws them as the constrained target's distribution says (exact, computed from the target's
    masked logits; chi-square over 200 seeds)."""
    from test_sampling import chi_square_pvalue

    from edge_llm_ros.core.engine.sampling import Sampler

    target, draft = models
    head = "reason: ahead\naction: "
    prompt = tokenizer.encode("Go to the red chair. " + head, add_special_tokens=False)
    continuing = grammar.continuing(head)
    sampler = Sampler(temperature=1.0)

    def p_next(generated: list[int]) -> torch.Tensor:
        ids = prompt + generated
        logits = target.forward(torch.tensor(ids), torch.arange(len(ids)), None, target.new_cache(len(ids) + 1))[-1]
        return sampler.probs(constrain(logits, continuing.allowed(generated)))

    first = p_next([])
    second = sum(float(first[t]) * p_next([t]) for t in first.nonzero().flatten().tolist())
    counts = torch.zeros(2, target.vocab_size)
    for seed in range(200):
        config = GenerationConfig(mode="sd", max_new_tokens=2, temperature=1.0, seed=seed, gamma=3, eos_token_ids=())
        tokens = generate_all(target, prompt, config, ModelDrafter(draft), grammar=continuing).tokens
        counts[0, tokens[0]] += 1
        counts[1, tokens[1]] += 1
    assert (first > 0).sum() > 2  # a real choice between actions
    assert chi_square_pvalue(counts[0], first) > 1e-3
    assert chi_square_pvalue(counts[1], second) > 1e-3
