"""The runtime under ROS 2 (rclpy on the sourced RMW), shaped like the embedded backend.

Nodes get rclpy's own classes. What is added here is only what the embedded backend does by itself
and rclpy leaves to each application; these are the places where the two backends could part, and
this module keeps them together:

- Callbacks. The embedded backend runs subscription, timer and service callbacks one at a time
  and each action goal on its own thread. Here :func:`spin` runs a MultiThreadedExecutor (a
  single-threaded one for nodes that ask, `single_threaded`). The node's default callback group is
  mutually exclusive, so those callbacks still run one at a time.
  :class:`ActionServer` puts goals in a reentrant group, and the executor gets one thread more per
  goal that may run at once (``max_goals``). So a goal that waits for messages (draft_node waits
  for `verify`) or for a cancel holds a thread of its own, as on the embedded backend, and the
  callbacks it waits for still run.
- Parameters. An integer given for a float parameter is taken as that float, as the embedded
  backend does (`stats_period_s: 1` in YAML, or `stats_period_s:=1` on the command line); a wrong
  type, or a value out of the descriptor's range, is a ValueError that names the parameter, worded
  as nodes/parameters.py words it on both backends.
- Action feedback. rclpy's ActionClient forgets a goal's feedback callback when the goal's result
  is in, and takes one feedback message per wake-up, so feedback still queued behind the result
  of a busy client is dropped. :class:`ActionClient` keeps delivering it.
- Message info. A subscription callback that takes it (two parameters) gets rclpy's info dict
  with the sender's ``publisher_gid`` added, as the embedded backend gives it; rclpy Jazzy leaves
  the gid out, so :func:`spin`'s executors take such messages through rcl (publisher_gids.py).
- Shutdown. rclpy's signal handlers shut the context down on SIGINT and SIGTERM, and spin returns,
  as on the embedded backend. No KeyboardInterrupt follows, so a second Ctrl-C (a terminal signals
  the whole process group, and `ros2 launch` signals its nodes again) cannot break the node's
  cleanup; only a stoppable call (stopping.py: loading, calibrating, in the main thread
  or an executor's worker) is ended with Stopped. :func:`shutdown` after that does nothing
  instead of failing (rcl_shutdown already called).
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections import OrderedDict
from typing import Any, Callable

import rclpy
from rclpy.action import ActionClient as _RclpyActionClient
from rclpy.action import ActionServer as _RclpyActionServer
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor, SingleThreadedExecutor, await_or_execute
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.lifecycle import LifecycleNodeMixin, LifecycleState, TransitionCallbackReturn  # noqa: F401 - runtime's names
from rclpy.node import Node as _RclpyNode
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile
from rclpy.waitable import NumberOfEntities
from unique_identifier_msgs.msg import UUID

from edge_llm_ros.runtime import stopping
from edge_llm_ros.runtime.link import NodeLinks
from edge_llm_ros.runtime.publisher_gids import TakesPublisherGids

EXECUTOR_THREADS = 4  # for callbacks, which never wait for long here; each running goal has a thread more
FEEDBACK_DEPTH = 100  # feedback history an action server keeps for slow readers (rclpy's default: 10)


class ParameterError(ValueError):
    """A parameter of the wrong type (the embedded backend raises the same)."""


class Node(_RclpyNode):
    """rclpy's Node, declaring parameters as the embedded backend does (see the module docstring).

    What the runtime keeps per node, with defaults (the embedded backend's Node declares the same):

    - ``single_threaded``: a node class sets it true to be spun on rclpy's single-threaded executor
      (:func:`spin` says when that pays);
    - ``goal_threads``: how many goals its action servers may run at once (each
      :class:`ActionServer` adds its ``max_goals``); :func:`spin` gives the executor that many
      threads more;
    - ``emulated_links``: its topics' emulated links (runtime/link.py), made from its
      `link_emulation` parameters by the first ``runtime.shaped()`` call; None before.
    """

    single_threaded: bool = False
    goal_threads: int = 0
    emulated_links: NodeLinks | None = None

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


class LifecycleNode(LifecycleNodeMixin, Node):
    """rclpy's LifecycleNode on the Node above (rcl_lifecycle's state machine and services)."""

    def __init__(self, node_name: str, **kwargs: Any) -> None:
        Node.__init__(self, node_name, **kwargs)
        LifecycleNodeMixin.__init__(self)

    @property
    def lifecycle_state(self) -> LifecycleState:
        state_id, label = self._state_machine.current_state
        return LifecycleState(label, state_id)


class ActionServer(_RclpyActionServer):
    """rclpy's ActionServer in a reentrant group; each running goal holds one executor thread, and
    ``max_goals`` (how many may run at once) adds that many threads to the node's executor (spin).

    The execute callback stays a plain blocking function. An async one that awaits a Future from
    another thread would make rclpy's executor spin: it resumes every pending coroutine on each
    pass of its loop without waiting (measured: edge-cloud `ee` fell from 8.4 to 2.6 tokens/s,
    the busy thread starving the drafter's).

    Feedback streams tokens, so its writer keeps FEEDBACK_DEPTH messages: with rclpy's 10 a busy
    reader lost some of a fast answer's feedback (reliable delivery resends only what the writer's
    history still holds)."""

    def __init__(self, node: Node, action_type: Any, action_name: str, execute_callback: Callable, *,
                 max_goals: int = 1, **kwargs: Any) -> None:
        kwargs.setdefault("callback_group", ReentrantCallbackGroup())
        kwargs.setdefault("feedback_pub_qos_profile", QoSProfile(depth=FEEDBACK_DEPTH))
        node.goal_threads += max_goals
        super().__init__(node, action_type, action_name, execute_callback, **kwargs)


class ActionClient(_RclpyActionClient):
    """rclpy's ActionClient, delivering all of a goal's feedback. rclpy's forgets a goal's feedback
    callback once the goal's result is in (rclpy/action/client.py, _remove_pending_result_request)
    and takes at most one feedback message each time the executor wakes it: when the client's
    executor is busy as an answer ends, the feedback still queued behind the result never reaches
    the callback (CI runs 15, 16, 18 and 19 lost the tail of a streamed answer that way; the result
    was exact; test_rclpy_feedback.py). This client remembers the callbacks of its last
    KEEP_STREAMS goals and hands such feedback to them. Feedback reads keep FEEDBACK_DEPTH
    messages, as the server's writer does."""

    KEEP_STREAMS = 256

    def __init__(self, node: Node, action_type: Any, action_name: str, **kwargs: Any) -> None:
        kwargs.setdefault("feedback_sub_qos_profile", QoSProfile(depth=FEEDBACK_DEPTH))
        # before rclpy's __init__, which adds this client to the node: an executor spinning the node
        # in another thread may ask it for its entities at once
        self._handle_lock = threading.RLock()
        self._destroyed = False
        super().__init__(node, action_type, action_name, **kwargs)
        self._streams: OrderedDict[bytes, Callable] = OrderedDict()  # goal id -> feedback callback

    # Two races of rclpy's client with an executor spinning the node in another thread, which our
    # clients meet (LLMClient on a node its caller spins; the test host's MultiThreadedExecutor):
    # - rclpy's destroy frees the handle at once, while the executor may be between is_ready and
    #   take_data on it ("action client pointer is invalid", CI stop 36). Taking and destroying
    #   exclude each other, and a destroyed client is never ready.
    # - a goal, cancel or result request is sent before its sequence number is registered, so a
    #   response taken in between is "unexpected" and dropped, and the request's future never ends
    #   (a fresh-clone run, 2026-11-28: "Ignoring unexpected goal response", then no answer in 30 s).
    #   Sending and registering hold the lock that taking needs.
    def send_goal_async(self, goal: Any, feedback_callback: Callable | None = None, goal_uuid: Any = None):
        if feedback_callback is not None:
            goal_uuid = goal_uuid or UUID(uuid=list(uuid.uuid4().bytes))
            self._streams[bytes(goal_uuid.uuid)] = feedback_callback
            while len(self._streams) > self.KEEP_STREAMS:
                self._streams.popitem(last=False)
        with self._handle_lock:
            return super().send_goal_async(goal, feedback_callback, goal_uuid)

    def _cancel_goal_async(self, goal_handle: Any):
        with self._handle_lock:
            return super()._cancel_goal_async(goal_handle)

    def _get_result_async(self, goal_handle: Any):
        with self._handle_lock:
            return super()._get_result_async(goal_handle)

    def get_num_entities(self) -> Any:
        with self._handle_lock:
            return NumberOfEntities() if self._destroyed else super().get_num_entities()

    def add_to_wait_set(self, wait_set: Any) -> None:
        with self._handle_lock:
            if not self._destroyed:
                super().add_to_wait_set(wait_set)

    def is_ready(self, wait_set: Any) -> bool:
        with self._handle_lock:
            return not self._destroyed and super().is_ready(wait_set)

    def take_data(self) -> dict:
        with self._handle_lock:
            return {} if self._destroyed else super().take_data()

    def destroy(self) -> None:
        with self._handle_lock:
            if self._destroyed:
                return
            self._destroyed = True  # from here on, nothing that checks under the lock uses the handle
        super().destroy()  # outside the lock: the node may hand remove_waitable to its spin thread

    async def execute(self, taken_data: Any) -> None:
        feedback = taken_data.get("feedback")
        if feedback is not None:
            goal = bytes(feedback.goal_id.uuid)
            if goal not in self._feedback_callbacks and goal in self._streams:  # behind its result
                taken_data = {k: v for k, v in taken_data.items() if k != "feedback"}
                await await_or_execute(self._streams[goal], feedback)
        await super().execute(taken_data)


class _SingleThreaded(TakesPublisherGids, SingleThreadedExecutor):
    """rclpy's executor, giving message-info callbacks the publisher's gid (publisher_gids.py)."""


class _MultiThreaded(TakesPublisherGids, MultiThreadedExecutor):
    """rclpy's executor, giving message-info callbacks the publisher's gid (publisher_gids.py)."""


def init(args: list[str] | None = None) -> None:
    if threading.current_thread() is threading.main_thread():
        # rclpy's handlers shut the context down and chain to these: no KeyboardInterrupt, except in
        # a stoppable call (runtime/stopping.py), whose work a signal ends at once
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda _signum, frame: stopping.signalled(frame))
    rclpy.init(args=args)


def shutdown() -> None:
    rclpy.try_shutdown()


def spin(node: Node) -> None:
    """Run the node's callbacks until shutdown (module docstring: how): EXECUTOR_THREADS threads
    for callbacks, plus one for each goal its action servers may run at once. A node that sets
    ``single_threaded`` (no action servers; all its callbacks in the default, mutually exclusive
    group) gets rclpy's single-threaded executor instead, the same order without the
    MultiThreadedExecutor's dispatching: under go2_sim's 50 Hz /odom and 15 Hz frames that held the
    GIL so much that the navigator's worker thread decided in 2.4-11 s instead of 1.05 s (session
    12). The other nodes keep it until they are measured: under the single-threaded executor, one
    edge-cloud test under rclpy (duplicate and stale verify results) timed out in 2 of 6 runs."""
    if node.single_threaded:
        executor = _SingleThreaded()
    else:
        executor = _MultiThreaded(num_threads=EXECUTOR_THREADS + node.goal_threads)
    executor.add_node(node)
    try:
        executor.spin()
    except ExternalShutdownException:
        pass
    except _rclpy.RCLError:
        # A SIGINT/SIGTERM runs its handler (which shuts the context down) in this thread, between
        # two bytecodes of spin: after spin checked the context and before it built the wait set,
        # rcl refuses the wait set for a context no longer valid (CI, a serve_node stopped while
        # loading its model exited 1). That is a shutdown too; any other RCLError is not.
        if executor.context.ok():
            raise
    finally:
        executor.shutdown()
