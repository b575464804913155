"""A navigation episode in simulated time: the navigator's policy (nav/episode.EpisodeController,
the class navigator_node runs), the bridge's motion executor and the kinematic Go2 together, on a
virtual clock (an episode takes as long as its decisions take to compute).

Contract: ``decide(pose)`` is one decision from the camera frame taken at ``pose`` and says how
long it took (measured, or a cost model: a link, a server); `run_episode` plays the episode and
returns what bench --scenario nav reports. Knows nothing about ROS.

:class:`SimulatedGo2` is the world side, what sim_node and go2_bridge_node are as processes: the
bridge's `Executor` (acceleration-limited motions, its frame-age gate) ticks every ``period_s``
and its setpoints drive `Robot.step`; the camera takes a frame every ``frame_period_s``, which
arrives at the next tick (its stamp: when it was taken). `run_episode` drives the controller as
nav/live.py does on the robot: every event (a frame, odometry, the bridge's state line, a decision
ready) goes to the controller, and after each the next decision starts if the controller says so.
A decision started at t is ready at the first tick at or after t + its seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_llm_ros.nav.actions import Magnitudes, NavCommand
from edge_llm_ros.nav.episode import EPS, Effect, End, EpisodeController, Frame, HandOver, PolicyConfig, bridge_event
from edge_llm_ros.nav.motion import Command, Executor, MotionLimits
from edge_llm_ros.nav.navigator import Waiting
from edge_llm_ros.nav.overlap import PoseHistory
from edge_llm_ros.nav.world import Pose, Robot, World, reached


@dataclass(frozen=True)
class Timed:
    """A decision and the seconds it took from its frame to the answer; a model's answer also
    keeps its text, its action line's probability (nav/navigator.Decision's) and its least
    probable token's (where the model was least sure: a stop is chosen in the reason, "reached",
    and the action line then follows it)."""

    command: NavCommand
    decide_s: float
    valid: bool = True
    text: str = ""
    confidence: float = math.nan
    least_p: float = math.nan


Decide = Callable[[Pose], Timed]


@dataclass(frozen=True)
class EpisodeConfig:
    overlap: bool = False
    max_actions: int = 60
    limits: MotionLimits = MotionLimits(max_frame_age_s=2.0)  # config/go2_sim.yaml's bridge (and navigator)
    magnitudes: Magnitudes = field(default_factory=Magnitudes)
    period_s: float = 0.05        # the bridge's control tick (20 Hz), also the physics step
    frame_period_s: float = 1 / 15  # the camera (15 Hz)
    max_time_s: float = 600.0
    carry: bool = True  # overlapped: carry decisions over to the pose now (False: hand them over as decided)

    def policy(self) -> PolicyConfig:
        """The navigator's policy here: its frame age limit is the bridge's (as in config/go2_sim.yaml)."""
        return PolicyConfig(overlap=self.overlap, max_actions=self.max_actions,
                            max_frame_age_s=self.limits.max_frame_age_s, carry=self.carry, magnitudes=self.magnitudes)


@dataclass
class TimedEpisode:
    outcome: str  # reached | stopped short | touched | invalid answer | max_actions | decisions too slow | timeout
    final: Pose
    time_s: float  # from the instruction to the end
    path_m: float
    actions: int  # handed to the bridge (the final stop, or the invalid answer, included)
    dropped: int  # overlapped decisions that re-anchoring found done already, or too old for the bridge
    waiting: Waiting
    touched: str = ""
    trajectory: list[tuple[float, float, float]] = field(default_factory=list)  # (t, x, y)
    handed: list[tuple[float, str, float]] = field(default_factory=list)  # (t, action, seconds waited for it)
    summary: dict = field(default_factory=dict)  # the controller's (EpisodeController.summary: outcome stopped, ...)
    hand_overs: list[HandOver] = field(default_factory=list)  # the controller's, as the bridge got them

    @property
    def success(self) -> bool:
        return self.outcome == "reached"


class SimulatedGo2:
    """The world side of a simulated episode (see the module docstring): ``t`` the clock."""

    def __init__(self, world: World, config: EpisodeConfig) -> None:
        self.world, self.config = world, config
        self.robot, self.executor = Robot(world, world.start), Executor(config.limits, config.period_s)
        self.t, self.path, self.touched = 0.0, 0.0, ""
        self.history = PoseHistory(horizon_s=60.0)  # where the camera was when it took each frame
        self.history.add(0.0, self.robot.pose)
        self.trajectory = [(0.0, self.robot.pose.x, self.robot.pose.y)]
        self.frames_taken = 0

    def new_frame(self) -> Frame | None:
        """The frame the camera took since the last call, arriving now (None: none)."""
        fp = self.config.frame_period_s
        k = math.floor(self.t / fp + EPS)
        if k < self.frames_taken:
            return None
        self.frames_taken = k + 1
        taken = k * fp
        return Frame(self.t, taken, self.history.at(taken) or self.robot.pose)

    def command(self, handed: HandOver) -> str:
        """The bridge takes a NavAction now; its state line after."""
        d = handed.decision
        self.executor.command(Command(handed.distance_m, handed.angle_rad, self.t - handed.frame.taken_at, d.valid,
                                      "" if d.valid else "invalid answer", d.command.action), self.t)
        return self.executor.status

    def tick(self) -> bool:
        """One control tick and physics step; True when the motion ended in it (``touched`` says
        what the robot touched, if it did: the bridge's e-stop then latches)."""
        moving = self.executor.motion is not None
        setpoint, _ = self.executor.tick(self.t)
        before = self.robot.pose
        if setpoint is not None and not setpoint.stop:
            self.touched = self.robot.step(setpoint.vx, setpoint.wz, self.config.period_s)
            if self.touched:
                self.executor.set_estop(True)
        self.t += self.config.period_s
        self.path += math.hypot(self.robot.pose.x - before.x, self.robot.pose.y - before.y)
        self.history.add(self.t, self.robot.pose)
        self.trajectory.append((self.t, self.robot.pose.x, self.robot.pose.y))
        return moving and self.executor.motion is None


def run_episode(world: World, decide: Decide, config: EpisodeConfig = EpisodeConfig()) -> TimedEpisode:
    """Play one episode from the world's start until it ends, the robot touches something, or
    max_time_s passes."""
    go2 = SimulatedGo2(world, config)
    control = EpisodeController(config.policy(), 0.0)
    control.odometry(0.0, go2.robot.pose)
    flight: tuple[Frame, Timed, float] | None = None  # a decision in flight: its frame, answer, when ready
    end: End | None = None

    def apply(effects: list[Effect]) -> None:
        nonlocal end
        for effect in effects:
            if isinstance(effect, HandOver):
                idle, takes = bridge_event(go2.command(effect))
                if not isinstance(effects[-1], End):  # an episode that ended with it needs no state
                    apply(control.bridge(go2.t, idle, takes))
            elif isinstance(effect, End):
                end = effect
        poll()

    def poll() -> None:
        nonlocal flight
        if flight is None and end is None:
            frame = control.next_decision(go2.t)
            if frame is not None:
                timed = decide(frame.image)
                flight = (frame, timed, go2.t + timed.decide_s)

    while go2.t < config.max_time_s and end is None:
        frame = go2.new_frame()
        if frame is not None:
            control.frame(frame)
            poll()
        while flight is not None and go2.t >= flight[2] - EPS and end is None:
            (frame, timed, _), flight = flight, None
            apply(control.decided(go2.t, frame, timed))
        if end is not None:
            break
        ended = go2.tick()
        control.odometry(go2.t, go2.robot.pose)
        poll()
        if go2.touched:
            break
        if ended:
            apply(control.bridge(go2.t, *bridge_event(go2.executor.status)))
    return finish(go2, control, end)


def finish(go2: SimulatedGo2, control: EpisodeController, end: End | None) -> TimedEpisode:
    """The episode as bench --scenario nav reports it: a stop is judged by the world (reached or
    stopped short)."""
    if go2.touched:
        outcome = "touched"
    elif end is None:
        outcome = "timeout"
    elif end.outcome == "stopped":
        outcome = "reached" if reached(go2.robot.pose, go2.world.target_object) else "stopped short"
    else:
        outcome = end.outcome
    handed = [(h.at, h.label, h.waited_s) for h in control.handed]
    return TimedEpisode(outcome, go2.robot.pose, go2.t, go2.path, len(control.handed), len(control.drops),
                        control.waiting, go2.touched, go2.trajectory, handed, control.summary(), control.handed)
