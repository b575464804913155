"""Replay fixtures for the Go2 navigator: rosbag2 bags recorded from the simulator, with the ground
truth inside (issue 28; first written for issue 15).

    python -m edge_llm_ros.tools.nav_bags                 # -> test/data/nav_bags/
    python -m edge_llm_ros.tools.nav_bags --out /tmp/bags

The simulator runs here in simulated time, as sim_node runs it on a real clock: the same world
(evaluation world seed 100, never trained on; `clear_path`), the same kinematic Go2 (nav.world.Robot,
integrated at PHYSICS_HZ) and the same camera (nav.camera, 128x96 rgb8). The robot is driven by the
camera expert (nav.expert.camera_expert, the teacher the navigator learned from), each of its actions
executed as go2_bridge_node executes a NavAction (nav.motion.Executor, config/go2_sim.yaml's limits),
so the robot turns, approaches and stops as it would in the simulator. Each bag holds, on its topics
as sim_node and go2_bridge_node publish them:

    /camera/image_raw      sensor_msgs/Image     the frames, FRAME_HZ, stamped when taken
    /odom                  nav_msgs/Odometry     the robot's true pose (the simulator's odometry is perfect), ODOM_HZ
    /sim/world             std_msgs/String       the world as YAML (the target's position), once at the start
    /cmd_vel               geometry_msgs/Twist   the motion driven, the bridge's rate
    /edge_llm/instruction  std_msgs/String       "go to the red chair" after the first frame; '' at the end

so a replay test needs nothing else for its ground truth: where the robot was when a frame was taken,
and where the target is. The bags:

- `moving`: from the world's start, the target out of view: search turns, the turn toward the chair
  once seen, the approach, the stop in reach; then HOLD_S standing there.
- `stale`: the robot stands facing the chair 3 m away while the camera's stamps lag the bag's time by
  STALE_S (a camera driver that stamps late frames, or a stalled pipeline): every frame is stale when
  it arrives.
- `no_camera`: the instruction alone, for the missing-topic error (`bag play --require`).

Stamps are sim time from EPOCH_NS, each bag on its own stretch, so a frame stamp tells which bag it
came from; replay them with `edge-llm-ros bag play BAG --clock` and nodes with use_sim_time:=true.
MCAP with zstd-compressed chunks keeps them small. The same bytes every run.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "test" / "data" / "nav_bags"
CAMERA = ("/camera/image_raw", "sensor_msgs/msg/Image")
ODOM = ("/odom", "nav_msgs/msg/Odometry")
WORLD = ("/sim/world", "std_msgs/msg/String")
CMD_VEL = ("/cmd_vel", "geometry_msgs/msg/Twist")
INSTRUCTION = ("/edge_llm/instruction", "std_msgs/msg/String")
GOAL = "go to the red chair"
SEED = 100  # an evaluation world (edge-llm-ros train nav --eval-worlds 100-109)
FRAME_HZ = 5.0
ODOM_HZ = 20.0  # also the rate of /cmd_vel (the bridge's rate_hz)
PHYSICS_HZ = 50.0  # sim_node's physics_hz
INSTRUCTION_AT_S = 0.1
HOLD_S = 4.0  # the robot stands in reach after the expert's stop
STALE_S = 3.0  # how far the `stale` bag's frame stamps lag its time
STAND_S = 6.0  # length of the bags where the robot stands
MAX_S = 90.0  # the expert gives up here (it reaches the chair of seed 100 well before)
EPOCH_NS = 1_735_689_600 * 10**9  # 2025-01-01T00:00:00Z: bag time and header stamps start here


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    camera: bool = True


SCENARIOS = (
    Scenario("moving", "from the start: search turns, the turn toward the red chair, the approach, the stop"),
    Scenario("stale", f"standing, facing the red chair; frames stamped {STALE_S:g} s late"),
    Scenario("no_camera", "the instruction alone, no /camera/image_raw: for the missing-topic error", camera=False),
)


def start_ns(scenario: Scenario) -> int:
    """Each bag on its own stretch of time (later bags later: replayed in order, sim time goes forward)."""
    return EPOCH_NS + 200 * 10**9 * SCENARIOS.index(scenario)


def world():
    from edge_llm_ros.nav.worldgen import GenerateConfig, generate

    return generate(SEED, GenerateConfig(clear_path=True))


def bridge_limits():
    """go2_bridge's limits in config/go2_sim.yaml (the bag's motion is the bridge's)."""
    from edge_llm_ros.nav.motion import MotionLimits

    bridge = yaml.safe_load((REPO / "config" / "go2_sim.yaml").read_text())["/**/go2_bridge"]
    p = bridge["ros__parameters"]
    return MotionLimits(max_linear_mps=p["max_linear_mps"], max_angular_rps=p["max_angular_rps"],
                        max_linear_accel=p["max_linear_accel"], max_angular_accel=p["max_angular_accel"],
                        max_distance_m=p["max_distance_m"], max_angle_rad=math.radians(p["max_angle_deg"]),
                        max_frame_age_s=p["max_frame_age_s"], watchdog_s=p["watchdog_s"]), p["rate_hz"]


# -- the simulation ----------------------------------------------------------------------------------


@dataclass
class Tick:
    """The simulator's state at one physics step."""

    t_s: float
    pose: object  # nav.world.Pose
    vx: float
    wz: float


def drive(w, pose, seconds: float | None) -> list[Tick]:
    """The robot from ``pose``, driven by the camera expert through the bridge's executor, one tick a
    physics step; with ``seconds`` None, until HOLD_S after the expert's stop (else it stands for
    ``seconds``)."""
    from edge_llm_ros.nav.actions import Magnitudes
    from edge_llm_ros.nav.expert import camera_expert
    from edge_llm_ros.nav.motion import Command, Executor
    from edge_llm_ros.nav.world import Robot

    limits, _ = bridge_limits()
    dt = 1.0 / PHYSICS_HZ
    executor, robot = Executor(limits, dt), Robot(w, pose)
    ticks, t, stopped_at = [], 0.0, None if seconds is None else 0.0
    end = seconds
    while end is None or t < end:
        if stopped_at is None and executor.motion is None and t >= INSTRUCTION_AT_S:
            command = camera_expert(w, robot.pose)
            distance, angle = command.motion(Magnitudes())
            if command.verb == "stop":
                stopped_at, end = t, t + HOLD_S
            else:
                executor.command(Command(distance, angle, label=command.action), t)
        setpoint, _ = executor.tick(t)
        vx, wz = (setpoint.vx, setpoint.wz) if setpoint is not None and not setpoint.stop else (0.0, 0.0)
        ticks.append(Tick(t, robot.pose, vx, wz))
        if robot.step(vx, wz, dt):
            raise SystemExit(f"error: the expert's motion touched something at {robot.pose}")
        t = round(t + dt, 9)
        if t > MAX_S:
            raise SystemExit(f"error: the expert did not stop within {MAX_S:g} s")
    return ticks


def facing_target(w):
    from edge_llm_ros.nav.world import Pose

    x, y = w.target_object.position
    return Pose(w.start.x, w.start.y, math.atan2(y - w.start.y, x - w.start.x))


# -- messages ------------------------------------------------------------------------------------------


def new(ros_type: str, **fields):
    from edge_llm_ros.runtime.interfaces import registry

    return registry().new(ros_type, **fields)


def set_stamp(msg, ns: int) -> None:
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(ns, 10**9)


def image(frame: np.ndarray, stamp_ns: int):
    """sensor_msgs/Image as sim_node publishes it: rgb8, frame `camera`."""
    h, w = frame.shape[:2]
    msg = new(CAMERA[1], height=h, width=w, encoding="rgb8", is_bigendian=0, step=3 * w,
              data=np.frombuffer(frame.tobytes(), dtype=np.uint8))
    msg.header.frame_id = "camera"
    set_stamp(msg, stamp_ns)
    return msg


def odometry(tick: Tick, stamp_ns: int):
    """nav_msgs/Odometry as sim_node publishes it: odom -> base_link, the pose and the twist followed."""
    msg = new(ODOM[1])
    msg.header.frame_id, msg.child_frame_id = "odom", "base_link"
    set_stamp(msg, stamp_ns)
    msg.pose.pose.position.x, msg.pose.pose.position.y = tick.pose.x, tick.pose.y
    msg.pose.pose.orientation.z, msg.pose.pose.orientation.w = math.sin(tick.pose.yaw / 2), math.cos(tick.pose.yaw / 2)
    msg.twist.twist.linear.x, msg.twist.twist.angular.z = tick.vx, tick.wz
    return msg


def every(ticks: list[Tick], hz: float) -> list[Tick]:
    step = round(PHYSICS_HZ / hz)
    return ticks[::step]


def messages(scenario: Scenario, w, camera) -> list[tuple[str, str, int, object]]:
    """(topic, type, bag time, message) in time order."""
    t0 = start_ns(scenario)

    def at(t_s: float) -> int:
        return t0 + round(t_s * 1e9)

    out = [(*INSTRUCTION, at(INSTRUCTION_AT_S), new(INSTRUCTION[1], data=GOAL))]
    if scenario.name == "no_camera":  # the instructions alone
        out.append((*INSTRUCTION, at(STAND_S), new(INSTRUCTION[1], data="")))
        return sorted(out, key=lambda m: m[2])
    out.append((*WORLD, t0, new(WORLD[1], data=yaml.safe_dump(w.to_dict(), sort_keys=False))))
    ticks = drive(w, w.start, None) if scenario.name == "moving" else [
        Tick(k / PHYSICS_HZ, facing_target(w), 0.0, 0.0) for k in range(round(STAND_S * PHYSICS_HZ))]
    lag_ns = round(STALE_S * 1e9) if scenario.name == "stale" else 0
    for tick in every(ticks, FRAME_HZ):
        out.append((*CAMERA, at(tick.t_s), image(camera.render(w, tick.pose), at(tick.t_s) - lag_ns)))
    for tick in every(ticks, ODOM_HZ):
        out.append((*ODOM, at(tick.t_s), odometry(tick, at(tick.t_s))))
        out.append((*CMD_VEL, at(tick.t_s), twist(tick)))
    end_s = ticks[-1].t_s + 1.0 / PHYSICS_HZ
    out.append((*INSTRUCTION, at(end_s), new(INSTRUCTION[1], data="")))
    return sorted(out, key=lambda m: m[2])


def twist(tick: Tick):
    msg = new(CMD_VEL[1])
    msg.linear.x, msg.angular.z = tick.vx, tick.wz
    return msg


def write_bag(path: Path, items: list[tuple[str, str, int, object]]) -> None:
    from edge_llm_ros.runtime.bag import BagWriter
    from edge_llm_ros.runtime.interfaces import registry

    shutil.rmtree(path, ignore_errors=True)
    with BagWriter(path, compression="zstd") as bag:
        for topic, typename, at_ns, msg in items:
            bag.add_topic(topic, typename)
            bag.write(topic, at_ns, registry().serialize(msg, typename))


# -- the ground truth, as a replay test reads it back -----------------------------------------------------


@dataclass(frozen=True)
class GroundTruth:
    """What a bag says happened: the world, the robot's pose over time, and each frame's capture time."""

    world: object  # nav.world.World
    poses: list[tuple[int, object]]  # (stamp ns, nav.world.Pose), in time order
    frames: dict[int, int]  # a frame's header stamp -> the bag time it was recorded at

    def pose_at(self, stamp_ns: int):
        """The pose at ``stamp_ns``: the last odometry at or before it."""
        import bisect

        i = bisect.bisect_right([s for s, _ in self.poses], stamp_ns) - 1
        if i < 0:
            raise ValueError(f"no odometry at or before {stamp_ns}")
        return self.poses[i][1]


def ground_truth(path: Path) -> GroundTruth:
    from edge_llm_ros.nav.world import Pose, World
    from edge_llm_ros.runtime.bag import BagReader
    from edge_llm_ros.runtime.interfaces import registry

    w, poses, frames = None, [], {}
    for m in BagReader(path):
        if m.topic == WORLD[0]:
            w = World.from_dict(yaml.safe_load(registry().deserialize(m.data, m.typename).data), str(path))
        elif m.topic == ODOM[0]:
            odom = registry().deserialize(m.data, m.typename)
            q, p = odom.pose.pose.orientation, odom.pose.pose.position
            poses.append((odom.header.stamp.sec * 10**9 + odom.header.stamp.nanosec,
                          Pose(p.x, p.y, math.atan2(2 * q.w * q.z, 1 - 2 * q.z * q.z))))
        elif m.topic == CAMERA[0]:
            stamp = registry().deserialize(m.data, m.typename).header.stamp
            frames[stamp.sec * 10**9 + stamp.nanosec] = m.timestamp_ns
    if w is None:
        raise ValueError(f"{path}: no {WORLD[0]}")
    return GroundTruth(w, sorted(poses, key=lambda p: p[0]), frames)


# -- the tool -----------------------------------------------------------------------------------------


def record(out: Path) -> None:
    from edge_llm_ros.nav.camera import Camera

    w, camera = world(), Camera()
    for scenario in SCENARIOS:
        items = messages(scenario, w, camera)
        write_bag(out / scenario.name, items)
        seconds = (items[-1][2] - items[0][2]) / 1e9
        frames = sum(1 for m in items if m[0] == CAMERA[0])
        print(f"{out / scenario.name}: {scenario.what} ({seconds:.1f} s, {frames} frames)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge_llm_ros.tools.nav_bags", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the bags")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    record(args.out)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {len(SCENARIOS)} bags to {args.out} ({size / 1e3:.0f} kB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
