"""Shared by the navigation tests: tiny random language models on SmolLM2's tokenizer, and frames
of a simulated world."""

import pytest

from edge_llm_ros.core.engine.models import load_tokenizer, tiny_llama


@pytest.fixture(scope="module")
def tiny_lms():
    """(target, draft): tiny Llamas (2 layers and 1, width 32) that read SmolLM2's tokens."""
    tokenizer = load_tokenizer()
    target = tiny_llama(vocab_size=len(tokenizer), hidden_size=32, num_layers=2, max_context=256, seed=5)
    draft = tiny_llama(vocab_size=len(tokenizer), hidden_size=32, num_layers=1, max_context=256, seed=6)
    target.tokenizer = draft.tokenizer = tokenizer
    return target, draft


@pytest.fixture(scope="module")
def lora_vlm(tiny_lms):
    """(adapter, target, draft): a fresh adapter on the tiny LMs with a random LoRA that changes the
    answers (so a server or a stage must merge it to give the one-device answer)."""
    import torch

    from edge_llm_ros.nav.vlm import AdapterConfig, NavAdapter, lora_shapes

    target, draft = tiny_lms
    adapter = NavAdapter(AdapterConfig(hidden={"target": 32, "draft": 32},
                                       lora={"target": lora_shapes(target), "draft": lora_shapes(draft)})).eval()
    torch.manual_seed(2)
    with torch.no_grad():
        for lows in adapter.lora.values():
            for low in lows.values():
                torch.nn.init.normal_(low.b, std=0.2)
    return adapter, target, draft


@pytest.fixture(scope="module")
def frames():
    """Three frames from world 3's start, turning: what the tiny VLMs decide on."""
    from edge_llm_ros.nav.camera import Camera
    from edge_llm_ros.nav.world import Pose
    from edge_llm_ros.nav.worldgen import generate

    world, camera = generate(3), Camera()
    start = world.start
    return [camera.render(world, Pose(start.x, start.y, start.yaw + turn)) for turn in (0.0, 1.5, 3.0)]
