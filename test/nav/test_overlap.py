"""Overlapped decisions without ROS (nav/overlap.py, nav/simulated.py): an action decided
from an older pose is carried over to the pose the robot stands at (a turn keeps its goal heading,
a move its goal point); the next decision starts one decision time before the motion ends; the
odometry history answers where the robot was when a frame was taken; and in simulated time,
over the ten evaluation worlds, overlap with carrying reaches every target the camera expert
reaches stop-and-go, touching nothing, while the robot waits less for decisions, and overlap
without carrying touches the chair (the finding that made overlap wait for this)."""

import math

import pytest

from edge_llm_ros.nav import Magnitudes, NavCommand
from edge_llm_ros.nav.expert import camera_expert
from edge_llm_ros.nav.motion import Command, Executor, MotionLimits, motion_seconds
from edge_llm_ros.nav.overlap import MIN_MOVE_M, Lead, Overlap, PoseHistory, decision_start, reanchor
from edge_llm_ros.nav.simulated import EpisodeConfig, Timed, run_episode
from edge_llm_ros.nav.world import Pose
from edge_llm_ros.nav.worldgen import GenerateConfig, generate

MAGNITUDES = Magnitudes()
EVALUATION = range(100, 110)


def carried(action: str, at_frame: Pose, now: Pose):
    verb, _, magnitude = action.partition(" ")
    command = NavCommand(verb, magnitude)
    return reanchor(command, *command.motion(MAGNITUDES), at_frame, now)


def test_a_turn_keeps_its_goal_heading():
    start = Pose(1.0, 2.0, 0.0)
    moved = carried("turn_left medium", start, Pose(1.0, 2.0, math.radians(10)))  # turned 10 degrees since
    assert moved.verb == "turn_left" and moved.angle_rad == pytest.approx(math.radians(20)) and moved.distance_m == 0
    past = carried("turn_left small", start, Pose(1.0, 2.0, math.radians(25)))  # turned past its goal: back
    assert past.verb == "turn_right" and past.angle_rad == pytest.approx(math.radians(-10))
    assert carried("turn_left medium", start, Pose(1.0, 2.0, math.radians(29))) is None  # done by the motion
    wrapped = carried("turn_right large", Pose(0, 0, math.radians(-170)), Pose(0, 0, math.radians(170)))
    assert wrapped.angle_rad == pytest.approx(math.radians(-40))  # turned right 20 of its 60, across +-180


def test_a_move_keeps_its_goal_point_along_the_frames_heading():
    start = Pose(0.0, 0.0, math.radians(90))
    moved = carried("forward large", start, Pose(0.0, 0.4, math.radians(92)))
    assert moved.verb == "forward" and moved.distance_m == pytest.approx(0.6, abs=0.01) and moved.angle_rad == 0
    assert carried("forward small", start, Pose(0.0, 0.3, math.radians(90))) is None  # passed its goal: never back
    assert carried("forward small", start, Pose(0.0, 0.25 - MIN_MOVE_M / 2, math.radians(90))) is None  # done
    assert carried("forward large", start, Pose(0.0, 0.2, math.radians(110))) is None  # decided facing elsewhere
    back = carried("backward small", start, Pose(0.0, -0.1, math.radians(90)))
    assert back.verb == "backward" and back.distance_m == pytest.approx(-0.15)
    assert carried("stop", start, Pose(3.0, 3.0, 1.0)).verb == "stop"


def test_the_next_decision_starts_one_decision_time_before_the_motion_ends():
    lead = Lead(first_s=1.0, margin_s=0.1, window=2)
    assert lead.lead_s == pytest.approx(1.1)
    for seconds in (0.5, 0.7, 0.9):
        lead.observe(seconds)
    assert lead.lead_s == pytest.approx(0.9)  # the mean of the last two, plus the margin
    assert decision_start(10.0, 13.0, 0.9) == pytest.approx(12.1)
    assert decision_start(10.0, 11.0, 0.9) == pytest.approx(10.5)  # short motion: half of it first
    schedule = Overlap(Lead(first_s=1.0, margin_s=0.0))
    schedule.handed(5.0, 8.0)
    assert schedule.start_at == pytest.approx(7.0)
    schedule.dropped(9.0)
    assert schedule.start_at == 9.0


def test_the_bridge_status_says_how_long_its_motion_takes():
    ex = Executor(MotionLimits(), 0.05)
    ex.command(Command(1.0, 0.0, 0.1, label="forward large"), 3.0)
    assert motion_seconds(ex.status) == pytest.approx(ex.motion.end - 3.0, abs=0.005)
    ex.command(Command(5.0, 0.0, 0.1, label="forward large"), 3.0)  # clamped: the note follows the time
    assert "clamped" in ex.status and motion_seconds(ex.status) == pytest.approx(ex.motion.end - 3.0, abs=0.005)
    assert motion_seconds("idle: motion done") is None and motion_seconds("moving: nonsense") is None


def test_the_pose_history_interpolates_and_knows_what_it_does_not_cover():
    history = PoseHistory(horizon_s=10.0)
    history.add(1.0, Pose(0.0, 0.0, math.radians(170)))
    history.add(2.0, Pose(1.0, 2.0, math.radians(-170)))
    mid = history.at(1.5)
    assert (mid.x, mid.y) == pytest.approx((0.5, 1.0)) and abs(mid.yaw) == pytest.approx(math.pi)  # the short way
    assert history.at(0.9) == history.at(1.0) and history.at(5.0) is None and history.at(0.0) is None
    assert history.latest == Pose(1.0, 2.0, math.radians(-170))
    for k in range(3, 40):
        history.add(float(k), Pose(k, 0.0))
    assert history.at(5.0) is None and history.at(30.0) == Pose(30.0, 0.0)  # older than the horizon: gone
    history.add(1.0, Pose(9.0, 9.0))  # the clock went back (a restarted simulator): start over
    assert history.at(1.0) == Pose(9.0, 9.0) and history.at(30.0) is None


def expert_episodes(decide_s: float, **config):
    """The camera expert as the navigator, deciding in ``decide_s``, over the evaluation worlds."""
    episodes = []
    for seed in EVALUATION:
        world = generate(seed, GenerateConfig(clear_path=True))
        decide = lambda pose, world=world: Timed(camera_expert(world, pose), decide_s)  # noqa: E731
        episodes.append(run_episode(world, decide, EpisodeConfig(**config)))
    return episodes


def waiting_per_episode(episodes) -> float:
    return sum(e.waiting.total_s for e in episodes) / len(episodes)


@pytest.mark.parametrize("decide_s", [0.3, 1.1])
def test_overlap_carried_over_reaches_every_target_and_waits_less(decide_s):
    stop_and_go = expert_episodes(decide_s, overlap=False)
    overlapped = expert_episodes(decide_s, overlap=True)
    for e in stop_and_go + overlapped:
        assert e.outcome == "reached" and not e.touched, (e.outcome, e.touched, e.handed)
    for e in stop_and_go:  # it waits a whole decision every round
        assert e.waiting.waited_rounds == e.waiting.rounds == e.actions
        assert e.waiting.total_s >= e.actions * decide_s - 1e-6
    assert waiting_per_episode(overlapped) < waiting_per_episode(stop_and_go)
    assert all(e.waiting.first_motion_s == pytest.approx(decide_s, abs=0.06) for e in stop_and_go + overlapped)
    if decide_s <= 0.3:  # decisions shorter than the motions: the robot waits only for the first one
        assert waiting_per_episode(overlapped) * 3 <= waiting_per_episode(stop_and_go)
        assert all(e.waiting.waited_rounds <= 2 for e in overlapped)


def test_overlap_without_carrying_over_touches_the_chair():
    """Relative actions decided from mid-motion frames, applied as decided: the robot overshoots."""
    episodes = expert_episodes(1.1, overlap=True, carry=False)
    assert any(e.outcome == "touched" and e.touched == "red chair" for e in episodes), [e.outcome for e in episodes]


def test_an_episode_reports_its_path_trajectory_and_rounds():
    world = generate(100, GenerateConfig(clear_path=True))
    e = run_episode(world, lambda pose: Timed(camera_expert(world, pose), 0.5), EpisodeConfig(overlap=True))
    assert e.success and e.final == Pose(*e.final.__dict__.values())
    xs = [(x, y) for _, x, y in e.trajectory]
    along = sum(math.dist(a, b) for a, b in zip(xs, xs[1:]))
    assert e.path_m == pytest.approx(along, abs=1e-6) and e.path_m > 0.5
    assert e.handed[-1][1] == "stop" and len(e.handed) == e.actions and e.time_s >= e.handed[-1][0]
    assert e.waiting.total_s == pytest.approx(sum(w for _, _, w in e.handed), abs=1e-6)
    invalid = run_episode(world, lambda pose: Timed(NavCommand("stop"), 0.5, valid=False), EpisodeConfig())
    assert invalid.outcome == "invalid answer" and invalid.path_m == 0


def test_decisions_slower_than_the_bridge_accepts_end_the_episode_without_moving():
    world = generate(100, GenerateConfig(clear_path=True))
    config = EpisodeConfig(overlap=True, limits=MotionLimits(max_frame_age_s=2.0))
    e = run_episode(world, lambda pose: Timed(camera_expert(world, pose), 2.5), config)
    assert e.outcome == "decisions too slow" and e.actions == 0 and e.path_m == 0 and e.dropped == 3
