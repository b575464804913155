"""The runtime under ROS 2 (rclpy on the sourced RMW), shaped like the embedded backend.

Nodes get rclpy's own classes. What is added here is only what the embedded backend does by itself
and rclpy leaves to each application; these are the places where the two backends could part, and
this module keeps them together:

- Callbacks. The embedded backend runs subscription, timer and service callbacks one at a time
  and each action goal on its own thread. Here :func:`spin` runs a MultiThreadedExecutor. The node's
  default callback group is mutually exclusive, so those callbacks still run one at a time.
  :class:`ActionServer` runs each goal's execute callback on a thread of its own and awaits it from
  a reentrant group. A goal that waits for messages (draft_node waits for `verify`) or for a cancel
  never holds an executor thread, and another goal can always be accepted.
- Parameters. An integer given for a float parameter is taken as that float, as the embedded
  backend does (`stats_period_s: 1` in YAML, or `stats_period_s:=1` on the command line); a wrong
  type, or a value out of the descriptor's range, is a ValueError that names the parameter, worded
  as nodes/parameters.py words it on both backends.
- Shutdown. rclpy's signal handlers shut the context down on SIGINT and SIGTERM, and spin returns,
  as on the embedded backend. No KeyboardInterrupt follows, so a second Ctrl-C (a terminal signals
  the whole process group, and `ros2 launch` signals its nodes again) cannot break the node's
  cleanup. :func:`shutdown` after that does nothing instead of failing (rcl_shutdown already called).
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable

import rclpy
from rclpy.action import ActionServer as _RclpyActionServer
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node as _RclpyNode
from rclpy.parameter import Parameter
from rclpy.task import Future

EXECUTOR_THREADS = 4  # callbacks never wait for long here: goals run on threads of their own


class ParameterError(ValueError):
    """A parameter of the wrong type (the embedded backend raises the same)."""


class Node(_RclpyNode):
    """rclpy's Node, declaring parameters as the embedded backend does (see the module docstring)."""

    def declare_parameter(self, name: str, value: Any = None, descriptor: Any = None,
                          ignore_override: bool = False) -> Parameter:
        override = self._parameter_overrides.get(name)
        if (isinstance(value, float) and override is not None and override.type_ == Parameter.Type.INTEGER):
            self._parameter_overrides[name] = Parameter(name, Parameter.Type.DOUBLE, float(override.value))
        given = self._parameter_overrides.get(name)
        try:
            return super().declare_parameter(name, value, descriptor, ignore_override)
        except InvalidParameterTypeException as exc:
            raise ParameterError(f"parameter '{name}' of {self.get_fully_qualified_name()} must be "
                                 f"{type(value).__name__}, got {given.value if given else None!r}") from exc
        except InvalidParameterValueException as exc:  # out of the descriptor's range
            ranges = [*descriptor.integer_range, *descriptor.floating_point_range] if descriptor else []
            bounds = f" must be in [{ranges[0].from_value:g}, {ranges[0].to_value:g}]" if ranges else ""
            raise ParameterError(f"parameter '{name}'{bounds}, got {given.value if given else value!r}") from exc


class ActionServer(_RclpyActionServer):
    """rclpy's ActionServer whose execute callback runs on a thread of its own per goal."""

    def __init__(self, node: Node, action_type: Any, action_name: str, execute_callback: Callable,
                 **kwargs: Any) -> None:
        kwargs.setdefault("callback_group", ReentrantCallbackGroup())
        super().__init__(node, action_type, action_name, _on_own_thread(node, execute_callback), **kwargs)


def _on_own_thread(node: Node, execute: Callable) -> Callable:
    async def run(goal_handle: Any) -> Any:
        done = Future(executor=node.executor)
        done.add_done_callback(lambda _: None)  # with an executor, completion wakes it to resume us

        def work() -> None:
            try:
                done.set_result(execute(goal_handle))
            except BaseException as exc:  # rclpy logs it and aborts the goal
                done.set_exception(exc)

        threading.Thread(target=work, daemon=True, name="goal").start()
        return await done

    return run


def init(args: list[str] | None = None) -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):  # rclpy's handlers chain to these: no KeyboardInterrupt
            signal.signal(sig, lambda *_: None)
    rclpy.init(args=args)


def shutdown() -> None:
    rclpy.try_shutdown()


def spin(node: Node) -> None:
    """Run the node's callbacks until shutdown (module docstring: how)."""
    executor = MultiThreadedExecutor(num_threads=EXECUTOR_THREADS)
    executor.add_node(node)
    try:
        executor.spin()
    except ExternalShutdownException:
        pass
    finally:
        executor.shutdown()


def rmw() -> str:
    from rclpy.utilities import get_rmw_implementation_identifier

    return get_rmw_implementation_identifier()
