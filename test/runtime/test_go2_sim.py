"""The Go2 navigation demo through real processes (issue 15), on both runtimes: `edge-llm-ros launch
go2_sim` (embedded) or `ros2 launch edge_llm_ros go2_sim.launch.py` (rclpy on Fast DDS, the colcon
install) starts sim_node (the evaluation world of seed 100, never trained on), navigator_node
(SmolLM2 + the shipped navigation adapter, decisions overlapped with motion) and go2_bridge_node;
"go to the red chair" published from the backend's CLI starts an episode: every NavAction is valid
and in the grammar, and the bridge moves the simulated Go2. On the embedded runtime the navigator
stops it at the red chair (within reach, 0.5 m body to body, or the STOP_BAND_M past it where the
model's stops straddle that line; nothing touched); under rclpy the
episode ends after ROS2_ACTIONS actions, with `deployment:=edge_cloud` (verifier_node serves
SmolLM2 + the adapter as task nav, the navigator keeps the draft, over the emulated 50 ms RTT
link). Either way the episode's summary (actions, waiting time, first motion) is published, and a
malformed frame makes the navigator stop the robot with a logged error naming the field.

On the embedded runtime an edge-cloud navigator also runs alone (a stop naming the missing
verifier), then with a verifier_node started beside it (the one-device answer); on both runtimes a
pipeline navigator (the robot as D0 of two stage_nodes) does the same with its stages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import yaml
from hosts import BACKENDS, host_for, latched
from hosts import start_launch as launch_on
from hosts import stop_launch as stop
from support import REPO, Diagnostics, Proc, cli, foxglove_layout, key_values, wait_until

pytestmark = pytest.mark.slow  # three node processes, SmolLM2 in one

INSTRUCTION = "go to the red chair"
MAX_ACTIONS = 40
# Under rclpy the episode is cut at two actions (the first one moves the Go2): the launch, the ros2
# CLI, the topics, QoS, the bridge and the decisions' speed (rclpy's MultiThreadedExecutor once made
# them 2.4-11 s, runtime/ros.py) are what that run is for, and the suite has a time budget; reaching
# the chair is checked on the embedded runtime.
ROS2_ACTIONS = 2
ROS2_FRAME_AGE_S = 10.0  # still far below the 11 s decisions that rclpy's MultiThreadedExecutor once gave
EPISODE_TIMEOUT_S = 240.0
SEED = 100  # an evaluation world (edge-llm-ros train nav --eval-worlds 100-109)
# How far past REACH_M a stop may land here. The expert the adapter learned from stops the moment the
# body gap reaches REACH_M, so the model's stops straddle that line, and the frame each decision
# sees depends on timing: the nav bench's episodes stopped short at 0.502, 0.504 and 0.595 m
# (docs/navigation.md), and CI (2026-11-27) once at 0.56 m in this world, where it otherwise reaches.
# Whether the model reaches within 0.5 m is measured elsewhere, in simulated time, with the node's
# episode policy and the real decisions: over the ten evaluation worlds in test/nav/
# test_shipped_adapter.py (>= 9 of 10, nothing touched), and by bench --scenario nav. This test is
# about the instruction driving the Go2 to the chair through real processes, in this one world.
STOP_BAND_M = 0.15


# rviz2's display plugins (rviz_default_plugins) and the message type each shows; TF reads /tf
RVIZ_TYPES = {"rviz_default_plugins/Image": "sensor_msgs/msg/Image",
              "rviz_default_plugins/MarkerArray": "visualization_msgs/msg/MarkerArray",
              "rviz_default_plugins/Marker": "visualization_msgs/msg/Marker",
              "rviz_default_plugins/Path": "nav_msgs/msg/Path",
              "rviz_default_plugins/Pose": "geometry_msgs/msg/PoseStamped",
              "rviz_default_plugins/Odometry": "nav_msgs/msg/Odometry"}
NODE_STATUSES = {"sim: world", "go2_bridge: motion", "navigator: navigation"}  # each node's on /diagnostics


def rviz_topics() -> list[tuple[str, str, bool]]:
    """(topic, type, transient local) of every display in config/go2_sim.rviz."""
    config = yaml.safe_load((REPO / "config" / "go2_sim.rviz").read_text())
    out = []
    for display in config["Visualization Manager"]["Displays"]:
        kind = display["Class"]
        if kind == "rviz_default_plugins/TF":
            out.append(("/tf", "tf2_msgs/msg/TFMessage", False))
        elif kind != "rviz_default_plugins/Grid":
            topic = display["Topic"]
            out.append((topic["Value"], RVIZ_TYPES[kind], topic.get("Durability Policy") == "Transient Local"))
    return out


def assert_rviz_displays_are_published(host, probe) -> None:
    """Every topic the .rviz file shows is in the graph with the display's type, and a message comes;
    the Foxglove layout's robot topics are among them."""
    shown = dict(probe.get_topic_names_and_types())
    topics = rviz_topics()
    assert {t for t, _, _ in topics} >= {"/camera/image_raw", "/tf", "/sim/markers", "/sim/path", "/sim/goal",
                                         "/edge_llm/navigator/decision"}
    robots = {t for t in foxglove_layout() if t.startswith(("/camera/", "/sim/", "/edge_llm/navigator/"))}
    assert robots and robots <= {t for t, _, _ in topics}, robots  # the Foxglove layout's robot topics too
    for topic, msg_type, transient_local in topics:
        assert msg_type in shown.get(topic, []), (topic, msg_type, shown.get(topic))
        heard = Recorder(probe, host.message(msg_type), topic, latched(host) if transient_local else 10)
        heard.wait(lambda m: True, 30, f"a {msg_type} on {topic}")


class Recorder:
    def __init__(self, node, msg_type, topic: str, qos=10) -> None:
        self.items, self.cond = [], threading.Condition()
        node.create_subscription(msg_type, topic, self.on, qos)

    def on(self, msg) -> None:
        with self.cond:
            self.items.append(msg)
            self.cond.notify_all()

    def wait(self, predicate, timeout: float, what: str, since: int = 0):
        """The first item from ``since`` on that ``predicate`` holds for, waiting for it."""
        with self.cond:
            if not self.cond.wait_for(lambda: any(predicate(m) for m in self.items[since:]), timeout):
                raise AssertionError(f"no {what} within {timeout:g} s; last: {self.items[-3:]}")
            return next(m for m in self.items[since:] if predicate(m))


def start_launch(host, router_endpoint: str, max_actions: int, *extra: str) -> Proc:
    """The go2_sim launch on the host's backend (hosts.start_launch)."""
    return launch_on(host, router_endpoint, "go2_sim", f"max_actions:={max_actions}", "world:=seeded", f"seed:={SEED}",
                     *extra)


def publish_instruction(host) -> None:
    """"go to the red chair" from the backend's command line: `ros2 topic pub` or `edge-llm-ros topic pub`."""
    message = f"{{data: '{INSTRUCTION}'}}"
    if host.backend == "rclpy":
        env = {**os.environ, **host.child_env}
        out = subprocess.run(["ros2", "topic", "pub", "--once", "-w", "1", "/edge_llm/instruction",
                              "std_msgs/msg/String", message], env=env, capture_output=True, text=True, timeout=90)
    else:
        out = cli("topic", "pub", "--once", "/edge_llm/instruction", "std_msgs/msg/String", message)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.timeout(720)
def test_an_instruction_from_the_cli_drives_the_simulated_go2(request, backend, router_endpoint):
    from edge_llm_ros.nav.actions import TURNS, parse
    from edge_llm_ros.nav.world import REACH_M, Pose, body_gap
    from edge_llm_ros.nav.worldgen import GenerateConfig, generate

    if backend == "rclpy":
        request.getfixturevalue("ros2_env")  # a sourced ROS 2 and this package's install, loopback only
    host = host_for(request, backend)
    world = generate(SEED, GenerateConfig(clear_path=True))
    max_actions = ROS2_ACTIONS if backend == "rclpy" else MAX_ACTIONS
    # the rclpy leg: the verifier too, and frames may age more (CI, 2026-11-28: its edge-cloud decisions
    # took 2.1-2.4 s on shared cores, all dropped as stale at the default 2 s, "decisions too slow")
    extra = ["deployment:=edge_cloud", f"max_frame_age_s:={ROS2_FRAME_AGE_S}"] if backend == "rclpy" else []
    launch = start_launch(host, router_endpoint, max_actions, *extra)
    probe = host.Node("go2_probe")
    try:
        actions = Recorder(probe, host.message("edge_llm_ros/msg/NavAction"), "/edge_llm/nav_action", 100)
        episode = Recorder(probe, host.message("std_msgs/msg/String"), "/edge_llm/navigator/episode", latched(host))
        odom = Recorder(probe, host.message("nav_msgs/msg/Odometry"), "/odom", 10)
        diagnostics = Diagnostics(probe, host.message("diagnostic_msgs/msg/DiagnosticArray"))
        Image = host.message("sensor_msgs/msg/Image")
        image = probe.create_publisher(Image, "/camera/image_raw", 10)
        launch.wait_for_line("active: navigating with SmolLM2", 180)
        wait_until(lambda: probe.count_subscribers("/edge_llm/instruction") >= 1, 60, "the navigator's instruction")
        if extra:
            launch.wait_for_line("tasks: nav", 180)
            wait_until(lambda: probe.count_subscribers("/edge_llm/draft") >= 1, 60, "the verifier on /edge_llm/draft")
        start = odom.wait(lambda m: True, 30, "odometry").pose.pose.position
        publish_instruction(host)
        summary = json.loads(episode.wait(lambda m: json.loads(m.data)["instruction"] == INSTRUCTION,
                                          EPISODE_TIMEOUT_S, "episode summary").data)
        if backend == "rclpy":  # cut short on purpose (ROS2_ACTIONS)
            assert summary["outcome"] == "max_actions" and summary["actions"] == ROS2_ACTIONS, summary
        else:
            assert summary["outcome"] == "stopped", (summary, launch.output[-3000:])
            assert 1 <= summary["actions"] <= MAX_ACTIONS
            # where the Go2 came to rest: the summary leaves at the stop's hand-over, while the last
            # odometry received may be a physics step behind (CI once saw 0.522 m) or still decelerating
            at_rest = lambda m: m.twist.twist.linear.x == 0.0 and m.twist.twist.angular.z == 0.0  # noqa: E731
            final = odom.wait(at_rest, 30, "odometry at rest after the stop", since=len(odom.items)).pose.pose.position
            gap = body_gap(Pose(final.x, final.y, 0.0), world.target_object)
            from_start = body_gap(Pose(start.x, start.y, 0.0), world.target_object)
            assert gap <= REACH_M + STOP_BAND_M and gap < from_start / 2, (
                gap, final, summary, [(a.action, a.magnitude, a.raw_text) for a in actions.items],
                launch.output[-3000:])
        assert summary["first_motion_s"] > 0
        assert "collision: touched" not in launch.output, launch.output[-3000:]
        assert_rviz_displays_are_published(host, probe)
        decision = Recorder(probe, host.message("visualization_msgs/msg/Marker"), "/edge_llm/navigator/decision",
                            latched(host)).wait(lambda m: True, 30, "the decision marker")
        assert decision.header.frame_id == "base_link" and decision.text.split(":")[0] in (
            "stop", *{a.action for a in actions.items}), decision.text
        for name in NODE_STATUSES | ({"verifier_node: verifier"} if extra else set()):
            diagnostics.status(name, timeout=30)
        assert key_values(diagnostics.status("navigator: navigation"))["last decision action"] != ""
        if backend == "rclpy":  # ros2's own CLI shows the same statuses
            echoed = subprocess.run(["ros2", "topic", "echo", "--once", "/diagnostics",
                                     "diagnostic_msgs/msg/DiagnosticArray"], env={**os.environ, **host.child_env},
                                    capture_output=True, text=True, timeout=60)
            assert echoed.returncode == 0, echoed.stderr
            echoed = {(st["name"], st["hardware_id"]) for st in yaml.safe_load(echoed.stdout.split("---")[0])["status"]}
            heard = lambda: {(st.name, st.hardware_id) for a in diagnostics.seen() for st in a.status}  # noqa: E731
            assert echoed, "ros2 topic echo printed no status"
            wait_until(lambda: echoed <= heard(), 10, f"the statuses ros2 echoed, {echoed}, heard here too")
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

        bad = Image(encoding="rgb8", width=4, height=4, step=5, data=[0] * 20)  # step < width x channels
        rejected = "rejected a frame: /camera/image_raw: step: 5 bytes per row is less than"

        def sent_and_rejected() -> bool:  # again until seen: the camera's frames may push one out of the
            image.publish(bad)             # navigator's queue (depth 2) before its executor takes it
            return rejected in launch.output

        wait_until(sent_and_rejected, 30, "the navigator rejecting the malformed frame", interval=0.5)
        actions.wait(lambda a: a.action == "stop" and a.error.startswith("/camera/image_raw: step"), 30,
                     "the stop after a malformed frame")
        if backend == "rclpy":
            launch.wait_for_line("[edge_llm.navigator]: runtime: rclpy", 5)
        # No bound on decision times here (issue 28: none in the parallel pass): on a worker's one core
        # beside the verifier, the simulator and the bridge, a first decision took 2.08 s once (CI,
        # 2026-11-28) and was dropped as decided from a stale frame, as it should be; `bench --scenario
        # nav` measures decision times.
    finally:
        probe.destroy_node()
        stop(launch)



class Operator:
    """A probe that shows a navigator one frame (the start of world SEED), sends the instruction and
    waits for the NavAction that answers it; and the one-device answer for that frame."""

    def __init__(self, host, name: str) -> None:
        from edge_llm_ros.nav.camera import Camera
        from edge_llm_ros.nav.worldgen import GenerateConfig, generate

        self.probe = host.Node(name)
        self.actions = Recorder(self.probe, host.message("edge_llm_ros/msg/NavAction"), "/edge_llm/nav_action", 100)
        self.Image, self.String = host.message("sensor_msgs/msg/Image"), host.message("std_msgs/msg/String")
        self.camera = self.probe.create_publisher(self.Image, "/camera/image_raw", 10)
        self.instruction = self.probe.create_publisher(self.String, "/edge_llm/instruction", 10)
        world = generate(SEED, GenerateConfig(clear_path=True))
        self.frame = Camera().render(world, world.start)

    def ready(self, navigator: Proc) -> None:
        navigator.wait_for_line("active: navigating with SmolLM2", 180)
        wait_until(lambda: self.probe.count_subscribers("/edge_llm/instruction") >= 1, 60, "the navigator")

    def frame_now(self) -> None:
        from array import array

        h, w = self.frame.shape[:2]
        msg = self.Image(encoding="rgb8", width=w, height=h, step=w * 3, data=array("B", self.frame.tobytes()))
        msg.header.stamp = self.probe.get_clock().now().to_msg()
        self.camera.publish(msg)

    def decide(self, found, what: str, timeout: float = 90):
        """Send the instruction, showing the frame until a NavAction that ``found`` holds for comes."""
        before = len(self.actions.items)
        self.instruction.publish(self.String(data=INSTRUCTION))
        wait_until(lambda: self.frame_now() or any(found(a) for a in self.actions.items[before:]), timeout, what,
                   interval=0.2)
        return next(a for a in self.actions.items[before:] if found(a))

    def one_device_answer(self):
        from edge_llm_ros.core.engine.models import load_model
        from edge_llm_ros.nav.navigator import Navigator
        from edge_llm_ros.nav.vlm import NavAdapter

        target = load_model()
        return Navigator(NavAdapter.load(None, target), target).decide(self.frame, INSTRUCTION)


# The Operator's navigators decide on one frame, stamped afresh each time it is shown; how old a
# frame may be is not what their tests check. go2_sim.yaml's 2 s is a bound on decision time: on a
# worker's one core beside two stage processes, decisions through the stages took 1.9-2.3 s (CI,
# 2026-11-28, the other core running a bench), each was dropped as stale, and the episode ended
# "decisions too slow" before any answer. `bench --scenario nav` measures decision times.
OPERATOR_FRAME_AGE_S = 30.0


def navigator_proc(host, *params: str) -> Proc:
    return Proc([sys.executable, "-m", "edge_llm_ros.nodes.navigator_node", "--ros-args", "--params-file",
                 str(REPO / "config" / "go2_sim.yaml"), "-p", "overlap:=false",
                 "-p", f"max_frame_age_s:={OPERATOR_FRAME_AGE_S}",
                 *(arg for p in params for arg in ("-p", p))], env=host.child_env)


@pytest.mark.timeout(660)
def test_an_edge_cloud_navigator_stops_without_its_verifier_and_decides_with_it(request, router_endpoint):
    """navigator_node (deployment edge_cloud, mode fsd) on the embedded runtime, first alone: the
    decision ends within seconds (nothing subscribes to its draft topic) and the robot gets a stop
    naming the missing verifier. Then verifier_node (nav_adapter shipped, exits 16 and 24, the
    emulated link of go2_sim.yaml) starts: the next instruction is decided through it, and the
    answer is the one SmolLM2 + the adapter gives on one device for the same frame (lossless
    through processes, early outcomes and pre-drafts included)."""
    host = host_for(request)
    navigator = navigator_proc(host, "deployment:=edge_cloud", "mode:=fsd")
    verifier = None
    operator = Operator(host, "go2_edge_probe")
    try:
        operator.ready(navigator)
        stop_ = operator.decide(lambda a: "verifier gone" in a.error, "a stop naming the missing verifier", 60)
        assert stop_.action == "stop" and not stop_.valid and "/edge_llm/draft" in stop_.error, stop_
        assert navigator.popen.poll() is None  # the node goes on

        verifier = Proc([sys.executable, "-m", "edge_llm_ros.nodes.verifier_node", "--ros-args", "--params-file",
                         str(REPO / "config" / "go2_sim.yaml"), "-r", "__ns:=/edge_llm"], env=host.child_env)
        verifier.wait_for_line("tasks: nav", 180)
        wait_until(lambda: operator.probe.count_subscribers("/edge_llm/draft") >= 1, 60,
                   "the verifier on /edge_llm/draft")
        decided = operator.decide(lambda a: bool(a.raw_text), "a decision through the verifier", 60)
        want = operator.one_device_answer()
        assert decided.valid and decided.raw_text == want.text, (decided, want.text, verifier.output[-2000:])
        assert decided.confidence == pytest.approx(want.confidence, rel=1e-3)
    finally:
        operator.probe.destroy_node()
        navigator.stop()
        if verifier is not None:
            verifier.stop()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.timeout(540)
def test_a_pipeline_navigator_stops_without_its_stages_and_decides_through_them(request, backend, router_endpoint):
    """navigator_node (deployment pipeline, mode flowspec: the robot as FlowSpec's D0) on each runtime,
    first alone: the robot gets a stop naming the stage nothing serves. Then two stage_nodes
    (SmolLM2's layers 0-14 and 15-29, each with the adapter's share: the first conditions on the
    frame's features, the last masks each row by the grammar state the navigator sent) start: the
    next decision is the one-device answer for the same frame, with its confidence."""
    if backend == "rclpy":
        request.getfixturevalue("ros2_env")  # a sourced ROS 2 and this package's install, loopback only
    host = host_for(request, backend)
    navigator = navigator_proc(host, "deployment:=pipeline", "mode:=flowspec", "timeout_s:=20.0")
    stages = []
    operator = Operator(host, "go2_pipeline_probe")
    try:
        operator.ready(navigator)
        stop_ = operator.decide(lambda a: "gone" in a.error, "a stop naming the missing stage")
        assert stop_.action == "stop" and not stop_.valid and "/edge_llm/stage_0/in" in stop_.error, stop_
        assert navigator.popen.poll() is None  # the node goes on

        for i in range(2):
            stages.append(Proc([sys.executable, "-m", "edge_llm_ros.nodes.stage_node", "--ros-args", "--params-file",
                                str(REPO / "config" / "go2_sim.yaml"), "-r", "__ns:=/edge_llm", "-r",
                                f"__node:=stage_{i}"], env=host.child_env))
        for stage in stages:
            stage.wait_for_line("tasks: nav", 180)
        wait_until(lambda: all(operator.probe.count_subscribers(f"/edge_llm/stage_{i}/in") >= 1 for i in range(2)),
                   60, "both stages on their inputs")
        decided = operator.decide(lambda a: bool(a.raw_text), "a decision through the stages")
        want = operator.one_device_answer()
        assert decided.valid and decided.raw_text == want.text, (decided, want.text, stages[-1].output[-2000:])
        assert decided.confidence == pytest.approx(want.confidence, rel=1e-3)
    finally:
        operator.probe.destroy_node()
        navigator.stop()
        for stage in stages:
            stage.stop()
