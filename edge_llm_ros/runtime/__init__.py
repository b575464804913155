"""The middleware the nodes see: rclpy when ROS 2 is sourced, the embedded Zenoh backend otherwise.

Nodes import this module instead of rclpy:

    from edge_llm_ros import runtime as rt
    rt.init()
    node = rt.Node("echo_node")
    String = rt.message("std_msgs/msg/String")
    node.create_subscription(String, "instruction", callback, 10)
    rt.spin(node)

`EDGE_LLM_BACKEND=zenoh|rclpy` forces a backend; the default is rclpy when
it imports, the embedded backend otherwise. Both give the same Node methods
(rclpy's names and signatures), `message/service/action(name)` for types,
`ActionServer`/`ActionClient`, and `spin`, `spin_until_future_complete`,
`init`, `shutdown`, `ok`.

`shaped(node, publisher)` puts a publisher on the emulated link its node's
`link_emulation` parameters give its topic (link.py); the embedded backend
does that for every publisher by itself, so the call matters under rclpy.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

from .interfaces import InterfaceError, normalize_name


def _choose_backend() -> str:
    forced = os.environ.get("EDGE_LLM_BACKEND", "").strip().lower()
    if forced in ("zenoh", "rclpy"):
        return forced
    if forced:
        raise ValueError(f"EDGE_LLM_BACKEND must be 'zenoh' or 'rclpy', got '{forced}'")
    return "rclpy" if importlib.util.find_spec("rclpy") is not None else "zenoh"


BACKEND = _choose_backend()

if BACKEND == "rclpy":  # pragma: no cover - exercised only where ROS 2 is installed
    import rclpy
    from rclpy.action import ActionClient, ActionServer, CancelResponse, GoalResponse
    from rclpy.node import Node
    from rclpy.qos import QoSProfile
    from rclpy.task import Future

    from .link import rclpy_shaped as shaped

    init, shutdown, ok, spin, spin_once = rclpy.init, rclpy.shutdown, rclpy.ok, rclpy.spin, rclpy.spin_once
    spin_until_future_complete = rclpy.spin_until_future_complete
    ServiceTimeoutError = TimeoutError

    def _import_type(name: str, kind: str) -> Any:
        pkg, kind, cls = normalize_name(name, kind).split("/")
        try:
            return getattr(importlib.import_module(f"{pkg}.{kind}"), cls)
        except (ImportError, AttributeError) as exc:
            raise InterfaceError(f"unknown {kind} type '{name}' ({exc})") from exc

    def message(name: str) -> Any:
        return _import_type(name, "msg")

    def service(name: str) -> Any:
        return _import_type(name, "srv")

    def action(name: str) -> Any:
        return _import_type(name, "action")

else:
    from .actions import ActionClient, ActionServer, CancelResponse, GoalResponse
    from .embedded import (
        ActionClass,
        Future,
        Node,
        QoSProfile,
        ServiceClass,
        ServiceTimeoutError,
        init,
        ok,
        shaped,
        shutdown,
        spin,
        spin_once,
        spin_until_future_complete,
    )
    from .interfaces import registry

    def message(name: str) -> Any:
        """The class of a message type, e.g. message('std_msgs/msg/String')."""
        return registry().message_class(name)

    def service(name: str) -> Any:
        return ServiceClass(name)

    def action(name: str) -> Any:
        return ActionClass(name)


__all__ = [
    "BACKEND", "ActionClient", "ActionServer", "CancelResponse", "Future", "GoalResponse", "InterfaceError", "Node",
    "QoSProfile", "ServiceTimeoutError", "action", "init", "message", "ok", "service", "shaped", "shutdown", "spin",
    "spin_once", "spin_until_future_complete",
]
