"""The middleware the nodes see: rclpy when ROS 2 is sourced, the embedded Zenoh backend otherwise.

Nodes import this module instead of rclpy:

    from edge_llm_ros import runtime as rt
    rt.init()
    node = rt.Node("echo_node")
    String = rt.message("std_msgs/msg/String")
    node.create_subscription(String, "instruction", callback, 10)
    rt.spin(node)

Which backend: a sourced ROS 2 environment (`source .venv/ros2_setup.sh`, or
/opt/ros/<distro>/setup.bash: ROS_DISTRO is set) selects rclpy; otherwise the embedded
backend runs, also where rclpy is installed but not sourced. `EDGE_LLM_BACKEND=zenoh|rclpy`
forces one. `WHY` says why, and every node logs it at start. Both give the same Node methods
(rclpy's names and signatures), `message/service/action(name)` for types,
`ActionServer`/`ActionClient`, and `spin`, `spin_until_future_complete`,
`init`, `shutdown`, `ok`; ros.py lists where rclpy needed help to behave as the embedded
backend does.

`stoppable(fn, ...)` calls fn so that a shutdown signal ends its work (loading a model,
calibrating) at once with `Stopped`, a KeyboardInterrupt (stopping.py); elsewhere a signal only
shuts the context down and spin returns.

Who sent a message: a subscription callback that takes two parameters gets (message, info), as
under rclpy; `info` is rclpy's message-info dict plus `publisher_gid`, the 16-byte gid of the
publisher that sent it (rmw's: the attachment's on Zenoh, the writer's GUID on Fast DDS), which
rclpy Jazzy itself leaves out (publisher_gids.py takes it through rcl). `publisher_gid(publisher)`
is a publisher's own, the one its messages carry.

`shaped(node, publisher)` puts a publisher on the emulated link its node's
`link_emulation` parameters give its topic (link.py); the embedded backend
does that for every publisher by itself, so the call matters under rclpy.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

from edge_llm_ros.runtime.interfaces import InterfaceError, normalize_name
from edge_llm_ros.runtime.stopping import Stopped, stoppable


def _choose_backend() -> tuple[str, str]:
    """(backend, why)."""
    forced = os.environ.get("EDGE_LLM_BACKEND", "").strip().lower()
    if forced in ("zenoh", "rclpy"):
        return forced, f"EDGE_LLM_BACKEND={forced}"
    if forced:
        raise ValueError(f"EDGE_LLM_BACKEND must be 'zenoh' or 'rclpy', got '{forced}'")
    distro = os.environ.get("ROS_DISTRO", "")
    if not distro:
        return "zenoh", "no ROS 2 environment is sourced (ROS_DISTRO is unset)"
    if importlib.util.find_spec("rclpy") is None:
        return "zenoh", f"ROS 2 {distro} is sourced, but rclpy does not import in this Python"
    return "rclpy", f"ROS 2 {distro} is sourced"


BACKEND, WHY = _choose_backend()

if BACKEND == "rclpy":  # pragma: no cover - exercised only where ROS 2 is installed
    import rclpy
    from rclpy.action import CancelResponse, GoalResponse
    from rclpy.qos import QoSProfile
    from rclpy.task import Future

    from edge_llm_ros.runtime.link import rclpy_shaped as shaped
    from edge_llm_ros.runtime.publisher_gids import publisher_gid
    from edge_llm_ros.runtime.ros import (
        ActionClient,
        ActionServer,
        LifecycleNode,
        LifecycleState,
        Node,
        ParameterError,
        TransitionCallbackReturn,
        init,
        shutdown,
        spin,
    )

    ok, spin_once, spin_until_future_complete = rclpy.ok, rclpy.spin_once, rclpy.spin_until_future_complete
    ServiceTimeoutError = TimeoutError

    def _import_type(name: str, kind: str) -> Any:
        pkg, kind, cls = normalize_name(name, kind).split("/")
        try:
            return getattr(importlib.import_module(f"{pkg}.{kind}"), cls)
        except (ImportError, AttributeError) as exc:
            hint = ""
            if pkg == "edge_llm_ros" and isinstance(exc, ImportError):  # ROS 2 sourced, this package's install not
                hint = ("; ROS 2 is sourced but not this package's interfaces: `make ros2`, then `source "
                        "build/ros2/install/local_setup.bash` (or EDGE_LLM_BACKEND=zenoh for the embedded backend)")
            raise InterfaceError(f"unknown {kind} type '{name}' ({exc}){hint}") from exc

    def message(name: str) -> Any:
        return _import_type(name, "msg")

    def service(name: str) -> Any:
        return _import_type(name, "srv")

    def action(name: str) -> Any:
        return _import_type(name, "action")

else:
    from edge_llm_ros.runtime.actions import ActionClient, ActionServer, CancelResponse, GoalResponse
    from edge_llm_ros.runtime.embedded import (
        ActionClass,
        Future,
        Node,
        ParameterError,
        QoSProfile,
        ServiceClass,
        ServiceTimeoutError,
        init,
        ok,
        publisher_gid,
        shaped,
        shutdown,
        spin,
        spin_once,
        spin_until_future_complete,
    )
    from edge_llm_ros.runtime.interfaces import registry
    from edge_llm_ros.runtime.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

    def message(name: str) -> Any:
        """The class of a message type, e.g. message('std_msgs/msg/String')."""
        return registry().message_class(name)

    def service(name: str) -> Any:
        return ServiceClass(name)

    def action(name: str) -> Any:
        return ActionClass(name)


__all__ = [
    "BACKEND", "WHY", "ActionClient", "ActionServer", "CancelResponse", "Future", "GoalResponse", "InterfaceError", "LifecycleNode",
    "LifecycleState", "Node", "TransitionCallbackReturn",
    "ParameterError", "QoSProfile", "ServiceTimeoutError", "Stopped", "action", "init", "message", "ok", "publisher_gid",
    "service", "shaped",
    "shutdown", "spin", "spin_once", "spin_until_future_complete", "stoppable",
]
