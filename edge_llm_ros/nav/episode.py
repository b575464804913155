"""The navigator's episode policy, once: what to do next, given what happened and when.

Contract: :class:`EpisodeController` is fed an episode's events, each with its time on the
driver's clock (``now``, seconds), and answers with what the driver must do. It holds no thread,
no clock and no model, and knows nothing about ROS. Two drivers run it:

- navigator_node (nav/live.py): ``time.monotonic()``, ROS callbacks and a worker thread that
  computes the decisions;
- ``bench --scenario nav`` (nav/simulated.py): simulated time, the bridge's motion executor and the
  kinematic Go2 stepped in process.

Events in: `frame` (the newest camera frame: `Frame.taken_at` on the driver's clock, when it
arrived; `Frame.stamp` on the odometry's clock), `odometry` (a pose at a stamp), `bridge` (the
bridge's state: idle, or moving and how long the motion takes, :func:`bridge_event`), `decided`
(a decision on a frame `next_decision` handed out). Questions: `next_decision(now)` (the frame to
decide from now, or None: not yet). Answers: a list of effects, :class:`HandOver` (an action for
the bridge, carried over by odometry when overlapped), :class:`Drop` (no action this round: decide
again) and :class:`End` (the episode's outcome, and whether the robot must be sent a stop).

The policy:

- **When a decision starts.** One at a time, and none while a decided one waits for the bridge.
  The robot idle: from the first frame that arrived since it stopped (stop-and-go, and overlapped
  after a drop). Overlapped (``overlap``) and moving: once the schedule says (nav/overlap.py: one
  decision time before the motion ends), from the first frame that arrived since then. Never from
  a frame older than ``max_frame_age_s``. Every start follows an event (a frame, the bridge, a
  decision), so a driver needs no timer.
- **The hand-over** (the robot idle). An invalid answer is handed over (the bridge stops) and ends
  the episode ("invalid answer"); a stop likewise ("stopped"), at any age: stopping is always
  safe. A move or turn from a frame older than ``max_frame_age_s`` is dropped (the bridge would
  refuse it). Overlapped, an action whose frame arrived while the robot still moved is carried
  over by odometry from the pose at the frame's stamp to the pose now (overlap.reanchor); one the
  motion already did, or one without odometry for its frame, is dropped. The ``max_actions``-th
  action ends the episode ("max_actions") with a stop.
- **Decisions too slow.** ``stale_rounds`` stale drops in a row end the episode ("decisions too
  slow") with a stop. This is the bench's old rule, now the robot's too: before, navigator_node
  dropped stale decisions forever, so a navigator slower than its frame age limit held the robot
  standing in an endless episode with a warning each round and no outcome. One stale decision (a
  first decision, contended cores) still only costs a round; three in a row say the deployment
  cannot decide in time, and the summary says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from edge_llm_ros.nav.actions import Magnitudes, NavCommand
from edge_llm_ros.nav.motion import motion_seconds
from edge_llm_ros.nav.navigator import Waiting
from edge_llm_ros.nav.overlap import Overlap, PoseHistory, reanchor
from edge_llm_ros.nav.world import Pose

STALE_ROUNDS = 3  # stale decisions in a row that end an episode
EPS = 1e-9  # clock slack in comparisons (simulated times are sums of floats)


@dataclass(frozen=True)
class PolicyConfig:
    overlap: bool = True  # decide while the robot moves (else stop-and-go)
    max_actions: int = 60
    max_frame_age_s: float = 1.0  # decide only from, and hand over only what was decided on, a younger frame
    stale_rounds: int = STALE_ROUNDS
    carry: bool = True  # overlapped: carry decisions over by odometry (False: the ablation that touches the chair)
    magnitudes: Magnitudes = field(default_factory=Magnitudes)

    def __post_init__(self) -> None:
        if self.max_actions < 1 or self.stale_rounds < 1 or not self.max_frame_age_s > 0:
            raise ValueError(f"max_actions and stale_rounds must be >= 1 and max_frame_age_s > 0, got "
                             f"{self.max_actions}, {self.stale_rounds}, {self.max_frame_age_s}")


@dataclass(frozen=True)
class Frame:
    """A camera frame as the policy sees it: when it arrived (``taken_at``, the driver's clock),
    its stamp (the odometry's clock: where the robot was), what a decision reads (``image``; in
    simulation the pose it renders) and the driver's own record of it (``header``)."""

    taken_at: float
    stamp: float
    image: Any = None
    header: Any = None


class Decided(Protocol):
    """What the policy reads of a decision (nav/navigator.Decision, nav/simulated.Timed)."""

    @property
    def command(self) -> NavCommand: ...

    @property
    def valid(self) -> bool: ...

    @property
    def decide_s(self) -> float: ...


@dataclass(frozen=True)
class HandOver:
    """An action for the bridge: ``verb`` and its motion as handed over (carried over: from the
    pose now, a turn may change side), the decision and frame it came from, and how long the
    robot stood waiting for it."""

    at: float
    frame: Frame
    decision: Any  # Decided
    verb: str
    distance_m: float
    angle_rad: float
    waited_s: float

    @property
    def label(self) -> str:
        """'forward large', 'stop', or 'invalid' (an answer that did not parse)."""
        return self.decision.command.action if self.decision.valid else "invalid"


@dataclass(frozen=True)
class Drop:
    """No action this round (the robot idle): ``reason`` stale | done | no odometry, ``note`` why."""

    at: float
    reason: str
    note: str


@dataclass(frozen=True)
class End:
    """The episode's outcome (stopped | invalid answer | max_actions | decisions too slow, or the
    driver's: replaced, node stopped, navigator failed), and ``stop``: why the robot must be sent a
    stop ('' when the last hand-over stopped it already)."""

    outcome: str
    stop: str = ""


Effect = HandOver | Drop | End


def bridge_event(status: str) -> tuple[bool, float | None]:
    """(idle, motion seconds) of a bridge state line (go2_bridge_node's `~/state`, nav/motion's
    Executor.status): 'moving: ... in 2.50 s' -> (False, 2.5)."""
    return status.startswith("idle"), motion_seconds(status)


class EpisodeController:
    """One episode's policy (see the module docstring). ``poses``: the odometry (shared with a
    driver that outlives episodes); ``bridge_idle``: the bridge's state when the episode starts."""

    def __init__(self, config: PolicyConfig, now: float, bridge_idle: bool = True,
                 poses: PoseHistory | None = None) -> None:
        self.config = config
        self.poses = poses if poses is not None else PoseHistory()
        self.waiting = Waiting(started=now)
        self.schedule = Overlap()
        self.bridge_idle = bridge_idle
        self.awaiting_motion = False  # handed over; the bridge has not said how long the motion takes
        self.newest: Frame | None = None
        self.deciding = False  # a decision started and not decided yet
        self.pending: tuple[Frame, Any] | None = None  # decided, waiting for the bridge to be idle
        self.handed: list[HandOver] = []
        self.drops: list[Drop] = []
        self.stale_in_a_row = 0
        self.outcome = ""
        if bridge_idle:
            self.waiting.idle(now)

    # -- events in ---------------------------------------------------------------------------------

    def frame(self, frame: Frame | None) -> None:
        """The newest frame (None: the last one was malformed; decide from none until the next)."""
        self.newest = frame

    def odometry(self, stamp: float, pose: Pose) -> None:
        self.poses.add(stamp, pose)

    def bridge(self, now: float, idle: bool, motion_s: float | None = None) -> list[Effect]:
        """The bridge's state: idle, or moving in a motion of ``motion_s`` seconds from now."""
        if motion_s is not None and self.awaiting_motion:  # the motion the last hand-over started
            self.schedule.handed(now, now + motion_s)
            self.awaiting_motion = False
        if idle and not self.bridge_idle:
            self.waiting.idle(now)
        self.bridge_idle = idle
        if idle and self.pending is not None and not self.outcome:
            return self._hand_over(now)  # overlapped: the next action was ready
        return []

    def decided(self, now: float, frame: Frame, decision: Any) -> list[Effect]:
        """The decision started on ``frame`` is ready; handed over at once if the robot is idle."""
        self.deciding = False
        if self.outcome:
            return []
        self.schedule.decided(decision.decide_s)
        self.pending = (frame, decision)
        return self._hand_over(now) if self.bridge_idle else []

    def end(self, outcome: str, stop: str = "") -> End | None:
        """The driver ends the episode (replaced, node stopped, navigator failed); None if it had ended."""
        if self.outcome:
            return None
        self.outcome, self.deciding, self.pending = outcome, False, None
        return End(outcome, stop)

    # -- questions ------------------------------------------------------------------------------

    def next_decision(self, now: float) -> Frame | None:
        """The frame to start the next decision from now, or None; a frame given is a decision in
        flight until `decided`."""
        if self.outcome or self.deciding or self.pending is not None:
            return None
        if self.bridge_idle:
            after = self.waiting.since if self.waiting.since is not None else -math.inf
        elif self.config.overlap and now >= self.schedule.start_at - EPS:
            after = self.schedule.start_at
        else:
            return None
        frame = self.newest
        if frame is None or frame.taken_at < after - EPS or now - frame.taken_at > self.config.max_frame_age_s + EPS:
            return None
        self.deciding = True
        return frame

    def summary(self) -> dict:
        """What an episode reports: outcome, actions handed over, the robot's waiting, drops."""
        w = self.waiting
        return {"outcome": self.outcome, "actions": len(self.handed), "waiting_s": round(w.total_s, 3),
                "waited_rounds": w.waited_rounds,
                "first_motion_s": None if w.first_motion_s is None else round(w.first_motion_s, 3),
                "dropped": len(self.drops)}

    # -- the hand-over ------------------------------------------------------------------------------

    def _hand_over(self, now: float) -> list[Effect]:
        """(The robot idle.) The pending decision to the bridge, or dropped (module docstring)."""
        assert self.pending is not None
        frame, decision = self.pending
        self.pending = None
        command = decision.command
        if not decision.valid or command.verb == "stop":
            return [self._give(now, frame, decision, command.verb, *command.motion(self.config.magnitudes)),
                    self._finish("stopped" if decision.valid else "invalid answer")]
        age = now - frame.taken_at
        if age > self.config.max_frame_age_s + EPS:
            return self._drop(now, "stale", f"a decision from a {age:.2f} s old frame is past max_frame_age_s "
                                            f"{self.config.max_frame_age_s:g} s (it took {decision.decide_s:.2f} s)")
        verb, (distance, angle) = command.verb, command.motion(self.config.magnitudes)
        still = self.waiting.since is not None and frame.taken_at >= self.waiting.since - EPS
        if self.config.overlap and self.config.carry and not still:  # decided from a pose the robot has left
            at_frame, here = self.poses.at(frame.stamp), self.poses.latest
            if at_frame is None or here is None:
                return self._drop(now, "no odometry", "no odometry for the frame's time: a decision from a "
                                                      "frame taken while moving cannot be carried over")
            moved = reanchor(command, distance, angle, at_frame, here)
            if moved is None:
                return self._drop(now, "done", f"{command.action} (decided {decision.decide_s:.2f} s ago) was "
                                               "already done by the motion since its frame")
            verb, distance, angle = moved.verb, moved.distance_m, moved.angle_rad
        self.stale_in_a_row = 0
        effects: list[Effect] = [self._give(now, frame, decision, verb, distance, angle)]
        if len(self.handed) >= self.config.max_actions:
            effects.append(self._finish("max_actions", f"{self.config.max_actions} actions without reaching a stop"))
        else:
            self.bridge_idle = False  # the bridge takes the action: not idle until it says so
            self.awaiting_motion = True  # its state says how long the motion takes
            self.schedule.start_at = math.inf  # until then: decide when it is idle again
        return effects

    def _give(self, now: float, frame: Frame, decision: Any, verb: str, distance: float, angle: float) -> HandOver:
        waited = 0.0 if self.waiting.since is None else now - self.waiting.since
        handed = HandOver(now, frame, decision, verb, distance, angle, waited)
        self.handed.append(handed)
        self.waiting.handed_over(now)
        return handed

    def _drop(self, now: float, reason: str, note: str) -> list[Effect]:
        drop = Drop(now, reason, note)
        self.drops.append(drop)
        self.stale_in_a_row = self.stale_in_a_row + 1 if reason == "stale" else 0
        if self.stale_in_a_row >= self.config.stale_rounds:
            return [drop, self._finish("decisions too slow", f"{self.stale_in_a_row} decisions in a row from "
                                                            f"frames older than {self.config.max_frame_age_s:g} s")]
        self.schedule.dropped(now)
        return [drop]

    def _finish(self, outcome: str, stop: str = "") -> End:
        self.outcome = outcome
        return End(outcome, stop)
