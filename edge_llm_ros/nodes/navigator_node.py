"""navigator_node: camera frames + an instruction -> NavActions, decided by the VLM (nav).

Subscribes `/camera/image_raw` (sensor_msgs/Image) and `/camera/image_raw/compressed`
(sensor_msgs/CompressedImage), keeping the newest frame, and `instruction` (std_msgs/String)
under its namespace (default /edge_llm): an instruction starts an episode, a new one replaces it,
an empty one ends it. It publishes `nav_action` (edge_llm_ros/msg/NavAction) for go2_bridge_node
and follows the bridge's `go2_bridge/state` (idle | moving | estop). For rviz it publishes each
decision as a text marker above the robot on `~/decision` (visualization_msgs/Marker in base_link:
action, reason, confidence, decision time; a stop in red with its reason); its status on
`/diagnostics` says the episode, the ages of the newest frame and the last decision, and the e-stop.

Each decision conditions the target and the draft on the newest frame and generates the answer
(a short reason, then one action) under the action grammar in `mode` (lossless: the constrained
target's answer). An answer that does not parse, a malformed frame, or an episode past
`max_actions` becomes a stop. A valid `stop` ends the episode.

`deployment`: `robot` runs target and draft in this process. `edge_cloud` keeps the draft and the
adapter's vision encoder here and verifies on a verifier_node that serves task "nav"
(`nav_adapter` set there): each decision's round 0 carries the frame's encoder features (2 kB)
with the prompt on `draft`, outcomes come back on `verify` (nodes/edge_link.py), in any edge mode
(`ar`: cloud decoding, `sd`, `tree`, `fsd`, `ee`), with the same answers as on one device. A
verifier that does not answer within `timeout_s`, or is gone, stops the robot with the reason.
`pipeline` makes this node the draft side (FlowSpec's D0) of `stages` stage_nodes serving task
"nav" (`nav_adapter` set on each): the prompt and the frame's features enter `stage_0/in`, the
last stage's choices come back on `stage_<stages>/in` (nodes/stage_client.py), in mode `ar`,
`chunk_pp` or `flowspec`, each row masked by the grammar state this node sends with it, so the
answers are again the one-device answers. A stage that refuses, dies or does not answer within
`timeout_s` stops the robot with the reason.

`vlm`: a local Qwen2-VL or Qwen2.5-VL checkpoint folder instead of SmolLM2 + the trained adapter
(`vlm_draft`: its draft, e.g. Qwen2-VL-2B beside a 7B, for sd and tree), read through
qwen-vl-utils and the checkpoint's processor (nav/qwen_vl.py), frames resized to
`vlm_width` x `vlm_height`. Over edge_cloud the robot holds `vlm_draft` only (the target is the
verifier's `nav_vlm`) and sends the resized frame with round 0. The load log names the VLM and
backend a run used.

`overlap` (default true): the next decision is made while the robot executes the current action,
so the robot does not stand and wait for the model (EE's pre-drafting; LiveVLN's overlap). It
starts about one decision time before the motion ends (the bridge's state says how long a motion
takes; nav/overlap.py), and is carried over by odometry (`/odom`, nav_msgs/Odometry) from the
pose its frame was taken at to the pose the robot stopped at: a turn keeps its goal heading, a
move its goal point. A decision the motion already did is dropped and the next one starts. With
no odometry for the frame's time, an overlapped decision is dropped (relative actions from
mid-motion frames overshoot) and the navigator decides stop-and-go. False: stop-and-go (a
decision starts when the robot is idle, from a frame taken then). Three decisions in a row from
frames older than `max_frame_age_s` end the episode ("decisions too slow") with a stop. Either way
the episode's waiting time (the robot idle, waiting for a decision), decisions and time to first
motion are logged when it ends and published latched on `~/episode` (std_msgs/String, JSON: episode,
instruction, outcome, actions, overlap, waiting_s, waited_rounds, first_motion_s, dropped).
With `use_sim_time` true the episode's clock is /clock (a bag replayed with `edge-llm-ros bag play
--clock`, at any rate): frame ages and waiting in the bag's time.

The node is a shell: the episode policy is nav/episode.EpisodeController (the class bench --scenario
nav runs in simulated time), driven on the real clock by nav/live.LiveEpisodes; each deployment is
a class of nodes/navigator_deployments.py; the parameters and the combinations refused are
nodes/navigator_params.py.
"""

from __future__ import annotations

import json
import math

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import latched_qos, policy_clock, run_node, stamp
from edge_llm_ros.nodes.diagnostics import ERROR, OK, WARN, Status, Updater
from edge_llm_ros.nodes.managed import ManagedNode, rss_mb
from edge_llm_ros.nodes.navigator_deployments import DEPLOYMENTS
from edge_llm_ros.nodes.navigator_params import NavigatorParams

__all__ = ["NavOutputs", "NavigatorNode", "NavigatorParams", "main"]
TEXT_VIEW_FACING, DECISION_HEIGHT_M = 9, 0.9  # visualization_msgs/Marker's text type; above the robot


class NavigatorNode(ManagedNode):
    single_threaded = True  # rclpy: its callbacks are light and frequent (runtime/ros.spin)

    def __init__(self) -> None:
        from edge_llm_ros.nav.episode import PolicyConfig
        from edge_llm_ros.nav.live import LiveEpisodes

        super().__init__("navigator", NavigatorParams)
        p = self.params
        self.outputs = NavOutputs(self)
        self.deployment = DEPLOYMENTS[p.deployment](self, p)
        self.episodes = LiveEpisodes(PolicyConfig(overlap=p.overlap, max_actions=p.max_actions,
                                                  max_frame_age_s=p.max_frame_age_s), self.outputs,
                                     clock=policy_clock(self))
        String = rt.message("std_msgs/msg/String")
        self.create_subscription(rt.message("sensor_msgs/msg/Image"), "/camera/image_raw", self.on_image, 2)
        self.create_subscription(rt.message("sensor_msgs/msg/CompressedImage"), "/camera/image_raw/compressed",
                                 self.on_compressed, 2)
        self.create_subscription(String, "instruction", lambda msg: self.episodes.instruction(msg.data), 10)
        self.create_subscription(String, "go2_bridge/state", lambda msg: self.episodes.bridge_state(msg.data),
                                 latched_qos())
        self.create_subscription(rt.message("nav_msgs/msg/Odometry"), "/odom", self.on_odometry, 10)
        self.diagnostics = Updater(self, hardware_id=f"{self.get_fully_qualified_name()} ({p.deployment})")
        self.diagnostics.add("navigation", self.diagnose)

    def diagnose(self, status: Status) -> None:
        """ERROR when configure failed or the bridge's e-stop is latched; WARN while not active, or while
        an episode runs on a frame older than max_frame_age_s (or none); the episode, the ages of the
        newest frame and of the last decision, and that decision."""
        now, seen = self.episodes.snapshot(), self.outputs.last
        running = "running" if now["running"] else "idle"
        status.summary(OK, f"episode {now['episode']} {running}" + (f": {now['instruction']!r}" if now["running"] else ""))
        self.lifecycle_status(status, "instructions wait")
        if now["bridge"].startswith("estop"):
            status.merge(ERROR, "the bridge's e-stop is latched")
        age = now["frame age s"]
        if now["running"] and (age is None or age > self.params.max_frame_age_s):
            status.merge(WARN, "no camera frame" if age is None else
                         f"newest frame is {age:.1f} s old (max_frame_age_s {self.params.max_frame_age_s:g})")
        for key, value in (("lifecycle state", self.lifecycle_state.label), ("deployment", self.params.deployment),
                           ("episode", now["episode"]), ("episode state", running),
                           ("instruction", now["instruction"]), ("last outcome", now["last outcome"]),
                           ("decisions", now["decisions"]), ("deciding", now["deciding"]),
                           ("frame age s", -1.0 if age is None else age),
                           ("e-stop", now["bridge"].startswith("estop")), ("bridge", now["bridge"])):
            status.add(key, value)
        if seen is not None:
            status.add("decision age s", self.outputs.clock() - seen["at"])
            for key in ("action", "reason", "confidence", "latency s"):
                status.add(f"last decision {key}", seen[key])

    # -- lifecycle ---------------------------------------------------------------------------------

    def load(self) -> str:
        navigator, what = self.deployment.load()
        self.outputs.magnitudes = navigator.magnitudes
        self.episodes.set_navigator(navigator)
        how = "overlapped with motion (carried over by /odom)" if self.params.overlap else "stop-and-go"
        return f"navigating with {what}, decisions {how}; {rss_mb():.0f} MB resident"

    def unload(self) -> None:
        self.episodes.set_navigator(None)
        self.deployment.unload()

    def on_activate(self, state):
        result = super().on_activate(state)
        self.episodes.set_active(True)
        return result

    def on_deactivate(self, state):
        self.episodes.set_active(False)  # a running episode goes on; the next waits for activate
        return super().on_deactivate(state)

    def destroy_node(self) -> None:
        self.episodes.close()
        super().destroy_node()

    # -- inputs ----------------------------------------------------------------------------------

    def on_image(self, msg) -> None:
        from edge_llm_ros.nav.frames import FrameError, from_raw

        try:
            frame = from_raw(msg.encoding, msg.width, msg.height, msg.step, msg.data)
        except FrameError as exc:
            self.episodes.bad_frame(f"/camera/image_raw: {exc}")
            return
        self.episodes.frame(frame, seconds(msg.header.stamp), msg.header.stamp)

    def on_compressed(self, msg) -> None:
        from edge_llm_ros.nav.frames import FrameError, from_compressed

        try:
            frame = from_compressed(msg.format, msg.data)
        except FrameError as exc:
            self.episodes.bad_frame(f"/camera/image_raw/compressed: {exc}")
            return
        self.episodes.frame(frame, seconds(msg.header.stamp), msg.header.stamp)

    def on_odometry(self, msg) -> None:
        from edge_llm_ros.nav.world import Pose

        q, position = msg.pose.pose.orientation, msg.pose.pose.position
        yaw = math.atan2(2 * (q.w * q.z + q.x * q.y), 1 - 2 * (q.y * q.y + q.z * q.z))
        self.episodes.odometry(seconds(msg.header.stamp), Pose(position.x, position.y, yaw))


class NavOutputs:
    """What the episodes publish (nav/live.Outputs): NavActions, the latched `~/episode` summary, the log."""

    def __init__(self, node) -> None:
        self.node = node
        self.NavAction = rt.message("edge_llm_ros/msg/NavAction")
        self.String = rt.message("std_msgs/msg/String")
        self.action_pub = node.create_publisher(self.NavAction, "nav_action", 10)
        self.episode_pub = node.create_publisher(self.String, "~/episode", latched_qos())
        self.magnitudes = None  # the navigator's, once loaded
        self.clock = policy_clock(node)
        self.last: dict | None = None  # the last decision handed over (diagnostics)
        self.Marker = rt.message("visualization_msgs/msg/Marker")
        self.marker_pub = node.create_publisher(self.Marker, "~/decision", latched_qos())

    def action(self, request_id: str, handed, age_s: float) -> None:
        """A decision as a NavAction: its verb and motion as handed over (overlapped: carried over to
        the pose now; a carried turn may change side)."""
        decision, command = handed.decision, handed.decision.command
        msg = self.NavAction(request_id=request_id, frame_stamp=handed.frame.header, action=handed.verb,
                             magnitude=command.magnitude, distance_m=handed.distance_m, angle_rad=handed.angle_rad,
                             reason=command.reason, confidence=decision.confidence, latency_s=age_s,
                             valid=decision.valid, raw_text=decision.text[:512], error=decision.error)
        self.action_pub.publish(stamp(self.node, msg))
        self.last = {"at": self.clock(), "action": command.action, "reason": command.reason,
                     "confidence": float(decision.confidence), "latency s": float(age_s)}
        self.show(f"{command.action}: {command.reason}\nconfidence {decision.confidence:.2f}, "
                  f"decided in {decision.decide_s:.2f} s", (0.2, 0.9, 0.2) if decision.valid else (1.0, 0.6, 0.0))
        note = f" ({decision.error})" if decision.error else ""
        if (handed.verb, (handed.distance_m, handed.angle_rad)) != (command.verb, command.motion(self.magnitudes)):
            note += (f" carried over to {handed.verb} {handed.distance_m:.2f} m, "
                     f"{math.degrees(handed.angle_rad):.0f} deg")
        self.node.get_logger().info(f"{request_id}: {command.action} — {command.reason!r}, confidence "
                                    f"{decision.confidence:.2f}, decided in {decision.decide_s:.2f} s{note}")

    def stop(self, request_id: str, reason: str) -> None:
        msg = self.NavAction(request_id=request_id, action="stop", valid=False, error=reason)
        msg.frame_stamp = self.node.get_clock().now().to_msg()
        self.action_pub.publish(stamp(self.node, msg))
        self.show(f"stop: {reason}", (1.0, 0.2, 0.2))

    def show(self, text: str, rgb: tuple[float, float, float]) -> None:
        """The decision as text above the robot, for rviz (`~/decision`, in base_link: it moves along)."""
        marker = self.Marker(ns="decision", id=0, type=TEXT_VIEW_FACING, action=0, text=text, frame_locked=True)
        marker.header.frame_id = "base_link"
        marker.pose.position.z, marker.pose.orientation.w = DECISION_HEIGHT_M, 1.0
        marker.scale.z = 0.2  # text height, metres
        marker.color.r, marker.color.g, marker.color.b, marker.color.a = (*rgb, 1.0)
        self.marker_pub.publish(stamp(self.node, marker))

    def summary(self, summary: dict) -> None:
        self.episode_pub.publish(self.String(data=json.dumps(summary)))

    def log(self, level: str, line: str) -> None:
        logger = self.node.get_logger()
        if level == "error":  # one severity per call site: rclpy's logger refuses a change
            logger.error(line)
        elif level == "warning":
            logger.warning(line)
        else:
            logger.info(line)


def seconds(stamp_msg) -> float:
    return stamp_msg.sec + stamp_msg.nanosec * 1e-9


def main(args: list[str] | None = None) -> int:
    return run_node(NavigatorNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
