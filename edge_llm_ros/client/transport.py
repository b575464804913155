"""The two runtimes as the client library needs them: a node (its own, or the caller's), types,
action and service clients, latched QoS, and who serves what in the graph.

:func:`own_node` makes a node of the client's own on the runtime edge_llm_ros.runtime picked
(rclpy when ROS 2 is sourced, else the embedded Zenoh backend) or the one named, on a context of its own with a
thread that spins it, so the caller's own rclpy context, signal handlers and executors are left
alone. :func:`attach` wraps a node the caller already has and spins (an rclpy Node, or a node of
the embedded backend: the kind is read from the node, so one test process can use both).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from edge_llm_ros import runtime as rt
from edge_llm_ros.runtime.goals import wait_for

SPIN_SLICE_S = 0.2


class Transport:
    """One node and the runtime it lives on (base: what both runtimes share)."""

    backend = ""

    def __init__(self, node: Any, owned: bool) -> None:
        self.node, self.owned = node, owned

    # -- types and endpoints (per runtime) -------------------------------------------------------
    def message(self, name: str) -> Any:
        raise NotImplementedError

    def action(self, name: str) -> Any:
        raise NotImplementedError

    def service(self, name: str) -> Any:
        raise NotImplementedError

    def action_client(self, action_type: Any, name: str) -> Any:
        raise NotImplementedError

    def latched_qos(self, depth: int = 10) -> Any:
        """Transient-local QoS: a late subscriber gets the publisher's last messages; ``depth`` keeps
        that many that arrive before the callbacks take them."""
        raise NotImplementedError

    def servers_of(self, service: str) -> list[str]:
        """The nodes (fully qualified names) that serve ``service`` now."""
        raise NotImplementedError

    def subscribers_of(self, topic: str) -> list[str]:
        """The nodes (fully qualified names) that subscribe to ``topic`` now."""
        raise NotImplementedError

    def close(self) -> None:
        """Free the node and its context when they are the client's own."""

    # -- shared ----------------------------------------------------------------------------------
    def call(self, client: Any, request: Any, timeout: float) -> Any:
        """One call on a service client of this node: the response, or NoAnswer when no server
        answers within ``timeout``."""
        return wait_for(client.call_async(request), timeout, f"a call of {client.srv_name}")

    def resolve(self, name: str) -> str:
        return self.node.resolve_topic_name(name)


class EmbeddedTransport(Transport):
    backend = "zenoh"

    def __init__(self, node: Any, owned: bool, context: Any = None) -> None:
        super().__init__(node, owned)
        self.context = context
        self.spinner: threading.Thread | None = None

    def message(self, name: str) -> Any:
        from edge_llm_ros.runtime.interfaces import registry

        return registry().message_class(name)

    def action(self, name: str) -> Any:
        from edge_llm_ros.runtime.embedded import ActionClass

        return ActionClass(name)

    def service(self, name: str) -> Any:
        from edge_llm_ros.runtime.embedded import ServiceClass

        return ServiceClass(name)

    def action_client(self, action_type: Any, name: str) -> Any:
        from edge_llm_ros.runtime.actions import ActionClient

        return ActionClient(self.node, action_type, name)

    def latched_qos(self, depth: int = 10) -> Any:
        from edge_llm_ros.runtime.embedded import QoSProfile

        return QoSProfile(depth=depth, transient_local=True)

    def servers_of(self, service: str) -> list[str]:
        service = self.resolve(service)
        return sorted({e.node_fqn for e in self.node.graph() if e.kind == "SS" and e.name == service})

    def subscribers_of(self, topic: str) -> list[str]:
        topic = self.resolve(topic)
        return sorted({e.node_fqn for e in self.node.graph() if e.kind == "MS" and e.name == topic})

    def spin(self) -> None:
        from edge_llm_ros.runtime.embedded import spin_once

        while self.context.ok():
            spin_once(SPIN_SLICE_S, self.context)

    def close(self) -> None:
        if not self.owned:
            return
        self.node.destroy_node()
        self.context.close()
        if self.spinner is not None:
            self.spinner.join(5)


class RclpyTransport(Transport):
    backend = "rclpy"

    def __init__(self, node: Any, owned: bool, context: Any = None, executor: Any = None) -> None:
        super().__init__(node, owned)
        self.context, self.executor = context, executor
        self.closing = threading.Event()
        self.spinner: threading.Thread | None = None

    @staticmethod
    def _type(name: str, kind: str) -> Any:
        if rt.BACKEND == "rclpy":  # the runtime's lookup, whose error says what to source
            return getattr(rt, {"msg": "message", "srv": "service", "action": "action"}[kind])(name)
        package, _, cls = name.split("/")
        try:
            return getattr(importlib.import_module(f"{package}.{kind}"), cls)
        except (ImportError, AttributeError) as exc:
            raise rt.InterfaceError(f"unknown {kind} type '{name}' under ROS 2 ({exc}); is this package's install "
                                    "sourced (build/ros2/install/local_setup.bash)?") from exc

    def message(self, name: str) -> Any:
        return self._type(name, "msg")

    def action(self, name: str) -> Any:
        return self._type(name, "action")

    def service(self, name: str) -> Any:
        return self._type(name, "srv")

    def action_client(self, action_type: Any, name: str) -> Any:
        from edge_llm_ros.runtime.ros import ActionClient  # delivers a goal's feedback queued behind its result

        return ActionClient(self.node, action_type, name)

    def latched_qos(self, depth: int = 10) -> Any:
        from rclpy.qos import DurabilityPolicy, QoSProfile

        return QoSProfile(depth=depth, durability=DurabilityPolicy.TRANSIENT_LOCAL)

    def servers_of(self, service: str) -> list[str]:
        service = self.resolve(service)
        found = []
        for name, namespace in self.node.get_node_names_and_namespaces():
            served = self.node.get_service_names_and_types_by_node(name, namespace)
            if any(s == service for s, _ in served):
                found.append(f"{namespace.rstrip('/')}/{name}")
        return sorted(found)

    def subscribers_of(self, topic: str) -> list[str]:
        infos = self.node.get_subscriptions_info_by_topic(self.resolve(topic))
        return sorted({f"{i.node_namespace.rstrip('/')}/{i.node_name}" for i in infos})

    def spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        while self.context.ok() and not self.closing.is_set():
            try:
                self.executor.spin_once(timeout_sec=SPIN_SLICE_S)
            except ExternalShutdownException:
                return

    def close(self) -> None:
        if not self.owned:
            return
        import rclpy

        self.closing.set()
        if self.spinner is not None:
            self.spinner.join(5)
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def attach(node: Any) -> Transport:
    """A transport over the caller's ``node``, which the caller spins."""
    return EmbeddedTransport(node, owned=False) if _is_embedded(node) else RclpyTransport(node, owned=False)


def _is_embedded(node: Any) -> bool:
    from edge_llm_ros.runtime.embedded import Node

    return isinstance(node, Node)


def own_node(name: str, namespace: str = "", backend: str | None = None) -> Transport:
    """A node of the client's own, on a context of its own, spun by a daemon thread; on ``backend``
    ("zenoh" or "rclpy"; None: the one edge_llm_ros.runtime picked)."""
    backend = backend or rt.BACKEND
    if backend not in ("zenoh", "rclpy"):
        raise ValueError(f"backend must be 'zenoh' or 'rclpy', got {backend!r}")
    transport = _own_rclpy(name, namespace) if backend == "rclpy" else _own_embedded(name, namespace)
    transport.spinner = threading.Thread(target=transport.spin, daemon=True, name=f"{name}-spin")
    transport.spinner.start()
    return transport


def _own_embedded(name: str, namespace: str) -> EmbeddedTransport:
    from edge_llm_ros.runtime.embedded import Context, Node

    context = Context(args=[])
    try:
        return EmbeddedTransport(Node(name, namespace=namespace or None, context=context), True, context)
    except BaseException:
        context.close()
        raise


def _own_rclpy(name: str, namespace: str) -> RclpyTransport:  # pragma: no cover - only where ROS 2 is sourced
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from rclpy.signals import SignalHandlerOptions

    context = Context()
    rclpy.init(context=context, signal_handler_options=SignalHandlerOptions.NO)  # the caller's Ctrl-C stays theirs
    try:
        node = Node(name, namespace=namespace, context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        return RclpyTransport(node, True, context, executor)
    except BaseException:
        rclpy.try_shutdown(context=context)
        raise
