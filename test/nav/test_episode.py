"""One episode policy (nav/episode.EpisodeController) under its two drivers: the real-clock one
navigator_node runs (nav/live.LiveEpisodes: callbacks, a lock, a worker thread that decides) and
the simulated-time one bench --scenario nav runs (nav/simulated.run_episode).

The equivalence test plays the same world (nav/simulated.SimulatedGo2: the bridge's executor, the
kinematic Go2, the camera's frames, odometry) through each driver with the same scripted decisions
(the camera expert on the frame's pose, with scripted decision times: some longer than the motions,
some past the frame age limit). The live driver runs on a manual clock in lockstep with the world:
every event goes in through the node's calls (frame, odometry, bridge_state with the bridge's own
state line), each decision runs on the driver's worker thread and is released when the world's
clock reaches its end. Both must hand the bridge the same actions at the same times (carried over
alike), drop the same decisions and end alike; the episodes are checked to exercise the policy
(hand-overs, carried actions, drops) so the comparison is not vacuous.

The policy's own rules are checked against hand-made event sequences: the stale rule, stops at any
age, the first frame since the robot stopped, no odometry, the driver's endings and bad frames.
"""

from __future__ import annotations

import itertools
import math
import threading
from dataclasses import dataclass

import pytest

from edge_llm_ros.nav import NavCommand
from edge_llm_ros.nav.episode import Drop, End, EpisodeController, Frame, HandOver, PolicyConfig, bridge_event
from edge_llm_ros.nav.expert import camera_expert
from edge_llm_ros.nav.live import LiveEpisodes
from edge_llm_ros.nav.simulated import EPS, EpisodeConfig, SimulatedGo2, Timed, run_episode
from edge_llm_ros.nav.world import Pose
from edge_llm_ros.nav.worldgen import GenerateConfig, generate

WAIT_S = 30.0  # how long the lockstep waits for the worker thread at most (it takes milliseconds)
SUMMARY_KEYS = {"episode", "instruction", "outcome", "actions", "overlap", "waiting_s", "waited_rounds",
                "first_motion_s", "dropped"}


class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Recorder:
    """nav/live.Outputs, recording."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, HandOver, float]] = []
        self.stops: list[tuple[str, str]] = []
        self.summaries: list[dict] = []
        self.lines: list[tuple[str, str]] = []

    def action(self, request_id, handed, age_s):
        self.actions.append((request_id, handed, age_s))

    def stop(self, request_id, reason):
        self.stops.append((request_id, reason))

    def summary(self, summary):
        self.summaries.append(summary)

    def log(self, level, line):
        self.lines.append((level, line))


class Script:
    """The scripted decisions: the camera expert on the frame's pose, decision times in turn."""

    def __init__(self, world, seconds: list[float], answers: list[NavCommand | None] | None = None) -> None:
        self.world, self.seconds, self.answers = world, itertools.cycle(seconds), iter(answers or [])

    def __call__(self, pose: Pose) -> Timed:
        answer = next(self.answers, None)
        if answer == "invalid":
            return Timed(NavCommand("stop"), next(self.seconds), valid=False)
        return Timed(answer or camera_expert(self.world, pose), next(self.seconds))


class LockstepNavigator:
    """A navigator for the live driver whose decide() takes scripted time on the manual clock: it
    answers at once but returns only when the world's clock has reached its end (``release``)."""

    def __init__(self, script: Script, clock: ManualClock) -> None:
        self.script, self.clock = script, clock
        self.cond = threading.Condition()
        self.calls, self.ready, self.in_flight, self.released = 0, math.inf, False, False

    def decide(self, image, instruction):
        with self.cond:
            timed = self.script(image)
            self.calls += 1
            self.ready, self.in_flight = self.clock() + timed.decide_s, True
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: self.released, WAIT_S), "never released"
            self.released = self.in_flight = False
            return timed

    def release(self) -> None:
        with self.cond:
            self.released = True
            self.cond.notify_all()


def live_episode(world, script: Script, config: EpisodeConfig) -> tuple[list[HandOver], dict, Recorder]:
    """The episode through LiveEpisodes on a manual clock, in the order nav/simulated.run_episode
    feeds its events: a frame, the decisions ready, a tick, odometry, the bridge's state."""
    clock, out, go2 = ManualClock(), Recorder(), SimulatedGo2(world, config)
    navigator = LockstepNavigator(script, clock)
    live = LiveEpisodes(config.policy(), out, clock)
    forwarded = 0

    def settle() -> None:  # a decision the driver started has entered decide()
        with navigator.cond:
            assert navigator.cond.wait_for(lambda: live.job is None and navigator.calls == live.started,
                                           WAIT_S), "a decision never began"

    def to_bridge() -> None:  # what the driver handed over goes to the world's bridge, whose state comes back
        nonlocal forwarded
        while forwarded < len(out.actions):
            status = go2.command(out.actions[forwarded][1])
            forwarded += 1
            if not out.summaries:
                live.bridge_state(status)
                settle()

    try:
        live.set_navigator(navigator)
        live.set_active(True)
        live.odometry(0.0, go2.robot.pose)
        live.instruction("go to the red chair")
        while go2.t < config.max_time_s and not out.summaries:
            frame = go2.new_frame()
            if frame is not None:
                live.frame(frame.image, frame.stamp)
                settle()
            while navigator.in_flight and go2.t >= navigator.ready - EPS and not out.summaries:
                done = navigator.calls
                navigator.release()
                with live.lock:
                    assert live.lock.wait_for(lambda: live.done == done, WAIT_S), "a decision never ended"
                to_bridge()
                settle()
            if out.summaries:
                break
            ended = go2.tick()
            clock.t = go2.t
            live.odometry(go2.t, go2.robot.pose)
            settle()
            assert not go2.touched, go2.touched
            if ended:
                live.bridge_state(go2.executor.status)
                to_bridge()
                settle()
    finally:
        live.close()
    assert len(out.summaries) == 1, out.summaries
    return [handed for _, handed, _ in out.actions], out.summaries[0], out


def record(handed: HandOver) -> tuple:
    return (handed.at, handed.label, handed.verb, handed.distance_m, handed.angle_rad, handed.waited_s,
            handed.frame.taken_at, handed.frame.stamp)


CASES = {
    # name: (seed, EpisodeConfig keywords, decision times, scripted answers before the expert's)
    "stop-and-go": (100, dict(overlap=False), [0.4, 0.7], None),
    "overlap, decisions longer than a turn": (101, dict(overlap=True), [0.6, 1.3], None),
    "overlap, a stale decision among them": (104, dict(overlap=True), [0.5, 2.6, 0.8, 0.3], None),
    "decisions too slow": (102, dict(overlap=True), [0.4, 0.4, 0.4, 2.5, 2.5, 2.5], None),
    "max_actions": (103, dict(overlap=True, max_actions=4), [0.9], None),
    "invalid answer": (100, dict(overlap=False), [0.5], [None, None, "invalid"]),
}


@pytest.mark.parametrize("name", CASES)
def test_the_robot_and_the_bench_run_the_same_episode(name):
    seed, keywords, seconds, answers = CASES[name]
    world = generate(seed, GenerateConfig(clear_path=True))
    config = EpisodeConfig(**keywords)
    simulated = run_episode(world, Script(world, seconds, answers), config)
    handed, summary, out = live_episode(world, Script(world, seconds, answers), config)

    assert [record(h) for h in handed] == [record(h) for h in simulated.hand_overs]
    assert set(summary) == SUMMARY_KEYS and summary["overlap"] == config.overlap
    assert {k: summary[k] for k in simulated.summary} == simulated.summary, (summary, simulated.summary)
    # not vacuous: each case exercises what it is named for
    expected = {"decisions too slow": "decisions too slow", "max_actions": "max_actions",
                "invalid answer": "invalid answer"}.get(name, "stopped")
    assert simulated.summary["outcome"] == expected and simulated.actions == len(handed) >= 3
    if expected == "stopped":
        assert simulated.outcome == "reached", simulated.outcome
    if config.overlap and name != "decisions too slow":
        assert any((h.verb, h.distance_m, h.angle_rad) != (h.decision.command.verb,
                                                          *h.decision.command.motion(config.magnitudes))
                   for h in handed), "no action was carried over"
    if "stale" in name or name == "decisions too slow":
        assert any("past max_frame_age_s" in line for _, line in out.lines) and simulated.dropped >= 1
    if expected in ("decisions too slow", "max_actions"):
        assert out.stops == [("nav-1", out.stops[0][1])] and out.stops[0][1], out.stops


# -- the policy's rules, event by event ---------------------------------------------------------

FORWARD = NavCommand("forward", "large", "chair ahead")


@dataclass(frozen=True)
class Answer:
    command: NavCommand
    decide_s: float = 0.5
    valid: bool = True


def frame(t: float, stamp: float | None = None) -> Frame:
    return Frame(t, t if stamp is None else stamp)


def test_a_decision_starts_from_the_first_frame_since_the_robot_stopped():
    control = EpisodeController(PolicyConfig(overlap=False, max_frame_age_s=1.0), now=10.0)
    control.frame(frame(9.9))
    assert control.next_decision(10.0) is None  # arrived before the episode began
    control.frame(frame(10.1))
    assert control.next_decision(12.0) is None  # too old by now
    assert control.next_decision(10.2) == frame(10.1) and control.next_decision(10.2) is None  # one at a time
    [handed] = control.decided(10.7, frame(10.1), Answer(FORWARD))
    assert (handed.verb, handed.distance_m, handed.waited_s) == ("forward", 1.0, pytest.approx(0.7))
    control.frame(frame(10.8))
    assert control.next_decision(10.8) is None  # stop-and-go: the robot moves
    assert control.bridge(10.8, *bridge_event("moving: forward large: 1.000 m, 0.000 rad in 2.50 s")) == []
    assert control.bridge(13.3, *bridge_event("idle: motion done")) == [] and control.next_decision(13.3) is None
    control.frame(frame(13.35))
    assert control.next_decision(13.35) == frame(13.35)


def test_stale_decisions_are_dropped_and_three_in_a_row_end_the_episode_with_a_stop():
    control = EpisodeController(PolicyConfig(max_frame_age_s=1.0), now=0.0)
    for k in range(3):
        t = 3.0 * k
        control.frame(frame(t + 0.1))
        assert control.next_decision(t + 0.1) is not None
        effects = control.decided(t + 1.2, frame(t + 0.1), Answer(FORWARD, 1.1))
        assert isinstance(effects[0], Drop) and effects[0].reason == "stale"
    assert isinstance(effects[-1], End) and effects[-1].outcome == "decisions too slow" and effects[-1].stop
    assert control.summary()["dropped"] == 3 and control.summary()["actions"] == 0
    # a fresh decision in between resets the count
    control = EpisodeController(PolicyConfig(max_frame_age_s=1.0, overlap=False), now=0.0)
    for k, late in enumerate((True, True, False, True, True)):
        control.bridge(3.0 * k, idle=True)
        control.frame(frame(3.0 * k + 0.1))
        assert control.next_decision(3.0 * k + 0.1) is not None
        control.decided(3.0 * k + (1.2 if late else 0.6), frame(3.0 * k + 0.1), Answer(FORWARD))
    assert not control.outcome and control.stale_in_a_row == 2


def test_a_stop_is_handed_over_at_any_age_and_an_invalid_answer_ends_the_episode():
    control = EpisodeController(PolicyConfig(max_frame_age_s=1.0), now=0.0)
    control.frame(frame(0.1))
    control.next_decision(0.1)
    handed, end = control.decided(5.0, frame(0.1), Answer(NavCommand("stop", "", "here")))
    assert handed.verb == "stop" and end == End("stopped")
    control = EpisodeController(PolicyConfig(), now=0.0)
    control.frame(frame(0.1))
    control.next_decision(0.1)
    handed, end = control.decided(0.5, frame(0.1), Answer(NavCommand("stop"), valid=False))
    assert handed.label == "invalid" and end == End("invalid answer")
    assert control.next_decision(0.6) is None and control.end("replaced") is None  # ended already


def test_overlapped_without_odometry_a_decision_from_a_moving_frame_is_dropped():
    control = EpisodeController(PolicyConfig(overlap=True, max_frame_age_s=2.0), now=0.0)
    control.frame(frame(0.1))
    control.next_decision(0.1)
    control.decided(0.6, frame(0.1), Answer(FORWARD))
    control.bridge(0.6, *bridge_event("moving: forward large: 1.000 m, 0.000 rad in 2.50 s"))
    start = control.schedule.start_at
    assert 0.6 < start < 3.1
    control.frame(frame(start + 0.01))
    assert control.next_decision(start + 0.01) is not None  # while moving
    assert control.decided(start + 0.5, frame(start + 0.01), Answer(FORWARD)) == []  # waits for the bridge
    [drop] = control.bridge(3.1, *bridge_event("idle: motion done"))
    assert drop.reason == "no odometry" and control.summary()["dropped"] == 1
    control.frame(frame(3.15))
    assert control.next_decision(3.15) is not None  # again, from a frame since it stopped


def test_the_live_driver_replaces_clears_fails_and_refuses_bad_frames():
    clock, out = ManualClock(), Recorder()
    gate = threading.Event()

    class Navigator:
        def decide(self, image, instruction):
            assert gate.wait(WAIT_S)
            if image == "boom":
                raise RuntimeError("verifier gone: nothing on /edge_llm/draft")
            return Answer(FORWARD)

    live = LiveEpisodes(PolicyConfig(overlap=False), out, clock)
    try:
        live.instruction("go to the red chair")  # before the navigator is loaded and active: it waits
        live.set_navigator(Navigator())
        clock.t = 1.0
        live.frame("image", 1.0)
        assert live.started == 0
        live.set_active(True)  # starts the episode, from the frame since it began
        with live.lock:
            assert live.lock.wait_for(lambda: live.busy, WAIT_S)
        clock.t = 1.1
        live.instruction("go to the blue sofa")  # replaces the episode with a decision in flight
        assert out.summaries[-1]["outcome"] == "replaced" and out.summaries[-1]["episode"] == 1
        assert set(out.summaries[-1]) == SUMMARY_KEYS
        gate.set()
        with live.lock:
            assert live.lock.wait_for(lambda: live.done == 1, WAIT_S)
        assert out.actions == [] and live.started == 1  # the old episode's decision is dropped
        live.bad_frame("/camera/image_raw: step: 5 bytes per row is less than 12")
        assert out.stops[-1] == ("", "/camera/image_raw: step: 5 bytes per row is less than 12")
        clock.t = 1.2
        live.odometry(1.2, Pose(0.0, 0.0, 0.0))
        assert live.started == 1  # no decision from the frame before the bad one
        live.frame("boom", 1.2)
        with live.lock:
            assert live.lock.wait_for(lambda: live.done == 2, WAIT_S)
        assert out.stops[-1] == ("nav-2", "navigator failed: verifier gone: nothing on /edge_llm/draft")
        assert out.summaries[-1]["outcome"] == "navigator failed"
        clock.t = 1.3
        live.instruction("go to the red chair")
        live.frame("image", 1.3)
        with live.lock:
            assert live.lock.wait_for(lambda: live.done == 3, WAIT_S)
        [(request_id, handed, age)] = out.actions
        assert request_id == "nav-3" and handed.verb == "forward" and age == pytest.approx(0.0)
        live.instruction("")
        assert out.stops[-1] == ("", "instruction cleared") and out.summaries[-1]["outcome"] == "replaced"
    finally:
        gate.set()
        live.close()
