"""Qwen2-VL and Qwen2.5-VL under the engine, through the real processor path (qwen-vl-utils and the
checkpoint's processor), on tiny random checkpoints written as published ones: the engine's logits
and greedy tokens equal transformers' own forward and generate with the image; every lossless mode
gives AR's answer under the action grammar; the navigator decides with them, on one device and over
edge-cloud (the draft on the robot, the target on the verifier, the resized frame sent with round
0). These tests need the ``vlm`` extra (qwen-vl-utils, torchvision): `make test` runs them in
.venv-vlm (`make vlm`)."""

import numpy as np
import pytest
import torch

from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.decoding import generate_all
from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.vision_lm import load_vision_lm, save_tiny_vlm
from edge_llm_ros.nav.actions import parse, parse_or_stop
from edge_llm_ros.nav.navigator import Navigator, answer_grammar
from edge_llm_ros.nav.qwen_vl import QwenImageSize, QwenVL

pytestmark = pytest.mark.vlm
INSTRUCTION = "go to the red chair"
SIZE = QwenImageSize(height=84, width=112)  # 3 x 4 merged patches: 12 image rows


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def checkpoints(request, tmp_path_factory):
    """(target folder, draft folder) of one model type: 2 layers and 1, other seeds, heads padded
    differently (as Qwen2-VL-7B's and 2B's: 152,064 and 151,936 rows for one tokenizer)."""
    root = tmp_path_factory.mktemp(request.param)
    return (save_tiny_vlm(root / "target", request.param, layers=2, seed=1, vocab_padding=12),
            save_tiny_vlm(root / "draft", request.param, layers=1, seed=2, vocab_padding=4))


@pytest.fixture(scope="module")
def vlm(checkpoints):
    return QwenVL.load(*checkpoints, size=SIZE)


@pytest.fixture(scope="module")
def frames():
    from edge_llm_ros.nav.camera import Camera
    from edge_llm_ros.nav.world import Pose
    from edge_llm_ros.nav.worldgen import generate

    world, camera = generate(3), Camera()
    start = world.start
    return [camera.render(world, Pose(start.x, start.y, start.yaw + turn)) for turn in (0.0, 1.5, 3.0)]


def test_a_draft_padded_otherwise_scores_at_the_targets_width(vlm):
    _, target, draft = vlm
    own = len(target.tokenizer) + 4  # the draft's head rows
    assert target.vocab_size == len(target.tokenizer) + 12 == draft.vocab_size
    for rows in (1, 3, 16):  # each of the head's paths
        logits = draft(torch.arange(1, rows + 1), torch.arange(rows), None, draft.new_cache(rows))  # [rows, V]
        assert logits.shape == (rows, target.vocab_size)
        assert torch.isinf(logits[:, own:]).all() and torch.isfinite(logits[:, :own]).all()


def test_the_engine_reads_the_image_as_transformers_does(vlm, frames, checkpoints):
    """Prompt logits of the conditioned view equal the checkpoint's own forward with pixel_values
    (M-RoPE positions, the vision tower's rows in the image tokens' places)."""
    adapter, target, _ = vlm
    batch = adapter.inputs(frames[0], INSTRUCTION)
    prompt = batch["input_ids"][0].tolist()
    view = adapter.condition(target, frames[0])
    assert view.image is not None and len(view.image.at) == 12 and view.image.delta != 0
    cache = view.new_cache(len(prompt))
    ours = view(torch.tensor(prompt), torch.arange(len(prompt)), None, cache)  # [T, V]
    with torch.inference_mode():
        theirs = target.hf(**batch).logits[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    blank = target(torch.tensor(prompt), torch.arange(len(prompt)), None, target.new_cache(len(prompt)))
    assert not torch.allclose(blank[-1], theirs[-1], atol=1e-3)  # the image changes the answer


def test_greedy_tokens_equal_transformers_generate(vlm, frames):
    """After the prompt, positions continue from the image's (p + delta): the engine's AR tokens
    equal the checkpoint's own greedy generate, unconstrained, for 12 tokens."""
    adapter, target, _ = vlm
    batch = adapter.inputs(frames[1], INSTRUCTION)
    prompt = batch["input_ids"][0].tolist()
    view = adapter.condition(target, frames[1])
    ours = generate_all(view, prompt, GenerationConfig(mode="ar", max_new_tokens=12)).tokens
    with torch.inference_mode():
        out = target.hf.generate(**batch, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert ours == out[0, len(prompt):].tolist()


@pytest.mark.parametrize("mode", ["sd", "tree", "llmcad"])
def test_speculative_modes_give_the_constrained_ar_answer(vlm, frames, mode):
    adapter, target, draft = vlm
    grammar = answer_grammar(target.tokenizer, target.vocab_size)
    prompt = adapter.prompt_ids(target.tokenizer, INSTRUCTION)
    for frame in frames:
        view, draft_view = adapter.condition(target, frame), adapter.condition(draft, frame, "draft")
        want = generate_all(view, prompt, GenerationConfig(mode="ar", max_new_tokens=40), grammar=grammar)
        got = generate_all(view, prompt, GenerationConfig(mode=mode, max_new_tokens=40, gamma=3, tree_depth=3,
                                                          tree_width=6),
                           ModelDrafter(draft_view), grammar=grammar)
        assert got.tokens == want.tokens and got.stats.rounds < len(want.tokens)
        text = target.tokenizer.decode(want.tokens, skip_special_tokens=True)
        assert not parse_or_stop(text)[1] or len(want.tokens) == 40, text  # a sentence of the grammar, or cut


def test_the_navigator_decides_with_a_qwen_vlm(vlm, frames):
    adapter, target, draft = vlm
    config = GenerationConfig(mode="sd", max_new_tokens=64, gamma=3)
    sd = Navigator(adapter, target, draft, config)
    ar = Navigator(adapter, target, None, config.with_overrides(mode="ar"))
    for frame in frames:
        a, b = ar.decide(frame, INSTRUCTION), sd.decide(frame, INSTRUCTION)
        assert b.text == a.text and b.command == a.command
        assert b.confidence == pytest.approx(a.confidence, rel=1e-5)
        if a.valid:
            assert parse(a.text) == a.command and 0.0 < a.confidence <= 1.0
        else:
            assert a.command.verb == "stop"


def test_bad_checkpoints_are_refused_naming_why(tmp_path, checkpoints):
    with pytest.raises(FileNotFoundError, match="no vision-language model"):
        load_vision_lm(tmp_path)
    adapter, target, _ = QwenVL.load(checkpoints[0], size=SIZE)
    other = QwenVL(adapter.processor, QwenImageSize(height=112, width=112))  # 4 x 4: 16 image rows
    prompt = other.prompt_ids(target.tokenizer, INSTRUCTION)
    batch = adapter.inputs(np.zeros((84, 112, 3), np.uint8))
    with pytest.raises(ValueError, match="16 image tokens, the image makes 12 rows"):
        target.with_image(prompt, batch["pixel_values"], batch["image_grid_thw"])


@pytest.mark.parametrize("mode", ["ar", "sd", "tree"])
def test_over_edge_cloud_every_mode_gives_the_one_device_answer(vlm, frames, mode):
    """The robot holds the draft and sends the resized frame; the verifier serves the target as
    task nav (nav_task over the same QwenVL) and conditions it on that frame."""
    from edge_llm_ros.core.edge_cloud import EarlyExitDrafter, EarlyExitVerifier, edge_cloud_rounds
    from edge_llm_ros.nav.navigator import NAV_TASK, EdgeCloudNavigator, nav_task

    adapter, target, draft = vlm
    verifier = EarlyExitVerifier(target, None, tasks={NAV_TASK: nav_task(adapter, target)},
                                 eos_ids=[target.tokenizer.eos_token_id])
    robot = EarlyExitDrafter([ModelDrafter(draft)], seed=0)

    def rounds(request_id, prompt, config, **start):
        return edge_cloud_rounds(verifier, robot, prompt, config, request_id=request_id, **start)

    config = GenerationConfig(max_new_tokens=64, gamma=3, tree_depth=3, tree_width=6)
    local = Navigator(adapter, target, None, config)
    remote = EdgeCloudNavigator(adapter, draft, rounds, mode, config)
    try:
        for frame in frames:
            assert adapter.features(frame).shape == (84, 112, 3)
            want, got = local.decide(frame, INSTRUCTION), remote.decide(frame, INSTRUCTION)
            assert got.text == want.text and got.command == want.command
            assert got.confidence == pytest.approx(want.confidence, rel=1e-5)
        assert verifier.requests == [] and robot.requests == []
    finally:
        robot.close()


def test_the_verifier_refuses_an_image_of_another_size_naming_it(vlm):
    from edge_llm_ros.core.edge_cloud import DraftError, EarlyExitVerifier
    from edge_llm_ros.nav.navigator import NAV_TASK, nav_task

    adapter, target, _ = vlm
    verifier = EarlyExitVerifier(target, None, tasks={NAV_TASK: nav_task(adapter, target)})
    prompt = adapter.prompt_ids(target.tokenizer, INSTRUCTION)
    with pytest.raises(DraftError, match=r"image_features.*112 x 84 RGB values in 0-255 \(28224 values"):
        verifier.start("too-small", prompt, NAV_TASK, [0.0] * 300)
    assert verifier.requests == []
