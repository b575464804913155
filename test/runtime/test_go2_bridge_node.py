"""go2_bridge_node through a real process on both runtimes (issue 15): NavAction -> /cmd_vel or
Unitree sport requests, with its safety gates.

- forward medium (0.5 m from the magnitude table) gives /cmd_vel setpoints within the limits whose
  integral over their arrival times is 0.5 m, then a stop and nothing more;
- a NavAction beyond max_distance_m is clamped, and the watchdog stops it when no fresh command
  comes; the motion also stops when its plan ends;
- the e-stop (std_msgs/Bool on /estop) stops at once and latches: a NavAction meanwhile is refused
  and logged; false releases it and the next NavAction moves;
- a NavAction from a frame older than max_frame_age_s is refused and logged with its age; one that
  is not valid stops the robot;
- output:=sport publishes unitree_api/msg/Request on /api/sport/request: api_id 1008 with JSON
  {"x", "y", "z"}, and 1003 on stop;
- a bad parameter ends the node with its reason and exit code 2.

Every wait is on an event (a message, a log line) with a timeout.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest
from hosts import BACKENDS, host_for
from support import REPO, Proc, wait_until

pytestmark = pytest.mark.slow  # real node processes

PARAMS = str(REPO / "config" / "go2_sim.yaml")
RATE_HZ, MAX_VX, ACCEL, MAX_DISTANCE, WATCHDOG_S = 20.0, 0.4, 1.0, 1.5, 2.0
LIMITS = (f"rate_hz:={RATE_HZ}", f"max_linear_mps:={MAX_VX}", f"max_linear_accel:={ACCEL}",
          f"max_distance_m:={MAX_DISTANCE}", f"watchdog_s:={WATCHDOG_S}", "max_frame_age_s:=1.0")


def bridge_cmd(*params: str, namespace: str | None = None) -> list[str]:
    overrides = [arg for p in params for arg in ("-p", p)]
    remap = ["-r", f"__ns:={namespace}"] if namespace else []
    return [sys.executable, "-m", "edge_llm_ros.nodes.go2_bridge_node", "--ros-args", "--params-file", PARAMS,
            *overrides, *remap]


def latched(host):
    """Transient-local QoS of the probe's backend (the bridge's ~/state is latched)."""
    if host.backend == "rclpy":
        from rclpy.qos import DurabilityPolicy, QoSProfile

        return QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    from edge_llm_ros import runtime as rt

    return rt.QoSProfile(depth=1, transient_local=True)


class Topic:
    """What a probe receives on one topic, with arrival times, to wait on."""

    def __init__(self, node, msg_type, name: str, qos=100) -> None:
        self.items: list[tuple[float, object]] = []
        self.cond = threading.Condition()
        self.sub = node.create_subscription(msg_type, name, self._on, qos)

    def _on(self, msg) -> None:
        with self.cond:
            self.items.append((time.monotonic(), msg))
            self.cond.notify_all()

    def mark(self) -> int:
        with self.cond:
            return len(self.items)

    def wait_for(self, predicate, timeout: float, what: str, start: int = 0) -> int:
        """The index of the first message from ``start`` on that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(start, len(self.items)):
                    if predicate(self.items[i][1]):
                        return i
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; got "
                                         f"{[m for _, m in self.items[start:]][-10:]}")
                self.cond.wait(left)

    def since(self, start: int, end: int | None = None) -> list[tuple[float, object]]:
        with self.cond:
            return list(self.items[start:end])


def is_stop(twist) -> bool:
    return twist.linear.x == 0.0 and twist.angular.z == 0.0


class Probe:
    """A node beside the bridge: publishes NavActions and e-stops, records /cmd_vel and the state."""

    def __init__(self, host, name: str, namespace: str = "edge_llm", estop: str = "/estop") -> None:
        self.host, self.node = host, host.Node(name, namespace=namespace)
        self.NavAction = host.message("edge_llm_ros/msg/NavAction")
        self.Time, self.Bool = host.message("builtin_interfaces/msg/Time"), host.message("std_msgs/msg/Bool")
        self.nav = self.node.create_publisher(self.NavAction, "nav_action", 10)
        self.estop_pub = self.node.create_publisher(self.Bool, estop, 10)
        self.state = Topic(self.node, host.message("std_msgs/msg/String"), "go2_bridge/state", latched(host))

    def ready(self, output_topic: str) -> None:
        wait_until(lambda: self.nav.get_subscription_count() >= 1 and self.estop_pub.get_subscription_count() >= 1
                   and self.node.count_publishers(output_topic) >= 1, 30, "go2_bridge on its topics")
        self.state.wait_for(lambda m: m.data.startswith(("idle", "moving", "estop")), 30, "the latched state")

    def send(self, request_id: str, action: str, magnitude: str = "", distance_m: float = 0.0, age_s: float = 0.05,
             valid: bool = True, error: str = "") -> None:
        sec, nanosec = divmod(time.time_ns() - int(age_s * 1e9), 1_000_000_000)
        self.nav.publish(self.NavAction(request_id=request_id, action=action, magnitude=magnitude,
                                        distance_m=float(distance_m), frame_stamp=self.Time(sec=sec, nanosec=nanosec),
                                        valid=valid, error=error))

    def estop(self, on: bool) -> None:
        self.estop_pub.publish(self.Bool(data=on))

    def close(self) -> None:
        self.node.destroy_node()


def integral(samples: list[tuple[float, object]], speed=lambda twist: twist.linear.x) -> float:
    """Distance a robot holding each command until the next one covers (arrival times)."""
    return sum(speed(msg) * (t1 - t0) for (t0, msg), (t1, _) in zip(samples, samples[1:]))


@pytest.fixture(scope="module")
def bridge(request, router_endpoint):
    """go2_bridge_node (output cmd_vel) as a process on the backend the test names (``indirect``);
    yields (process, probe, /cmd_vel recorder)."""
    host = host_for(request, getattr(request, "param", "zenoh"))
    proc = Proc(bridge_cmd(*LIMITS), env=host.child_env)
    probe = Probe(host, "bridge_probe")
    cmd_vel = Topic(probe.node, host.message("geometry_msgs/msg/Twist"), "/cmd_vel")
    try:
        proc.wait_for_line(f"go2_bridge: cmd_vel on /cmd_vel at {RATE_HZ:g} Hz", 60)
        proc.wait_for_line(f"runtime: {host.backend}", 10)
        probe.ready("/cmd_vel")
        yield proc, probe, cmd_vel
    finally:
        probe.close()
        proc.stop()


def stopped_after(cmd_vel: Topic, probe: Probe, start: int, what: str, timeout: float = 20) -> int:
    return cmd_vel.wait_for(is_stop, timeout, what, start)


@pytest.mark.parametrize("bridge", BACKENDS, indirect=True)
def test_forward_medium_moves_half_a_metre_within_limits_then_stops(bridge):
    proc, probe, cmd_vel = bridge
    start = cmd_vel.mark()
    probe.send("fwd-1", "forward", "medium")  # no distance: the magnitude table's 0.5 m
    proc.wait_for_line("nav_action 'fwd-1': forward medium: 0.500 m, 0.000 rad in 1.65 s", 20)
    stop = stopped_after(cmd_vel, probe, start, "the stop at the motion's end")
    samples = cmd_vel.since(start, stop + 1)
    speeds = [twist.linear.x for _, twist in samples[:-1]]
    assert len(speeds) >= 10 and min(speeds) > 0 and max(speeds) <= MAX_VX + 1e-9
    for (t0, a), (t1, b) in zip(samples, samples[1:-1]):  # |dv| <= a dt between ticks (+ a period of delivery jitter)
        assert abs(b.linear.x - a.linear.x) <= ACCEL * (max(t1 - t0, 1 / RATE_HZ) + 1 / RATE_HZ)
    assert integral(samples) == pytest.approx(0.5, abs=0.05)
    assert all(twist.angular.z == 0.0 for _, twist in samples)
    probe.state.wait_for(lambda m: m.data == "idle: motion done", 10, "idle after the motion")
    proc.wait_for_line("motion done", 5)
    probe.send("stop-1", "stop")  # a barrier: its stop comes after anything the motion still sent
    barrier = stopped_after(cmd_vel, probe, stop + 1, "the stop for 'stop-1'")
    assert all(is_stop(twist) for _, twist in cmd_vel.since(stop, barrier + 1))


@pytest.mark.parametrize("bridge", BACKENDS, indirect=True)
def test_a_long_command_is_clamped_and_the_watchdog_stops_it(bridge):
    proc, probe, cmd_vel = bridge
    start = cmd_vel.mark()
    began = time.monotonic()
    probe.send("far-1", "forward", "large", distance_m=5.0)
    proc.wait_for_line(f"nav_action 'far-1': forward large: {MAX_DISTANCE:.3f} m, 0.000 rad in", 20)
    proc.wait_for_line("(clamped from 5.000 m, 0.000 rad)", 5)
    stop = stopped_after(cmd_vel, probe, start, "the watchdog's stop", timeout=WATCHDOG_S + 10)
    line = proc.wait_for_line("watchdog: no fresh command for", 5)
    assert f"(limit {WATCHDOG_S:.2f} s), stopping" in line
    samples = cmd_vel.since(start, stop + 1)
    assert samples[-1][0] - began >= WATCHDOG_S - 0.1  # not before the deadline
    assert max(twist.linear.x for _, twist in samples) == pytest.approx(MAX_VX)
    assert 0.3 < integral(samples) < MAX_DISTANCE - 0.3  # cut short of the clamped 1.5 m
    probe.state.wait_for(lambda m: m.data.startswith("idle: watchdog"), 10, "idle after the watchdog")


@pytest.mark.parametrize("bridge", BACKENDS, indirect=True)
@pytest.mark.timeout(180)
def test_the_estop_latches_until_released_and_refuses_meanwhile(bridge):
    proc, probe, cmd_vel = bridge
    start = cmd_vel.mark()
    probe.send("go-1", "forward", "large")
    moving = cmd_vel.wait_for(lambda t: t.linear.x > 0, 20, "motion before the e-stop", start)
    probe.estop(True)
    stop = stopped_after(cmd_vel, probe, moving, "the e-stop's stop")
    proc.wait_for_line("e-stop latched: stopped; commands are refused until it is released", 10)
    probe.state.wait_for(lambda m: m.data.startswith("estop: e-stop latched"), 10, "the estop state")
    probe.send("go-2", "forward", "medium")
    proc.wait_for_line("nav_action 'go-2': refused forward medium: e-stop latched", 20)
    refused = stopped_after(cmd_vel, probe, stop + 1, "the stop sent again on the refused command")
    assert all(is_stop(twist) for _, twist in cmd_vel.since(stop, refused + 1))
    probe.state.wait_for(lambda m: m.data.startswith("estop: refused forward medium"), 10, "the refusal state")
    probe.estop(False)
    proc.wait_for_line("e-stop released: stays stopped until the next command", 20)
    probe.state.wait_for(lambda m: m.data.startswith("idle: e-stop released"), 10, "the release state")
    probe.send("go-3", "turn_left", "small")
    turning = cmd_vel.wait_for(lambda t: t.angular.z > 0, 20, "motion after the release", refused + 1)
    stopped_after(cmd_vel, probe, turning, "the end of the turn")
    assert all(is_stop(twist) for _, twist in cmd_vel.since(refused, turning))


@pytest.mark.parametrize("bridge", BACKENDS, indirect=True)
def test_stale_frames_are_refused_and_invalid_actions_stop(bridge):
    proc, probe, cmd_vel = bridge
    start = cmd_vel.mark()
    probe.send("old-1", "forward", "medium", age_s=5.0)
    line = proc.wait_for_line("nav_action 'old-1': refused forward medium: stale frame: ", 20)
    age = float(line.split("stale frame: ")[1].split(" s old")[0])
    assert 5.0 <= age < 15.0 and line.endswith("s old, limit 1.000 s")
    probe.state.wait_for(lambda m: "refused forward medium: stale frame" in m.data, 10, "the refusal state")
    probe.send("stop-2", "stop")  # a barrier: nothing moved before its stop
    barrier = stopped_after(cmd_vel, probe, start, "the stop for 'stop-2'")
    assert all(is_stop(twist) for _, twist in cmd_vel.since(start, barrier + 1))

    probe.send("go-4", "backward", "large")
    moving = cmd_vel.wait_for(lambda t: t.linear.x < 0, 20, "motion before the invalid action", barrier + 1)
    probe.send("bad-1", "stop", valid=False, error="not 'reason: ...\\naction: <verb> [<magnitude>]'")
    stopped_after(cmd_vel, probe, moving, "the stop on the invalid action", timeout=10)
    proc.wait_for_line("nav_action 'bad-1': refused stop: invalid action, stopping: not 'reason: ...", 10)
    probe.state.wait_for(lambda m: m.data.startswith("idle: refused stop: invalid action"), 10, "idle after it")


@pytest.fixture
def sport(request, router_endpoint):
    """go2_bridge_node with output:=sport, in a namespace of its own and its e-stop on /sport/estop
    (the cmd_vel bridge may still run); yields (process, probe, requests)."""
    host = host_for(request, getattr(request, "param", "zenoh"))
    proc = Proc(bridge_cmd(*LIMITS, "output:=sport", namespace="/sport") + ["-r", "/estop:=/sport/estop"],
                env=host.child_env)
    probe = Probe(host, "sport_probe", namespace="sport", estop="/sport/estop")
    requests = Topic(probe.node, host.message("unitree_api/msg/Request"), "/api/sport/request")
    try:
        proc.wait_for_line(f"go2_bridge: sport on /api/sport/request at {RATE_HZ:g} Hz", 60)
        probe.ready("/api/sport/request")
        yield proc, probe, requests
    finally:
        probe.close()
        proc.stop()


@pytest.mark.parametrize("sport", BACKENDS, indirect=True)
def test_the_sport_output_sends_move_requests_then_stop_move(sport):
    proc, probe, requests = sport
    probe.send("sport-1", "forward", "small")  # 0.25 m
    first = requests.wait_for(lambda r: r.header.identity.api_id == 1008, 20, "a Move request")
    last = requests.wait_for(lambda r: r.header.identity.api_id == 1003, 20, "a StopMove request", first)
    moves = [r for _, r in requests.since(first, last)]
    assert all(r.header.identity.api_id == 1008 for r in moves)
    params = [json.loads(r.parameter) for r in moves]
    assert all(set(p) == {"x", "y", "z"} and p["y"] == 0 and p["z"] == 0 for p in params)
    assert max(p["x"] for p in params) <= MAX_VX + 1e-9 and min(p["x"] for p in params) > 0
    x = lambda request: json.loads(request.parameter)["x"] if request.header.identity.api_id == 1008 else 0.0
    assert integral(requests.since(first, last + 1), x) == pytest.approx(0.25, abs=0.05)
    ids = [r.header.identity.id for _, r in requests.since(first, last + 1)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    probe.estop(True)
    requests.wait_for(lambda r: r.header.identity.api_id == 1003, 20, "StopMove on the e-stop", last + 1)
    probe.estop(False)
    proc.wait_for_line("e-stop released", 20)


@pytest.mark.parametrize("override, message", [
    ("output:=serial", "error: parameter 'output' must be one of 'cmd_vel' | 'sport', got 'serial'"),
    ("forward_m.small:=2.0", "error: forward_m: values must be positive and grow small < medium < large"),
    ("max_linear_mps:=0.0", "error: parameter 'max_linear_mps' must be in [0.01, 5], got 0.0"),
])
def test_bad_parameters_end_the_node_with_their_reason(router_endpoint, override, message):
    proc = Proc(bridge_cmd(override), env={"EDGE_LLM_BACKEND": "zenoh"})
    try:
        proc.wait_for_line(message, 60)
        assert proc.wait(30) == 2
    finally:
        proc.stop()
