"""The simulator's 2D world and a kinematic Go2 (issue 15). Knows nothing about ROS.

A world is what a YAML file (config/worlds/) or ``worldgen.generate(seed)`` gives: `bounds` (the
outer walls), interior `walls` as segments, `boxes` (solid axis-aligned blocks as tall as the walls:
cupboards, pillars), `objects` (name, shape, colour, position, radius, height), the `target`
object's name and the robot's `start` pose ({x, y, yaw_deg}, or yaw in radians). Metres in the
world frame, yaw counter-clockwise from +x. Every bad field is a WorldError naming it
(`objects[2].position: ...`).

The robot is a disc of radius ROBOT_RADIUS (a Go2 is 0.70 x 0.31 m and turns in place). It touches
a wall or an object when the discs overlap or the disc crosses the segment. `Robot.step` integrates
a velocity command (unicycle), `Robot.apply` executes one discrete NavCommand (nav/actions.py)
as a pose change; both stop a translation before the first contact (turning in place never
touches) and record what was touched in `collided_with`.

Reached, the issue's "within 0.5 m": the gap between the robot's body and the object's, that is
the distance of the centres less both radii, is at most REACH_M.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from edge_llm_ros.nav.actions import Magnitudes, NavCommand

ROBOT_RADIUS = 0.3
REACH_M = 0.5
SWEEP_M = 0.02  # translation sub-step while checking contacts
SHAPES = {"chair": 0.9, "bottle": 0.35, "can": 0.25, "box": 0.5, "cone": 0.5}  # shape: default height (m)
DEFAULT_RADIUS = {"chair": 0.3, "bottle": 0.1, "can": 0.12, "box": 0.25, "cone": 0.2}
PALETTE = {
    "red": (200, 30, 30), "dark red": (110, 15, 20), "orange": (235, 120, 25), "yellow": (230, 200, 40),
    "green": (40, 150, 60), "blue": (40, 70, 200), "silver": (195, 198, 205), "grey": (120, 120, 125),
    "white": (240, 240, 240), "black": (30, 30, 30), "brown": (120, 80, 40),
}
Colour = tuple[int, int, int]


class WorldError(ValueError):
    """A world description is wrong; the message names the field."""


def wrap(angle: float) -> float:
    """``angle`` in (-pi, pi]."""
    return math.atan2(math.sin(angle), math.cos(angle))


@dataclass(frozen=True)
class Pose:
    x: float
    y: float
    yaw: float = 0.0

    def bearing_to(self, x: float, y: float) -> float:
        """Angle of the point (x, y) from the heading, radians, positive to the left."""
        return wrap(math.atan2(y - self.y, x - self.x) - self.yaw)

    def distance_to(self, x: float, y: float) -> float:
        return math.hypot(x - self.x, y - self.y)


@dataclass(frozen=True)
class WorldObject:
    name: str
    shape: str
    colour: Colour
    position: tuple[float, float]
    radius: float
    height: float


@dataclass(frozen=True)
class Colours:
    """What the camera paints walls, boxes, floor and ceiling with (RGB)."""

    wall: Colour = (214, 200, 170)
    box: Colour = (140, 110, 80)
    floor: Colour = (95, 80, 65)
    ceiling: Colour = (225, 225, 220)


# -- geometry ----------------------------------------------------------------------------------------


def point_segment_distances(points: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """[N, S] distances from points [N, 2] to segments [S, 4] (x0, y0, x1, y1)."""
    a, b = segments[None, :, :2], segments[None, :, 2:]
    ab, ap = b - a, points[:, None, :] - a  # [1, S, 2], [N, S, 2]
    t = np.clip((ap * ab).sum(-1) / np.maximum((ab * ab).sum(-1), 1e-12), 0.0, 1.0)  # [N, S]
    return np.linalg.norm(ap - t[..., None] * ab, axis=-1)


def box_edges(box: tuple[float, float, float, float]) -> list[tuple[float, float, float, float]]:
    x0, y0, x1, y1 = box
    return [(x0, y0, x1, y0), (x1, y0, x1, y1), (x1, y1, x0, y1), (x0, y1, x0, y0)]


def body_gap(pose: Pose, obj: WorldObject, radius: float = ROBOT_RADIUS) -> float:
    """Distance between the robot's body and the object's (negative: they overlap)."""
    return pose.distance_to(*obj.position) - obj.radius - radius


def approach_point(pose: Pose, obj: WorldObject, gap: float, radius: float = ROBOT_RADIUS) -> tuple[float, float]:
    """The point on the straight line from ``pose`` to ``obj`` where the body gap is ``gap``."""
    k = 1 - (obj.radius + radius + gap) / pose.distance_to(*obj.position)
    return pose.x + k * (obj.position[0] - pose.x), pose.y + k * (obj.position[1] - pose.y)


def reached(pose: Pose, obj: WorldObject, within: float = REACH_M, radius: float = ROBOT_RADIUS) -> bool:
    return body_gap(pose, obj, radius) <= within


# -- the world ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    bounds: tuple[float, float, float, float]  # xmin, ymin, xmax, ymax: the outer walls
    objects: tuple[WorldObject, ...]
    target: str
    start: Pose
    walls: tuple[tuple[float, float, float, float], ...] = ()
    boxes: tuple[tuple[float, float, float, float], ...] = ()
    colours: Colours = field(default_factory=Colours)
    name: str = "world"

    def __post_init__(self) -> None:
        check_world(self)

    # derived geometry (cached: a world never changes)
    @cached_property
    def segments(self) -> np.ndarray:
        """[S, 4] every wall segment: the outer walls, the interior walls, the boxes' edges."""
        return np.array([s for s, _ in self._named_segments], dtype=np.float64).reshape(-1, 4)

    @cached_property
    def segment_names(self) -> tuple[str, ...]:
        return tuple(n for _, n in self._named_segments)

    @cached_property
    def segment_is_box(self) -> np.ndarray:
        return np.array([n.startswith("box") for n in self.segment_names])

    @cached_property
    def _named_segments(self) -> list[tuple[tuple[float, ...], str]]:
        named = [(s, "outer wall") for s in box_edges(self.bounds)]
        named += [(s, f"wall {i}") for i, s in enumerate(self.walls)]
        named += [(s, f"box {i}") for i, b in enumerate(self.boxes) for s in box_edges(b)]
        return named

    @cached_property
    def object_array(self) -> np.ndarray:
        """[O, 3] x, y, radius of every object."""
        return np.array([(*o.position, o.radius) for o in self.objects], dtype=np.float64).reshape(-1, 3)

    @property
    def target_object(self) -> WorldObject:
        return self.object(self.target)

    def object(self, name: str) -> WorldObject:
        found = [o for o in self.objects if o.name == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} objects named {name!r} in world {self.name!r} "
                           f"(objects: {[o.name for o in self.objects]})")
        return found[0]

    def in_box(self, points: np.ndarray) -> np.ndarray:
        """[N] whether each point [N, 2] is inside a box."""
        inside = np.zeros(len(points), dtype=bool)
        for x0, y0, x1, y1 in self.boxes:
            inside |= (points[:, 0] > x0) & (points[:, 0] < x1) & (points[:, 1] > y0) & (points[:, 1] < y1)
        return inside

    def clearance(self, points: np.ndarray, ignore: str = "") -> np.ndarray:
        """[N] distance from each point [N, 2] to the nearest wall or object surface other than
        ``ignore``; 0 inside a box or an object, or outside the bounds."""
        points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        nearest = point_segment_distances(points, self.segments).min(axis=1)
        keep = [i for i, o in enumerate(self.objects) if o.name != ignore]
        if keep:
            objs = self.object_array[keep]
            surface = np.linalg.norm(points[:, None, :] - objs[None, :, :2], axis=-1) - objs[None, :, 2]
            nearest = np.minimum(nearest, surface.min(axis=1))
        xmin, ymin, xmax, ymax = self.bounds
        outside = (points[:, 0] < xmin) | (points[:, 0] > xmax) | (points[:, 1] < ymin) | (points[:, 1] > ymax)
        return np.where(outside | self.in_box(points), 0.0, np.maximum(nearest, 0.0))

    def touching(self, x: float, y: float, radius: float = ROBOT_RADIUS) -> str:
        """The name of what a disc at (x, y) touches (the nearest), or ''."""
        point = np.array([[x, y]])
        walls = point_segment_distances(point, self.segments)[0]
        objs = np.hypot(self.object_array[:, 0] - x, self.object_array[:, 1] - y) - self.object_array[:, 2]
        i, j = int(walls.argmin()), int(objs.argmin()) if len(objs) else -1
        if j >= 0 and objs[j] < radius and objs[j] <= walls[i]:
            return self.objects[j].name
        if walls[i] < radius or self.in_box(point)[0]:
            return self.segment_names[i]
        return ""

    def clear_line(self, a: tuple[float, float], b: tuple[float, float], clearance: float) -> bool:
        """Whether a point can go straight from a to b keeping ``clearance`` from everything."""
        n = max(2, math.ceil(math.hypot(b[0] - a[0], b[1] - a[1]) / 0.05) + 1)
        return bool((self.clearance(np.linspace(a, b, n)) >= clearance).all())

    def line_of_sight(self, a: tuple[float, float], b: tuple[float, float]) -> bool:
        """Whether the segment a-b crosses no wall or box edge."""
        (ax, ay), (bx, by) = a, b
        s = self.segments
        d, e = np.array([bx - ax, by - ay]), s[:, 2:] - s[:, :2]
        denom = d[0] * e[:, 1] - d[1] * e[:, 0]
        w = s[:, :2] - np.array([ax, ay])
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (w[:, 0] * e[:, 1] - w[:, 1] * e[:, 0]) / denom
            u = (w[:, 0] * d[1] - w[:, 1] * d[0]) / denom
        return not bool(np.any((np.abs(denom) > 1e-12) & (t > 0) & (t < 1) & (u >= 0) & (u <= 1)))

    def summary(self) -> str:
        xmin, ymin, xmax, ymax = self.bounds
        t, s = self.target_object, self.start
        others = ", ".join(o.name for o in self.objects if o.name != self.target) or "none"
        return (f"world {self.name!r}: {xmax - xmin:.1f} x {ymax - ymin:.1f} m, {len(self.walls)} interior walls, "
                f"{len(self.boxes)} boxes; target {t.name} at ({t.position[0]:.2f}, {t.position[1]:.2f}); "
                f"others: {others}; start ({s.x:.2f}, {s.y:.2f}, {math.degrees(s.yaw):.0f} deg)")

    # -- YAML ------------------------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, path: str | Path) -> World:
        import yaml

        path = Path(path).expanduser()
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise WorldError(f"world file {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise WorldError(f"world file {path}: not YAML ({exc})") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: object, source: str = "world") -> World:
        try:
            return _parse_world(data)
        except WorldError as exc:
            raise WorldError(f"{source}: {exc}") from None

    def to_dict(self) -> dict:
        """The YAML form (from_dict(to_dict()) == self)."""
        return {
            "name": self.name, "bounds": list(self.bounds), "walls": [list(w) for w in self.walls],
            "boxes": [list(b) for b in self.boxes],
            "objects": [{"name": o.name, "shape": o.shape, "colour": list(o.colour), "position": list(o.position),
                         "radius": o.radius, "height": o.height} for o in self.objects],
            "target": self.target,
            "start": {"x": self.start.x, "y": self.start.y, "yaw": self.start.yaw},  # radians: exact
            "colours": {k: list(getattr(self.colours, k)) for k in ("wall", "box", "floor", "ceiling")},
        }


def check_world(world: World) -> None:
    """WorldError naming the first field that makes no sense (the field types are the parser's job)."""
    xmin, ymin, xmax, ymax = world.bounds
    if not (xmax - xmin >= 1.0 and ymax - ymin >= 1.0):
        raise WorldError(f"bounds: expected [xmin, ymin, xmax, ymax] at least 1 m apart, got {list(world.bounds)}")
    for i, (x0, y0, x1, y1) in enumerate(world.boxes):
        if not (x0 < x1 and y0 < y1):
            raise WorldError(f"boxes[{i}]: expected [xmin, ymin, xmax, ymax] with min < max, got {[x0, y0, x1, y1]}")
    seen: dict[str, int] = {}
    for i, obj in enumerate(world.objects):
        where = f"objects[{i}] ({obj.name})"
        if obj.shape not in SHAPES:
            raise WorldError(f"{where}.shape: expected one of {sorted(SHAPES)}, got {obj.shape!r}")
        if not (obj.radius > 0 and obj.height > 0):
            raise WorldError(f"{where}: radius and height must be > 0, got {obj.radius}, {obj.height}")
        others = World.clearance(world, np.array([obj.position]), ignore=obj.name)[0]
        if others < obj.radius or world.in_box(np.array([obj.position]))[0]:
            raise WorldError(f"{where}.position: {list(obj.position)} puts it into a wall, a box, another object "
                             f"or outside the bounds")
        seen[obj.name] = seen.get(obj.name, 0) + 1
    if seen.get(world.target, 0) != 1:
        raise WorldError(f"target: {world.target!r} must name exactly one object, objects: {list(seen)}")
    s = world.start
    if World.clearance(world, np.array([[s.x, s.y]]))[0] == 0:
        raise WorldError(f"start: ({s.x}, {s.y}) is outside the bounds or inside a box or an object")
    hit = world.touching(s.x, s.y)
    if hit:
        raise WorldError(f"start: the robot (radius {ROBOT_RADIUS} m) at ({s.x}, {s.y}) touches {hit}")


# -- parsing (every error names its field) ------------------------------------------------------------

WORLD_FIELDS = ("name", "bounds", "walls", "boxes", "objects", "target", "start", "colours")
OBJECT_FIELDS = ("name", "shape", "colour", "position", "radius", "height")


def _mapping(value: object, where: str, known: tuple[str, ...], required: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise WorldError(f"{where}: expected a mapping, got {value!r}")
    unknown = [k for k in value if k not in known]
    if unknown:
        raise WorldError(f"{where}.{unknown[0]}: unknown field (expected one of {list(known)})".lstrip("."))
    missing = [k for k in required if k not in value]
    if missing:
        raise WorldError(f"{where}.{missing[0]}: missing (required: {list(required)})".lstrip("."))
    return value


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorldError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _numbers(value: object, count: int, where: str, form: str) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)) or len(value) != count:
        raise WorldError(f"{where}: expected {form}, got {value!r}")
    return tuple(_number(v, f"{where}[{i}]") for i, v in enumerate(value))


def _colour(value: object, where: str) -> Colour:
    if isinstance(value, str):
        if value not in PALETTE:
            raise WorldError(f"{where}: unknown colour {value!r} (names: {sorted(PALETTE)}, or [r, g, b])")
        return PALETTE[value]
    rgb = _numbers(value, 3, where, "a colour name or [r, g, b] in 0..255")
    if any(not (0 <= c <= 255 and c == int(c)) for c in rgb):
        raise WorldError(f"{where}: expected [r, g, b] integers in 0..255, got {value!r}")
    return tuple(int(c) for c in rgb)


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise WorldError(f"{where}: expected a non-empty string, got {value!r}")
    return value.strip()


def _list(value: object, where: str) -> list:
    if not isinstance(value, list):
        raise WorldError(f"{where}: expected a list, got {value!r}")
    return value


def _object(value: object, where: str) -> WorldObject:
    d = _mapping(value, where, OBJECT_FIELDS, ("name", "shape", "colour", "position"))
    shape = _text(d["shape"], f"{where}.shape")
    if shape not in SHAPES:
        raise WorldError(f"{where}.shape: expected one of {sorted(SHAPES)}, got {shape!r}")
    return WorldObject(
        name=_text(d["name"], f"{where}.name"), shape=shape, colour=_colour(d["colour"], f"{where}.colour"),
        position=_numbers(d["position"], 2, f"{where}.position", "[x, y] in metres"),
        radius=_number(d.get("radius", DEFAULT_RADIUS[shape]), f"{where}.radius"),
        height=_number(d.get("height", SHAPES[shape]), f"{where}.height"))


def _parse_world(data: object) -> World:
    d = _mapping(data, "", WORLD_FIELDS, ("bounds", "objects", "target", "start"))
    start = _mapping(d["start"], "start", ("x", "y", "yaw_deg", "yaw"), ("x", "y"))
    if "yaw" in start and "yaw_deg" in start:
        raise WorldError("start: give yaw_deg (degrees) or yaw (radians), not both")
    yaw = _number(start["yaw"], "start.yaw") if "yaw" in start else \
        math.radians(_number(start.get("yaw_deg", 0.0), "start.yaw_deg"))
    colours = _mapping(d.get("colours", {}), "colours", ("wall", "box", "floor", "ceiling"), ())
    quad = "[xmin, ymin, xmax, ymax] in metres"
    return World(
        name=_text(d.get("name", "world"), "name"),
        bounds=_numbers(d["bounds"], 4, "bounds", quad),
        walls=tuple(_numbers(w, 4, f"walls[{i}]", "[x0, y0, x1, y1] in metres")
                    for i, w in enumerate(_list(d.get("walls", []), "walls"))),
        boxes=tuple(_numbers(b, 4, f"boxes[{i}]", quad) for i, b in enumerate(_list(d.get("boxes", []), "boxes"))),
        objects=tuple(_object(o, f"objects[{i}]") for i, o in enumerate(_list(d["objects"], "objects"))),
        target=_text(d["target"], "target"),
        start=Pose(_number(start["x"], "start.x"), _number(start["y"], "start.y"), yaw),
        colours=Colours(**{k: _colour(v, f"colours.{k}") for k, v in colours.items()}),
    )


# -- the robot ---------------------------------------------------------------------------------------


@dataclass
class Robot:
    """A kinematic Go2 in ``world``: a disc that turns in place and moves along its heading."""

    world: World
    pose: Pose
    radius: float = ROBOT_RADIUS
    collided_with: str = ""  # what the last contact touched ('' = none yet)
    contacts: int = 0  # motions stopped by a contact

    def translate(self, distance: float, yaw: float) -> str:
        """Move ``distance`` metres along ``yaw`` in SWEEP_M steps, stopping before the first contact;
        what it touched, or ''."""
        steps = max(1, math.ceil(abs(distance) / SWEEP_M))
        dx, dy = distance / steps * math.cos(yaw), distance / steps * math.sin(yaw)
        for _ in range(steps):
            hit = self.world.touching(self.pose.x + dx, self.pose.y + dy, self.radius)
            if hit:
                self.collided_with, self.contacts = hit, self.contacts + 1
                return hit
            self.pose = Pose(self.pose.x + dx, self.pose.y + dy, self.pose.yaw)
        return ""

    def step(self, vx: float, wz: float, dt: float) -> str:
        """Integrate (vx m/s forward, wz rad/s to the left) for ``dt`` seconds (unicycle, midpoint
        heading); what a contact stopped the translation on, or ''."""
        mid = self.pose.yaw + wz * dt / 2
        hit = self.translate(vx * dt, mid) if vx else ""
        self.pose = Pose(self.pose.x, self.pose.y, wrap(self.pose.yaw + wz * dt))
        return hit

    def apply(self, command: NavCommand, magnitudes: Magnitudes = Magnitudes()) -> str:
        """Execute one discrete action as a pose change; what a contact stopped it on, or ''."""
        distance, angle = command.motion(magnitudes)
        self.pose = Pose(self.pose.x, self.pose.y, wrap(self.pose.yaw + angle))
        return self.translate(distance, self.pose.yaw) if distance else ""
