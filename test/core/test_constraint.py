"""Constrained decoding (core/constraint.py) with the navigator's action grammar: tiny random models
on SmolLM2's tokenizer. Every output is in the grammar, and every mode (target and draft masked
alike) gives the constrained target's greedy output token for token; sampled output follows the
constrained target's distribution."""

import collections

import pytest
import torch

from edge_llm_ros.core import GenerationConfig, ModelDrafter, generate_all, tiny_llama
from edge_llm_ros.core.constraint import TokenGrammar, constrain
from edge_llm_ros.core.models import load_tokenizer
from edge_llm_ros.core.nav.actions import ANSWER, parse

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
    """The action line after a fixed reason: sd with a masked draft draws it as ar does (the
    constrained target's distribution), compared by total variation over 300 seeds each."""
    target, draft = models
    prompt = tokenizer.encode("Go to the red chair.", add_special_tokens=False)
    head = tokenizer.encode("reason: ahead\naction: ", add_special_tokens=False)

    forced = TokenGrammar(_Forced(tokenizer.decode(head)), grammar.texts, grammar.eos_ids)

    def action(mode: str, seed: int) -> str:
        config = GenerationConfig(mode=mode, max_new_tokens=40, temperature=1.0, seed=seed, gamma=3)
        result = generate_all(target, prompt, config, ModelDrafter(draft) if mode != "ar" else None, grammar=forced)
        return parse(result.text).action  # any tokenization of the fixed start, then a whole action line

    counts = {mode: collections.Counter(action(mode, s) for s in range(300)) for mode in ("ar", "sd")}
    support = set(counts["ar"]) | set(counts["sd"])
    tv = sum(abs(counts["ar"][a] - counts["sd"][a]) for a in support) / 600
    assert len(support) > 3 and tv < 0.15, (tv, counts)


class _Forced:
    """The action grammar with the answer's start fixed to ``text`` (sampling then varies only in
    the action line)."""

    alphabet = ANSWER.alphabet
    start = ("forced", 0)

    def __init__(self, text: str) -> None:
        self.text = text

    def step(self, state, ch):
        if state[0] != "forced":
            return ANSWER.step(state, ch)
        at = state[1]
        if self.text[at] != ch:
            return None
        if at + 1 < len(self.text):
            return ("forced", at + 1)
        state = ANSWER.start
        for c in self.text:
            state = ANSWER.step(state, c)
        return state

    def accepting(self, state):
        return state[0] != "forced" and ANSWER.accepting(state)
