"""The navigator over edge-cloud decoding (the robot's half with the draft, the verifier's with the
target as task "nav"), on a tiny random VLM with LoRA: every edge mode gives the one-device AR
answer token for token and its confidence; the verifier refuses what a navigation round 0 must
not carry, naming the field."""

import functools

import pytest
import torch

from edge_llm_ros.core import GenerationConfig
from edge_llm_ros.core.drafters import ModelDrafter
from edge_llm_ros.core.edge_cloud import (DraftError, DraftRequest, EarlyExitDrafter, EarlyExitVerifier,
                                          edge_cloud_rounds)
from edge_llm_ros.core.nav.navigator import NAV_TASK, EdgeCloudNavigator, Navigator, nav_task
from edge_llm_ros.core.nav.vlm import AdapterConfig, NavAdapter, lora_shapes

INSTRUCTION = "go to the red chair"


@pytest.fixture(scope="module")
def vlm(tiny_lms):
    target, draft = tiny_lms
    adapter = NavAdapter(AdapterConfig(hidden={"target": 32, "draft": 32},
                                       lora={"target": lora_shapes(target), "draft": lora_shapes(draft)})).eval()
    torch.manual_seed(2)
    with torch.no_grad():
        for lows in adapter.lora.values():  # a LoRA that changes the answers, so the server must merge it
            for low in lows.values():
                torch.nn.init.normal_(low.b, std=0.2)
    return adapter, target, draft


@pytest.fixture(scope="module")
def halves(vlm):
    """(the verifier serving task nav, the robot's EarlyExitDrafter over the adapted draft)."""
    adapter, target, draft = vlm
    verifier = EarlyExitVerifier(target, None, tasks={NAV_TASK: nav_task(adapter, target)},
                                 eos_ids=[target.tokenizer.eos_token_id])
    robot = EarlyExitDrafter([ModelDrafter(adapter.attach(draft, "draft"))], seed=0)
    yield verifier, robot
    robot.close()


@pytest.mark.parametrize("mode", ["ar", "sd", "fsd"])  # tree: the same verifier path as sd
def test_every_edge_mode_gives_the_one_device_answer(vlm, frames, halves, mode):
    adapter, target, draft = vlm
    verifier, robot = halves
    config = GenerationConfig(max_new_tokens=64, gamma=3, tree_depth=3, tree_width=6)
    local = Navigator(adapter, target, None, config)
    remote = EdgeCloudNavigator(adapter, draft, functools.partial(_rounds, verifier, robot), mode, config)
    confidences = []
    for frame in frames:
        want, got = local.decide(frame, INSTRUCTION), remote.decide(frame, INSTRUCTION)
        assert got.text == want.text and got.command == want.command
        assert got.confidence == pytest.approx(want.confidence, rel=1e-5)
        assert got.stats.new_tokens == want.stats.new_tokens and got.stats.rounds >= 1
        confidences.append(got.confidence)
    # each frame its own probabilities (1e-4 apart on this tiny model): the server read each image
    assert min(abs(a - b) for i, a in enumerate(confidences) for b in confidences[:i]) > 1e-4 * max(confidences)
    assert verifier.requests == [] and robot.requests == []  # every decision released both halves


def test_the_verifier_warms_the_nav_task_up_and_keeps_nothing(halves):
    verifier, _ = halves
    assert verifier.warm_up() > 0 and verifier.requests == []


def _rounds(verifier, robot, request_id, prompt, config, **start):
    return edge_cloud_rounds(verifier, robot, prompt, config, request_id=request_id, **start)


def test_a_navigation_round_0_is_checked_naming_the_field(vlm, frames, halves):
    adapter, target, _ = vlm
    verifier, _ = halves
    prompt = adapter.prompt_ids(target.tokenizer, INSTRUCTION)
    features = adapter.features(frames[0]).flatten().tolist()

    def round0(**fields):
        return DraftRequest("bad", 0, prompt, len(prompt), [], [], [], **fields)

    cases = [
        (dict(task="chess"), r"^task: this verifier serves no task 'chess' \(tasks: 'nav'\)"),
        (dict(task=NAV_TASK), r"^image_features: task 'nav' needs the frame's image features"),
        (dict(task=NAV_TASK, image_features=features[:-1]), r"^image_features: image features must be 8 x 64"),
        (dict(task=NAV_TASK, image_features=[float("nan")] * len(features)), r"^image_features: must be finite"),
        (dict(image_features=features), r"^image_features: an image needs a task"),
    ]
    for fields, message in cases:
        with pytest.raises(DraftError, match=message):
            verifier.verify_all(round0(**fields))
        assert verifier.requests == []  # nothing was started
    later = DraftRequest("bad", 1, [], len(prompt), [], [], [], task=NAV_TASK)
    with pytest.raises(DraftError, match=r"^task: only round 0 names the task"):
        later.check(target.vocab_size)
