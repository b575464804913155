"""A navigation episode in simulated time: decisions, the bridge's motions and the kinematic Go2
together, stop-and-go or overlapped, as navigator_node, go2_bridge_node and sim_node run them as
processes, but on a virtual clock (an episode takes as long as its decisions take to compute).

Contract: ``decide(pose)`` is one decision from the camera frame taken at ``pose`` and says how
long it took (measured, or a cost model: a link, a server); `run_episode` plays the episode and
returns what bench --scenario nav reports. Knows nothing about ROS.

The pieces are the processes' own: the bridge's `Executor` (acceleration-limited motions, its
frame-age gate) ticks every ``period_s`` and its setpoints drive `Robot.step`; frames exist every
``frame_period_s``; `Waiting` accounts the robot standing still for a decision. Stop-and-go: a
decision starts on the first frame after the robot stopped. Overlapped: it starts one lead before
the motion ends (nav/overlap.py), and is re-anchored by the pose history at the hand-over.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_llm_ros.nav.actions import Magnitudes, NavCommand
from edge_llm_ros.nav.motion import Command, Executor, MotionLimits
from edge_llm_ros.nav.navigator import Waiting
from edge_llm_ros.nav.overlap import Overlap, PoseHistory, reanchor
from edge_llm_ros.nav.world import Pose, Robot, World, reached

STALE_ROUNDS = 3  # decisions in a row older than the bridge's max_frame_age_s end the episode


@dataclass(frozen=True)
class Timed:
    """A decision and the seconds it took from its frame to the answer."""

    command: NavCommand
    decide_s: float
    valid: bool = True


Decide = Callable[[Pose], Timed]


@dataclass(frozen=True)
class EpisodeConfig:
    overlap: bool = False
    max_actions: int = 60
    limits: MotionLimits = MotionLimits(max_frame_age_s=2.0)  # config/go2_sim.yaml's bridge
    magnitudes: Magnitudes = field(default_factory=Magnitudes)
    period_s: float = 0.05        # the bridge's control tick (20 Hz), also the physics step
    frame_period_s: float = 1 / 15  # the camera (15 Hz)
    max_time_s: float = 600.0
    carry: bool = True  # overlapped: carry decisions over to the pose now (False: hand them over as decided)


@dataclass
class TimedEpisode:
    outcome: str  # reached | stopped short | touched | invalid answer | max_actions | decisions too slow | timeout
    final: Pose
    time_s: float  # from the instruction to the end
    path_m: float
    actions: int  # handed to the bridge (the final stop included)
    dropped: int  # overlapped decisions that re-anchoring found done already, or too old for the bridge
    waiting: Waiting
    touched: str = ""
    trajectory: list[tuple[float, float, float]] = field(default_factory=list)  # (t, x, y)
    handed: list[tuple[float, str, float]] = field(default_factory=list)  # (t, action, seconds waited for it)

    @property
    def success(self) -> bool:
        return self.outcome == "reached"


@dataclass
class _Decision:
    frame_t: float
    pose: Pose
    timed: Timed
    ready_at: float


def run_episode(world: World, decide: Decide, config: EpisodeConfig = EpisodeConfig()) -> TimedEpisode:
    """Play one episode from the world's start until a stop, a contact, max_actions or max_time_s."""
    robot, executor = Robot(world, world.start), Executor(config.limits, config.period_s)
    history, waiting, schedule = PoseHistory(horizon_s=60.0), Waiting(started=0.0), Overlap()
    t, path, actions, dropped, fp = 0.0, 0.0, 0, 0, config.frame_period_s
    trajectory, handed = [(0.0, robot.pose.x, robot.pose.y)], []
    history.add(0.0, robot.pose)
    waiting.idle(0.0)
    flight: _Decision | None = None
    ready: _Decision | None = None
    touched, stale_in_a_row = "", 0

    def hand_over(action: str) -> None:
        handed.append((t, action, 0.0 if waiting.since is None else t - waiting.since))
        waiting.handed_over(t)

    def finish(result: str) -> TimedEpisode:
        return TimedEpisode(result, robot.pose, t, path, actions, dropped, waiting, touched, trajectory, handed)

    while t < config.max_time_s:
        if flight is None and ready is None and t >= schedule.start_at - 1e-9:
            frame_t = math.floor(t / fp + 1e-9) * fp  # the newest frame
            pose = history.at(frame_t) or robot.pose
            timed = decide(pose)
            schedule.decided(timed.decide_s)
            flight = _Decision(frame_t, pose, timed, t + timed.decide_s)
        if flight is not None and t >= flight.ready_at - 1e-9:
            ready, flight = flight, None
        if ready is not None and executor.motion is None:
            decision, ready = ready, None
            command, age = decision.timed.command, t - decision.frame_t
            if not decision.timed.valid:
                hand_over("invalid")
                return finish("invalid answer")
            if command.verb == "stop":
                hand_over("stop")
                actions += 1
                return finish("reached" if reached(robot.pose, world.target_object) else "stopped short")
            distance, angle = command.motion(config.magnitudes)
            if config.overlap and config.carry:  # decided from an older pose: carried over to this one
                moved = reanchor(command, distance, angle, decision.pose, robot.pose)
                distance, angle = (moved.distance_m, moved.angle_rad) if moved else (0.0, 0.0)
            stale = age > config.limits.max_frame_age_s  # the bridge would refuse it
            if (distance, angle) == (0.0, 0.0) or stale:
                dropped, stale_in_a_row = dropped + 1, (stale_in_a_row + 1 if stale else 0)
                if stale_in_a_row >= STALE_ROUNDS:
                    return finish("decisions too slow")
                schedule.dropped(t)
                continue  # decide again now, from the newest frame
            stale_in_a_row = 0
            executor.command(Command(distance, angle, age, True, "", command.action), t)
            hand_over(command.action)
            actions += 1
            if actions >= config.max_actions:
                return finish("max_actions")
            schedule.handed(t, executor.motion.end)
            if not config.overlap:
                schedule.start_at = math.inf  # once the robot stops
        moving = executor.motion is not None
        setpoint, _ = executor.tick(t)
        before = robot.pose
        if setpoint is not None and not setpoint.stop:
            touched = robot.step(setpoint.vx, setpoint.wz, config.period_s)
            if touched:
                executor.set_estop(True)
                t += config.period_s
                return finish("touched")
        t += config.period_s
        path += math.hypot(robot.pose.x - before.x, robot.pose.y - before.y)
        history.add(t, robot.pose)
        trajectory.append((t, robot.pose.x, robot.pose.y))
        if moving and executor.motion is None:  # the motion ended during this tick
            waiting.idle(t)
            if not config.overlap:
                schedule.start_at = math.ceil(t / fp - 1e-9) * fp  # the first frame after the robot stopped
    return finish("timeout")
