"""navigator_node: camera frames + an instruction -> NavActions, decided by the VLM (nav).

Subscribes `/camera/image_raw` (sensor_msgs/Image) and `/camera/image_raw/compressed`
(sensor_msgs/CompressedImage), keeping the newest frame, and `instruction` (std_msgs/String)
under its namespace (default /edge_llm): an instruction starts an episode, a new one replaces it,
an empty one ends it. It publishes `nav_action` (edge_llm_ros/msg/NavAction) for go2_bridge_node
and follows the bridge's `go2_bridge/state` (idle | moving | estop).

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
decision starts when the robot is idle, from a frame taken then). Either way the episode's waiting
time (the robot idle, waiting for a decision), decisions and time to first motion are logged when
it ends and published latched on `~/episode` (std_msgs/String, JSON).
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import latched_qos, run_node, stamp
from edge_llm_ros.nodes.edge_link import VerifierLink
from edge_llm_ros.nodes.managed import ManagedNode, QwenFrameParams, rss_mb
from edge_llm_ros.nodes.parameters import param


@dataclasses.dataclass(frozen=True)
class NavigatorParams(QwenFrameParams):
    adapter: str = param("", "navigation adapter folder ('' = the shipped one for SmolLM2: edge-llm-ros train nav)")
    draft: str = param("", "draft model folder for the speculative modes ('' = the shipped SmolLM2 draft)")
    mode: str = param("ar", "decoding mode (lossless under the grammar); fsd and ee: edge_cloud only; chunk_pp "
                            "and flowspec: pipeline only", choices=("ar", "sd", "tree", "fsd", "ee", "chunk_pp",
                                                                    "flowspec"))
    deployment: str = param("robot", "where the target runs: robot (this process), edge_cloud (a verifier_node "
                                     "serving task nav, over draft/verify) or pipeline (stage_nodes serving task "
                                     "nav, over stage_0/in ... stage_<stages>/in)",
                            choices=("robot", "edge_cloud", "pipeline"))
    timeout_s: float = param(10.0, "edge_cloud and pipeline: seconds to wait for the next answer", low=0.001)
    stages: int = param(2, "pipeline: stage_nodes in the pipeline", low=1, high=1024)
    segment: int = param(8, "pipeline: draft rows a message (flowspec's segment, chunk_pp's chunk)", low=1,
                         high=4096)
    in_flight: int = param(0, "pipeline: segments on their way at most (0 = stages)", low=0, high=1024)
    prefill_chunk: int = param(0, "pipeline: prompt tokens a prefill message (0 = the whole prompt)", low=0)
    gamma: int = param(4, "drafted tokens per round (sd)", low=1, high=16)
    overlap: bool = param(True, "decide the next action while the robot executes the current one, carried "
                                 "over by /odom to the pose it starts from (false: stop-and-go)")
    max_actions: int = param(60, "an episode stops after this many actions", low=1)
    max_frame_age_s: float = param(1.0, "decide only from a frame at most this old (else wait for one)", low=0.01)
    threads: int = param(0, "torch intra-op threads (0 = every core)", low=0, high=1024)
    vlm: str = param("", "a local Qwen2-VL / Qwen2.5-VL checkpoint folder as the target ('' = SmolLM2 + the "
                         "navigation adapter); needs the vlm extra (qwen-vl-utils)")
    vlm_draft: str = param("", "the Qwen draft's checkpoint folder (same tokenizer as the target; '' = none, mode "
                               "ar only); over edge_cloud the only model here (the verifier's nav_vlm verifies)")

    def __post_init__(self) -> None:
        if (self.vlm or self.vlm_draft) and self.deployment == "pipeline":
            raise ValueError("parameter 'vlm': a Qwen VLM runs with deployment robot or edge_cloud (a stage holds "
                             "no vision tower); got deployment pipeline")
        if self.vlm and self.deployment == "edge_cloud":
            raise ValueError("parameter 'vlm': over edge_cloud the target is the verifier's (its nav_vlm); give "
                             "this robot its draft as vlm_draft")
        if self.vlm_draft and not self.vlm and self.deployment == "robot":
            raise ValueError("parameter 'vlm_draft': a Qwen draft here needs its target here too: give vlm (or "
                             "deployment edge_cloud, the target on the verifier)")
        if self.vlm and self.mode != "ar" and not self.vlm_draft:
            raise ValueError(f"parameter 'vlm_draft': mode {self.mode} drafts, and vlm has no draft: give "
                             "vlm_draft (e.g. Qwen2-VL-2B beside a 7B target) or mode ar")

    @property
    def qwen(self) -> bool:
        """A Qwen VLM: the target here (vlm) or the draft of the verifier's (vlm_draft over edge_cloud)."""
        return bool(self.vlm or (self.vlm_draft and self.deployment == "edge_cloud"))
        if self.mode in ("fsd", "ee") and self.deployment != "edge_cloud":
            raise ValueError(f"parameter 'mode': {self.mode} pre-drafts from a verifier's early exits: it needs "
                             "deployment edge_cloud")
        if (self.mode in ("chunk_pp", "flowspec")) != (self.deployment == "pipeline") and self.mode != "ar":
            raise ValueError(f"parameter 'mode': deployment pipeline decodes in ar, chunk_pp or flowspec; "
                             f"{self.mode} is for " + ("pipeline" if self.mode in ("chunk_pp", "flowspec")
                                                       else "robot or edge_cloud") + " deployments")


class NavigatorNode(ManagedNode):
    single_threaded = True  # rclpy: its callbacks are light and frequent (runtime/ros.spin)

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
        self.schedule = None  # the episode's Overlap: when the next decision starts
        self.awaiting_motion = False  # handed over; the bridge has not said how long the motion takes
        self.poses = None  # PoseHistory from /odom, by stamp (s)
        self.warned_odometry = False
        self.action_pub = self.create_publisher(self.NavAction, "nav_action", 10)
        self.episode_pub = self.create_publisher(self.String, "~/episode", latched_qos())
        self.create_subscription(rt.message("sensor_msgs/msg/Image"), "/camera/image_raw", self.on_image, 2)
        self.create_subscription(rt.message("sensor_msgs/msg/CompressedImage"), "/camera/image_raw/compressed",
                                 self.on_compressed, 2)
        self.create_subscription(self.String, "instruction", self.on_instruction, 10)
        self.create_subscription(self.String, "go2_bridge/state", self.on_bridge_state, latched_qos())
        self.create_subscription(rt.message("nav_msgs/msg/Odometry"), "/odom", self.on_odometry, 10)
        # edge_cloud: the verifier's link; pipeline: the stages' refusals come on `verify` too, and prunes
        # go on `prune`
        self.link = VerifierLink(self, self.params.timeout_s) if self.params.deployment != "robot" else None
        self.stages = None
        if self.params.deployment == "pipeline":
            from edge_llm_ros.nodes.stage_client import StageClient

            self.stages = StageClient(self, self.params.stages, self.params.timeout_s, self.link.inboxes,
                                      self.link.prune_pub)
        self.worker = threading.Thread(target=self.run, daemon=True, name="navigator")
        self.worker.start()

    # -- lifecycle ---------------------------------------------------------------------------------

    def load(self) -> str:
        import numpy as np

        from edge_llm_ros.core.drafts.draft_models import load_draft
        from edge_llm_ros.core.drafts.loading import draft_home, set_threads
        from edge_llm_ros.core.edge_cloud import EDGE_MODES
        from edge_llm_ros.core.engine.config import GenerationConfig
        from edge_llm_ros.core.engine.models import load_model
        from edge_llm_ros.nav.navigator import MAX_ANSWER_TOKENS, Navigator
        from edge_llm_ros.nav.overlap import PoseHistory
        from edge_llm_ros.nav.vlm import NavAdapter

        p = self.params
        set_threads(p.threads)
        remote = p.deployment != "robot"
        if p.qwen:  # the user's Qwen VLM: target and draft here, or the draft of the verifier's target
            adapter, target, draft = self.qwen_vlm()
            kind = target.hf.config.model_type
            vlm = (f"{kind} {p.vlm} (draft {p.vlm_draft or 'none'})" if not remote
                   else f"{kind} draft {p.vlm_draft}") + f", {adapter.describe()}"
        else:
            # split deployments: only what the draft shares of the target (its embedding and head)
            target = draft_home(None, p.draft or None) if remote else load_model()
            adapter = NavAdapter.load(p.adapter or None, target)
            draft = load_draft(target, p.draft or None).model if p.mode != "ar" or remote else None
            trained = adapter.training_info.get("action_accuracy")
            vlm = (f"SmolLM2 + adapter {p.adapter or 'shipped'}"
                   + (f" (held-out action accuracy {trained:.2f})" if trained is not None else ""))
        if p.deployment == "pipeline":
            mode = "ar" if p.mode == "ar" else "sd"  # the config's: the pipeline's own mode is p.mode
        else:
            mode = EDGE_MODES[p.mode][0] if remote else p.mode  # fsd and ee draft chains, as sd does
        config = GenerationConfig(mode=mode, max_new_tokens=MAX_ANSWER_TOKENS, gamma=p.gamma, tree_depth=p.gamma)
        blank = np.zeros((96, 128, 3), np.uint8)
        if p.deployment == "pipeline":
            from edge_llm_ros.nav.navigator import PipelineNavigator

            self.navigator = PipelineNavigator(adapter, draft, self.stages.run, p.mode, config, segment=p.segment,
                                               in_flight=p.in_flight or p.stages, prefill_chunk=p.prefill_chunk)
            seconds_ = self.navigator.warm_up(blank, "go to the red chair")
            where = (f"over a stage pipeline: the draft here (D0), SmolLM2 + the adapter in {p.stages} stage(s) "
                     f"serving task nav ({self.stages.describe()})")
        elif remote:
            self.navigator = self.remote_navigator(adapter, draft, config)
            seconds_ = self.navigator.warm_up(blank, "go to the red chair")
            where = (f"over edge-cloud: the draft here, the target on the verifier serving task nav "
                     f"({self.resolve_topic_name('draft')} -> {self.resolve_topic_name('verify')})")
        else:
            self.navigator = Navigator(adapter, target, draft, config)
            self.navigator.grammar.warm()  # every mask of the answer grammar, before a decision waits for one
            seconds_ = self.navigator.decide(blank, "go to the red chair").decide_s
            where = "on torch in this process"
        self.poses = PoseHistory()
        self.get_logger().info(f"warmed up: a first {'draft' if remote else 'decision'} (a blank frame) in "
                               f"{seconds_:.2f} s")  # torch's first pass is slow
        how = "overlapped with motion (carried over by /odom)" if p.overlap else "stop-and-go"
        return f"navigating with {vlm}, mode {p.mode} {where}, decisions {how}; {rss_mb():.0f} MB resident"

    def qwen_vlm(self):
        """(the VLM, target, draft) of a Qwen VLM from local checkpoints (parameters vlm, vlm_draft)."""
        from edge_llm_ros.nav.qwen_vl import QwenVL

        p = self.params
        if p.deployment == "edge_cloud":
            vlm, draft, _ = QwenVL.load(p.vlm_draft, size=p.qwen_size)
            return vlm, draft, draft
        return QwenVL.load(p.vlm, p.vlm_draft or None, p.qwen_size)

    def remote_navigator(self, adapter, draft, config):
        """The robot's half of an edge-cloud navigator, its rounds over this node's VerifierLink."""
        from edge_llm_ros.core.edge_cloud import EarlyExitDrafter
        from edge_llm_ros.core.engine.drafters import ModelDrafter
        from edge_llm_ros.nav.navigator import EdgeCloudNavigator

        # the shared drafter answers what a request without its own asks (tokenizer, window: cloud ar);
        # every speculative decision drafts with one conditioned on its frame
        self.link.drafter = EarlyExitDrafter([ModelDrafter(adapter.attach(draft, "draft"))], seed=0,
                                             sender=self.link.send, max_requests=2)
        return EdgeCloudNavigator(adapter, draft, self.link.rounds, self.params.mode, config)

    def unload(self) -> None:
        if self.link is not None and self.link.drafter is not None:
            self.link.drafter.close()
            self.link.drafter = None
        self.navigator = None

    # -- inputs ----------------------------------------------------------------------------------

    def on_image(self, msg) -> None:
        from edge_llm_ros.nav.frames import FrameError, from_raw

        try:
            frame = from_raw(msg.encoding, msg.width, msg.height, msg.step, msg.data)
        except FrameError as exc:
            self.bad_frame(f"/camera/image_raw: {exc}")
            return
        self.new_frame(frame, msg.header.stamp)

    def on_compressed(self, msg) -> None:
        from edge_llm_ros.nav.frames import FrameError, from_compressed

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

    def on_odometry(self, msg) -> None:
        from edge_llm_ros.nav.world import Pose

        q, position = msg.pose.pose.orientation, msg.pose.pose.position
        yaw = math.atan2(2 * (q.w * q.z + q.x * q.y), 1 - 2 * (q.y * q.y + q.z * q.z))
        with self.lock:
            if self.poses is not None:
                self.poses.add(seconds(msg.header.stamp), Pose(position.x, position.y, yaw))

    def on_bridge_state(self, msg) -> None:
        from edge_llm_ros.nav.motion import motion_seconds

        with self.lock:
            takes = motion_seconds(msg.data)
            if takes is not None and self.schedule is not None and self.awaiting_motion:
                now = time.monotonic()  # the motion this hand-over started: the next decision's time
                self.schedule.handed(now, now + takes)
                self.awaiting_motion = False
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
        """Decide, hand over, until a stop. Stop-and-go: one decision per idle robot, from a frame
        taken after it stopped. Overlapped: the next decision starts when the schedule says (one
        decision time before the motion ends) from the newest frame, and waits (``pending``) for
        the bridge to become idle; the state callback hands it over at once then."""
        from edge_llm_ros.nav.navigator import Waiting
        from edge_llm_ros.nav.overlap import Overlap

        with self.lock:
            self.waiting, self.pending, self.handed = Waiting(), None, 0
            self.request_id, self.outcome = f"nav-{episode}", ""
            self.schedule, self.awaiting_motion = Overlap(), False
            if self.bridge_idle:
                self.waiting.idle(time.monotonic())
        while True:
            with self.lock:
                while self.live(episode) and not self.outcome and not self.may_decide():
                    self.lock.wait(0.05)
                if not self.live(episode) or self.outcome:
                    break
                after = self.waiting.since if self.bridge_idle else self.schedule.start_at
            frame = self.fresh_frame(after if after is not None else 0.0, episode)
            if frame is None:
                break
            decision = self.navigator.decide(frame[0], instruction)
            with self.lock:
                self.schedule.decided(decision.decide_s)
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

    def may_decide(self) -> bool:
        """(Under the lock.) Whether the next decision may start now: nothing is pending, and the
        robot is idle, or (overlapped) the schedule's time has come while it moves."""
        if self.pending is not None:
            return False
        if self.bridge_idle:
            return True
        return self.params.overlap and time.monotonic() >= self.schedule.start_at

    def live(self, episode: int) -> bool:
        return not self.stopping and episode == self.episode

    def hand_over(self) -> None:
        """(Under the lock, the bridge idle.) The pending decision to the bridge, if its frame is
        still fresh enough for it (and, overlapped, carried over to the pose now); a stop, an
        invalid answer or max_actions ends the episode."""
        frame, decision = self.pending
        self.pending = None
        now = time.monotonic()
        age = now - frame[2]
        if age > self.params.max_frame_age_s:  # too old for the bridge: decide again
            self.get_logger().warning(f"{self.request_id}: a decision from a {age:.2f} s old frame is past "
                                      f"max_frame_age_s {self.params.max_frame_age_s:g} s (it took "
                                      f"{decision.decide_s:.2f} s); dropped: if decisions take that long here, "
                                      "raise max_frame_age_s on the navigator and the bridge")
            self.drop(now)
            return
        motion = decision.command.motion(self.navigator.magnitudes)
        verb = decision.command.verb
        still = self.waiting.since is not None and frame[2] >= self.waiting.since  # taken since the robot stopped
        if self.params.overlap and verb != "stop" and decision.valid and not still:
            carried = self.carry(frame, decision)
            if carried is None:
                self.drop(now)
                return
            verb, motion = carried.verb, (carried.distance_m, carried.angle_rad)
        self.publish_decision(self.request_id, frame, decision, verb, motion)
        self.waiting.handed_over(now)
        self.handed += 1
        if decision.command.verb == "stop":
            self.outcome = "stopped" if decision.valid else "invalid answer"
        elif self.handed >= self.params.max_actions:
            self.outcome = "max_actions"
            self.publish_stop(self.request_id, f"{self.params.max_actions} actions without reaching a stop")
        else:
            self.bridge_idle = False  # the bridge takes the action: not idle until it says so
            self.awaiting_motion = True  # its state says how long the motion takes
            self.schedule.start_at = math.inf  # until then: decide when it is idle again
        self.lock.notify_all()

    def carry(self, frame, decision):
        """(Under the lock.) The decision carried over by odometry from its frame's pose to the pose
        now (nav/overlap.reanchor), or None to drop it."""
        from edge_llm_ros.nav.overlap import reanchor

        at_frame = self.poses.at(seconds(frame[1]))
        now = self.poses.latest
        if at_frame is None or now is None:
            if not self.warned_odometry:
                self.warned_odometry = True
                self.get_logger().warning("overlap: no /odom for the frame's time, so a decision from a frame "
                                          "taken while moving cannot be carried over; dropping such decisions "
                                          "and deciding stop-and-go until odometry arrives")
            return None
        distance, angle = decision.command.motion(self.navigator.magnitudes)
        carried = reanchor(decision.command, distance, angle, at_frame, now)
        if carried is None:
            self.get_logger().info(f"{self.request_id}: {decision.command.action} (decided {decision.decide_s:.2f} s "
                                   "ago) was already done by the motion since its frame; deciding again")
        return carried

    def drop(self, now: float) -> None:
        """(Under the lock, the bridge idle.) No action this round: decide again from a new frame."""
        self.schedule.dropped(now)
        self.lock.notify_all()

    # -- outputs ---------------------------------------------------------------------------------

    def publish_decision(self, request_id: str, frame, decision, verb: str, motion: tuple[float, float]) -> None:
        """The decision as a NavAction: ``verb`` and ``motion`` (distance, angle) as handed over
        (overlapped: carried over to the pose now; a carried turn may change side)."""
        command = decision.command
        distance, angle = motion
        age = time.monotonic() - frame[2]
        msg = self.NavAction(request_id=request_id, frame_stamp=frame[1], action=verb,
                             magnitude=command.magnitude, distance_m=distance, angle_rad=angle,
                             reason=command.reason, confidence=decision.confidence, latency_s=age,
                             valid=decision.valid, raw_text=decision.text[:512], error=decision.error)
        self.action_pub.publish(stamp(self, msg))
        note = f" ({decision.error})" if decision.error else ""
        if (verb, motion) != (command.verb, command.motion(self.navigator.magnitudes)):
            note += f" carried over to {verb} {distance:.2f} m, {math.degrees(angle):.0f} deg"
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


def seconds(stamp_msg) -> float:
    return stamp_msg.sec + stamp_msg.nanosec * 1e-9


def main(args: list[str] | None = None) -> int:
    return run_node(NavigatorNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
