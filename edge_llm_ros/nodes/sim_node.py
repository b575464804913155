"""sim_node: the 2D simulator for the Go2 navigator (issue 15): a world, a kinematic Go2, its camera.

The world is `world` (a YAML file, or the name of one in config/worlds/, e.g. `default`) or, with
`world: seeded` (or `''`), the one nav.worldgen draws from `seed`. The robot (nav.world.Robot) follows
the latest `/cmd_vel` (geometry_msgs/Twist: linear.x forward, angular.z to the left, clamped to
`max_speed_mps`, `max_turn_rps`), integrated `physics_hz` times a second; a command older than
`cmd_timeout_s` stops it. A motion into a wall or an object stops before the contact, and the first
contact of each streak is logged ("collision: touched orange chair at (6.02, 1.31)").

Publishes:
- `/camera/image_raw` (sensor_msgs/Image, rgb8, frame `camera`) at `rate_hz`: nav.camera's
  pinhole render of what the robot sees;
- `/odom` (nav_msgs/Odometry, odom -> base_link) every physics step: the odom frame is the world
  frame (odometry is perfect here); the twist is the command being followed (linear 0 while a
  contact blocks it);
- `/tf` (tf2_msgs/TFMessage: odom -> base_link, base_link -> camera) with it, where tf2_msgs is
  installed (a ROS 2 without it gets a log line instead; the embedded backend always has it);
- `~/markers` (visualization_msgs/MarkerArray, transient local) for rviz: walls, boxes and objects
  in `odom`, the robot in `base_link`; at start and after each reset;
- `~/world` (std_msgs/String, transient local): the world as YAML (nav.world.World.to_dict),
  for tools that need the map (the expert, the nav bench);
- `~/path` (nav_msgs/Path in `odom`, every 0.5 s): the robot's way since the last reset, a pose
  per 5 cm or 5 degrees (the last 2000), and `~/goal` (geometry_msgs/PoseStamped, transient
  local): the target object's position, both for rviz (config/go2_sim.rviz);
- its status on `/diagnostics` (nodes/diagnostics.py): the world, the pose, the target's distance;
  WARN in a period the robot touched something.

Subscribes `~/reset` (std_msgs/Int32): a seed >= 0 draws that world, a negative number reloads
the configured one; the robot goes back to the world's start, at rest until the next /cmd_vel.

Parameters: SimParams below, all read-only. A bad world file exits with code 2 and the field at fault.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from array import array
from pathlib import Path

import yaml

from edge_llm_ros import runtime as rt
from edge_llm_ros.nav.camera import Camera
from edge_llm_ros.nav.world import ROBOT_RADIUS, Robot, World, WorldError
from edge_llm_ros.nav.worldgen import GenerateConfig, generate
from edge_llm_ros.nodes.common import latched_qos, run_node, stamp
from edge_llm_ros.nodes.diagnostics import OK, WARN, Increase, Status, Updater
from edge_llm_ros.nodes.parameters import declare, param
from edge_llm_ros.runtime.interfaces import interface_dirs

CUBE, CYLINDER, TEXT, DELETEALL = 1, 3, 9, 3  # visualization_msgs/Marker types and action
PATH_STEP_M, PATH_TURN_RAD, PATH_POSES = 0.05, math.radians(5.0), 2000  # ~/path: a pose per step or turn, the last 2000
PATH_PERIOD_S = 0.5  # ~/path is published this often


@dataclasses.dataclass(frozen=True)
class SimParams:
    world: str = param("", "world YAML: a path, or a name in config/worlds/ (e.g. 'default'); 'seeded' (or '') = "
                           "drawn from seed")
    seed: int = param(0, "the drawn world's seed (when world is 'seeded')", low=0, high=2 ** 31 - 1)
    clear_path: bool = param(True, "drawn worlds have a straight way from the start to the target (as the "
                                   "navigator's training and evaluation worlds, edge-llm-ros train nav)")
    rate_hz: float = param(15.0, "camera frames per second on /camera/image_raw", low=10.0, high=30.0)
    physics_hz: float = param(50.0, "/cmd_vel integration steps per second (/odom and /tf with each)", low=10.0,
                              high=200.0)
    width: int = param(128, "image width in pixels", low=16, high=1280)
    height: int = param(96, "image height in pixels", low=16, high=960)
    hfov_deg: float = param(90.0, "the camera's horizontal field of view, degrees", low=30.0, high=150.0)
    cmd_timeout_s: float = param(0.5, "the robot stops when the last /cmd_vel is older than this", low=0.05,
                                 high=10.0)
    max_speed_mps: float = param(1.0, "|linear.x| is clamped to this", low=0.05, high=3.0)
    max_turn_rps: float = param(2.0, "|angular.z| is clamped to this", low=0.05, high=6.0)


SEEDED = ("", "seeded")  # `world` values that draw the world from `seed` ('' cannot be a `ros2 launch` argument)


def find_world(name: str) -> Path:
    """The world file ``name``: a path, else config/worlds/<name>[.yaml] of the source tree or an install."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    stem = name if name.endswith(".yaml") else f"{name}.yaml"
    for root in interface_dirs():
        if (root / "config" / "worlds" / stem).is_file():
            return root / "config" / "worlds" / stem
    raise ValueError(f"parameter 'world': {name} is not a file, nor a world in config/worlds/")


def clamp(value: float, limit: float) -> float:
    """``value`` within [-limit, limit]; 0 for NaN or infinity."""
    value = float(value)
    return max(-limit, min(limit, value)) if math.isfinite(value) else 0.0


def quaternion(yaw: float) -> dict:
    return dict(x=0.0, y=0.0, z=math.sin(yaw / 2), w=math.cos(yaw / 2))


class SimNode(rt.Node):
    single_threaded = True  # rclpy: its callbacks are light and frequent (runtime/ros.spin)

    def __init__(self, **node_options) -> None:
        super().__init__("sim", **node_options)
        self.params = p = declare(self, SimParams)
        self.camera = Camera(p.width, p.height, p.hfov_deg)
        self.lock = threading.Lock()
        self.world = self.load_world(-1)
        self.robot = Robot(self.world, self.world.start)
        self.command, self.command_time, self.last_tick = (0.0, 0.0), -math.inf, time.monotonic()
        self.touching = ""
        self.msg = {name: rt.message(name) for name in (
            "sensor_msgs/msg/Image", "nav_msgs/msg/Odometry", "geometry_msgs/msg/TransformStamped",
            "visualization_msgs/msg/Marker", "visualization_msgs/msg/MarkerArray", "std_msgs/msg/String",
            "nav_msgs/msg/Path", "geometry_msgs/msg/PoseStamped")}
        self.image_pub = self.create_publisher(self.msg["sensor_msgs/msg/Image"], "/camera/image_raw", 5)
        self.odom_pub = self.create_publisher(self.msg["nav_msgs/msg/Odometry"], "/odom", 10)
        self.tf_pub = self.tf_publisher()
        self.marker_pub = self.create_publisher(self.msg["visualization_msgs/msg/MarkerArray"], "~/markers",
                                                latched_qos())
        self.world_pub = self.create_publisher(self.msg["std_msgs/msg/String"], "~/world", latched_qos())
        self.path = self.msg["nav_msgs/msg/Path"]()  # the robot's way since the last reset (rviz)
        self.path.header.frame_id = "odom"
        self.path_pub = self.create_publisher(self.msg["nav_msgs/msg/Path"], "~/path", 10)
        self.goal_pub = self.create_publisher(self.msg["geometry_msgs/msg/PoseStamped"], "~/goal", latched_qos())
        self.collisions, self.new_collisions = 0, Increase()  # since start; since the last status
        self.diagnostics = Updater(self, hardware_id=f"{self.get_fully_qualified_name()} (2D simulator)")
        self.diagnostics.add("world", self.diagnose)
        self.create_subscription(rt.message("geometry_msgs/msg/Twist"), "/cmd_vel", self.on_cmd_vel, 10)
        self.create_subscription(rt.message("std_msgs/msg/Int32"), "~/reset", self.on_reset, 10)
        self.create_timer(1.0 / p.physics_hz, self.on_physics)
        self.create_timer(1.0 / p.rate_hz, self.on_camera)
        self.create_timer(PATH_PERIOD_S, lambda: self.path_pub.publish(stamp(self, self.path)))
        self.publish_world()
        self.get_logger().info(f"camera {p.width}x{p.height} ({p.hfov_deg:g} deg) at {p.rate_hz:g} Hz on "
                               f"/camera/image_raw; physics at {p.physics_hz:g} Hz")

    # -- the world -------------------------------------------------------------------------------------

    def load_world(self, seed: int) -> World:
        """World ``seed`` (>= 0) or the configured one (< 0); ValueError naming what is wrong."""
        if seed < 0 and self.params.world not in SEEDED:
            try:
                return World.from_yaml(find_world(self.params.world))
            except WorldError as exc:
                raise ValueError(f"parameter 'world': {exc}") from None
        return generate(seed if seed >= 0 else self.params.seed, GenerateConfig(clear_path=self.params.clear_path))

    def publish_world(self) -> None:
        self.get_logger().info(self.world.summary())
        self.world_pub.publish(self.msg["std_msgs/msg/String"](data=yaml.safe_dump(self.world.to_dict(),
                                                                                    sort_keys=False)))
        self.marker_pub.publish(self.markers())
        goal = self.msg["geometry_msgs/msg/PoseStamped"]()
        goal.header.frame_id = "odom"
        goal.pose.position.x, goal.pose.position.y = self.world.target_object.position
        goal.pose.orientation.w = 1.0
        self.goal_pub.publish(stamp(self, goal))

    def diagnose(self, status: Status) -> None:
        """WARN when the robot touched something in the last period; the world, the pose, the target."""
        with self.lock:
            world, pose, touching = self.world, self.robot.pose, self.touching
            collisions = self.new_collisions.since_last(self.collisions)
        target = world.target_object
        status.summary(OK, f"{world.name}: target {target.name} {math.hypot(target.position[0] - pose.x, target.position[1] - pose.y):.2f} m away")
        if collisions:
            status.merge(WARN, f"{collisions} collision(s) in the last {self.diagnostics.period:g} s")
        for key, value in (("world", world.name), ("target", target.name),
                           ("target distance m", math.hypot(target.position[0] - pose.x, target.position[1] - pose.y)),
                           ("x m", pose.x), ("y m", pose.y), ("yaw deg", math.degrees(pose.yaw)),
                           ("touching", touching or "nothing"), ("collisions", self.collisions)):
            status.add(key, value)

    def on_reset(self, msg) -> None:
        try:
            world = self.load_world(int(msg.data))
        except (ValueError, RuntimeError) as exc:  # the configured file changed meanwhile, or no world for a seed
            self.get_logger().error(f"reset refused, the world stays: {exc}")
            return
        with self.lock:
            self.world, self.robot, self.touching = world, Robot(world, world.start), ""
            self.path.poses = []
            self.command, self.command_time = (0.0, 0.0), -math.inf  # at rest until the next /cmd_vel
        self.get_logger().info(f"reset ({'seed ' + str(msg.data) if msg.data >= 0 else 'the configured world'})")
        self.publish_world()

    # -- motion ----------------------------------------------------------------------------------------

    def on_cmd_vel(self, msg) -> None:
        """The command to follow: clamped to the limits; a NaN or infinite one means stop."""
        vx, wz = clamp(msg.linear.x, self.params.max_speed_mps), clamp(msg.angular.z, self.params.max_turn_rps)
        with self.lock:
            self.command, self.command_time = (vx, wz), time.monotonic()

    def on_physics(self) -> None:
        """One integration step over the time since the last (at most 3 periods: a stall never teleports)."""
        now = time.monotonic()
        with self.lock:
            dt = min(now - self.last_tick, 3.0 / self.params.physics_hz)
            self.last_tick = now
            vx, wz = self.command if now - self.command_time <= self.params.cmd_timeout_s else (0.0, 0.0)
            hit = self.robot.step(vx, wz, dt)
            pose = self.robot.pose
            newly = hit and not self.touching
            self.touching = hit
            self.collisions += bool(newly)
            self.follow(pose)
        if newly:
            self.get_logger().warning(f"collision: touched {hit} at ({pose.x:.2f}, {pose.y:.2f}); motion stopped")
        self.publish_odometry(pose, 0.0 if hit else vx, wz)

    def follow(self, pose) -> None:
        """(Under the lock.) Add the pose to the path when it moved PATH_STEP_M or turned PATH_TURN_RAD."""
        poses = self.path.poses
        if poses:
            last = poses[-1].pose
            moved = math.hypot(pose.x - last.position.x, pose.y - last.position.y)
            turned = abs(math.remainder(pose.yaw - 2 * math.atan2(last.orientation.z, last.orientation.w), math.tau))
            if moved < PATH_STEP_M and turned < PATH_TURN_RAD:
                return
        here = self.msg["geometry_msgs/msg/PoseStamped"]()
        here.header.frame_id = "odom"
        here.header.stamp = self.get_clock().now().to_msg()
        here.pose.position.x, here.pose.position.y = pose.x, pose.y
        for k, v in quaternion(pose.yaw).items():
            setattr(here.pose.orientation, k, v)
        self.path.poses = (poses + [here])[-PATH_POSES:]

    def publish_odometry(self, pose, vx: float, wz: float) -> None:
        odom = self.msg["nav_msgs/msg/Odometry"]()
        odom.header.frame_id, odom.child_frame_id = "odom", "base_link"
        odom.pose.pose.position.x, odom.pose.pose.position.y = pose.x, pose.y
        for k, v in quaternion(pose.yaw).items():
            setattr(odom.pose.pose.orientation, k, v)
        odom.twist.twist.linear.x, odom.twist.twist.angular.z = vx, wz
        self.odom_pub.publish(stamp(self, odom))
        if self.tf_pub is not None:
            self.tf_pub.publish(self.transforms(odom.header.stamp, pose))

    def tf_publisher(self):
        try:
            self.TFMessage = rt.message("tf2_msgs/msg/TFMessage")
        except rt.InterfaceError as exc:
            self.get_logger().warning(f"tf2_msgs is not available, /tf is not published ({exc})")
            return None
        return self.create_publisher(self.TFMessage, "/tf", 10)

    def transforms(self, now, pose):
        def transform(parent: str, child: str, x: float, y: float, z: float, yaw: float):
            t = self.msg["geometry_msgs/msg/TransformStamped"](child_frame_id=child)
            t.header.stamp, t.header.frame_id = now, parent
            t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = x, y, z
            for k, v in quaternion(yaw).items():
                setattr(t.transform.rotation, k, v)
            return t

        return self.TFMessage(transforms=[
            transform("odom", "base_link", pose.x, pose.y, 0.0, pose.yaw),
            transform("base_link", "camera", self.camera.forward_m, 0.0, self.camera.height_m, 0.0)])

    # -- camera and markers ------------------------------------------------------------------------------

    def on_camera(self) -> None:
        with self.lock:
            world, pose = self.world, self.robot.pose
        frame = self.camera.render(world, pose)  # [H, W, 3] uint8 RGB
        h, w = frame.shape[:2]
        image = self.msg["sensor_msgs/msg/Image"](height=h, width=w, encoding="rgb8", is_bigendian=0, step=3 * w,
                                                   data=array("B", frame.tobytes()))
        image.header.frame_id = "camera"
        self.image_pub.publish(stamp(self, image))

    def markers(self):
        Marker = self.msg["visualization_msgs/msg/Marker"]
        world, wall_h = self.world, self.camera.wall_height_m
        now = self.get_clock().now().to_msg()

        def marker(ns: str, i: int, kind: int, frame: str, xyz, scale, rgb, yaw: float = 0.0, text: str = ""):
            m = Marker(ns=ns, id=i, type=kind, action=0, text=text, frame_locked=frame == "base_link")
            m.header.stamp, m.header.frame_id = now, frame
            m.pose.position.x, m.pose.position.y, m.pose.position.z = xyz
            for k, v in quaternion(yaw).items():
                setattr(m.pose.orientation, k, v)
            m.scale.x, m.scale.y, m.scale.z = scale
            m.color.r, m.color.g, m.color.b, m.color.a = rgb[0] / 255, rgb[1] / 255, rgb[2] / 255, 1.0
            return m

        clear = Marker(action=DELETEALL)
        clear.header.frame_id = "odom"
        out = [clear]
        for i, (x0, y0, x1, y1) in enumerate(world.segments.tolist()):
            if not world.segment_is_box[i]:
                out.append(marker("walls", i, CUBE, "odom", ((x0 + x1) / 2, (y0 + y1) / 2, wall_h / 2),
                                  (math.hypot(x1 - x0, y1 - y0), 0.05, wall_h), world.colours.wall,
                                  math.atan2(y1 - y0, x1 - x0)))
        for i, (x0, y0, x1, y1) in enumerate(world.boxes):
            out.append(marker("boxes", i, CUBE, "odom", ((x0 + x1) / 2, (y0 + y1) / 2, wall_h / 2),
                              (x1 - x0, y1 - y0, wall_h), world.colours.box))
        for i, o in enumerate(world.objects):
            out.append(marker("objects", i, CYLINDER, "odom", (*o.position, o.height / 2),
                              (2 * o.radius, 2 * o.radius, o.height), o.colour))
            out.append(marker("labels", i, TEXT, "odom", (*o.position, o.height + 0.2), (0.0, 0.0, 0.2),
                              (255, 255, 255), text=o.name + (" (target)" if o.name == world.target else "")))
        out.append(marker("robot", 0, CYLINDER, "base_link", (0.0, 0.0, 0.2),
                          (2 * ROBOT_RADIUS, 2 * ROBOT_RADIUS, 0.4), (60, 60, 60)))
        return self.msg["visualization_msgs/msg/MarkerArray"](markers=out)


def main(args: list[str] | None = None) -> int:
    return run_node(SimNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
