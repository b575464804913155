"""The simulator's camera (issue 15): a pinhole camera on the robot, rendered with numpy alone (a
column ray cast and a few convex polygons need no OpenCV). Knows nothing about ROS.

``Camera(...).render(world, pose)`` returns an [H, W, 3] uint8 RGB frame, the same for the same world
and pose. The scene is "2.5D" (as Wolfenstein drew it): walls and boxes are vertical planes as tall
as ``wall_height_m``, ray cast once per image column; objects are upright billboards facing the
camera at their centre's depth, each drawn as its shape's silhouette (a chair has legs, a seat and
a back; a bottle a neck; a can is squat; a cone tapers) in its own flat colour, so that colour,
shape, bearing (column) and distance (size, and where it stands on the floor) are what a small
network can learn. Walls are shaded by their direction, floor and ceiling are flat.

Pinhole geometry, square pixels, the optical axis level at ``height_m``:

    f = (W / 2) / tan(hfov / 2)            focal length in pixels
    column c looks along  forward + s_c * left,   s_c = (W / 2 - (c + 0.5)) / f
    a point at depth z (along the axis), height h  ->  row = H / 2 + f * (height_m - h) / z

With that ray direction the ray parameter of a hit is its depth, so walls need no fisheye fix.
Objects are painted far to near; a column hides an object where a wall is nearer there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from edge_llm_ros.nav.world import Pose, World, WorldObject

NEAR_M = 0.01  # nothing nearer than this along the axis is drawn


def _rect(u0: float, v0: float, u1: float, v1: float) -> list[tuple[float, float]]:
    return [(u0, v0), (u1, v0), (u1, v1), (u0, v1)]


# Silhouettes as convex polygons, counter-clockwise, in the object's frame: u in radii across (-1
# left .. 1 right), v in heights up (0 floor .. 1 top). A chair seen from the front: two legs, a
# seat, a back; a bottle: its body, shoulders and neck.
SILHOUETTES: dict[str, list[list[tuple[float, float]]]] = {
    "chair": [_rect(-1.0, 0.0, -0.72, 0.45), _rect(0.72, 0.0, 1.0, 0.45), _rect(-1.0, 0.45, 1.0, 0.55),
              _rect(-0.85, 0.55, 0.85, 1.0)],
    "bottle": [_rect(-1.0, 0.0, 1.0, 0.62), [(-1.0, 0.62), (1.0, 0.62), (0.4, 0.8), (-0.4, 0.8)],
               _rect(-0.4, 0.8, 0.4, 1.0)],
    "can": [_rect(-1.0, 0.0, 1.0, 1.0)],
    "box": [_rect(-1.0, 0.0, 1.0, 1.0)],
    "cone": [[(-1.0, 0.0), (1.0, 0.0), (0.15, 1.0), (-0.15, 1.0)]],
}


def inside(polygon: list[tuple[float, float]], u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[h, w] whether each point (u [1, w], v [h, 1]) is inside the convex counter-clockwise ``polygon``."""
    result = np.ones(np.broadcast_shapes(u.shape, v.shape), dtype=bool)
    for (ax, ay), (bx, by) in zip(polygon, polygon[1:] + polygon[:1]):
        result &= (bx - ax) * (v - ay) - (by - ay) * (u - ax) >= 0
    return result


@dataclass(frozen=True)
class Camera:
    width: int = 128
    height: int = 96
    hfov_deg: float = 90.0
    height_m: float = 0.35  # the optical centre above the floor (a Go2's head camera)
    wall_height_m: float = 1.2
    forward_m: float = 0.2  # the optical centre ahead of the robot's centre (inside its radius: never in a wall)

    def __post_init__(self) -> None:
        if not (8 <= self.width <= 4096 and 8 <= self.height <= 4096):
            raise ValueError(f"width, height: expected 8..4096 pixels, got {self.width} x {self.height}")
        if not 10.0 <= self.hfov_deg <= 170.0:
            raise ValueError(f"hfov_deg: expected 10..170 degrees, got {self.hfov_deg}")
        if not 0.0 < self.height_m < self.wall_height_m:
            raise ValueError(f"height_m: expected above the floor and below the walls ({self.wall_height_m} m), "
                             f"got {self.height_m}")

    @property
    def focal(self) -> float:
        return self.width / 2 / math.tan(math.radians(self.hfov_deg) / 2)

    @cached_property
    def slopes(self) -> np.ndarray:
        """[W] s_c: each column's ray is forward + s_c * left."""
        return (self.width / 2 - (np.arange(self.width) + 0.5)) / self.focal

    def optical_centre(self, pose: Pose) -> tuple[float, float]:
        return pose.x + self.forward_m * math.cos(pose.yaw), pose.y + self.forward_m * math.sin(pose.yaw)

    def row_of(self, height: float | np.ndarray, depth: float | np.ndarray) -> float | np.ndarray:
        """Image row (fractional) of a point at ``height`` metres and ``depth`` metres ahead."""
        return self.height / 2 + self.focal * (self.height_m - height) / depth

    # -- the steps ---------------------------------------------------------------------------------------

    def background(self, world: World) -> np.ndarray:
        """[H, W, 3] ceiling above the horizon, floor below it."""
        frame = np.empty((self.height, self.width, 3), dtype=np.uint8)
        half = self.height // 2
        frame[:half] = world.colours.ceiling
        frame[half:] = world.colours.floor
        return frame

    def cast_walls(self, world: World, pose: Pose) -> tuple[np.ndarray, np.ndarray]:
        """([W] depth of the nearest wall or box face in each column (inf: none), [W] its segment index)."""
        px, py = self.optical_centre(pose)
        fwd = np.array([math.cos(pose.yaw), math.sin(pose.yaw)])
        left = np.array([-fwd[1], fwd[0]])
        d = fwd[None, :] + self.slopes[:, None] * left[None, :]  # [W, 2] ray directions
        s = world.segments  # [S, 4]
        e = s[:, 2:] - s[:, :2]  # [S, 2]
        w = s[:, :2] - np.array([px, py])  # [S, 2]
        denom = d[:, None, 0] * e[None, :, 1] - d[:, None, 1] * e[None, :, 0]  # [W, S]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (w[None, :, 0] * e[None, :, 1] - w[None, :, 1] * e[None, :, 0]) / denom  # depth along the ray
            u = (w[None, :, 0] * d[:, None, 1] - w[None, :, 1] * d[:, None, 0]) / denom  # where on the segment
        hit = (np.abs(denom) > 1e-12) & (t > NEAR_M) & (u >= 0) & (u <= 1)
        t = np.where(hit, t, np.inf)
        nearest = t.argmin(axis=1)
        return t[np.arange(self.width), nearest], nearest

    def paint_walls(self, frame: np.ndarray, world: World, depth: np.ndarray, segment: np.ndarray) -> None:
        """Each column's wall from the floor to ``wall_height_m``, shaded by the wall's direction."""
        seen = np.isfinite(depth)
        z = np.where(seen, depth, 1.0)
        top, bottom = self.row_of(self.wall_height_m, z), self.row_of(0.0, z)
        rows = np.arange(self.height)[:, None] + 0.5  # [H, 1]
        mask = seen[None, :] & (rows >= top[None, :]) & (rows < bottom[None, :])  # [H, W]
        colours = self.wall_colours(world)[segment]  # [W, 3]
        frame[mask] = np.broadcast_to(colours[None, :, :], frame.shape)[mask]

    def wall_colours(self, world: World) -> np.ndarray:
        """[S, 3] uint8: walls and boxes in their colours, lit by how much they face +x+y (1 to 0.7)."""
        s = world.segments
        e = s[:, 2:] - s[:, :2]
        normal = np.stack([-e[:, 1], e[:, 0]], axis=1) / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-9)
        light = 0.7 + 0.3 * np.abs(normal @ np.array([0.8, 0.6]))  # [S]
        base = np.where(world.segment_is_box[:, None], np.array(world.colours.box), np.array(world.colours.wall))
        return np.clip(base * light[:, None], 0, 255).astype(np.uint8)

    def paint_object(self, frame: np.ndarray, obj: WorldObject, pose: Pose, wall_depth: np.ndarray) -> None:
        """The object's silhouette as a billboard at its centre's depth, hidden where a wall is nearer."""
        px, py = self.optical_centre(pose)
        dx, dy = obj.position[0] - px, obj.position[1] - py
        z = dx * math.cos(pose.yaw) + dy * math.sin(pose.yaw)
        if z - obj.radius < NEAR_M:
            return
        lateral = -dx * math.sin(pose.yaw) + dy * math.cos(pose.yaw)  # to the left
        centre, half = self.width / 2 - self.focal * lateral / z, self.focal * obj.radius / z
        if centre + half < 0 or centre - half > self.width:
            return
        c0, c1 = max(0, math.floor(centre - half)), min(self.width, math.ceil(centre + half))
        r0 = max(0, math.floor(self.row_of(obj.height, z)))
        r1 = min(self.height, math.ceil(self.row_of(0.0, z)))
        if c0 >= c1 or r0 >= r1:
            return
        u = ((np.arange(c0, c1) + 0.5 - centre) / half)[None, :]  # [1, w]
        heights = self.height_m - (np.arange(r0, r1) + 0.5 - self.height / 2) * z / self.focal
        v = (heights / obj.height)[:, None]  # [h, 1]
        mask = np.zeros((r1 - r0, c1 - c0), dtype=bool)
        for polygon in SILHOUETTES[obj.shape]:
            mask |= inside(polygon, u, v)
        mask &= (wall_depth[c0:c1] > z - obj.radius)[None, :]
        frame[r0:r1, c0:c1][mask] = obj.colour

    def render(self, world: World, pose: Pose) -> np.ndarray:
        """[H, W, 3] uint8 RGB: what the camera on a robot at ``pose`` sees."""
        frame = self.background(world)
        depth, segment = self.cast_walls(world, pose)
        self.paint_walls(frame, world, depth, segment)
        px, py = self.optical_centre(pose)
        for obj in sorted(world.objects, key=lambda o: -math.hypot(o.position[0] - px, o.position[1] - py)):
            self.paint_object(frame, obj, pose, depth)
        return frame
