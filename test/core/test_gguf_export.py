"""The shipped draft exported to GGUF and run by llama.cpp (core/drafts/gguf.py).

Its logits equal the torch draft's over the draft's vocabulary subset within quantization noise
(llama.cpp rounds activations to Q8_0 for Q8_0 weights). Measured over 400 positions of the
shipped prompt files: max |Δ| 0.37, mean 0.041, argmax agreement 97.8% (README text: 0.43,
0.043, 97%). The default export's vocabulary is the draft's subset (fed embeddings, its head
scores the subset only): its logits equal those of the full-vocabulary export exactly. ``sd``
with it and the torch target equals the target's greedy output; the export is built once into
the model cache; a target with another vocabulary is refused; the CLI writes a file.
"""

from __future__ import annotations

import io
import json
import types
from pathlib import Path

import pytest
import torch

from edge_llm_ros.core.drafts import gguf as gguf_export
from edge_llm_ros.core.drafts.draft_models import DraftMismatchError, load_draft
from edge_llm_ros.core.drafts.gguf import (
    INPUT_EMBEDDING_KEY,
    TokenEmbedding,
    default_draft_gguf,
    load_llama_drafter,
    read_gguf_string,
)
from edge_llm_ros.core.drafts.loading import byte_tokenizer
from edge_llm_ros.core.engine.config import GenerationConfig, preset
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.models import MODEL_CACHE_ENV, chat_prompt, encode, tiny_llama
from edge_llm_ros.tools import export

PROMPT_FILES = Path(__file__).resolve().parents[2] / "edge_llm_ros" / "data" / "prompts"
POSITIONS = 400
PROMPTS = ("Describe how a robot should explore a new house.", "def fibonacci(n):")
THREADS = 1


@pytest.fixture(scope="module")
def cache_dir(smollm2, tmp_path_factory):
    """A model cache of our own (after the session's SmolLM2 was loaded from the usual one)."""
    folder = tmp_path_factory.mktemp("model-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MODEL_CACHE_ENV, str(folder))
        yield folder


@pytest.fixture(scope="module")
def exported(cache_dir) -> Path:
    return default_draft_gguf()


@pytest.fixture
def drafter(smollm2, exported):
    """A fresh one per test: its model has one live cache, which a test's own new_cache replaces."""
    drafter = load_llama_drafter(smollm2, exported, n_threads=THREADS)
    yield drafter
    drafter.model.close()


def read_prompt_files(tokenizer, count: int) -> torch.Tensor:
    text = "".join(f.read_text(encoding="utf-8") for f in sorted(PROMPT_FILES.glob("*.txt")))
    return torch.tensor(encode(tokenizer, text)[:count])


def test_the_export_is_built_once_into_the_cache(exported, cache_dir, monkeypatch):
    assert exported.is_relative_to(cache_dir) and exported.stat().st_size > 0
    before = exported.stat().st_mtime_ns
    monkeypatch.setattr(gguf_export, "prepare_export", lambda *a, **k: pytest.fail("exported again"))
    assert default_draft_gguf() == exported
    assert exported.stat().st_mtime_ns == before


def test_logits_equal_the_torch_drafts_over_its_vocabulary(smollm2, drafter):
    """Same text through the torch draft and the exported one: close logits, the same argmax."""
    draft = load_draft(smollm2)
    ids = read_prompt_files(smollm2.tokenizer, POSITIONS)
    positions = torch.arange(len(ids))
    ours = draft.model.forward(ids, positions, None, draft.model.new_cache(POSITIONS))[:, draft.vocab_ids]
    lm = drafter.model
    theirs = lm.forward(ids, positions, None, lm.new_cache(POSITIONS))
    assert torch.isinf(theirs).sum(-1).eq(lm.vocab_size - len(draft.vocab_ids)).all()  # -inf outside the subset
    theirs = theirs[:, draft.vocab_ids]
    diff = (theirs - ours).abs()
    assert diff.mean() < 0.08 and diff.max() < 1.0, (diff.mean(), diff.max())
    assert (theirs.argmax(-1) == ours.argmax(-1)).float().mean() >= 0.95


def test_the_subset_export_gives_the_full_exports_logits_exactly(smollm2, drafter):
    """Its head scores the subset's 8192 rows only, from embeddings: the same numbers, bit for bit,
    in one batch and row by row (a draft's chain)."""
    full = load_llama_drafter(smollm2, default_draft_gguf(vocab="full"), n_threads=THREADS)
    sub, whole = drafter.model, full.model
    assert sub.lm.vocab_size == len(sub.vocab_ids) < whole.lm.vocab_size == sub.vocab_size == smollm2.vocab_size
    ids = read_prompt_files(smollm2.tokenizer, 64)
    positions = torch.arange(len(ids))
    sub_cache, whole_cache = sub.new_cache(64), whole.new_cache(64)
    assert torch.equal(sub.forward(ids[:48], positions[:48], None, sub_cache),
                       whole.forward(ids[:48], positions[:48], None, whole_cache))
    for t in range(48, 64):
        assert torch.equal(sub.forward(ids[t : t + 1], positions[t : t + 1], None, sub_cache),
                           whole.forward(ids[t : t + 1], positions[t : t + 1], None, whole_cache))
    full.model.close()


def test_sd_with_the_llama_cpp_draft_equals_the_targets_greedy_output(smollm2, drafter):
    for text in PROMPTS:
        ids = chat_prompt(smollm2.tokenizer, text)
        ar = generate_all(smollm2, ids, GenerationConfig(max_new_tokens=32, eos_token_ids=()))
        out = generate_all(smollm2, ids, preset("sd", gamma=4, max_new_tokens=32, eos_token_ids=()), drafter)
        assert out.tokens == ar.tokens, text
        assert out.stats.tau > 1.0


def test_a_target_with_another_vocabulary_is_refused(exported):
    with pytest.raises(ValueError, match="vocabulary of 49152 tokens.*one of 64"):
        load_llama_drafter(tiny_llama(vocab_size=64), exported, n_threads=THREADS)
    # same size, other tokens (a CausalLM as far as the check reads one: no file of its own)
    byte_level = types.SimpleNamespace(vocab_size=49152, tokenizer=byte_tokenizer(), path=None)
    with pytest.raises(DraftMismatchError, match="different tokenizers"):
        load_llama_drafter(byte_level, exported, n_threads=THREADS)
    source = json.loads(read_gguf_string(exported, INPUT_EMBEDDING_KEY))
    with pytest.raises(DraftMismatchError, match="not the one it was exported with"):
        TokenEmbedding(json.dumps({**source, "sha256": "0" * 64}), "d.gguf")


def test_the_cli_writes_a_file(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    assert export.main(["draft", "--out", str(tmp_path / "d.gguf"), "--type", "f16"], out, err) == 0, err.getvalue()
    assert (tmp_path / "d.gguf").stat().st_size > 30e6 and "wrote" in out.getvalue()  # 4 layers in f16: 28 MB
    assert export.main(["draft", "--draft", str(tmp_path / "missing")], out, err) == 2
    assert err.getvalue().strip() == f"error: draft directory not found: {tmp_path / 'missing'}"
