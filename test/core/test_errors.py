"""Bad requests fail early with a message naming the problem; EOS and stop strings end cleanly."""

import pytest
from reference import hf_greedy

from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.decoding import generate, generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.models import tiny_llama


class LetterTokenizer:
    """A stand-in tokenizer for tiny models: token i is one letter."""

    eos_token_id = None

    def __init__(self, vocab_size=64, offset=0):
        self.vocab = {chr(0x100 + i + offset): i for i in range(vocab_size)}
        self.letters = {i: ch for ch, i in self.vocab.items()}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.letters[i] for i in ids)

    def get_vocab(self):
        return dict(self.vocab)


def test_empty_prompt(tiny):
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(tiny, [], GenerationConfig())


@pytest.mark.parametrize("length", [128, 200])
def test_prompt_longer_than_context(tiny, length):
    with pytest.raises(ValueError, match="context window is 128"):
        generate(tiny, [1] * length, GenerationConfig())


def test_token_ids_outside_the_vocabulary(tiny):
    with pytest.raises(ValueError, match="token ids"):
        generate(tiny, [1, 64], GenerationConfig())


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown mode 'beam'"):
        GenerationConfig(mode="beam")


@pytest.mark.parametrize("n", [0, -3])
def test_max_new_tokens_not_positive(n):
    with pytest.raises(ValueError, match="max_new_tokens must be > 0"):
        GenerationConfig(max_new_tokens=n)


def test_draft_with_another_vocabulary_size(tiny):
    other = ModelDrafter(tiny_llama(vocab_size=32, seed=2))
    with pytest.raises(ValueError, match="draft vocabulary size 32 differs from the target's 64"):
        generate(tiny, [1, 2], GenerationConfig(mode="sd"), other)


def test_draft_with_another_tokenizer():
    target = tiny_llama(vocab_size=64, seed=0)
    draft = tiny_llama(vocab_size=64, seed=1)
    target.tokenizer, draft.tokenizer = LetterTokenizer(), LetterTokenizer(offset=1)
    with pytest.raises(ValueError, match="draft tokenizer differs"):
        generate(target, [1, 2], GenerationConfig(mode="tree"), ModelDrafter(draft))
    draft.tokenizer = LetterTokenizer()  # equal vocabularies are fine
    assert len(generate_all(target, [1, 2], GenerationConfig(mode="tree", max_new_tokens=3), ModelDrafter(draft)).tokens) == 3


def test_stop_strings_need_a_tokenizer(tiny):
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        generate(tiny, [1], GenerationConfig(stop_strings=("x",)))


@pytest.mark.parametrize("mode", ["ar", "sd", "tree", "llmcad"])
def test_eos_ends_generation_after_emitting_it(tiny, tiny_drafters, mode):
    prompt = [7, 8, 9]
    ref = hf_greedy(tiny, prompt, 30)
    eos = ref[6]
    cut = ref.index(eos) + 1
    config = GenerationConfig(mode=mode, max_new_tokens=30, eos_token_ids=(eos,))
    result = generate_all(tiny, prompt, config, tiny_drafters["self"])
    assert result.tokens == ref[:cut] and result.stats.finish_reason == "eos"


@pytest.mark.parametrize("mode", ["ar", "sd", "tree", "llmcad"])
def test_stop_string_ends_generation_where_it_completes(mode):
    model = tiny_llama(vocab_size=64, seed=0)
    model.tokenizer = LetterTokenizer()
    prompt = [7, 8, 9]
    ref = hf_greedy(model, prompt, 30)
    stop = model.tokenizer.decode(ref[4:6])
    cut = next(i for i in range(1, 31) if stop in model.tokenizer.decode(ref[:i]))
    config = GenerationConfig(mode=mode, max_new_tokens=30, stop_strings=(stop,))
    result = generate_all(model, prompt, config, ModelDrafter(model))
    assert result.tokens == ref[:cut] and result.stats.finish_reason == "stop"
    assert result.text.endswith(stop)


def test_closing_the_stream_early_is_clean(tiny, tiny_drafters):
    stream = generate(tiny, [1, 2], GenerationConfig(mode="llmcad", max_new_tokens=50), tiny_drafters["self"])
    assert isinstance(next(stream), int)
    stream.close()  # waits for the background draft, raises nothing
    again = generate_all(tiny, [1, 2], GenerationConfig(mode="llmcad", max_new_tokens=10), tiny_drafters["self"])
    assert again.tokens == hf_greedy(tiny, [1, 2], 10)
