"""navigator_node: camera frames + an instruction -> NavActions, decided by the VLM (core/nav).

Subscribes `/camera/image_raw` (sensor_msgs/Image) and `/camera/image_raw/compressed`
(sensor_msgs/CompressedImage), keeping the newest frame, and `instruction` (std_msgs/String)
under its namespace (default /edge_llm): an instruction starts an episode, a new one replaces it,
an empty one ends it. It publishes `nav_action` (edge_llm_ros/msg/NavAction) for go2_bridge_node
and follows the bridge's `go2_bridge/state` (idle | moving | estop).

Each decision conditions the target and the draft on the newest frame and generates the answer
(a short reason, then one action) under the action grammar in `mode` (lossless: the constrained
target's answer). An answer that does not parse, a malformed frame, or an episode past
`max_actions` becomes a stop. A valid `stop` ends the episode.

`overlap` (default false): while the robot executes an action, the next one is decided from the
newest frame, and handed over when the bridge is idle, so the robot does not stand and wait for
the model (EE's pre-drafting; LiveVLN's overlap). Off by default: the actions are relative
(forward 1 m, turn 30 degrees), so one decided from a frame taken mid-motion is applied from a
pose it never saw; in the simulator that overshot the red chair and touched it, where stop-and-go
reached it. False: stop-and-go (a decision starts when the robot is idle, from a frame taken then). Either way the episode's waiting time (the robot idle,
waiting for a decision), decisions and time to first motion are logged when it ends and
published latched on `~/episode` (std_msgs/String, JSON).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import latched_qos, run_node, stamp
from edge_llm_ros.nodes.managed import ManagedNode, ManagedParams
from edge_llm_ros.nodes.parameters import param


@dataclasses.dataclass(frozen=True)
class NavigatorParams(ManagedParams):
    adapter: str = param("", "navigation adapter folder ('' = the shipped one for SmolLM2: edge-llm-ros train nav)")
    draft: str = param("", "draft model folder for the speculative modes ('' = the shipped SmolLM2 draft)")
    mode: str = param("ar", "decoding mode (lossless under the grammar)", choices=("ar", "sd", "tree"))
    gamma: int = param(4, "drafted tokens per round (sd)", low=1, high=16)
    overlap: bool = param(False, "decide the next action while the robot executes the current one (false: "
                                 "stop-and-go; relative actions from mid-motion frames overshoot)")
    max_actions: int = param(60, "an episode stops after this many actions", low=1)
    max_frame_age_s: float = param(1.0, "decide only from a frame at most this old (else wait for one)", low=0.01)
    threads: int = param(0, "torch intra-op threads (0 = every core)", low=0, high=1024)


class NavigatorNode(ManagedNode):
    def __init__(self) -> None:
        super().__init__("navigator", NavigatorParams)
        self.NavAction = rt.message("edge_llm_ros/msg/NavAction")
        self.String = rt.message("std_msgs/msg/String")
        self.navigator = None
        self.lock = threading.Condition()
        self.frame = None  # (rgb array, stamp, received monotonic) or an error string
        self.instruction = ""
        self.episode = 0  # bumped by every instruction: a decision of an older episode is dropped
        self.bridge_idle = True
        self.stopping = False
        self.waiting = self.pending = None  # the episode's Waiting, and a decision not handed over yet
        self.handed, self.request_id, self.outcome = 0, "", ""
        self.action_pub = self.create_publisher(self.NavAction, "nav_action", 10)
        self.episode_pub = self.create_publisher(self.String, "~/episode", latched_qos())
        self.create_subscription(rt.message("sensor_msgs/msg/Image"), "/camera/image_raw", self.on_image, 2)
        self.create_subscription(rt.message("sensor_msgs/msg/CompressedImage"), "/camera/image_raw/compressed",
                                 self.on_compressed, 2)
        self.create_subscription(self.String, "instruction", self.on_instruction, 10)
        self.create_subscription(self.String, "go2_bridge/state", self.on_bridge_state, latched_qos())
        self.worker = threading.Thread(target=self.run, daemon=True, name="navigator")
        self.worker.start()

    # -- lifecycle ---------------------------------------------------------------------------------

    def load(self) -> str:
        from edge_llm_ros.core import GenerationConfig, load_model
        from edge_llm_ros.core.draft_models import load_draft
        from edge_llm_ros.core.loading import set_threads
        from edge_llm_ros.core.nav.navigator import MAX_ANSWER_TOKENS, Navigator
        from edge_llm_ros.core.nav.vlm import NavAdapter

        p = self.params
        set_threads(p.threads)
        target = load_model()
        adapter = NavAdapter.load(p.adapter or None, target)
        draft = load_draft(target, p.draft or None).model if p.mode != "ar" else None
        config = GenerationConfig(mode=p.mode, max_new_tokens=MAX_ANSWER_TOKENS, gamma=p.gamma, tree_depth=p.gamma)
        self.navigator = Navigator(adapter, target, draft, config)
        trained = adapter.training_info.get("action_accuracy")
        how = "overlapped with motion" if p.overlap else "stop-and-go"
        return (f"navigating with SmolLM2 + adapter {p.adapter or 'shipped'}"
                + (f" (held-out action accuracy {trained:.2f})" if trained is not None else "")
                + f", mode {p.mode} on torch, decisions {how}")

    def unload(self) -> None:
        self.navigator = None

    # -- inputs ----------------------------------------------------------------------------------

    def on_image(self, msg) -> None:
        from edge_llm_ros.core.nav.frames import FrameError, from_raw

        try:
            frame = from_raw(msg.encoding, msg.width, msg.height, msg.step, msg.data)
        except FrameError as exc:
            self.bad_frame(f"/camera/image_raw: {exc}")
            return
        self.new_frame(frame, msg.header.stamp)

    def on_compressed(self, msg) -> None:
        from edge_llm_ros.core.nav.frames import FrameError, from_compressed

        try:
            frame = from_compressed(msg.format, msg.data)
        except FrameError as exc:
            self.bad_frame(f"/camera/image_raw/compressed: {exc}")
            return
        self.new_frame(frame, msg.header.stamp)

    def new_frame(self, frame, frame_stamp) -> None:
        with self.lock:
            self.frame = (frame, frame_stamp, time.monotonic())
            self.lock.notify_all()

    def bad_frame(self, error: str) -> None:
        """A malformed frame: logged, the robot stops, and no decision uses it."""
        self.get_logger().error(f"rejected a frame: {error}; stopping")
        with self.lock:
            self.frame = error
        self.publish_stop("", error)

    def on_instruction(self, msg) -> None:
        with self.lock:
            self.instruction = msg.data.strip()
            self.episode += 1
            self.lock.notify_all()
        if self.instruction:
            self.get_logger().info(f"episode {self.episode}: {self.instruction!r}")
        else:
            self.publish_stop("", "instruction cleared")

    def on_bridge_state(self, msg) -> None:
        with self.lock:
            idle = msg.data.startswith("idle")
            if idle and not self.bridge_idle and self.waiting is not None:
                self.waiting.idle(time.monotonic())
            self.bridge_idle = idle
            if idle and self.pending is not None and not self.outcome:
                self.hand_over()  # overlapped: the next action was ready
            self.lock.notify_all()

    # -- the decision loop (worker thread) ----------------------------------------------------------

    def fresh_frame(self, after: float, episode: int):
        """The newest frame received after ``after`` (monotonic) and at most max_frame_age_s old;
        waits for one. None when the episode changed or the node stops."""
        with self.lock:
            while not self.stopping and episode == self.episode:
                frame = self.frame
                if isinstance(frame, tuple) and frame[2] >= after \
                        and time.monotonic() - frame[2] <= self.params.max_frame_age_s:
                    return frame
                self.lock.wait(0.1)
        return None

    def run(self) -> None:
        while True:
            with self.lock:
                while not self.stopping and not (self.instruction and self.navigator is not None and self.active):
                    self.lock.wait(0.2)
                if self.stopping:
                    return
                episode, instruction = self.episode, self.instruction
            try:
                self.run_episode(episode, instruction)
            except Exception as exc:  # never leave the robot moving on a failure
                self.get_logger().error(f"episode {episode}: {exc!r}; stopping")
                self.publish_stop("", f"navigator failed: {exc}")
            with self.lock:
                if self.episode == episode:
                    self.instruction = ""

    def run_episode(self, episode: int, instruction: str) -> None:
        """Decide, hand over, until a stop. Overlapped: decisions go on from the newest frame while the
        robot moves, the freshest one waiting (``pending``) for the bridge to become idle; the state
        callback hands it over at once then. Stop-and-go: one decision per idle robot, from a frame
        taken after it stopped."""
        from edge_llm_ros.core.nav.navigator import Waiting

        with self.lock:
            self.waiting, self.pending, self.handed = Waiting(), None, 0
            self.request_id, self.outcome = f"nav-{episode}", ""
            if self.bridge_idle:
                self.waiting.idle(time.monotonic())
        while True:
            with self.lock:
                while not self.params.overlap and not self.bridge_idle and self.live(episode):
                    self.lock.wait(0.1)
                if not self.live(episode) or self.outcome:
                    break
                since = self.waiting.since if not self.params.overlap else None
            frame = self.fresh_frame(since if since is not None else 0.0, episode)
            if frame is None:
                break
            decision = self.navigator.decide(frame[0], instruction)
            with self.lock:
                if not self.live(episode) or self.outcome:
                    break
                self.pending = (frame, decision)
                if self.bridge_idle:
                    self.hand_over()
        with self.lock:
            outcome = self.outcome or ("replaced" if episode != self.episode else "node stopped")
            waiting, handed = self.waiting, self.handed
        summary = {"episode": episode, "instruction": instruction, "outcome": outcome, "actions": handed,
                   "overlap": self.params.overlap, "waiting_s": round(waiting.total_s, 3),
                   "waited_rounds": waiting.waited_rounds,
                   "first_motion_s": None if waiting.first_motion_s is None else round(waiting.first_motion_s, 3)}
        self.get_logger().info(f"episode {episode} {outcome} after {handed} action(s): waited "
                               f"{waiting.total_s:.2f} s for decisions ({waiting.waited_rounds} of "
                               f"{waiting.rounds} rounds), first motion after {summary['first_motion_s']} s")
        self.episode_pub.publish(self.String(data=json.dumps(summary)))

    def live(self, episode: int) -> bool:
        return not self.stopping and episode == self.episode

    def hand_over(self) -> None:
        """(Under the lock, the bridge idle.) The pending decision to the bridge, if its frame is
        still fresh enough for it; a stop, an invalid answer or max_actions ends the episode."""
        frame, decision = self.pending
        age = time.monotonic() - frame[2]
        if age > self.params.max_frame_age_s:  # too old for the bridge: the decision under way replaces it
            self.get_logger().warning(f"{self.request_id}: a decision from a {age:.2f} s old frame is past "
                                      f"max_frame_age_s {self.params.max_frame_age_s:g} s (it took "
                                      f"{decision.decide_s:.2f} s); dropped: if decisions take that long here, "
                                      "raise max_frame_age_s on the navigator and the bridge")
            return
        self.pending = None
        self.publish_decision(self.request_id, frame, decision)
        self.waiting.handed_over(time.monotonic())
        self.handed += 1
        if decision.command.verb == "stop":
            self.outcome = "stopped" if decision.valid else "invalid answer"
        elif self.handed >= self.params.max_actions:
            self.outcome = "max_actions"
            self.publish_stop(self.request_id, f"{self.params.max_actions} actions without reaching a stop")
        else:
            self.bridge_idle = False  # the bridge takes the action: not idle until it says so
        self.lock.notify_all()

    # -- outputs ---------------------------------------------------------------------------------

    def publish_decision(self, request_id: str, frame, decision) -> None:
        command = decision.command
        distance, angle = command.motion(self.navigator.magnitudes)
        age = time.monotonic() - frame[2]
        msg = self.NavAction(request_id=request_id, frame_stamp=frame[1], action=command.verb,
                             magnitude=command.magnitude, distance_m=distance, angle_rad=angle,
                             reason=command.reason, confidence=decision.confidence, latency_s=age,
                             valid=decision.valid, raw_text=decision.text[:512], error=decision.error)
        self.action_pub.publish(stamp(self, msg))
        note = f" ({decision.error})" if decision.error else ""
        self.get_logger().info(f"{request_id}: {command.action} — {command.reason!r}, confidence "
                               f"{decision.confidence:.2f}, decided in {decision.decide_s:.2f} s{note}")

    def publish_stop(self, request_id: str, error: str) -> None:
        msg = self.NavAction(request_id=request_id, action="stop", valid=False, error=error)
        msg.frame_stamp = self.get_clock().now().to_msg()
        self.action_pub.publish(stamp(self, msg))

    def destroy_node(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        self.worker.join(timeout=5.0)
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    return run_node(NavigatorNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
