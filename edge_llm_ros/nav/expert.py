"""The teacher (issue 15): the simulator knows where everything is, so it gives the expert action and
a short reason for any pose. Knows nothing about ROS.

``expert(world, pose, target)`` answers one NavCommand of nav/actions.py's vocabulary:

    plan      cost-to-go to the target over a grid of the map (Dijkstra from the cells within
              `goal_m` of it, body to body), keeping `margin_m` beyond the robot's radius, with a
              soft cost near obstacles so paths keep to the middle of doors and gaps
    waypoint  straight at the target when that line is clear (to `goal_m` short of it); else follow
              the cost downhill from the robot to the farthest point of that path within
              `lookahead_m` that a straight, clear line reaches
    act       target there (within `stop_m`, REACH_M or a margin inside it) and within `face_deg`
              of the heading -> stop; there but not faced -> turn toward it;
              else, of the headings one action away from which a step forward is clear, the one
              nearest the waypoint's bearing: forward (the largest magnitude not past the waypoint
              whose sweep stays clear) if it is this heading, else the turn to it

The reason is what the camera would show and why the action follows ("red chair ahead left, 2 m,
turning left"; "red chair not in view, turning right"), in the grammar's alphabet (clean_reason).
``rollout`` runs a policy through discrete actions (Robot.apply) until it stops, touches something
or runs out of steps, and returns the Episode as data.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edge_llm_ros.nav.actions import MAGNITUDES, Magnitudes, NavCommand, clean_reason
from edge_llm_ros.nav.world import (
    REACH_M,
    ROBOT_RADIUS,
    Pose,
    Robot,
    World,
    WorldObject,
    approach_point,
    body_gap,
    reached,
    wrap,
)
from edge_llm_ros.nav.worldgen import Grid

SEARCH = NavCommand("turn_left", "medium", "searching left")  # the camera expert's turn while the target is unseen
WHERE = ("not in view", "ahead", "ahead left", "ahead right", "left", "right")
NEIGHBOURS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


@dataclass(frozen=True)
class ExpertConfig:
    magnitudes: Magnitudes = field(default_factory=Magnitudes)
    margin_m: float = 0.1  # planned paths and forward sweeps keep this beyond the robot's radius
    goal_m: float = 0.3  # plan to this body gap from the target (inside REACH_M)
    face_deg: float = 20.0  # stop only with the target within this of the heading
    lookahead_m: float = 1.5
    resolution_m: float = 0.1
    hfov_deg: float = 90.0  # the camera's: what "in view" means in a reason
    ahead_deg: float = 10.0  # "ahead" in a reason; the camera expert heads straight within it
    stop_m: float = REACH_M  # stop only within this body gap (a margin inside REACH_M: a learner that
    #                          stops a little early still reaches)

    def __post_init__(self) -> None:
        if not 0 < self.goal_m < self.stop_m <= REACH_M:
            raise ValueError(f"expected 0 < goal_m < stop_m <= {REACH_M} (the reach), got goal_m {self.goal_m}, "
                             f"stop_m {self.stop_m}")

    def there(self, pose: Pose, obj: WorldObject) -> bool:
        """Close enough to ``obj`` to stop (facing it)."""
        return reached(pose, obj, within=self.stop_m)


# -- plan ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostMap:
    grid: Grid
    cost: np.ndarray  # [ny, nx] metres to the goal (soft costs included); inf: no way there


@functools.lru_cache(maxsize=32)
def cost_map(world: World, target: str, margin: float, goal: float, resolution: float) -> CostMap:
    """Dijkstra over 8-connected free cells from every goal cell (once per world and target)."""
    grid = Grid.of(world, resolution)
    free = grid.clearance >= ROBOT_RADIUS + margin
    xs, ys = grid.centres()
    t = world.object(target)
    goal_cells = free & (np.hypot(xs - t.position[0], ys - t.position[1]) - t.radius - ROBOT_RADIUS <= goal)
    # soft cost: up to 3x per metre in the last 0.3 m before the margin, so paths keep off walls
    weight = 1.0 + 2.0 * np.clip((ROBOT_RADIUS + margin + 0.3 - grid.clearance) / 0.3, 0.0, 1.0)
    cost = np.full(free.shape, np.inf)
    heap = [(0.0, int(r), int(c)) for r, c in zip(*np.nonzero(goal_cells))]
    for _, r, c in heap:
        cost[r, c] = 0.0
    ny, nx = free.shape
    while heap:
        d, r, c = heapq.heappop(heap)
        if d > cost[r, c]:
            continue
        for dr, dc in NEIGHBOURS:
            rr, cc = r + dr, c + dc
            if 0 <= rr < ny and 0 <= cc < nx and free[rr, cc]:
                nd = d + resolution * math.hypot(dr, dc) * (weight[r, c] + weight[rr, cc]) / 2
                if nd < cost[rr, cc]:
                    cost[rr, cc] = nd
                    heapq.heappush(heap, (nd, rr, cc))
    return CostMap(grid, cost)


def path_cells(costs: CostMap, pose: Pose, max_cells: int) -> list[tuple[int, int]]:
    """Cells downhill from the robot's (or the cheapest near it, when its own is too close to
    something) towards the goal, at most ``max_cells``; [] when no way leads there."""
    cost, (r, c) = costs.cost, costs.grid.cell(pose.x, pose.y)
    if not math.isfinite(cost[r, c]):
        window = cost[max(r - 3, 0):r + 4, max(c - 3, 0):c + 4]
        if not np.isfinite(window).any():
            return []
        wr, wc = np.unravel_index(np.argmin(window), window.shape)
        r, c = max(r - 3, 0) + int(wr), max(c - 3, 0) + int(wc)
    cells = [(r, c)]
    while cost[r, c] > 0 and len(cells) < max_cells:
        r, c = min(((r + dr, c + dc) for dr, dc in NEIGHBOURS
                    if 0 <= r + dr < cost.shape[0] and 0 <= c + dc < cost.shape[1]), key=lambda rc: cost[rc])
        cells.append((r, c))
    return cells


def safe_clearance(world: World, pose: Pose, config: ExpertConfig) -> float:
    """What a straight motion from ``pose`` must keep: half the margin beyond the robot's radius, or,
    where the robot is already nearer than that to something, no nearer than it is (never touching)."""
    here = float(world.clearance(np.array([[pose.x, pose.y]]))[0])
    return max(ROBOT_RADIUS + 0.01, min(ROBOT_RADIUS + config.margin_m / 2, here - 1e-6))


def direct_goal(world: World, pose: Pose, target: str, config: ExpertConfig) -> tuple[float, float] | None:
    """The point `goal_m` short of the target on the straight line to it, when that line is clear."""
    t = world.object(target)
    if body_gap(pose, t) <= config.goal_m:
        return None
    point = approach_point(pose, t, config.goal_m)
    return point if world.clear_line((pose.x, pose.y), point, safe_clearance(world, pose, config)) else None


def waypoint(world: World, pose: Pose, costs: CostMap, config: ExpertConfig) -> tuple[float, float] | None:
    """The farthest point of the path within lookahead that a clear straight line reaches."""
    res = costs.grid.resolution
    cells = path_cells(costs, pose, max_cells=int(3 * config.lookahead_m / res) + 2)
    if not cells:
        return None
    xs, ys = costs.grid.centres()
    points = [(float(xs[rc]), float(ys[rc])) for rc in cells]
    here, clearance = (pose.x, pose.y), safe_clearance(world, pose, config)
    for point in reversed(points):
        if pose.distance_to(*point) <= config.lookahead_m and world.clear_line(here, point, clearance):
            return point
    return points[min(1, len(points) - 1)]


# -- act ----------------------------------------------------------------------------------------------


def nearest_turn(angle: float, magnitudes: Magnitudes) -> NavCommand:
    """The turn whose angle is nearest |angle|, toward its side."""
    degrees = abs(math.degrees(angle))
    magnitude = min(MAGNITUDES, key=lambda m: abs(magnitudes.turn_deg[m] - degrees))
    return NavCommand("turn_left" if angle > 0 else "turn_right", magnitude)


def forward_magnitude(world: World, pose: Pose, limit: float, config: ExpertConfig) -> str:
    """The largest forward magnitude up to ``limit`` metres (the smallest at least) whose sweep keeps
    safe_clearance; '' when none does."""
    small, clearance = config.magnitudes.forward_m[MAGNITUDES[0]], safe_clearance(world, pose, config)
    for m in reversed(MAGNITUDES):
        metres = config.magnitudes.forward_m[m]
        if metres > max(limit, small):
            continue
        end = (pose.x + metres * math.cos(pose.yaw), pose.y + metres * math.sin(pose.yaw))
        if world.clear_line((pose.x, pose.y), end, clearance):
            return m
    return ""


def turns(magnitudes: Magnitudes) -> list[tuple[float, NavCommand | None]]:
    """(angle, the turn) of every heading one action away; (0, None): keep this one."""
    options: list[tuple[float, NavCommand | None]] = [(0.0, None)]
    for m in MAGNITUDES:
        angle = math.radians(magnitudes.turn_deg[m])
        options += [(angle, NavCommand("turn_left", m)), (-angle, NavCommand("turn_right", m))]
    return options


def choose(world: World, pose: Pose, target: str, config: ExpertConfig) -> tuple[str, str, str]:
    """(verb, magnitude, why): the action without its reason's description of the scene.

    Toward the waypoint: of the headings one action away (this one, or a turn) from which a small
    step forward is clear, the one nearest the waypoint's bearing; forward if that is this heading,
    else the turn to it. Choosing among reachable headings by the same rule at every pose keeps the
    robot from turning back and forth where a corner blocks the heading that points best.
    """
    t = world.object(target)
    if config.there(pose, t):
        to_target = pose.bearing_to(*t.position)
        if abs(math.degrees(to_target)) <= config.face_deg:
            return "stop", "", "reached"
        turn = nearest_turn(to_target, config.magnitudes)
        return turn.verb, turn.magnitude, "turning to face it"
    costs = cost_map(world, target, config.margin_m, config.goal_m, config.resolution_m)
    goal = direct_goal(world, pose, target, config) or waypoint(world, pose, costs, config)
    if goal is None:
        return "turn_left", "large", "no way there, turning"
    bearing = pose.bearing_to(*goal)
    smallest = math.radians(config.magnitudes.turn_deg[MAGNITUDES[0]])
    open_ = [(abs(wrap(bearing - angle)), angle, turn) for angle, turn in turns(config.magnitudes)
             if forward_magnitude(world, Pose(pose.x, pose.y, pose.yaw + angle), 0.0, config)]
    best = min(open_, key=lambda o: (o[0], abs(o[1])), default=None)
    if best is None or best[0] > 2 * smallest:  # nothing clear near the waypoint's direction: face it
        if abs(bearing) > smallest / 2:
            turn = nearest_turn(bearing, config.magnitudes)
            return turn.verb, turn.magnitude, f"turning {'left' if bearing > 0 else 'right'}"
        back = config.magnitudes.forward_m[MAGNITUDES[0]]
        behind = (pose.x - back * math.cos(pose.yaw), pose.y - back * math.sin(pose.yaw))
        if world.clear_line((pose.x, pose.y), behind, safe_clearance(world, pose, config)):
            return "backward", MAGNITUDES[0], "blocked ahead, backing off"
        return "turn_left", "large", "blocked, turning"
    _, angle, turn = best
    if turn is not None:
        return turn.verb, turn.magnitude, f"turning {'left' if angle > 0 else 'right'}"
    return "forward", forward_magnitude(world, pose, pose.distance_to(*goal), config), "path clear"


def in_view(world: World, pose: Pose, obj: WorldObject, hfov_deg: float) -> bool:
    """Whether the camera shows ``obj``: its centre inside the field of view, no wall between."""
    return (abs(math.degrees(pose.bearing_to(*obj.position))) <= hfov_deg / 2
            and world.line_of_sight((pose.x, pose.y), obj.position))


def where_seen(world: World, pose: Pose, obj: WorldObject, config: ExpertConfig) -> str:
    """Where the camera shows ``obj``: one of WHERE ('not in view', 'ahead', 'ahead left', ...)."""
    if not in_view(world, pose, obj, config.hfov_deg):
        return WHERE[0]
    bearing = math.degrees(pose.bearing_to(*obj.position))
    side = "left" if bearing > 0 else "right"
    return "ahead" if abs(bearing) < config.ahead_deg else f"ahead {side}" if abs(bearing) < 30 else side


def describe(world: World, pose: Pose, target: str, why: str, config: ExpertConfig) -> str:
    """'red chair ahead left, 2 m, turning left': where the target is as the camera sees it (or not
    in view), how far, and why the action."""
    t = world.object(target)
    where = where_seen(world, pose, t, config)
    if where == WHERE[0]:
        return clean_reason(f"{t.name} {where}, {why}")
    gap = body_gap(pose, t)
    distance = f"{round(gap)} m" if gap >= 1.0 else "under 1 m"
    return clean_reason(f"{t.name} {where}, {distance}, {why}")


def expert(world: World, pose: Pose, target: str | None = None, config: ExpertConfig = ExpertConfig()) -> NavCommand:
    """The expert's action and reason at ``pose`` for going to ``target`` (default: the world's)."""
    target = target or world.target
    verb, magnitude, why = choose(world, pose, target, config)
    return NavCommand(verb, magnitude, describe(world, pose, target, why, config))


def camera_expert(world: World, pose: Pose, target: str | None = None,
                  config: ExpertConfig = ExpertConfig()) -> NavCommand:
    """The teacher a camera-only policy can learn from: every action follows from what the frame
    shows. Not in view: SEARCH, a left turn of 30 degrees (a third of the view, so the target
    crosses the middle of some frame). In view: turn toward it until it is within `ahead_deg` of
    the heading, then forward by a magnitude that fits its distance (and a clear sweep). There
    (`stop_m`): face it, then stop. Only when something blocks the way forward does it fall back on the
    map-based expert's choice (`choose`)."""
    target = target or world.target
    t = world.object(target)
    bearing = pose.bearing_to(*t.position)
    if config.there(pose, t):
        verb, magnitude, why = choose(world, pose, target, config)
    elif not in_view(world, pose, t, config.hfov_deg):
        verb, magnitude, why = SEARCH.verb, SEARCH.magnitude, SEARCH.reason
    elif abs(math.degrees(bearing)) >= config.ahead_deg:
        turn = nearest_turn(bearing, config.magnitudes)
        verb, magnitude, why = turn.verb, turn.magnitude, f"turning {'left' if bearing > 0 else 'right'}"
    else:
        verb, magnitude, why = "forward", forward_magnitude(world, pose, body_gap(pose, t) - config.goal_m,
                                                            config), "path clear"
        if not magnitude:
            verb, magnitude, why = choose(world, pose, target, config)
    return NavCommand(verb, magnitude, describe(world, pose, target, why, config))


# -- episodes -----------------------------------------------------------------------------------------

Policy = Callable[[World, Pose], NavCommand]


@dataclass
class Episode:
    steps: list[tuple[Pose, NavCommand]]  # each pose and the action taken there
    final: Pose
    outcome: str  # reached | stopped short | touched | out of steps
    touched: str = ""  # what a contact stopped, when outcome is touched

    @property
    def success(self) -> bool:
        return self.outcome == "reached"


def rollout(world: World, policy: Policy = expert, max_steps: int = 200,
            magnitudes: Magnitudes = Magnitudes()) -> Episode:
    """Run ``policy`` from the world's start until it stops (reached, or short of the target), touches
    something, or ``max_steps`` actions have run."""
    robot, steps = Robot(world, world.start), []
    target = world.target_object
    for _ in range(max_steps):
        command = policy(world, robot.pose)
        steps.append((robot.pose, command))
        if command.verb == "stop":
            return Episode(steps, robot.pose, "reached" if reached(robot.pose, target) else "stopped short")
        touched = robot.apply(command, magnitudes)
        if touched:
            return Episode(steps, robot.pose, "touched", touched)
    return Episode(steps, robot.pose, "out of steps")


