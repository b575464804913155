"""go2_bridge_node: NavAction -> motion on a Unitree Go2, within limits and behind safety gates.

Subscribes to `nav_action` (edge_llm_ros/msg/NavAction) under its namespace (default /edge_llm)
and to `/estop` (std_msgs/msg/Bool: true latches a stop and refuses every NavAction until false
releases it). Each accepted NavAction becomes an acceleration-limited motion (nav/motion.py)
that the control loop sends every 1/`rate_hz` s and ends with a stop, on the output `output` picks:

    cmd_vel   geometry_msgs/msg/Twist on /cmd_vel (go2_ros2_sdk reads it through twist_mux)
    sport     unitree_api/msg/Request on /api/sport/request: api_id 1008 (Move) with parameter
              {"x": vx, "y": 0, "z": wz}; 1003 (StopMove) to stop

The robot stops on a NavAction that is not valid (its error is logged), on stop, on the e-stop,
when no fresh NavAction came for `watchdog_s` while moving, and when the motion is done. A NavAction
whose camera frame (frame_stamp) is older than `max_frame_age_s` on the node's clock is refused. With
`use_sim_time` true the node runs on /clock (a bag replayed with `edge-llm-ros bag play --clock`):
frame ages, motions and the watchdog in the bag's time, and the control loop's timer too. A NavAction that gives
an action and a magnitude but no distance or angle moves by the magnitude tables
`forward_m.<small|medium|large>` (metres) and `turn_deg.<...>` (degrees). Every refusal is logged
with its reason; `~/state` (std_msgs/String, latched) says `idle|moving|estop: <last event>`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time

from edge_llm_ros import runtime as rt
from edge_llm_ros.nav.actions import MAGNITUDES, Magnitudes
from edge_llm_ros.nav.motion import Executor, MotionLimits, Setpoint, to_command
from edge_llm_ros.nodes.common import latched_qos, policy_clock, run_node
from edge_llm_ros.nodes.diagnostics import ERROR, OK, WARN, Status, Updater
from edge_llm_ros.nodes.parameters import Spec, declare, descriptor, param

SPORT_MOVE, SPORT_STOP_MOVE = 1008, 1003  # unitree_ros2 ros2_sport_client.h: ROBOT_SPORT_API_ID_MOVE, _STOPMOVE


@dataclasses.dataclass(frozen=True)
class BridgeParams:
    output: str = param("cmd_vel", "where motion goes: Twist on /cmd_vel, or unitree_api Requests on "
                        "/api/sport/request", choices=("cmd_vel", "sport"))
    rate_hz: float = param(20.0, "control loop: setpoints per second while moving", low=1.0, high=1000.0)
    max_linear_mps: float = param(0.5, "largest |vx| sent, m/s", low=0.01, high=5.0)
    max_angular_rps: float = param(1.0, "largest |wz| sent, rad/s", low=0.01, high=10.0)
    max_linear_accel: float = param(1.0, "largest |dvx/dt| of a motion, m/s^2", low=0.01, high=20.0)
    max_angular_accel: float = param(2.0, "largest |dwz/dt| of a motion, rad/s^2", low=0.01, high=50.0)
    max_distance_m: float = param(2.0, "one NavAction's |distance| (longer ones are clamped)", low=0.01)
    max_angle_deg: float = param(180.0, "one NavAction's |angle| (larger ones are clamped)", low=0.1, high=360.0)
    max_frame_age_s: float = param(1.0, "a NavAction decided from an older camera frame is refused", low=0.001)
    watchdog_s: float = param(4.0, "moving, no fresh NavAction for this long: stop", low=0.01)

    def limits(self) -> MotionLimits:
        fields = {f.name for f in dataclasses.fields(MotionLimits)} - {"max_angle_rad"}
        return MotionLimits(max_angle_rad=math.radians(self.max_angle_deg),
                            **{name: getattr(self, name) for name in fields})


def declare_magnitudes(node) -> Magnitudes:
    """The magnitude tables as parameters forward_m.<size> (metres) and turn_deg.<size> (degrees)."""
    default, tables = Magnitudes(), {}
    for table, unit in (("forward_m", "metres of a move"), ("turn_deg", "degrees of a turn")):
        tables[table] = {}
        for size in MAGNITUDES:
            name, spec = f"{table}.{size}", Spec(f"{unit} of magnitude {size}", low=0.001)
            value = node.declare_parameter(name, getattr(default, table)[size], descriptor(name, 1.0, spec)).value
            spec.check(name, value)
            tables[table][size] = float(value)
    return Magnitudes(**tables)  # ValueError unless small < medium < large


class TwistOutput:
    topic = "/cmd_vel"

    def __init__(self, node) -> None:
        self.Twist = rt.message("geometry_msgs/msg/Twist")
        self.pub = node.create_publisher(self.Twist, self.topic, 10)

    def send(self, setpoint: Setpoint) -> None:
        msg = self.Twist()
        msg.linear.x, msg.angular.z = float(setpoint.vx), float(setpoint.wz)
        self.pub.publish(msg)


class SportOutput:
    topic = "/api/sport/request"

    def __init__(self, node) -> None:
        self.Request = rt.message("unitree_api/msg/Request")
        self.pub = node.create_publisher(self.Request, self.topic, 10)

    def send(self, setpoint: Setpoint) -> None:
        msg = self.Request()
        msg.header.identity.id = time.monotonic_ns()  # as unitree_ros2's clients number their requests
        if setpoint.stop:
            msg.header.identity.api_id = SPORT_STOP_MOVE
        else:
            msg.header.identity.api_id = SPORT_MOVE
            msg.parameter = json.dumps({"x": setpoint.vx, "y": 0.0, "z": setpoint.wz})
        self.pub.publish(msg)


class Go2BridgeNode(rt.Node):
    single_threaded = True  # rclpy: its callbacks are light and frequent (runtime/ros.spin)

    def __init__(self, **node_options) -> None:
        """``node_options``: rt.Node's (namespace, parameter_overrides: how tests start it in-process)."""
        super().__init__("go2_bridge", **{"namespace": "edge_llm", **node_options})
        self.params = declare(self, BridgeParams)
        self.magnitudes = declare_magnitudes(self)
        self.bridge = Executor(self.params.limits(), 1.0 / self.params.rate_hz)
        self.clock = policy_clock(self)  # motions and the watchdog; frame ages on the node's clock
        self.lock = threading.RLock()
        self.output = TwistOutput(self) if self.params.output == "cmd_vel" else SportOutput(self)
        self.String = rt.message("std_msgs/msg/String")
        self.state_pub = self.create_publisher(self.String, "~/state", latched_qos())
        self.published_status = ""
        self.create_subscription(rt.message("edge_llm_ros/msg/NavAction"), "nav_action", self.on_nav_action, 10)
        self.create_subscription(rt.message("std_msgs/msg/Bool"), "/estop", self.on_estop, 10)
        self.create_timer(self.bridge.period_s, self.control)
        self.reported = dict(self.bridge.counts)  # the counts at the last status
        self.diagnostics = Updater(self, hardware_id=f"go2 via {self.output.topic}")
        self.diagnostics.add("motion", self.diagnose)
        p = self.params
        self.get_logger().info(
            f"go2_bridge: {p.output} on {self.output.topic} at {p.rate_hz:g} Hz; |vx| <= {p.max_linear_mps:g} m/s, "
            f"|wz| <= {p.max_angular_rps:g} rad/s, frames older than {p.max_frame_age_s:g} s refused, "
            f"watchdog {p.watchdog_s:g} s")
        self.control()

    def frame_age_s(self, stamp) -> float:
        """Seconds since the frame was taken, on this node's clock; inf when it has no stamp."""
        taken = stamp.sec * 1_000_000_000 + stamp.nanosec
        return math.inf if taken == 0 else (self.get_clock().now().nanoseconds - taken) / 1e9

    def on_nav_action(self, msg) -> None:
        command = to_command(msg.action, msg.magnitude, float(msg.distance_m), float(msg.angle_rad), bool(msg.valid),
                             msg.error, self.frame_age_s(msg.frame_stamp), self.magnitudes)
        with self.lock:
            verdict = self.bridge.command(command, self.clock())
            line = f"nav_action {msg.request_id!r}: {verdict.note}"
            if verdict.accepted:  # one severity per call site: rclpy's logger refuses a change
                self.get_logger().info(line)
            else:
                self.get_logger().warning(line)
            self.control()

    def on_estop(self, msg) -> None:
        with self.lock:
            note = self.bridge.set_estop(bool(msg.data))
            if note:
                self.get_logger().warning(note)
            self.control()

    def control(self) -> None:
        """One tick: send the setpoint (or the stop) due now; publish the state when it changed."""
        with self.lock:
            setpoint, note = self.bridge.tick(self.clock())
            if note:
                self.get_logger().info(note)
            if setpoint is not None:
                self.output.send(setpoint)
            if self.bridge.status != self.published_status:
                self.published_status = self.bridge.status
                self.state_pub.publish(self.String(data=self.published_status))


    def diagnose(self, status: Status) -> None:
        """ERROR while the e-stop is latched; WARN when the last period clamped a motion to the limits,
        refused a command or stopped on the watchdog; the state and the counts since start."""
        with self.lock:
            counts, state, line = dict(self.bridge.counts), self.bridge.state, self.bridge.status
        new = {k: v - self.reported.get(k, 0) for k, v in counts.items()}
        self.reported = counts
        status.summary(OK, line)
        if state == "estop":
            status.merge(ERROR, "e-stop latched: every command is refused until false on /estop")
        for key, what in (("clamped", "motion(s) clamped to the limits"), ("refused", "command(s) refused"),
                          ("watchdog", "watchdog stop(s): no fresh command")):
            if new[key]:
                status.merge(WARN, f"{new[key]} {what} in the last {self.diagnostics.period:g} s")
        status.add("state", state)
        status.add("e-stop latched", state == "estop")
        status.add("watchdog trips", counts["watchdog"])
        status.add("limits applied (clamped motions)", counts["clamped"])
        status.add("refused commands", counts["refused"])
        status.add("output", self.output.topic)


def main(args: list[str] | None = None) -> int:
    return run_node(Go2BridgeNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
