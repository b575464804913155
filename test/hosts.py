"""This test process as a node host on either backend, with one interface, so a node scenario runs
against nodes on the embedded backend and against nodes under rclpy without a copy of the test.

    host.Node(name, namespace=...)                      # rclpy's Node methods on both
    host.message(name), host.action(name)               # the backend's classes
    llm = LLMClient("/edge_llm", node=host.Node(...))   # Generate goals: edge_llm_ros.client, on either
    host.child_env                                      # environment for node processes to match

The embedded host is the session's (conftest.rt_session). The rclpy host spins a
MultiThreadedExecutor on a context of its own in a daemon thread; a callback that raises there fails
the test running (callback_errors), and the thread spins on.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any, Callable

import callback_errors as callback_errors_module


class EmbeddedHost:
    backend = "zenoh"

    def __init__(self, embedded: Any) -> None:
        from edge_llm_ros.runtime.interfaces import registry

        self._embedded, self._registry = embedded, registry()
        self.child_env = {"EDGE_LLM_BACKEND": "zenoh"}

    def Node(self, name: str, namespace: str = "") -> Any:
        return self._embedded.Node(name, namespace=namespace)

    def message(self, name: str) -> Any:
        return self._registry.message_class(name)

    def action(self, name: str) -> Any:
        return self._embedded.ActionClass(name)

    def publisher_gid(self, publisher: Any) -> bytes:
        """The gid a publisher of this host's nodes sends with its messages (runtime.publisher_gid)."""
        return self._embedded.publisher_gid(publisher)


# A turn of the rclpy host's executor waits at most this long for work. A destroy handed to the spin
# thread (RclpyHost.between_turns) ends the turn with an empty task: rclpy's wake() alone only
# rebuilds the wait set, and the turn would run out its time.
SPIN_TIMEOUT_S = 0.05


class RclpyHost:
    backend = "rclpy"

    def __init__(self, domain_id: int, callback_errors: Any = None) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import MultiThreadedExecutor
        from rclpy.signals import SignalHandlerOptions

        self._rclpy = rclpy
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
        self.executor = MultiThreadedExecutor(num_threads=4, context=self.context)
        self._closing = False
        self._doomed: list[tuple[Callable[[], Any], threading.Event]] = []  # to run on the spin thread
        self._doomed_lock = threading.Lock()
        callback_errors = callback_errors or callback_errors_module.SUITE
        self._thread = threading.Thread(target=callback_errors.spin, args=(self._spin_once, self._running),
                                        daemon=True, name="rclpy-host")
        self._thread.start()
        self.child_env = {"EDGE_LLM_BACKEND": "rclpy", "ROS_DOMAIN_ID": str(domain_id)}

    def _running(self) -> bool:
        return self.context.ok() and not self._closing

    def _spin_once(self) -> None:
        """One turn of the session's executor, on the thread ``callback_errors.spin`` guards: an
        exception out of a callback (rclpy's MultiThreadedExecutor raises it from a later spin_once)
        is recorded there and fails the test running now, and the executor spins on for the others.
        Unguarded, it would end the thread and leave every later rclpy test of the session deaf (CI
        run 18 looked like that)."""
        from rclpy.executors import ExternalShutdownException

        self._destroy_doomed()
        try:
            self.executor.spin_once(timeout_sec=SPIN_TIMEOUT_S)
        except (ExternalShutdownException, KeyboardInterrupt):
            self._closing = True

    def _destroy_doomed(self) -> None:
        with self._doomed_lock:
            doomed, self._doomed = self._doomed, []
        failed: BaseException | None = None
        for destroy, done in doomed:  # every one, then the first failure (recorded for the test running)
            try:
                destroy()
            except Exception as exc:  # noqa: BLE001 - raised below, after the others
                failed = failed or exc
            finally:
                done.set()
        if failed is not None:
            raise failed

    def between_turns(self, destroy: Callable[[], Any], what: str) -> Any:
        """Run ``destroy`` (of a node, or of one of its entities) on the spin thread, between two turns
        of the executor. From another thread, rclpy's executor may be putting that entity into its wait
        set, or reading its handle, at that moment, and that raises InvalidHandle ('destruction was
        requested') on the spin thread: CI, 2026-11-28, a probe destroyed as its test ended; make
        test-fast, 2026-11-28, a get_state client that wait_until_ready destroyed."""
        if threading.current_thread() is self._thread or self._closing or not self._thread.is_alive():
            return destroy()
        done, result = threading.Event(), []
        with self._doomed_lock:
            self._doomed.append((lambda: result.append(destroy()), done))
        self.executor.create_task(lambda: None)  # ends the turn (work to yield); wake() would not
        if not done.wait(10):
            raise TimeoutError(f"the rclpy host's spin thread did not destroy {what} within 10 s")
        return result[0] if result else None

    def Node(self, name: str, namespace: str = "") -> Any:
        from rclpy.node import Node

        host, executor = self, self.executor

        class HostNode(Node):
            """A node whose destroy_* run between the executor's turns (RclpyHost.between_turns)."""

            def destroy_node(self) -> None:
                host.between_turns(self.destroy_now, f"node {self.get_name()!r}")

            def destroy_now(self) -> None:  # leave the executor first: it must not wait on its entities
                executor.remove_node(self)
                super().destroy_node()

            def destroy_publisher(self, entity: Any) -> bool:  # its event handlers are waitables
                return host.between_turns(lambda: super(HostNode, self).destroy_publisher(entity),
                                           f"a publisher of {self.get_name()!r}")

            def destroy_subscription(self, entity: Any) -> bool:
                return host.between_turns(lambda: super(HostNode, self).destroy_subscription(entity),
                                           f"a subscription of {self.get_name()!r}")

            def destroy_client(self, entity: Any) -> bool:
                return host.between_turns(lambda: super(HostNode, self).destroy_client(entity),
                                           f"a client of {self.get_name()!r}")

            def destroy_service(self, entity: Any) -> bool:
                return host.between_turns(lambda: super(HostNode, self).destroy_service(entity),
                                           f"a service of {self.get_name()!r}")

            def destroy_timer(self, entity: Any) -> bool:
                return host.between_turns(lambda: super(HostNode, self).destroy_timer(entity),
                                           f"a timer of {self.get_name()!r}")

            def remove_waitable(self, entity: Any) -> None:  # an action client's destroy() starts here
                host.between_turns(lambda: super(HostNode, self).remove_waitable(entity),
                                    f"a waitable of {self.get_name()!r}")

        node = HostNode(name, namespace=namespace, context=self.context)
        self.executor.add_node(node)
        return node

    def message(self, name: str) -> Any:
        return self._type(name, "msg")

    def action(self, name: str) -> Any:
        return self._type(name, "action")

    def publisher_gid(self, publisher: Any) -> bytes:
        """The gid a publisher of this host's nodes sends with its messages (runtime.publisher_gid)."""
        from edge_llm_ros.runtime.publisher_gids import publisher_gid

        return publisher_gid(publisher)

    @staticmethod
    def _type(name: str, kind: str) -> Any:
        package, _, cls = name.split("/")
        return getattr(importlib.import_module(f"{package}.{kind}"), cls)

    def close(self) -> None:
        self._closing = True
        self.executor.shutdown(5)
        self._rclpy.try_shutdown(context=self.context)
        self._thread.join(5)
        self._destroy_doomed()


BACKENDS = ("zenoh", "rclpy")


def latched(host: Any) -> Any:
    """Transient-local QoS on the host's backend (a late subscriber gets the last message)."""
    if host.backend == "rclpy":
        from rclpy.qos import DurabilityPolicy, QoSProfile

        return QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    from edge_llm_ros.nodes.common import latched_qos

    return latched_qos()


def host_for(request: Any, backend: str = "zenoh") -> Any:
    """The session's node host for ``backend`` (zenoh: the embedded backend), from conftest's fixtures."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return request.getfixturevalue("embedded_host" if backend == "zenoh" else "rclpy_host")


def start_launch(host: Any, router_endpoint: str, name: str, *args: str) -> Any:
    """A launch file on the host's runtime: `edge-llm-ros launch NAME` on the embedded one (at the
    session's router); `ros2 launch edge_llm_ros NAME.launch.py` under rclpy, the nodes from the colcon
    install (this checkout left off PYTHONPATH), on the host's ROS domain."""
    import os

    from support import REPO, Proc

    if host.backend == "rclpy":
        env = {**os.environ, **host.child_env, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                            if p and os.path.realpath(p) != str(REPO))
        return Proc(["ros2", "launch", "edge_llm_ros", f"{name}.launch.py", *args], env=env)
    return Proc([sys.executable, "-m", "edge_llm_ros.runtime.cli", "launch", name, *args, "--router", router_endpoint])


def stop_launch(launch: Any) -> None:
    """Ctrl-C, as a user stops a launch (SIGTERM to `ros2 launch` would leave its nodes running), then
    whatever is left the hard way."""
    import signal
    import subprocess

    if launch.popen.poll() is None:
        launch.popen.send_signal(signal.SIGINT)
        try:
            launch.wait(60)
        except subprocess.TimeoutExpired:
            pass
    launch.stop()
