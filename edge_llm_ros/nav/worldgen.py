"""Seeded worlds for training and evaluation (issue 15), and the grid they are checked on. Knows
nothing about ROS.

``generate(seed)`` draws a world (nav/world.py): a room of 6-10 x 5-8 m, split by a wall with a
door or half-split by a partial wall or open; up to two boxes away from walls and doors; the target
(default "red chair") and 2-5 distractors, look-alikes first (a dark red or orange chair and a red box
for the red chair; a grey can, a white or green bottle for the silver bottle); floor, wall and box
colours from small palettes. The robot starts clear of everything, at least `start_gap_m` from the
target, with the target out of view (outside the camera's field of view or behind a wall), and only
where a path with a margin reaches it (`reachable`); with ``clear_path``, only where a straight one
does (`straight_path`: the target is found by looking around, then reached head-on). The same seed
gives the same world.

``Grid`` is the map the expert plans on: cell centres over the bounds and each one's clearance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edge_llm_ros.nav.actions import Magnitudes
from edge_llm_ros.nav.world import (
    DEFAULT_RADIUS,
    PALETTE,
    REACH_M,
    ROBOT_RADIUS,
    SHAPES,
    Colours,
    Pose,
    World,
    WorldError,
    WorldObject,
    approach_point,
    body_gap,
    box_edges,
    point_segment_distances,
)


@dataclass(frozen=True)
class Grid:
    """Cell centres over the bounds at ``resolution`` and each one's clearance (metres)."""

    origin: tuple[float, float]
    resolution: float
    clearance: np.ndarray  # [ny, nx]

    @classmethod
    def of(cls, world: World, resolution: float = 0.1) -> Grid:
        xmin, ymin, xmax, ymax = world.bounds
        xs = np.arange(xmin + resolution / 2, xmax, resolution)
        ys = np.arange(ymin + resolution / 2, ymax, resolution)
        gx, gy = np.meshgrid(xs, ys)  # [ny, nx]
        points = np.stack([gx.ravel(), gy.ravel()], axis=1)
        return cls((xmin, ymin), resolution, world.clearance(points).reshape(gx.shape))

    def cell(self, x: float, y: float) -> tuple[int, int]:
        """(row, column) of the cell holding (x, y), clipped to the grid."""
        ny, nx = self.clearance.shape
        row = int((y - self.origin[1]) // self.resolution)
        col = int((x - self.origin[0]) // self.resolution)
        return min(max(row, 0), ny - 1), min(max(col, 0), nx - 1)

    def centres(self) -> tuple[np.ndarray, np.ndarray]:
        """([ny, nx] x, [ny, nx] y) of every cell centre."""
        ny, nx = self.clearance.shape
        xs = self.origin[0] + (np.arange(nx) + 0.5) * self.resolution
        ys = self.origin[1] + (np.arange(ny) + 0.5) * self.resolution
        return np.meshgrid(xs, ys)


def flood(free: np.ndarray, seed: tuple[int, int]) -> np.ndarray:
    """[ny, nx] the cells of ``free`` 4-connected to ``seed``."""
    reached_ = np.zeros_like(free)
    if not free[seed]:
        return reached_
    reached_[seed] = True
    while True:
        grown = reached_.copy()
        grown[1:] |= reached_[:-1]
        grown[:-1] |= reached_[1:]
        grown[:, 1:] |= reached_[:, :-1]
        grown[:, :-1] |= reached_[:, 1:]
        grown &= free
        if (grown == reached_).all():
            return reached_
        reached_ = grown


def reachable(world: World, margin: float = 0.1, radius: float = ROBOT_RADIUS, resolution: float = 0.1) -> bool:
    """Whether a path keeping ``margin`` beyond the robot's radius leads from the start to within
    REACH_M - margin of the target."""
    grid = Grid.of(world, resolution)
    free = grid.clearance >= radius + margin
    xs, ys = grid.centres()
    t = world.target_object
    goal = np.hypot(xs - t.position[0], ys - t.position[1]) - t.radius - radius <= REACH_M - margin
    return bool((flood(free, grid.cell(world.start.x, world.start.y)) & goal).any())


# -- seeded generation -------------------------------------------------------------------------------

KINDS = {  # name: (shape, colour)
    "red chair": ("chair", "red"), "dark red chair": ("chair", "dark red"), "orange chair": ("chair", "orange"),
    "blue chair": ("chair", "blue"), "red box": ("box", "red"), "silver bottle": ("bottle", "silver"),
    "grey can": ("can", "grey"), "white bottle": ("bottle", "white"), "green bottle": ("bottle", "green"),
    "yellow cone": ("cone", "yellow"), "orange cone": ("cone", "orange"), "brown box": ("box", "brown"),
}
LOOKALIKES = {  # a target: the distractors that differ from it in one thing (hue, shade or shape)
    "red chair": ("dark red chair", "orange chair", "red box"),
    "silver bottle": ("grey can", "white bottle", "green bottle"),
    "blue chair": ("red chair", "brown box"), "yellow cone": ("orange cone", "red box"),
}
WALL_COLOURS = ((214, 200, 170), (175, 195, 210), (195, 210, 175), (222, 196, 196), (200, 200, 210))
FLOOR_COLOURS = ((95, 80, 65), (70, 75, 85), (110, 100, 80), (60, 90, 70))
BOX_COLOURS = ((140, 110, 80), (90, 100, 120), (150, 140, 120))


@dataclass(frozen=True)
class GenerateConfig:
    target: str = "red chair"
    width_m: tuple[float, float] = (6.0, 10.0)
    depth_m: tuple[float, float] = (5.0, 8.0)
    two_rooms: float = 0.6  # probability of an interior wall with a door (else, half the time, a partial wall)
    door_m: tuple[float, float] = (1.2, 1.6)
    boxes: int = 2  # at most
    distractors: tuple[int, int] = (2, 5)  # other objects, look-alikes first
    start_gap_m: float = 2.0  # the robot starts at least this far from the target, body to body
    hfov_deg: float = 90.0  # the target starts out of view: outside this field of view, or hidden
    clear_path: bool = False  # the straight line from the start to the target keeps `PATH_MARGIN_M` clear
    # Kinds that stand among the distractors where a robot searching left from the start sees one of
    # them before the target (within DECOY_TURNS of its turns, at most DECOY_RANGE_M away, nothing
    # between): the other targets a navigator was taught, to teach it that they are not this one.
    decoys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.target not in KINDS:
            raise ValueError(f"target: expected one of {sorted(KINDS)}, got {self.target!r}")
        if not 0 <= self.distractors[0] <= self.distractors[1] <= len(KINDS) - 1:
            raise ValueError(f"distractors: expected (low, high) within 0..{len(KINDS) - 1}, got {self.distractors}")
        unknown = [d for d in self.decoys if d not in KINDS or d == self.target]
        if unknown or len(set(self.decoys)) != len(self.decoys) or len(self.decoys) > self.distractors[1]:
            raise ValueError(f"decoys: expected at most {self.distractors[1]} distinct kinds other than the target "
                             f"{self.target!r}, got {self.decoys}")


SEARCH_TURN_DEG = Magnitudes().turn_deg["medium"]  # the camera expert's search (expert.SEARCH): turn_left medium
DECOY_TURNS = 3
DECOY_RANGE_M = 4.0


PATH_MARGIN_M = 0.3


def straight_path(world: World, pose: Pose, target: WorldObject) -> bool:
    """Whether the robot can drive straight from ``pose`` to within 0.3 m of ``target`` (body to
    body) keeping PATH_MARGIN_M beyond its radius from everything: a world where turning until the
    target is in view, then heading for it, gets there."""
    return world.clear_line((pose.x, pose.y), approach_point(pose, target, 0.3), ROBOT_RADIUS + PATH_MARGIN_M)


def generate(seed: int, config: GenerateConfig = GenerateConfig()) -> World:
    """A world drawn from ``seed`` (the same seed, the same world): one or two rooms, up to
    ``config.boxes`` boxes, the target, look-alike and other distractors, and a start from which the
    target is out of view, at least ``start_gap_m`` away and reachable."""
    rng = np.random.default_rng(seed)
    for _ in range(500):
        world = _layout(rng, config, f"seed {seed}")
        if world is not None and reachable(world):
            return world
    raise RuntimeError(f"no world found for seed {seed} with {config}")


def _layout(rng: np.random.Generator, config: GenerateConfig, name: str) -> World | None:
    w, d = round(rng.uniform(*config.width_m), 1), round(rng.uniform(*config.depth_m), 1)
    bounds = (0.0, 0.0, w, d)
    walls, doors = _interior_walls(rng, config, w, d)
    boxes = _boxes(rng, config, bounds, walls, doors)
    segments = np.array([s for s in box_edges(bounds) + walls + [e for b in boxes for e in box_edges(b)]])
    objects = _objects(rng, config, segments, boxes, doors)
    if objects is None:
        return None
    start = _start(rng, config, bounds, walls, boxes, objects)
    if start is None:
        return None
    colours = Colours(wall=WALL_COLOURS[rng.integers(len(WALL_COLOURS))],
                      box=BOX_COLOURS[rng.integers(len(BOX_COLOURS))],
                      floor=FLOOR_COLOURS[rng.integers(len(FLOOR_COLOURS))])
    return World(bounds, tuple(objects), config.target, start, tuple(walls), tuple(boxes), colours, name)


def _interior_walls(rng, config, w, d) -> tuple[list, list]:
    """Walls across the longer side with a door (two rooms), or a partial wall from one side, or none."""
    vertical = w >= d  # the wall runs along y at some x
    length, across = (d, w) if vertical else (w, d)
    at = round(rng.uniform(0.4, 0.6) * across, 2)
    if rng.random() < config.two_rooms:
        door = rng.uniform(*config.door_m)
        lo = rng.uniform(0.6, length - 0.6 - door)
        runs, doors = [(0.0, lo), (lo + door, length)], [lo + door / 2]
    elif rng.random() < 0.5:
        reach = rng.uniform(0.4, 0.6) * length
        runs, doors = [(0.0, reach) if rng.random() < 0.5 else (length - reach, length)], []
    else:
        return [], []
    walls = [(at, a, at, b) if vertical else (a, at, b, at) for a, b in runs]
    return walls, [(at, c) if vertical else (c, at) for c in doors]


def _boxes(rng, config, bounds, walls, doors) -> list:
    boxes: list = []
    segments = np.array(box_edges(bounds) + walls)
    for _ in range(int(rng.integers(0, config.boxes + 1))):
        for _ in range(50):
            bw, bd = rng.uniform(0.6, 1.4), rng.uniform(0.4, 0.9)
            x, y = rng.uniform(bounds[0], bounds[2] - bw), rng.uniform(bounds[1], bounds[3] - bd)
            box = (round(x, 2), round(y, 2), round(x + bw, 2), round(y + bd, 2))
            corners = np.array([(box[0], box[1]), (box[2], box[3]), (box[0], box[3]), (box[2], box[1]),
                                ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)])
            near_wall = point_segment_distances(corners, segments).min() < 1.1
            near_door = any(math.hypot(cx - dx, cy - dy) < 1.6 for cx, cy in corners for dx, dy in doors)
            near_box = any(box[0] < b[2] + 1.1 and b[0] < box[2] + 1.1 and box[1] < b[3] + 1.1 and b[1] < box[3] + 1.1
                           for b in boxes)
            if not (near_wall or near_door or near_box):
                boxes.append(box)
                break
    return boxes


def _in_boxes(x: float, y: float, boxes: list, pad: float) -> bool:
    return any(b[0] - pad < x < b[2] + pad and b[1] - pad < y < b[3] + pad for b in boxes)


def _objects(rng, config, segments, boxes, doors) -> list[WorldObject] | None:
    lookalikes = list(LOOKALIKES.get(config.target, ()))
    others = [k for k in KINDS if k != config.target and k not in lookalikes]
    rng.shuffle(lookalikes)
    rng.shuffle(others)
    count = int(rng.integers(config.distractors[0], config.distractors[1] + 1))
    names = [config.target] + (lookalikes[:max(1, count - 1)] + others)[:count]
    if config.decoys:
        rest = [n for n in names[1:] if n not in config.decoys]
        names = [config.target, *config.decoys, *rest][:1 + max(count, len(config.decoys))]
    xmin, ymin, xmax, ymax = segments[:4, :2].min(0).tolist() + segments[:4, :2].max(0).tolist()
    placed: list[WorldObject] = []
    for name in names:
        shape, colour = KINDS[name]
        r = DEFAULT_RADIUS[shape]
        for _ in range(100):
            x, y = round(rng.uniform(xmin + r, xmax - r), 2), round(rng.uniform(ymin + r, ymax - r), 2)
            clear = point_segment_distances(np.array([[x, y]]), segments).min() >= r + 0.35
            apart = all(math.hypot(x - o.position[0], y - o.position[1]) >= r + o.radius + 0.8 for o in placed)
            if clear and apart and not _in_boxes(x, y, boxes, r) and all(math.hypot(x - dx, y - dy) >= 1.0
                                                                            for dx, dy in doors):
                placed.append(WorldObject(name, shape, PALETTE[colour], (x, y), r, SHAPES[shape]))
                break
        else:
            return None
    return placed


def _start(rng, config, bounds, walls, boxes, objects) -> Pose | None:
    """A start pose clear of everything, far from the target, with the target out of view."""
    target = objects[0]
    for _ in range(100):
        pose = Pose(round(rng.uniform(bounds[0] + 0.5, bounds[2] - 0.5), 2),
                    round(rng.uniform(bounds[1] + 0.5, bounds[3] - 0.5), 2), round(rng.uniform(-math.pi, math.pi), 3))
        try:
            world = World(bounds, tuple(objects), config.target, pose, tuple(walls), tuple(boxes))
        except WorldError:
            continue
        clear = world.clearance(np.array([[pose.x, pose.y]]))[0] >= ROBOT_RADIUS + 0.25
        far = body_gap(pose, target) >= config.start_gap_m
        in_view = (abs(pose.bearing_to(*target.position)) < math.radians(config.hfov_deg) / 2
                   and world.line_of_sight((pose.x, pose.y), target.position))
        if (clear and far and not in_view and (not config.clear_path or straight_path(world, pose, target))
                and (not config.decoys or _decoy_seen_first(world, pose, config))):
            return pose
    return None


def _turns_to_see(world: World, pose: Pose, obj: WorldObject, hfov: float) -> float:
    """How many of the search's SEARCH_TURN_DEG turns left from ``pose`` bring ``obj`` into view (0:
    in view now; inf when a wall or box hides it from here)."""
    if not world.line_of_sight((pose.x, pose.y), obj.position):
        return math.inf
    bearing = pose.bearing_to(*obj.position)
    if abs(bearing) < hfov / 2:
        return 0
    return math.floor(((bearing - hfov / 2) % (2 * math.pi)) / math.radians(SEARCH_TURN_DEG)) + 1


def _decoy_seen_first(world: World, pose: Pose, config: GenerateConfig) -> bool:
    """Whether searching left from ``pose`` shows a decoy within DECOY_TURNS turns, within
    DECOY_RANGE_M, in a view before the first that shows the target."""
    hfov = math.radians(config.hfov_deg)
    target = _turns_to_see(world, pose, world.target_object, hfov)
    return any(turns <= DECOY_TURNS and turns < target and body_gap(pose, o) <= DECOY_RANGE_M
               for o in world.objects if o.name in config.decoys
               for turns in [_turns_to_see(world, pose, o, hfov)])
