"""The simulator's world (nav/world.py, worldgen.py): YAML in with every bad field named, the
kinematic Go2 that integrates commands and stops before any contact, and seeded generation."""

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from edge_llm_ros.nav import NavCommand
from edge_llm_ros.nav.world import ROBOT_RADIUS, Pose, Robot, World, WorldError, body_gap, reached
from edge_llm_ros.nav.worldgen import LOOKALIKES, GenerateConfig, generate, reachable, straight_path

DEFAULT = Path(__file__).resolve().parents[2] / "config" / "worlds" / "default.yaml"


def default_dict() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def open_room(**start) -> World:
    """A 6 x 4 m room, a chair at (4, 2), the robot at (1, 2) facing it unless told."""
    return World.from_dict({"bounds": [0, 0, 6, 4], "target": "red chair",
                            "objects": [{"name": "red chair", "shape": "chair", "colour": "red", "position": [4, 2]}],
                            "start": {"x": 1.0, "y": 2.0, **start}})


def test_the_default_world_loads_and_survives_a_yaml_round_trip():
    world = World.from_yaml(DEFAULT)
    assert world.target_object.colour == (200, 30, 30) and world.target_object.radius == 0.3
    assert world.start == Pose(2.2, 1.6, math.pi / 2)
    assert len(world.segments) == 4 + 2 + 4 and world.segment_names[4] == "wall 0"
    assert World.from_dict(yaml.safe_load(yaml.safe_dump(world.to_dict()))) == world
    assert "target red chair at (8.60, 1.60)" in world.summary()


def _set(path: str, value):
    def change(d: dict) -> None:
        *parents, last = path.split(".")
        for key in parents:
            d = d[int(key)] if isinstance(d, list) else d[key]
        if value is KeyError:
            del d[last]
        else:
            d[last] = value
    return change


@pytest.mark.parametrize("change, named", [
    (_set("bounds", KeyError), "bounds: missing"),
    (_set("wals", []), "wals: unknown field"),
    (_set("bounds", [0, 0, 10]), "bounds: expected [xmin, ymin, xmax, ymax]"),
    (_set("bounds", [0, 0, 0.5, 7]), "bounds: expected [xmin, ymin, xmax, ymax] at least 1 m apart"),
    (_set("walls", [[5.0, 0.0, "x", 3.0]]), "walls[0][2]: expected a number, got 'x'"),
    (_set("boxes", [[8, 4, 7, 5]]), "boxes[0]: expected [xmin, ymin, xmax, ymax] with min < max"),
    (_set("objects.1.position", [1.0]), "objects[1].position: expected [x, y] in metres, got [1.0]"),
    (_set("objects.1.colour", "purple"), "objects[1].colour: unknown colour 'purple'"),
    (_set("objects.1.colour", [300, 0, 0]), "objects[1].colour: expected [r, g, b] integers in 0..255"),
    (_set("objects.1.shape", "sofa"), "objects[1].shape: expected one of"),
    (_set("objects.1.radius", True), "objects[1].radius: expected a number, got True"),
    (_set("objects.1.size", 2), "objects[1].size: unknown field"),
    (_set("objects.0.name", KeyError), "objects[0].name: missing"),
    (_set("objects.2.position", [5.0, 4.0]), "objects[2] (orange chair).position: [5.0, 4.0] puts it into a wall"),
    (_set("target", "green chair"), "target: 'green chair' must name exactly one object"),
    (_set("start.x", 0.1), "start: the robot (radius 0.3 m) at (0.1, 1.6) touches outer wall"),
    (_set("start.yaw", 1.0), "start: give yaw_deg (degrees) or yaw (radians), not both"),
    (_set("start", [1, 2]), "start: expected a mapping"),
])
def test_every_bad_field_is_named(change, named):
    data = default_dict()
    change(data)
    with pytest.raises(WorldError) as error:
        World.from_dict(data, source="test.yaml")
    assert str(error.value).startswith("test.yaml: ") and named in str(error.value)


def test_a_missing_or_unreadable_file_is_named(tmp_path):
    with pytest.raises(WorldError, match=r"world file .*nowhere.yaml: No such file"):
        World.from_yaml(tmp_path / "nowhere.yaml")
    (tmp_path / "broken.yaml").write_text("bounds: [0, 0\n")
    with pytest.raises(WorldError, match=r"broken.yaml: not YAML"):
        World.from_yaml(tmp_path / "broken.yaml")


def test_step_integrates_a_unicycle():
    robot = Robot(open_room(), Pose(1.0, 2.0, 0.0))
    for _ in range(50):  # 1 s at 0.5 m/s straight
        assert robot.step(0.5, 0.0, 0.02) == ""
    assert (robot.pose.x, robot.pose.y) == pytest.approx((1.5, 2.0))
    robot = Robot(open_room(), Pose(1.0, 1.0, 0.0))
    for _ in range(100):  # a quarter circle of radius 1 m: 0.5 m/s, 0.5 rad/s for pi s
        robot.step(0.5, 0.5, math.pi / 100)
    assert (robot.pose.x, robot.pose.y, robot.pose.yaw) == pytest.approx((2.0, 2.0, math.pi / 2), abs=1e-3)


def test_a_motion_into_a_wall_or_an_object_stops_before_the_contact_and_names_it():
    world = open_room()
    robot = Robot(world, Pose(1.0, 2.0, math.pi))  # facing the west wall, 1 m away
    hits = [robot.step(1.0, 0.0, 0.05) for _ in range(40)]
    assert "outer wall" in hits and robot.collided_with == "outer wall" and robot.contacts >= 1
    assert ROBOT_RADIUS <= robot.pose.x < ROBOT_RADIUS + 0.021
    robot = Robot(world, Pose(1.0, 2.0, 0.0))
    assert robot.apply(NavCommand("forward", "large")) == "" and robot.pose.x == pytest.approx(2.0)
    assert robot.apply(NavCommand("forward", "large")) == "" and robot.pose.x == pytest.approx(3.0)
    assert robot.apply(NavCommand("forward", "large")) == "red chair"  # touching from x = 3.4 on
    assert 4.0 - 0.6 - 0.021 < robot.pose.x <= 4.0 - 0.6 and not world.touching(robot.pose.x, robot.pose.y)
    assert robot.apply(NavCommand("turn_left", "medium")) == "" and robot.pose.yaw == pytest.approx(math.radians(30))


def test_reached_is_the_body_gap():
    chair = open_room().target_object
    assert body_gap(Pose(3.0, 2.0), chair) == pytest.approx(1.0 - 0.3 - ROBOT_RADIUS)
    assert reached(Pose(3.0, 2.0), chair) and reached(Pose(2.9, 2.0), chair)
    assert not reached(Pose(2.85, 2.0), chair)


def test_clearance_and_line_of_sight():
    world = World.from_yaml(DEFAULT)
    assert world.clearance(np.array([[1.2, 1.5]]))[0] == pytest.approx(1.2)  # the west wall is nearest
    assert world.clearance(np.array([[7.9, 3.7]]))[0] == 0.0  # inside the cupboard
    assert world.line_of_sight((2.0, 3.7), (8.0, 3.7)) is False  # through the cupboard
    assert world.line_of_sight((2.0, 3.7), (6.0, 3.7)) is False  # through the wall at x = 5
    assert world.line_of_sight((2.0, 1.5), (8.6, 1.6)) is True  # through the door, to the red chair


def test_the_same_seed_draws_the_same_world_and_others_differ():
    assert generate(3) == generate(3)
    assert len({generate(s).to_dict()["bounds"][2] for s in range(10)}) > 3
    assert World.from_dict(yaml.safe_load(yaml.safe_dump(generate(3).to_dict()))) == generate(3)


@pytest.mark.parametrize("target", ["red chair", "silver bottle"])
def test_generated_worlds_start_out_of_view_far_and_reachable_among_lookalikes(target):
    config = GenerateConfig(target=target)
    for seed in range(40):
        world = generate(seed, config)
        t, start = world.target_object, world.start
        assert t.name == target and body_gap(start, t) >= config.start_gap_m
        in_view = abs(start.bearing_to(*t.position)) < math.radians(config.hfov_deg) / 2 \
            and world.line_of_sight((start.x, start.y), t.position)
        assert not in_view and reachable(world)
        names = [o.name for o in world.objects]
        assert len(set(names)) == len(names) and any(n in LOOKALIKES[target] for n in names)
        assert world.name == f"seed {seed}"


def test_clear_path_worlds_have_a_straight_way_to_the_target_from_the_start():
    config = GenerateConfig(clear_path=True)
    for seed in range(100, 110):
        world = generate(seed, config)
        assert straight_path(world, world.start, world.target_object), seed
    assert sum(not straight_path(w, w.start, w.target_object) for w in map(generate, range(20))) > 0


def test_decoy_worlds_show_a_decoy_before_the_target_to_a_robot_searching_left():
    """Turning left from the start in 30-degree steps, as the search does, the robot's view holds a
    decoy (a kind it might be told to find elsewhere) within three turns and before the target, the
    decoy near enough to be seen, nothing between. Worlds without decoys are drawn as before."""
    decoys = ("blue chair", "yellow cone", "silver bottle")
    config = GenerateConfig(clear_path=True, decoys=decoys)
    half = math.radians(config.hfov_deg) / 2

    def in_view(world, pose, obj) -> bool:
        return abs(pose.bearing_to(*obj.position)) < half and world.line_of_sight((pose.x, pose.y), obj.position)

    for seed in range(20):
        world = generate(seed, config)
        names = [o.name for o in world.objects]
        assert names[0] == "red chair" and set(decoys) <= set(names) and len(set(names)) == len(names)
        assert straight_path(world, world.start, world.target_object) and reachable(world)
        views = [Pose(world.start.x, world.start.y, world.start.yaw + math.radians(30) * k) for k in range(13)]
        first_target = next(k for k, pose in enumerate(views) if in_view(world, pose, world.target_object))
        first_decoy = min(k for k, pose in enumerate(views) for o in world.objects
                          if o.name in decoys and in_view(world, pose, o) and body_gap(pose, o) <= 4.0)
        assert first_decoy <= 3 and first_decoy < first_target and first_target > 0, seed
    assert generate(100, GenerateConfig(clear_path=True)) == generate(100, GenerateConfig(clear_path=True, decoys=()))


def test_generate_refuses_an_unknown_target():
    with pytest.raises(ValueError, match="target: expected one of"):
        GenerateConfig(target="purple sofa")
    with pytest.raises(ValueError, match="decoys: expected at most"):
        GenerateConfig(decoys=("red chair",))  # the target itself
    with pytest.raises(ValueError, match="decoys: expected at most"):
        GenerateConfig(decoys=("blue chair", "blue chair"))
