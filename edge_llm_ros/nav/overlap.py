"""Overlapped decisions that stay right: when to start the next decision while the robot still
moves, and how to carry an action decided from one pose over to the pose it starts from.

Contract: plain numbers, injected time, nothing about ROS. The navigator's actions are relative
("forward 1 m", "turn left 30 degrees") to the pose its camera frame was taken at. Overlapped with
motion, that frame is older than the pose the robot stands at when the action is handed over, so
the action is re-anchored by odometry first (`reanchor`): a turn keeps its goal heading, a move
its goal point along the frame's heading, both re-expressed from the pose now. A decision the
motion since its frame has already carried out (what is left is below `MIN_TURN_RAD` /
`MIN_MOVE_M`), or a move decided facing more than `MAX_HEADING_CHANGE_RAD` away from today's
heading, is dropped: the robot is idle, and the next decision starts from the newest frame.

When to start (`Lead`, `decision_start`): a frame taken just after a hand-over shows the pose the
handed action starts from, so a decision on it repeats that action and is dropped at the next
hand-over. The next decision therefore starts one decision time (`Lead.lead_s`: an average of
the decisions measured so far, plus a margin) before the motion ends, from the newest frame then:
it is ready when the robot stops, and its frame is at most a decision time behind the pose the
robot stops at. A motion shorter than that starts the decision at the hand-over.

`PoseHistory` answers where the robot was when a frame was taken (odometry, interpolated).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

from edge_llm_ros.nav.actions import MOVES, TURNS, NavCommand
from edge_llm_ros.nav.world import Pose, wrap

MIN_TURN_RAD = math.radians(3.0)   # less than this left to turn: the motion since the frame did it
MIN_MOVE_M = 0.05                  # less than this left to move: likewise
MAX_HEADING_CHANGE_RAD = math.radians(10.0)  # a move decided facing further away than this is not re-aimed


@dataclass(frozen=True)
class Reanchored:
    """An action re-expressed from the pose it starts from: its verb (a turn may change side),
    signed distance (m) and angle (rad)."""

    verb: str
    distance_m: float
    angle_rad: float


def reanchor(command: NavCommand, distance_m: float, angle_rad: float, at_frame: Pose, now: Pose) -> Reanchored | None:
    """``command`` (its motion ``distance_m``, ``angle_rad``), decided from a frame taken at pose
    ``at_frame``, as the motion to start from pose ``now``; None when nothing of it is left to do
    or it no longer applies (see the module docstring). A stop stays a stop."""
    if command.verb in TURNS:
        left = wrap(at_frame.yaw + angle_rad - now.yaw)
        if abs(left) < MIN_TURN_RAD:
            return None
        return Reanchored("turn_left" if left > 0 else "turn_right", 0.0, left)
    if command.verb in MOVES:
        if abs(wrap(now.yaw - at_frame.yaw)) > MAX_HEADING_CHANGE_RAD:
            return None
        goal_x = at_frame.x + distance_m * math.cos(at_frame.yaw)
        goal_y = at_frame.y + distance_m * math.sin(at_frame.yaw)
        along = (goal_x - now.x) * math.cos(now.yaw) + (goal_y - now.y) * math.sin(now.yaw)
        if along * distance_m <= 0 or abs(along) < MIN_MOVE_M:  # reached or passed: never turn a move around
            return None
        return Reanchored(command.verb, along, 0.0)
    return Reanchored(command.verb, 0.0, 0.0)


@dataclass
class Lead:
    """How long before a motion ends the next decision starts: the mean of the last ``window``
    decision times plus ``margin_s`` (none measured yet: ``first_s``)."""

    first_s: float = 1.0
    margin_s: float = 0.15
    window: int = 8

    def __post_init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=self.window)

    def observe(self, decide_s: float) -> None:
        self.recent.append(decide_s)

    @property
    def lead_s(self) -> float:
        mean = sum(self.recent) / len(self.recent) if self.recent else self.first_s
        return mean + self.margin_s


def decision_start(handed_at: float, motion_end: float, lead_s: float, into: float = 0.5) -> float:
    """When the decision after an action handed over at ``handed_at`` should start, its motion
    ending at ``motion_end``: one lead before the end, and never before ``into`` of the motion
    has passed (a frame from nearer its start shows little the handed action did not)."""
    return max(handed_at + into * (motion_end - handed_at), motion_end - lead_s)


class Overlap:
    """One episode's overlapped schedule, kept by the episode policy (nav/episode.py, which the
    robot and the bench both run): when the next decision starts (`start_at`). The policy carries
    a decision over to the pose at its hand-over with `reanchor`."""

    def __init__(self, lead: Lead | None = None, into: float = 0.5) -> None:
        self.lead = lead or Lead()
        self.into = into
        self.start_at = 0.0  # when the next decision starts

    def decided(self, decide_s: float) -> None:
        self.lead.observe(decide_s)

    def handed(self, now: float, motion_end: float) -> None:
        """A decision went to the robot at ``now``; its motion ends at ``motion_end``."""
        self.start_at = decision_start(now, motion_end, self.lead.lead_s, self.into)

    def dropped(self, now: float) -> None:
        """The decision was dropped (nothing left of it to do): the next starts at once."""
        self.start_at = now


class PoseHistory:
    """Odometry poses by time (seconds on the clock that stamps frames), the last ``horizon_s``."""

    def __init__(self, horizon_s: float = 30.0) -> None:
        self.horizon_s = horizon_s
        self.times: list[float] = []
        self.poses: list[Pose] = []

    def add(self, t: float, pose: Pose) -> None:
        if self.times and t < self.times[-1]:  # out of order (a reset clock): start over
            self.times.clear()
            self.poses.clear()
        self.times.append(t)
        self.poses.append(pose)
        drop = bisect.bisect_left(self.times, t - self.horizon_s)
        if drop > len(self.times) // 2:  # amortised trimming
            del self.times[:drop], self.poses[:drop]

    @property
    def latest(self) -> Pose | None:
        return self.poses[-1] if self.poses else None

    def at(self, t: float, tolerance_s: float = 0.25) -> Pose | None:
        """The pose at time ``t``, interpolated between the odometry around it; None when ``t`` is
        outside what the history covers (give or take ``tolerance_s``)."""
        if not self.times or t < self.times[0] - tolerance_s or t > self.times[-1] + tolerance_s:
            return None
        i = bisect.bisect_left(self.times, t)
        if i == 0:
            return self.poses[0]
        if i == len(self.times):
            return self.poses[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        a, b = self.poses[i - 1], self.poses[i]
        w = 0.0 if t1 == t0 else (t - t0) / (t1 - t0)
        return Pose(a.x + w * (b.x - a.x), a.y + w * (b.y - a.y), wrap(a.yaw + w * wrap(b.yaw - a.yaw)))
