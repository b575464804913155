"""The teachers (nav/expert.py): with the discrete actions alone the map-based expert reaches
the target in seeded worlds, and the camera expert in clear-path worlds, without touching anything;
they stop only when there and facing it, and say why in the grammar's alphabet."""

import math
from collections import Counter
from pathlib import Path

import pytest

from edge_llm_ros.nav import Magnitudes, NavCommand, parse
from edge_llm_ros.nav.expert import WHERE, ExpertConfig, camera_expert, expert, in_view, rollout, where_seen
from edge_llm_ros.nav.world import Pose, World, body_gap, reached
from edge_llm_ros.nav.worldgen import GenerateConfig, generate

DEFAULT = Path(__file__).resolve().parents[2] / "config" / "worlds" / "default.yaml"
SEEDS = range(1000, 1050)  # 50 worlds


def check_episode(episode, world) -> None:
    """Every answer is canonical grammar text, and the episode ends at the target, faced."""
    for _, command in episode.steps:
        assert parse(command.text()) == command
    assert episode.steps[-1][1].verb == "stop" or not episode.success
    if episode.success:
        t = world.target_object
        assert reached(episode.final, t) and abs(episode.final.bearing_to(*t.position)) <= math.radians(20)


def test_the_expert_reaches_the_red_chair_in_95_percent_of_seeded_worlds_and_touches_nothing():
    outcomes, steps = Counter(), []
    for seed in SEEDS:
        world = generate(seed)
        episode = rollout(world, max_steps=150)
        check_episode(episode, world)
        outcomes[episode.outcome] += 1
        steps.append(len(episode.steps))
    print(f"expert over {len(SEEDS)} seeds: {dict(outcomes)}, {sum(steps) / len(steps):.1f} actions on average")
    assert outcomes["touched"] == 0, outcomes
    assert outcomes["reached"] >= 0.95 * len(SEEDS), outcomes


def test_the_expert_reaches_other_targets_and_the_default_world():
    for seed in range(20):
        world = generate(seed, GenerateConfig(target="silver bottle"))
        episode = rollout(world)
        check_episode(episode, world)
        assert episode.success, (seed, episode.outcome, episode.touched)
    world = World.from_yaml(DEFAULT)
    episode = rollout(world)
    check_episode(episode, world)
    assert episode.success and episode.steps[-1][1].reason.startswith("red chair ahead")
    seen = rollout(world, camera_expert, max_steps=40)  # in sight through the door once it turns: no map needed
    check_episode(seen, world)
    assert seen.success, (seen.outcome, seen.touched)


def test_an_episode_is_the_same_every_time():
    world = generate(1003)
    first, again = rollout(world), rollout(world)
    assert [(p, c) for p, c in first.steps] == [(p, c) for p, c in again.steps]


def test_it_stops_only_when_reached_and_facing_the_target():
    world = World.from_yaml(DEFAULT)
    t = world.target_object  # (8.6, 1.6), radius 0.3
    facing = Pose(t.position[0] - 1.0, t.position[1], 0.0)  # body gap 0.4
    assert reached(facing, t) and expert(world, facing) == NavCommand("stop", "", "red chair ahead, under 1 m, reached")
    sideways = Pose(facing.x, facing.y, math.radians(90))
    command = expert(world, sideways)
    assert command.verb == "turn_right" and command.magnitude == "large" and "turning to face it" in command.reason
    short = Pose(t.position[0] - 1.4, t.position[1], 0.0)  # body gap 0.8
    assert not reached(short, t) and expert(world, short).verb == "forward"


def test_a_stop_margin_keeps_going_past_the_reach_edge_and_stops_inside_it():
    """ExpertConfig.stop_m (the adapter's teacher: 0.4 m): at a body gap of 0.45 m, facing the
    chair, the plain expert stops and the margined one steps forward; over clear-path worlds the
    margined camera expert still reaches every target, facing it, touching nothing, and stops
    within its margin."""
    teacher = ExpertConfig(stop_m=0.4)
    world = World.from_yaml(DEFAULT)
    t = world.target_object
    edge = Pose(t.position[0] - 1.05, t.position[1], 0.0)  # body gap 0.45: reached, not within 0.4
    assert expert(world, edge).verb == "stop" and camera_expert(world, edge).verb == "stop"
    assert expert(world, edge, config=teacher).action == camera_expert(world, edge, config=teacher).action == \
        "forward small"
    for seed in [*range(100, 110), *range(10_000, 10_010)]:
        world = generate(seed, GenerateConfig(clear_path=True))
        episode = rollout(world, lambda w, p: camera_expert(w, p, config=teacher), max_steps=40)
        check_episode(episode, world)
        assert episode.success and body_gap(episode.final, world.target_object) <= 0.4, (seed, episode.outcome)
    for bad in (0.25, 0.3, 0.6):  # not between goal_m (0.3) and the reach (0.5)
        with pytest.raises(ValueError, match="stop_m"):
            ExpertConfig(stop_m=bad)


def test_reasons_say_where_the_target_is_or_that_it_is_not_in_view():
    world = World.from_yaml(DEFAULT)
    assert expert(world, world.start).reason.startswith("red chair not in view, turning")
    left = Pose(6.0, 3.0, math.radians(-68))  # the chair at (8.6, 1.6) is 28 deg right of +x: 40 deg left of this
    assert 30 < math.degrees(left.bearing_to(*world.target_object.position)) < 45
    assert expert(world, left).reason.startswith(f"red chair left, {round(body_gap(left, world.target_object))} m")


def test_other_magnitudes_are_followed():
    magnitudes = Magnitudes(forward_m={"small": 0.2, "medium": 0.4, "large": 0.8},
                            turn_deg={"small": 10.0, "medium": 20.0, "large": 45.0})
    config = ExpertConfig(magnitudes=magnitudes)
    world = generate(1001)
    episode = rollout(world, policy=lambda w, p: expert(w, p, config=config), magnitudes=magnitudes)
    check_episode(episode, world)
    assert episode.success


@pytest.mark.parametrize("seed", [1000, 1010])
def test_no_action_of_an_episode_ends_in_a_contact(seed):
    from edge_llm_ros.nav.world import Robot

    world = generate(seed)
    episode = rollout(world)
    robot = Robot(world, world.start)
    for pose, command in episode.steps:
        assert robot.pose == pose
        assert robot.apply(command) == ""


@pytest.mark.parametrize("target", ["red chair", "silver bottle", "blue chair", "yellow cone"])
def test_the_camera_expert_reaches_every_clear_path_world_touching_nothing(target):
    """The teacher the VLM learns from: over 25 worlds per target (the evaluation seeds among them)
    it reaches the target every time, faced, with nothing touched."""
    outcomes = Counter()
    for seed in [*range(100, 110), *range(10_000, 10_015)]:
        world = generate(seed, GenerateConfig(target=target, clear_path=True))
        episode = rollout(world, camera_expert, max_steps=40)
        check_episode(episode, world)
        outcomes[episode.outcome] += 1
    assert outcomes == Counter(reached=25), outcomes


def test_the_camera_expert_acts_on_what_the_frame_shows():
    """Out of view: search left; in view off the heading: turn toward it; ahead: forward; the reason
    says which (never the map's knowledge of where an unseen target is)."""
    config = ExpertConfig()
    world = generate(100, GenerateConfig(clear_path=True))
    t, start = world.target_object, world.start
    assert not in_view(world, start, t, config.hfov_deg)
    command = camera_expert(world, start)
    assert command.action == "turn_left medium" and command.reason.endswith("not in view, searching left")
    facing = start.bearing_to(*t.position) + start.yaw
    ahead = Pose(start.x, start.y, facing)
    command = camera_expert(world, ahead)
    assert command.verb == "forward" and "red chair ahead," in command.reason
    right = Pose(start.x, start.y, facing + math.radians(35))  # the chair 35 degrees to the right
    command = camera_expert(world, right)
    assert command.action == "turn_right medium" and "red chair right" in command.reason
    assert where_seen(world, right, t, config) == "right" and WHERE.index("right") > 0
