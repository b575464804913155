"""The navigator over edge-cloud decoding (the robot's half with the draft, the verifier's with the
target as task "nav"), on a tiny random VLM with LoRA: every edge mode gives the one-device AR
answer token for token and its confidence; the verifier refuses what a navigation round 0 must
not carry, naming the field."""

import functools

import pytest

from edge_llm_ros.core.edge_cloud import (
    DraftError,
    DraftRequest,
    EarlyExitDrafter,
    EarlyExitVerifier,
    edge_cloud_rounds,
    linked_rounds,
)
from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.nav.navigator import NAV_TASK, EdgeCloudNavigator, Navigator, nav_task

INSTRUCTION = "go to the red chair"


@pytest.fixture(scope="module")
def vlm(lora_vlm):
    return lora_vlm


@pytest.fixture(scope="module")
def halves(vlm):
    """(the verifier serving task nav, the robot's EarlyExitDrafter over the adapted draft)."""
    adapter, target, draft = vlm
    verifier = EarlyExitVerifier(target, None, tasks={NAV_TASK: nav_task(adapter, target)},
                                 eos_ids=[target.tokenizer.eos_token_id])
    robot = EarlyExitDrafter([ModelDrafter(adapter.attach(draft, "draft"))], seed=0)
    yield verifier, robot
    robot.close()


@pytest.mark.parametrize("mode", ["ar", "sd", "fsd", "ee"])  # tree: the same verifier path as sd
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


def test_over_emulated_links_and_in_ee_go2_simulated_time_every_mode_gives_the_same_answer(vlm, frames, halves):
    """The bench's two paths (tools/bench_nav.py): the server on its own thread behind 10 ms links
    each way, and core/sim/edge_cloud.py with EE's Go2 seconds; both the one-device answer. Cloud AR's
    simulated decision is Table 4's: 2 T_c + a prefill (T_q's share of the layers) + T(1 row) per
    token, and round 0's bytes up."""
    from edge_llm_ros.core.edge_cloud.records import draft_bytes
    from edge_llm_ros.core.sim.edge_cloud import simulate_edge_cloud
    from edge_llm_ros.nav.deployment import ee_go2_costs
    from edge_llm_ros.runtime.link import Link, LinkSpec

    adapter, target, draft = vlm
    verifier, robot = halves
    config = GenerationConfig(max_new_tokens=64, gamma=3)
    local = Navigator(adapter, target, None, config)
    links = [Link(LinkSpec(latency_ms=10.0, bandwidth_mbps=100.0), name) for name in ("up", "down")]

    def linked(request_id, prompt, request_config, **start):
        return linked_rounds(verifier, robot, prompt, request_config, uplink=links[0], downlink=links[1],
                             request_id=request_id, timeout_s=30, **start)

    costs, inputs = ee_go2_costs(len(target.layer_ids))
    try:
        for mode in ("ar", "sd", "fsd", "ee"):
            remote = EdgeCloudNavigator(adapter, draft, linked, mode, config)
            for frame in frames[:2]:
                want, got = local.decide(frame, INSTRUCTION), remote.decide(frame, INSTRUCTION)
                assert got.text == want.text, mode
                prompt = remote.prompt(INSTRUCTION)
                timeline = simulate_edge_cloud(verifier, robot, prompt, remote.config, costs, request_id=f"sim-{mode}",
                                               **remote.request(frame))
                assert timeline.tokens == local.answer(frame, prompt)[0], mode
                if mode == "ar":
                    t_c, t_q, one_row = (next(c.value for c in inputs if c.name.startswith(n)) / 1e3 for n in
                                         ("communication", "verification latency", "a one-row"))
                    head = next(c.value for c in inputs if c.name.startswith("Qwen2-VL-7B's head"))
                    layers = len(target.layer_ids)
                    prefill = t_q * layers / (layers + head)  # the layers' share: no head over a prompt
                    up = draft_bytes(DraftRequest("x", 0, prompt, len(prompt), [], [], [], task=NAV_TASK,
                                                  image_features=[0.0] * 512)) * 8 / 100e6
                    want_s = 2 * t_c + prefill + len(timeline.tokens) * one_row + up
                    assert timeline.total_s == pytest.approx(want_s, rel=0.01)
    finally:
        for link in links:
            link.close()
    assert verifier.requests == [] and robot.requests == []


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


def test_a_task_serves_its_own_exits_which_must_cover_the_verifiers_layers(vlm, frames):
    """A nav request's early outcomes are read with the task's exits (trained on its model), a plain
    request's with the verifier's; task exits without one of the verifier's layers are refused."""
    from edge_llm_ros.core.drafts.exits import build_exits

    adapter, target, _ = vlm
    plain_exits = build_exits(target, [0], bottleneck=8, seed=1)
    task_exits = build_exits(adapter.attach(target, "target"), [0], bottleneck=8, seed=2)
    read = []
    for name, exits in (("plain", plain_exits), ("task", task_exits)):
        original = exits.exit_logits
        exits.exit_logits = lambda *args, name=name, original=original, **kw: read.append(name) or original(*args, **kw)
    verifier = EarlyExitVerifier(target, plain_exits, eos_ids=[target.tokenizer.eos_token_id],
                                 tasks={NAV_TASK: nav_task(adapter, target, exits=task_exits)})
    prompt = adapter.prompt_ids(target.tokenizer, INSTRUCTION)
    features = adapter.features(frames[0]).flatten().tolist()
    nav = DraftRequest("nav", 0, prompt, len(prompt), [5], [-1], [1.0], task=NAV_TASK, image_features=features)
    early = [o for o in verifier.verify_all(nav) if not o.final]
    assert early and read == ["task"] * len(early)
    read.clear()
    plain = DraftRequest("plain", 0, prompt, len(prompt), [5], [-1], [1.0])
    early = [o for o in verifier.verify_all(plain) if not o.final]
    assert early and read == ["plain"] * len(early)
    with pytest.raises(ValueError, match=r"task 'nav': its exits have no exit at layers \[0\]"):
        elsewhere = type("Exits", (), {"layers": (5,)})()  # exits of a deeper model: none at layer 0
        EarlyExitVerifier(target, plain_exits, tasks={NAV_TASK: nav_task(adapter, target, exits=elsewhere)})
