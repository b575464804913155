"""The llama.cpp backend (issue 5): SmolLM2's GGUF on llama.cpp behind the engine's model protocol.

Greedy outputs of ar and sd on it equal llama.cpp's own greedy decoding of the same GGUF
(llama-cpp-python's ``Llama.generate``, 5 prompts x 64 tokens); a llama.cpp draft with a torch
target equals the torch target's greedy output; batch size never changes llama.cpp's logits (the
build without llamafile kernels); token trees are refused with a clear error.
"""

from __future__ import annotations

import pytest
import torch

from edge_llm_ros.core import GenerationConfig, ModelDrafter, chat_prompt, generate_all, load_drafter, preset
from edge_llm_ros.core.llama_backend import LlamaCppLM, load_llama_cpp
from edge_llm_ros.core.models import default_model_path
from edge_llm_ros.core.tree import TokenTree

PROMPTS = ("Describe how a robot should explore a new house.", "Write a short poem about the sea.",
           "Explain how a robot vacuum cleaner maps a room.", "Give three tips for charging a battery safely.",
           "What should a delivery robot do when a door is closed?")
NEW_TOKENS = 64
THREADS = 1


@pytest.fixture(scope="module")
def lm():
    model = load_llama_cpp(n_threads=THREADS)
    yield model
    model.close()


@pytest.fixture(scope="module")
def prompts(lm):
    return [chat_prompt(lm.tokenizer, p) for p in PROMPTS]


@pytest.fixture(scope="module")
def llama_greedy(prompts):
    """llama.cpp's own greedy decoding (its high-level API, its own context) of each prompt."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(default_model_path()), n_ctx=1024, n_threads=THREADS, n_batch=512, verbose=False)
    out = []
    for ids in prompts:
        tokens = []
        for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            tokens.append(int(tok))
            if len(tokens) == NEW_TOKENS:
                break
        out.append(tokens)
    llm.close()
    return out


def decode(lm, chunks: list[list[int]]) -> torch.Tensor:
    """Logits of every row, decoding ``chunks`` one batch each on a fresh cache."""
    cache, pos, out = lm.new_cache(512), 0, []
    for chunk in chunks:
        out.append(lm.forward(torch.tensor(chunk), torch.arange(pos, pos + len(chunk)), None, cache))
        pos += len(chunk)
    return torch.cat(out)


def test_batch_size_never_changes_the_logits(lm, prompts):
    """One row at a time, a few rows, or all at once: bit-identical (what makes verification exact)."""
    ids = prompts[3] + [33, 30, 11078, 2381, 260, 6979]
    whole = decode(lm, [ids])
    n = len(prompts[3])
    for chunks in ([ids[:n]] + [[t] for t in ids[n:]], [ids[: n - 1], ids[n - 1 : n + 2], ids[n + 2 :]]):
        assert torch.equal(decode(lm, chunks), whole)


def test_keep_and_truncate_cut_the_chain(lm, prompts):
    ids = prompts[1]
    n = len(ids)
    cache = lm.new_cache(512)
    lm.forward(torch.tensor(ids + [42, 12, 14]), torch.arange(n + 3), None, cache, logits_rows=None)
    cache.keep(list(range(n + 2)))  # the verifier accepted 42, 12 and rejected 14
    assert cache.length == n + 2
    after = lm.forward(torch.tensor([7]), torch.tensor([n + 2]), None, cache)
    assert torch.equal(after[0], decode(lm, [ids + [42, 12, 7]])[-1])
    cache = lm.new_cache(512)
    lm.forward(torch.tensor(ids), torch.arange(n), None, cache, logits_rows=None)
    with pytest.raises(ValueError, match="keeps a prefix"):
        cache.keep([0, 2])
    decode(lm, [ids])  # its new cache replaces this one
    with pytest.raises(RuntimeError, match="replaced"):
        cache.truncate(1)


def test_trees_are_refused_with_a_clear_error(lm, prompts, smollm2):
    ids = prompts[2]
    cache = lm.new_cache(512)
    lm.forward(torch.tensor(ids), torch.arange(len(ids)), None, cache, logits_rows=None)
    tree = TokenTree.from_root(42)
    tree.add(0, 11, -1.0), tree.add(0, 12, -2.0)
    with pytest.raises(ValueError, match="chains only"):
        lm.forward(torch.tensor(tree.tokens), tree.position_ids(len(ids)), tree.attention_mask(len(ids)), cache)
    for mode in ("tree", "llmcad"):
        with pytest.raises(ValueError, match=f"mode '{mode}' verifies token trees"):
            generate_all(lm, ids, preset(mode, max_new_tokens=4), load_drafter(smollm2))


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_ar_and_sd_on_llama_cpp_equal_llama_cpp_greedy(lm, prompts, llama_greedy, smollm2, mode):
    """Target on llama.cpp; sd drafts with the shipped torch draft."""
    drafter = None if mode == "ar" else load_drafter(smollm2)
    for ids, expected in zip(prompts, llama_greedy):
        out = generate_all(lm, ids, preset(mode, max_new_tokens=NEW_TOKENS, eos_token_ids=()), drafter)
        assert out.tokens == expected, (mode, PROMPTS[prompts.index(ids)])
        if mode == "sd":
            assert out.stats.tau > 1.0


def test_a_llama_cpp_draft_for_a_torch_target(prompts, smollm2):
    """The GGUF itself as a draft on llama.cpp, verified by the fp32 torch target: the torch target's greedy output."""
    draft_lm = LlamaCppLM(n_threads=THREADS)
    try:
        drafter = ModelDrafter(draft_lm)
        for ids in prompts[:2]:
            ar = generate_all(smollm2, ids, GenerationConfig(max_new_tokens=32, eos_token_ids=()))
            out = generate_all(smollm2, ids, preset("sd", max_new_tokens=32, eos_token_ids=()), drafter)
            assert out.tokens == ar.tokens
            assert out.stats.tau > 2.0  # the quantized twin agrees with the target on most tokens
    finally:
        draft_lm.close()
