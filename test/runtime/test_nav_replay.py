"""Rosbag replay of the Go2 navigator (issue 15), the replay_testing way: input MCAP fixtures
(test/data/nav_bags, made by `python -m edge_llm_ros.tools.nav_bags` from the simulator's world and
camera) -> navigator_node and go2_bridge_node as processes on the embedded runtime -> an output bag
recorded by `edge-llm-ros bag record` -> asserts on it.

- The fixtures are what the tool writes, byte for byte, and were answered by the adapter that ships
  (its sha256); after the adapter, prompt or grammar changes on purpose, rerun the tool.
- Replayed with `bag play --require` at 1x and at 2x (one navigator process for both, the model
  loaded once): every NavAction the navigator decided is valid, in the grammar, and the answer
  expected.json holds for the frame it names (frame_stamp); each bag's episode ends with the bag's
  empty instruction; the bridge put the motion of those actions on /cmd_vel, within its limits.
- A bag without the camera topic fails `--require` before anything is published
  (test_bag_cli.py; the check itself in test_bag.py).

Every wait is on an event (a log line, an episode summary) with a timeout.
"""

from __future__ import annotations

import json
import math
import signal

import pytest
from support import REPO, Proc, cli, python_module, setup_budget, wait_until

from edge_llm_ros.tools import nav_bags

PARAMS = str(REPO / "config" / "go2_sim.yaml")
BAGS = nav_bags.OUT
PLAYED = ("search", "approach")
REQUIRE = [f"{topic}:{ros_type}" for topic, ros_type in (nav_bags.CAMERA, nav_bags.INSTRUCTION)]
OUTPUTS = ("/edge_llm/nav_action", "/cmd_vel", "/edge_llm/navigator/episode")
RERUN = f"if the adapter, the prompt or the grammar changed on purpose, rerun `{nav_bags.REGENERATE}`"
MAX_VX, MAX_WZ = 0.5, 1.0  # the bridge's max_linear_mps and max_angular_rps in config/go2_sim.yaml
# The robot in the bags stands and they hold no /odom: the navigator decides stop-and-go (overlap
# false), each decision from a frame that arrived after the bridge went idle.
# The bags' frames keep their recording stamps (2025-01-01; the embedded runtime has no /clock for
# sim time), so the bridge's stale-frame gate would refuse every replayed action: open it. The
# navigator's own gate (max_frame_age_s 2.0) counts from when a frame arrived, and stays.
BRIDGE_FRAME_AGE_S = "1000000000.0"
SIGNS = {"forward": ("vx", 1), "backward": ("vx", -1), "turn_left": ("wz", 1), "turn_right": ("wz", -1)}


@pytest.fixture(scope="module")
def expected():
    return nav_bags.load_expected()


def test_fixtures_are_what_the_tool_writes(tmp_path, expected):
    from edge_llm_ros.nav.camera import Camera
    from edge_llm_ros.nav.worldgen import GenerateConfig, generate

    world = generate(nav_bags.SEED, GenerateConfig(clear_path=True))
    for scenario in nav_bags.SCENARIOS:
        frame = Camera().render(world, nav_bags.scenario_pose(world, scenario)) if scenario.camera else None
        nav_bags.write_bag(tmp_path / scenario.name, nav_bags.messages(scenario, frame))
        for path in (BAGS / scenario.name).iterdir():
            assert path.read_bytes() == (tmp_path / scenario.name / path.name).read_bytes(), \
                f"{path} differs from what the tool writes now: rerun `{nav_bags.REGENERATE}`"
        stamps = [s for d in expected["bags"][scenario.name]["decisions"] for s in d["frame_stamps_ns"]]
        assert sorted(stamps) == (nav_bags.frame_stamps(scenario) if scenario.camera else [])
    size = sum(p.stat().st_size for p in BAGS.rglob("*") if p.is_file())
    assert size < 1_000_000, f"the fixtures take {size} bytes"


def test_fixtures_were_answered_by_the_shipped_adapter(expected):
    assert expected["adapter"] == nav_bags.adapter_fingerprint(), \
        f"the shipped navigation adapter changed since test/data/nav_bags was recorded: rerun `{nav_bags.REGENERATE}`"


@pytest.fixture(scope="module")
@setup_budget(270)
def nodes(router_endpoint, rt_session):
    """navigator_node (SmolLM2 + the shipped adapter, loaded once; it warms up on configure) and
    go2_bridge_node, with a probe that collects the navigator's episode summaries (one per replayed bag)."""
    from edge_llm_ros import runtime as rt

    navigator = Proc(python_module("edge_llm_ros.nodes.navigator_node", "--ros-args", "--params-file", PARAMS,
                                   "-p", "overlap:=false"))
    bridge = Proc(python_module("edge_llm_ros.nodes.go2_bridge_node", "--ros-args", "--params-file", PARAMS,
                                "-p", f"max_frame_age_s:={BRIDGE_FRAME_AGE_S}"))
    probe = rt_session.Node("nav_replay_probe")
    episodes: list[dict] = []
    probe.create_subscription(rt.message("std_msgs/msg/String"), "/edge_llm/navigator/episode",
                              lambda m: episodes.append(json.loads(m.data)), rt.QoSProfile(depth=1, transient_local=True))
    try:
        navigator.wait_for_line("active: navigating with SmolLM2", 180)
        bridge.wait_for_line("go2_bridge: cmd_vel on /cmd_vel", 60)
        wait_until(lambda: probe.count_subscribers(nav_bags.CAMERA[0]) >= 1
                   and probe.count_publishers("/edge_llm/go2_bridge/state") >= 1, 30, "the navigator and the bridge")
        yield episodes
    finally:
        probe.destroy_node()
        navigator.stop()
        bridge.stop()


def replay(name: str, rate: float, episodes: list[dict]) -> dict:
    """Play one input bag; its episode's summary (the bag's empty instruction ends it)."""
    before = len(episodes)
    played = cli("bag", "play", str(BAGS / name), "--rate", f"{rate:g}", "--require", *REQUIRE)
    assert played.returncode == 0, played.stderr
    wait_until(lambda: len(episodes) > before, 30, f"the episode of bag {name} at {rate:g}x to end")
    summary = episodes[before]
    assert summary["instruction"] == nav_bags.GOAL and summary["outcome"] == "replaced", summary
    return summary


def record_replays(out, rate: float, episodes: list[dict]) -> dict[str, dict]:
    recorder = Proc(python_module("edge_llm_ros.runtime.cli", "bag", "record", "-o", str(out), *OUTPUTS))
    try:
        for topic in OUTPUTS:
            recorder.wait_for_line(f"subscribed to {topic}", 30)
        summaries = {name: replay(name, rate, episodes) for name in PLAYED}
        recorder.popen.send_signal(signal.SIGINT)
        assert recorder.wait(30) == 0, recorder.output
    finally:
        recorder.stop()
    return summaries


def recorded(out) -> dict[str, list]:
    from edge_llm_ros.runtime.bag import BagReader
    from edge_llm_ros.runtime.interfaces import registry

    by_topic: dict[str, list] = {topic: [] for topic in OUTPUTS}
    for m in BagReader(out):
        by_topic[m.topic].append(registry().deserialize(m.data, m.typename))
    return by_topic


def check_decisions(name: str, summary: dict, actions: list, expected: dict) -> list[str]:
    """The NavActions of the bag's episode against expected.json; returns their verbs."""
    from edge_llm_ros.nav.actions import parse

    by_stamp = {s: d for d in expected["bags"][name]["decisions"] for s in d["frame_stamps_ns"]}
    decided = [a for a in actions if a.request_id == f"nav-{summary['episode']}"]
    assert len(decided) == summary["actions"] >= 1, (summary, decided)
    for a in decided:
        stamp = a.frame_stamp.sec * 10**9 + a.frame_stamp.nanosec
        assert stamp in by_stamp, f"{name}: a NavAction from frame stamp {stamp}, which is not a frame of the bag"
        want = by_stamp[stamp]
        assert a.valid and not a.error and parse(a.raw_text).verb == a.action, a
        assert (a.raw_text, a.action, a.magnitude) == (want["text"], want["action"], want["magnitude"]), \
            f"{name}: navigator_node answered {a.raw_text!r} to frame {stamp}, expected.json says {want['text']!r}; {RERUN}"
        assert math.isclose(a.confidence, want["confidence"], abs_tol=0.01), (a.confidence, want)
    return [a.action for a in decided]


@pytest.mark.slow  # navigator_node (SmolLM2) and go2_bridge_node processes; two bags per rate
@pytest.mark.parametrize("rate", [1.0, 2.0])
def test_replayed_bags_give_the_expected_actions(nodes, expected, tmp_path, rate):
    assert expected["adapter"] == nav_bags.adapter_fingerprint(), f"the adapter changed: {RERUN}"
    out = tmp_path / "out"
    summaries = record_replays(out, rate, nodes)
    topics = recorded(out)

    verbs = {v for name in PLAYED for v in check_decisions(name, summaries[name], topics[OUTPUTS[0]], expected)}
    assert {json.loads(s.data)["episode"] for s in topics[OUTPUTS[2]]} >= {s["episode"] for s in summaries.values()}
    cleared = [a for a in topics[OUTPUTS[0]] if not a.request_id]
    assert [(a.action, a.error) for a in cleared] == [("stop", "instruction cleared")] * len(PLAYED), cleared

    twists = topics[OUTPUTS[1]]
    assert all(abs(t.linear.x) <= MAX_VX + 1e-6 and abs(t.angular.z) <= MAX_WZ + 1e-6 for t in twists), twists
    moved = {(axis, int(math.copysign(1, value))) for t in twists
             for axis, value in (("vx", t.linear.x), ("wz", t.angular.z)) if abs(value) > 1e-3}
    assert moved == {SIGNS[v] for v in verbs if v in SIGNS}, (verbs, moved)
