"""The Go2 navigation demo through real processes (issue 15): `edge-llm-ros launch go2_sim` starts
sim_node (the evaluation world of seed 100, never trained on), navigator_node (SmolLM2 + the
shipped navigation adapter) and go2_bridge_node on the embedded runtime; "go to the red chair"
published from the CLI starts an episode: every NavAction is valid and in the grammar, the bridge
moves the simulated Go2, and the navigator stops it within reach of the red chair (0.5 m body to
body, nothing touched), with the episode's summary (actions, waiting time, first motion). A
malformed frame makes the navigator stop the robot with a logged error naming the field."""

from __future__ import annotations

import json
import sys
import threading

import pytest

from support import Proc, cli, wait_until

pytestmark = pytest.mark.slow  # three node processes, SmolLM2 in one

INSTRUCTION = "go to the red chair"
MAX_ACTIONS = 40
EPISODE_TIMEOUT_S = 240.0
SEED = 100  # an evaluation world (edge-llm-ros train nav --eval-worlds 100-109)


class Recorder:
    def __init__(self, node, msg_type, topic: str, qos=10) -> None:
        self.items, self.cond = [], threading.Condition()
        node.create_subscription(msg_type, topic, self.on, qos)

    def on(self, msg) -> None:
        with self.cond:
            self.items.append(msg)
            self.cond.notify_all()

    def wait(self, predicate, timeout: float, what: str):
        with self.cond:
            if not self.cond.wait_for(lambda: any(predicate(m) for m in self.items), timeout):
                raise AssertionError(f"no {what} within {timeout:g} s; last: {self.items[-3:]}")
            return next(m for m in self.items if predicate(m))


def test_an_instruction_from_the_cli_drives_the_simulated_go2(rt_session, router_endpoint):
    from edge_llm_ros import runtime as rt
    from edge_llm_ros.core.nav.actions import TURNS, parse

    from edge_llm_ros.core.nav.world import Pose, reached
    from edge_llm_ros.core.nav.worldgen import GenerateConfig, generate

    world = generate(SEED, GenerateConfig(clear_path=True))
    launch = Proc([sys.executable, "-m", "edge_llm_ros.runtime.cli", "launch", "go2_sim", f"max_actions:={MAX_ACTIONS}",
                   "world:=", f"seed:={SEED}", "--router", router_endpoint])
    probe = rt_session.Node("go2_probe")
    try:
        latched = rt.QoSProfile(depth=1, transient_local=True)
        actions = Recorder(probe, rt.message("edge_llm_ros/msg/NavAction"), "/edge_llm/nav_action", 100)
        episode = Recorder(probe, rt.message("std_msgs/msg/String"), "/edge_llm/navigator/episode", latched)
        odom = Recorder(probe, rt.message("nav_msgs/msg/Odometry"), "/odom", 10)
        image = probe.create_publisher(rt.message("sensor_msgs/msg/Image"), "/camera/image_raw", 10)
        launch.wait_for_line("active: navigating with SmolLM2", 180)
        wait_until(lambda: probe.count_subscribers("/edge_llm/instruction") >= 1, 30, "the navigator's instruction")
        start = odom.wait(lambda m: True, 30, "odometry").pose.pose.position
        pub = cli("topic", "pub", "--once", "/edge_llm/instruction", "std_msgs/msg/String",
                  f"{{data: '{INSTRUCTION}'}}")
        assert pub.returncode == 0, pub.stderr
        summary = json.loads(episode.wait(lambda m: json.loads(m.data)["instruction"] == INSTRUCTION,
                                          EPISODE_TIMEOUT_S, "episode summary").data)
        assert summary["outcome"] == "stopped", (summary, launch.output[-3000:])
        assert 1 <= summary["actions"] <= MAX_ACTIONS and summary["first_motion_s"] > 0
        final = odom.items[-1].pose.pose.position
        assert reached(Pose(final.x, final.y, 0.0), world.target_object), (final, summary)
        assert "collision: touched" not in launch.output, launch.output[-3000:]
        assert summary["overlap"] is True and summary["waiting_s"] >= 0
        decided = [a for a in actions.items if a.request_id == f"nav-{summary['episode']}" and a.raw_text]
        assert decided, actions.items
        for action in decided:
            answer = parse(action.raw_text)  # a turn carried over to the pose now may change side
            assert action.valid and (answer.verb == action.action or {answer.verb, action.action} <= set(TURNS)), action
            assert 0.0 <= action.confidence <= 1.0 and action.frame_stamp.sec > 0
        if any(a.action != "stop" for a in decided):
            moved = lambda m: (abs(m.pose.pose.position.x - start.x) + abs(m.pose.pose.position.y - start.y) > 0.05
                               or abs(m.twist.twist.angular.z) > 0)  # noqa: E731
            odom.wait(moved, 30, "the Go2 moving")

        bad = rt.message("sensor_msgs/msg/Image")(encoding="rgb8", width=4, height=4, step=5, data=[0] * 20)
        image.publish(bad)  # step < width x channels
        launch.wait_for_line("rejected a frame: /camera/image_raw: step: 5 bytes per row is less than", 30)
        actions.wait(lambda a: a.action == "stop" and a.error.startswith("/camera/image_raw: step"), 30,
                     "the stop after a malformed frame")
    finally:
        probe.destroy_node()
        launch.stop()
