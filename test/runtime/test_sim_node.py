"""sim_node through real processes (issue 15), on both runtimes (the embedded one and rclpy):

- camera frames arrive on /camera/image_raw at the configured rate, rgb8, of the configured size,
  stamped, frame `camera`, and the frame at the start pose is nav.camera's render byte for byte;
- a Twist on /cmd_vel moves /odom along the heading and turns it; when commands stop coming the
  robot stops (cmd_timeout_s);
- driving into a wall stops the robot before it and logs the collision;
- the world is latched on /sim/world (the same as the YAML file), the markers on /sim/markers;
  /tf carries odom -> base_link where tf2_msgs exists, else the node says it does not publish it;
- a seed on /sim/reset draws that world (nav.worldgen) and puts the robot at its start;
- bad parameters and a bad world file exit with code 2 naming the parameter or the field.
"""

from __future__ import annotations

import math
import sys
import threading
import time

import numpy as np
import pytest
import yaml
from hosts import BACKENDS, host_for, latched
from support import REPO, Proc, stamped_now, wait_until

pytestmark = pytest.mark.slow  # real node processes

PARAMS = str(REPO / "config" / "go2_sim.yaml")
WORLD = REPO / "config" / "worlds" / "default.yaml"
WIDTH, HEIGHT, RATE = 96, 72, 20.0


def sim_cmd(*params: str) -> list[str]:
    overrides = [arg for p in params for arg in ("-p", p)]
    return [sys.executable, "-m", "edge_llm_ros.nodes.sim_node", "--ros-args", "--params-file", PARAMS, *overrides]


def yaw_of(odom) -> float:
    q = odom.pose.pose.orientation
    return 2 * math.atan2(q.z, q.w)


class Probe:
    """This test's side of the simulator: what arrives on its topics, kept in order; a Twist out."""

    def __init__(self, host, node) -> None:
        self.host, self.node = host, node
        self.cond = threading.Condition()
        self.images: list = []
        self.odoms: list = []
        self.worlds: list = []
        self.markers: list = []
        self.tfs: list = []
        self.subscribe("sensor_msgs/msg/Image", "/camera/image_raw", self.images, 10)
        self.subscribe("nav_msgs/msg/Odometry", "/odom", self.odoms, 50)
        self.subscribe("std_msgs/msg/String", "/sim/world", self.worlds, latched(host))
        self.subscribe("visualization_msgs/msg/MarkerArray", "/sim/markers", self.markers, latched(host))
        self.subscribe("tf2_msgs/msg/TFMessage", "/tf", self.tfs, 50)  # rclpy: make ros2 vendors tf2_msgs here
        self.paths: list = []
        self.goals: list = []
        self.subscribe("nav_msgs/msg/Path", "/sim/path", self.paths, 10)
        self.subscribe("geometry_msgs/msg/PoseStamped", "/sim/goal", self.goals, latched(host))
        self.Twist = host.message("geometry_msgs/msg/Twist")
        self.cmd = node.create_publisher(self.Twist, "/cmd_vel", 10)
        self.reset_pub = node.create_publisher(host.message("std_msgs/msg/Int32"), "/sim/reset", 10)

    def subscribe(self, type_name: str, topic: str, into: list, qos) -> None:
        def on_message(msg) -> None:
            with self.cond:
                into.append((time.monotonic(), msg))
                self.cond.notify_all()

        self.node.create_subscription(self.host.message(type_name), topic, on_message, qos)

    def wait(self, predicate, timeout: float, what: str):
        """Wait for ``predicate()`` (called under the lock as messages arrive) to be truthy."""
        with self.cond:
            value = self.cond.wait_for(predicate, timeout)
        assert value, f"timed out after {timeout:g} s waiting for {what}"
        return value

    def odom(self):
        with self.cond:
            return self.odoms[-1][1] if self.odoms else None

    def drive(self, vx: float, wz: float, until, timeout: float, what: str) -> None:
        """Publish the Twist every 0.1 s until ``until()`` holds."""
        twist = self.Twist()
        twist.linear.x, twist.angular.z = float(vx), float(wz)

        def sent_and_done():
            self.cmd.publish(twist)
            return until()

        wait_until(sent_and_done, timeout, what, interval=0.1)

    def reset(self, seed: int, start) -> None:
        """A reset to ``seed``, waited for until /odom shows the robot at ``start`` (a core Pose) at rest."""
        Int32 = self.host.message("std_msgs/msg/Int32")
        wait_until(lambda: self.reset_pub.get_subscription_count() >= 1, 30, "sim_node on /sim/reset")

        def at_start():
            odom = self.odom()
            return odom is not None and math.hypot(odom.pose.pose.position.x - start.x,
                                                   odom.pose.pose.position.y - start.y) < 1e-6 \
                and abs(math.remainder(yaw_of(odom) - start.yaw, math.tau)) < 1e-6 and odom.twist.twist.linear.x == 0

        def sent_and_there():  # again until seen: a route may still be forming when the graph already shows it
            self.reset_pub.publish(Int32(data=seed))
            with self.cond:
                return self.cond.wait_for(at_start, 2.0)

        wait_until(sent_and_there, 30, f"the robot back at the start after reset {seed}")


@pytest.fixture(scope="module")
def sim(request, router_endpoint):
    """sim_node on the default world as a process on the backend the test names (``indirect``);
    yields (process, probe)."""
    host = host_for(request, getattr(request, "param", "zenoh"))
    proc = Proc(sim_cmd(f"width:={WIDTH}", f"height:={HEIGHT}", f"rate_hz:={RATE}"), env=host.child_env)
    node = host.Node("sim_probe")
    try:
        proc.wait_for_line(f"camera {WIDTH}x{HEIGHT}", 60)
        proc.wait_for_line(f"runtime: {host.backend}", 10)
        yield proc, Probe(host, node)
    finally:
        node.destroy_node()
        proc.stop()


@pytest.mark.parametrize("sim", BACKENDS, indirect=True)
def test_frames_arrive_at_the_rate_in_rgb8_and_show_the_core_render(sim):
    from edge_llm_ros.nav.camera import Camera
    from edge_llm_ros.nav.world import World

    proc, probe = sim
    world = World.from_yaml(WORLD)
    probe.reset(-1, world.start)
    with probe.cond:
        first = len(probe.images)
    probe.wait(lambda: len(probe.images) >= first + 31, 30, "31 camera frames")
    with probe.cond:
        frames = [msg for _, msg in probe.images[first:first + 31]]
    for msg in frames:
        assert (msg.width, msg.height, msg.encoding, msg.step) == (WIDTH, HEIGHT, "rgb8", 3 * WIDTH)
        assert len(msg.data) == WIDTH * HEIGHT * 3 and msg.header.frame_id == "camera" and stamped_now(msg)
    stamps = [m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for m in frames]
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    # Never faster than configured; slower only as far as a loaded 2-core machine delays the timer
    # (CI saw 9.8 frames/s at 20 under rclpy while other suites' processes ran).
    assert 0.4 * RATE <= rate <= 1.25 * RATE, f"{rate:.1f} frames/s, configured {RATE}"
    expected = Camera(WIDTH, HEIGHT, 90.0).render(world, world.start)
    assert np.array_equal(np.frombuffer(bytes(frames[-1].data), np.uint8).reshape(HEIGHT, WIDTH, 3), expected)


@pytest.mark.parametrize("sim", BACKENDS, indirect=True)
def test_a_twist_moves_odom_and_the_robot_stops_when_commands_stop(sim):
    from edge_llm_ros.nav.world import World

    proc, probe = sim
    start = World.from_yaml(WORLD).start  # (2.2, 1.6) facing +y, open ahead
    probe.reset(-1, start)
    probe.drive(0.5, 0.0, lambda: probe.odom().pose.pose.position.y > start.y + 0.3, 20, "/odom 0.3 m ahead")
    odom = probe.odom()
    assert abs(odom.pose.pose.position.x - start.x) < 1e-6 and abs(yaw_of(odom) - start.yaw) < 1e-6
    assert odom.twist.twist.linear.x == pytest.approx(0.5, rel=0.05)
    probe.wait(lambda: probe.odoms[-1][1].twist.twist.linear.x == 0.0, 10, "the robot stopped (cmd_timeout_s)")
    stopped = probe.odom().pose.pose.position.y
    with probe.cond:
        turn_start = len(probe.odoms)
    probe.drive(0.0, 1.0, lambda: yaw_of(probe.odom()) > start.yaw + 0.3, 20, "/odom turned 0.3 rad left")
    assert probe.odom().pose.pose.position.y == stopped
    with probe.cond:  # the turn's odometry reports the command it follows (a loaded machine may let one lapse)
        assert any(m.twist.twist.angular.z == 1.0 for _, m in probe.odoms[turn_start:])


@pytest.mark.parametrize("sim", BACKENDS, indirect=True)
def test_driving_into_a_wall_stops_before_it_and_is_logged(sim):
    from edge_llm_ros.nav.world import ROBOT_RADIUS, World

    proc, probe = sim
    start = World.from_yaml(WORLD).start  # 1.6 m north of the south wall
    probe.reset(-1, start)
    probe.drive(-1.0, 0.0, lambda: any("collision: touched outer wall" in line for line in proc.lines), 20,
                "the collision with the south wall")
    probe.wait(lambda: probe.odoms[-1][1].twist.twist.linear.x == 0.0, 10, "the robot at rest against the wall")
    y = probe.odom().pose.pose.position.y
    assert ROBOT_RADIUS <= y < ROBOT_RADIUS + 0.03  # stopped at the wall, not through it


@pytest.mark.parametrize("sim", BACKENDS, indirect=True)
def test_the_world_markers_and_tf_are_published(sim):
    from edge_llm_ros.nav.world import World

    proc, probe = sim
    world = World.from_yaml(WORLD)
    probe.reset(-1, world.start)
    probe.wait(lambda: probe.worlds and probe.markers, 30, "the latched world and markers")
    with probe.cond:
        described, markers = probe.worlds[-1][1], probe.markers[-1][1].markers
    assert World.from_dict(yaml.safe_load(described.data)) == world
    namespaces = [m.ns for m in markers]
    assert markers[0].action == 3  # DELETEALL: a reset replaces the old world
    assert {ns: namespaces.count(ns) for ns in set(namespaces) - {""}} == \
        {"walls": 4 + len(world.walls), "boxes": len(world.boxes), "objects": len(world.objects),
         "labels": len(world.objects), "robot": 1}
    labels = [m.text for m in markers if m.ns == "labels"]
    assert "red chair (target)" in labels
    probe.wait(lambda: probe.tfs, 10, "/tf")
    with probe.cond:
        transforms = probe.tfs[-1][1].transforms
    assert [(t.header.frame_id, t.child_frame_id) for t in transforms] == [("odom", "base_link"),
                                                                           ("base_link", "camera")]
    # for rviz: the goal is the target object's position, the path the robot's way since the reset
    probe.wait(lambda: probe.goals, 10, "/sim/goal")
    with probe.cond:
        goal = probe.goals[-1][1]
    assert goal.header.frame_id == "odom"
    assert (goal.pose.position.x, goal.pose.position.y) == pytest.approx(world.target_object.position)
    def away(odom) -> float:
        return math.hypot(odom.pose.pose.position.x - world.start.x, odom.pose.pose.position.y - world.start.y)

    probe.drive(0.3, 0.0, lambda: away(probe.odom()) > 0.3, 30, "0.3 m forward")
    def gone(path) -> list[float]:  # each pose's distance from the start
        return [math.hypot(p.pose.position.x - world.start.x, p.pose.position.y - world.start.y) for p in path.poses]

    probe.wait(lambda: probe.paths and gone(probe.paths[-1][1])[-1:] >= [0.25], 10, "a path of the drive")
    with probe.cond:
        path = probe.paths[-1][1]
    assert path.header.frame_id == "odom" and gone(path) == sorted(gone(path)) and len(path.poses) >= 5, gone(path)


@pytest.mark.parametrize("sim", BACKENDS, indirect=True)
def test_a_reset_to_a_seed_draws_that_world(sim):
    from edge_llm_ros.nav.world import World
    from edge_llm_ros.nav.worldgen import GenerateConfig, generate

    proc, probe = sim
    drawn = generate(7, GenerateConfig(clear_path=True))  # the default: clear_path true
    probe.reset(7, drawn.start)
    probe.wait(lambda: probe.worlds and "seed 7" in probe.worlds[-1][1].data, 30, "the world of seed 7")
    assert World.from_dict(yaml.safe_load(probe.worlds[-1][1].data)) == drawn
    proc.wait_for_line("reset (seed 7)", 10)
    proc.wait_for_line("world 'seed 7'", 10)
    probe.reset(-1, World.from_yaml(WORLD).start)


@pytest.mark.parametrize("params, error", [
    (("rate_hz:=50.0",), "parameter 'rate_hz' must be in [10, 30]"),
    (("world:=nowhere",), "parameter 'world': nowhere is not a file, nor a world in config/worlds/"),
    (("world:={bad}",), "objects[0].position: expected [x, y] in metres, got [1.0]"),
    (("world:={unknown}",), "objects[1].colour: unknown colour 'purple'"),
], ids=["rate_hz", "no such world", "a bad field", "an unknown colour"])
def test_bad_parameters_and_world_files_exit_2_naming_them(router_endpoint, tmp_path, params, error):
    bad = yaml.safe_load(WORLD.read_text())
    bad["objects"][0]["position"] = [1.0]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    unknown = yaml.safe_load(WORLD.read_text())
    unknown["objects"][1]["colour"] = "purple"
    (tmp_path / "unknown.yaml").write_text(yaml.safe_dump(unknown))
    files = {"bad": tmp_path / "bad.yaml", "unknown": tmp_path / "unknown.yaml"}
    proc = Proc(sim_cmd(*(p.format(**files) for p in params)), env={"EDGE_LLM_BACKEND": "zenoh"})
    try:
        assert proc.wait(60) == 2, proc.output
        assert error in proc.output
    finally:
        proc.stop()
