"""`ros2 launch` support: a launch_ros LaunchDescription from a launch file's NODES and CONFIG.

The embedded launcher (runtime/launcher/) and `ros2 launch` read the same
data. Here, under ROS 2, each NODES entry becomes a launch_ros Node loading
the params file, and every parameter the file gives these nodes becomes a
launch argument, so `ros2 launch edge_llm_ros pipeline.launch.py chunk_words:=3`
overrides `chunk_words` on every node that has it, as `edge-llm-ros launch` does.

A parameter whose value differs between nodes is not declared (a declared
argument has one default); `name:=value` still overrides it on each node,
whose own value is the fallback. `launch` and `launch_ros` are imported inside
describe(), so this module imports without ROS 2.

A `lifecycle` node (a managed one, nodes/managed.py) is a launch_ros LifecycleNode started with
`autostart` false; the launch configures it when its process starts (again after a respawn) and
activates it when a configure succeeds, through launch_ros' ChangeState events and the node's
transition events (OnStateTransition), so it is active without anyone calling `ros2 lifecycle`.

A node's `respawn`, `respawn_delay` and `respawn_max_retries` go to launch_ros'
Node as they are (launch restarts the process itself). A `required` node gets
an on_exit Shutdown; launch emits that exit event on every exit, also the ones
it respawns after, so for a respawning node the Shutdown comes only with the
exit that has no retry left (never, with unlimited retries), as in the
embedded launcher, and never while the launch is shutting down already.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edge_llm_ros.runtime.launcher import PACKAGE, LaunchError, NodeSpec, find_config
from edge_llm_ros.runtime.params import format_param_value, load_params_files


def config_path(config: str) -> Path:
    """The params file: the installed share/edge_llm_ros/config first, then the source tree's."""
    try:
        from ament_index_python.packages import get_package_share_directory

        installed = Path(get_package_share_directory(PACKAGE)) / "config" / config
        if installed.is_file():
            return installed
    except (ImportError, LookupError, OSError):  # PackageNotFoundError is a LookupError; no AMENT_PREFIX_PATH
        pass
    return find_config(config, Path(__file__).resolve().parents[1] / "launch" / "_.launch.py")


def describe(nodes: list[dict[str, Any]], config: str, overlays: Sequence[Path] = ()):
    """launch.LaunchDescription for NODES (launch file dicts) with CONFIG (a params file under config/)
    and ``overlays``, params files layered over it in order (a launch file's OVERLAY argument)."""
    from launch.actions import DeclareLaunchArgument, Shutdown
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import LifecycleNode, Node

    from launch import LaunchDescription

    source = Path(f"<{config} launch>")
    specs = [NodeSpec.from_entry(entry, source) for entry in nodes]
    params_file = config_path(config)
    files = [str(params_file), *map(str, overlays)]
    node_params = {spec.fqn: load_params_files(files, spec.fqn) for spec in specs}

    defaults: dict[str, set[str]] = {}
    for params in node_params.values():
        for key, value in params.items():
            defaults.setdefault(key, set()).add(format_param_value(value))
    actions: list = [
        DeclareLaunchArgument(key, default_value=next(iter(values)),
                              description=f"parameter '{key}' of every node that has it in {config}")
        for key, values in sorted(defaults.items()) if len(values) == 1
    ] + security()
    for spec in specs:
        if spec.cmd or spec.module:
            raise LaunchError(f"node {spec.fqn}: 'cmd' and 'module' are for the embedded launcher only")
        overrides = {key: LaunchConfiguration(key, default=format_param_value(value))
                     for key, value in node_params[spec.fqn].items()}
        extra: dict[str, Any] = {"ros_arguments": ["--enclave", spec.fqn]}  # its enclave when keystore:= is given
        if spec.required and (on_exit := _shutdown_on_last_exit(spec, Shutdown)) is not None:
            extra["on_exit"] = on_exit
        if spec.prefix:
            extra["prefix"] = shlex.join(spec.prefix)
        if spec.respawn:
            extra.update(respawn=True, respawn_delay=spec.respawn_delay, respawn_max_retries=spec.respawn_max_retries)
        if spec.lifecycle:
            node = LifecycleNode(package=PACKAGE, executable=spec.executable, name=spec.name,
                                 namespace=spec.namespace, parameters=[*files, overrides, {"autostart": False}],
                                 remappings=spec.remappings, output="screen", **extra)
            actions += [node, *_bring_up(node)]
        else:
            actions.append(Node(package=PACKAGE, executable=spec.executable, name=spec.name,
                                namespace=spec.namespace or None, parameters=[*files, overrides],
                                remappings=spec.remappings, output="screen", **extra))
    return LaunchDescription(actions + foxglove(next((spec.namespace for spec in specs if spec.namespace), "edge_llm")))


def security() -> list:
    """`keystore:=DIR`: SROS2's environment for every node (ROS_SECURITY_ENABLE, Enforce, the keystore),
    each node in the enclave of its fully qualified name. The rmw decides what that means: a Fast DDS
    built without its security plugins, as ../shared/ros2's is, refuses to create the nodes ("This Fast
    DDS version doesn't have the security libraries"), so a secured launch never runs unsecured.
    `edge-llm-ros launch ... keystore:=DIR` is the secured deployment of this package (docs/security.md)."""
    from launch.actions import DeclareLaunchArgument, SetEnvironmentVariable
    from launch.conditions import IfCondition
    from launch.substitutions import LaunchConfiguration, PythonExpression

    given = IfCondition(PythonExpression(["'", LaunchConfiguration("keystore"), "' != ''"]))
    return [DeclareLaunchArgument("keystore", default_value="",
                                  description="a keystore (edge-llm-ros security create): SROS2 security, each "
                                              "node in its enclave"),
            SetEnvironmentVariable("ROS_SECURITY_KEYSTORE", LaunchConfiguration("keystore"), condition=given),
            SetEnvironmentVariable("ROS_SECURITY_ENABLE", "true", condition=given),
            SetEnvironmentVariable("ROS_SECURITY_STRATEGY", "Enforce", condition=given)]


def foxglove(namespace: str) -> list:
    """`foxglove:=true` (and `foxglove_port:=`, 8765 by default): a foxglove_bridge_node beside the nodes,
    as the embedded launcher adds one (runtime/launcher/plan.py launcher_arguments)."""
    from launch.actions import DeclareLaunchArgument
    from launch.conditions import IfCondition
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    from edge_llm_ros.runtime.launcher.plan import FOXGLOVE_PORT

    return [DeclareLaunchArgument("foxglove", default_value="false",
                                  description="true: foxglove_bridge_node serves the graph on Foxglove's WebSocket protocol"),
            DeclareLaunchArgument("foxglove_port", default_value=str(FOXGLOVE_PORT),
                                  description="the Foxglove WebSocket server's port (127.0.0.1)"),
            Node(package=PACKAGE, executable="foxglove_bridge_node", name="foxglove_bridge", namespace=namespace,
                 parameters=[{"port": LaunchConfiguration("foxglove_port")}], output="screen",
                 condition=IfCondition(LaunchConfiguration("foxglove")))]


def rviz(config: str) -> list:
    """The `rviz` launch argument (default false) and what it starts: rviz2 with ``config`` (an .rviz
    file under config/) where rviz2 is installed; where it is not, a line saying so."""
    import shutil

    from launch.actions import DeclareLaunchArgument, ExecuteProcess, LogInfo, OpaqueFunction
    from launch.substitutions import LaunchConfiguration

    def start(context):
        if LaunchConfiguration("rviz").perform(context).lower() != "true":
            return []
        path = config_path(config)
        if shutil.which("rviz2") is None:
            return [LogInfo(msg=f"rviz:=true: rviz2 is not installed here (apt install ros-$ROS_DISTRO-rviz2); "
                                f"on a machine that has it: rviz2 -d {path}")]
        return [ExecuteProcess(cmd=["rviz2", "-d", str(path)], output="screen")]

    return [DeclareLaunchArgument("rviz", default_value="false", description=f"true: rviz2 with config/{config}"),
            OpaqueFunction(function=start)]


def _bring_up(node) -> list:
    """Event handlers that configure a LifecycleNode when its process starts and activate it when a
    configure succeeded (its transition event from configuring to inactive)."""
    from launch.actions import EmitEvent, RegisterEventHandler
    from launch.event_handlers import OnProcessStart
    from launch.events import matches_action
    from launch_ros.event_handlers import OnStateTransition
    from launch_ros.events.lifecycle import ChangeState
    from lifecycle_msgs.msg import Transition

    def change(transition_id: int):
        return EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node), transition_id=transition_id))

    return [RegisterEventHandler(OnProcessStart(target_action=node, on_start=[change(Transition.TRANSITION_CONFIGURE)])),
            RegisterEventHandler(OnStateTransition(target_lifecycle_node=node, start_state="configuring",
                                                   goal_state="inactive",
                                                   entities=[change(Transition.TRANSITION_ACTIVATE)]))]


def _shutdown_on_last_exit(spec: NodeSpec, Shutdown):
    """on_exit of a required node: a callback returning Shutdown when the node exits on its own (for
    a respawning one, on the exit that has no retry left). An exit during shutdown adds no second
    Shutdown: launch_ros stops its ROS adapter (there is one once a LifecycleNode runs) on every
    Shutdown event, and a second stop fails the launch ("Cannot shutdown a ROS adapter that is
    not running", exit code 1 after Ctrl-C)."""
    reason = f"required node {spec.fqn} exited"
    if spec.respawn and spec.respawn_max_retries < 0:
        return None  # respawned for ever
    exits = itertools.count(1)

    def on_exit(event, context):
        last = not spec.respawn or next(exits) > spec.respawn_max_retries
        return [Shutdown(reason=reason)] if last and not context.is_shutdown else None

    return on_exit
