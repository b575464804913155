"""Actions on the embedded backend, laid out as rcl_action lays them out.

An action `/ns/generate` of type `pkg/action/A` is three services and two topics:

    /ns/generate/_action/send_goal    pkg/action/A_SendGoal     {goal_id, goal} -> {accepted, stamp}
    /ns/generate/_action/cancel_goal  action_msgs/srv/CancelGoal
    /ns/generate/_action/get_result   pkg/action/A_GetResult    {goal_id} -> {status, result} (answered at the end)
    /ns/generate/_action/feedback     pkg/action/A_FeedbackMessage {goal_id, feedback}
    /ns/generate/_action/status       action_msgs/msg/GoalStatusArray

Each accepted goal runs its execute callback on a thread of its own, so a
slow goal never blocks another goal or the node's other callbacks. Feedback
of one goal arrives in order (reliable publisher, FIFO executor).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable

import numpy as np

from edge_llm_ros.runtime import graph
from edge_llm_ros.runtime.embedded import ActionClass, Clock, Future, Node, ServiceTimeoutError, type_name_of
from edge_llm_ros.runtime.interfaces import registry

# action_msgs/msg/GoalStatus
STATUS_UNKNOWN, STATUS_ACCEPTED, STATUS_EXECUTING, STATUS_CANCELING = 0, 1, 2, 3
STATUS_SUCCEEDED, STATUS_CANCELED, STATUS_ABORTED = 4, 5, 6
TERMINAL = (STATUS_SUCCEEDED, STATUS_CANCELED, STATUS_ABORTED)
STATUS_NAMES = {0: "UNKNOWN", 1: "ACCEPTED", 2: "EXECUTING", 3: "CANCELING", 4: "SUCCEEDED", 5: "CANCELED", 6: "ABORTED"}

# action_msgs/srv/CancelGoal return codes
CANCEL_NONE, CANCEL_REJECTED, CANCEL_UNKNOWN_GOAL, CANCEL_TERMINATED = 0, 1, 2, 3

RESULT_WAIT_S = 24 * 3600.0
"""How long a client waits for a goal's result; a server that goes away ends the wait at once."""


class ServerGoneError(ServiceTimeoutError):
    """The action server went away (its process died, or it left the graph) while a goal was running."""


class GoalResponse:
    REJECT, ACCEPT = 0, 1


class CancelResponse:
    REJECT, ACCEPT = 0, 1


def _uuid_msg(raw: bytes) -> Any:
    return registry().new("unique_identifier_msgs/msg/UUID", uuid=np.frombuffer(raw, dtype=np.uint8).copy())


def _stamp_now() -> Any:
    return Clock().now().to_msg()


# ---------------------------------------------------------------------- server
class ServerGoalHandle:
    """What an execute callback gets: the goal, feedback, and how it ends."""

    def __init__(self, server: ActionServer, goal_id: bytes, request: Any) -> None:
        self._server = server
        self.goal_id = goal_id
        self.request = request
        self.status = STATUS_ACCEPTED
        self.stamp = _stamp_now()
        self._cancel_requested = threading.Event()
        self._result_future = Future()

    @property
    def is_cancel_requested(self) -> bool:
        return self._cancel_requested.is_set()

    @property
    def is_active(self) -> bool:
        return self.status not in TERMINAL

    def publish_feedback(self, feedback: Any) -> None:
        self._server._publish_feedback(self.goal_id, feedback)

    def execute(self) -> None:
        self._set_status(STATUS_EXECUTING)

    def succeed(self) -> None:
        self._set_status(STATUS_SUCCEEDED)

    def abort(self) -> None:
        self._set_status(STATUS_ABORTED)

    def canceled(self) -> None:
        self._set_status(STATUS_CANCELED)

    def _set_status(self, status: int) -> None:
        if not self.is_active:
            return
        self.status = status
        self._server._publish_status()


class ActionServer:
    """rclpy.action.ActionServer's shape: execute_callback(goal_handle) -> Result."""

    def __init__(self, node: Node, action_type: Any, action_name: str, execute_callback: Callable,
                 goal_callback: Callable | None = None, cancel_callback: Callable | None = None,
                 result_timeout: float = 900.0, max_goals: int | None = None) -> None:
        """``max_goals``: how many goals may run at once (the rclpy backend sizes its executor by
        it; counted in the node's ``goal_threads`` here too); here every goal runs on a thread of
        its own anyway."""
        self.node = node
        node.goal_threads += max_goals or 0
        self.spec = registry().action(type_name_of(action_type, "__actiontype__"))
        self.name = node.resolve_topic_name(action_name)
        self._execute = execute_callback
        self._goal_cb = goal_callback or (lambda goal: GoalResponse.ACCEPT)
        self._cancel_cb = cancel_callback or (lambda handle: CancelResponse.REJECT)
        self._result_timeout = result_timeout
        self._goals: dict[bytes, ServerGoalHandle] = {}
        self._lock = threading.Lock()
        names = graph.action_names(self.name)
        self._send_goal = node.create_service(self.spec.send_goal.name, names["send_goal"], self._on_send_goal)
        self._cancel = node.create_service("action_msgs/srv/CancelGoal", names["cancel_goal"], self._on_cancel)
        self._get_result = node.create_service(self.spec.get_result.name, names["get_result"], self._on_get_result)
        self._feedback_pub = node.create_publisher(self.spec.feedback_message, names["feedback"], 100)
        self._status_pub = node.create_publisher("action_msgs/msg/GoalStatusArray", names["status"], 10)

    def _on_send_goal(self, request: Any, response: Any) -> Any:
        goal_id = bytes(np.asarray(request.goal_id.uuid, dtype=np.uint8))
        accepted = self._goal_cb(request.goal) == GoalResponse.ACCEPT
        response.accepted = accepted
        response.stamp = _stamp_now()
        if accepted:
            handle = ServerGoalHandle(self, goal_id, request.goal)
            with self._lock:
                self._goals[goal_id] = handle
            self._publish_status()
            threading.Thread(target=self._run_goal, args=(handle,), daemon=True, name="goal").start()
        return response

    def _run_goal(self, handle: ServerGoalHandle) -> None:
        handle.execute()
        try:
            result = self._execute(handle)
        except Exception as exc:
            self.node.get_logger().error(f"action {self.name}: goal failed: {exc!r}")
            result = None
            handle.abort()
        if handle.is_active:  # the callback returned without saying how it ended
            handle.abort()
        if result is None:
            result = registry().new(self.spec.result)
        handle._result_future.set_result(result)

    def _on_get_result(self, request: Any, response: Any) -> Any:
        goal_id = bytes(np.asarray(request.goal_id.uuid, dtype=np.uint8))
        with self._lock:
            handle = self._goals.get(goal_id)
        if handle is None:
            response.status = STATUS_UNKNOWN
            return response
        answer = Future()

        def done(f: Future) -> None:
            response.status = handle.status
            response.result = f.result()
            answer.set_result(response)

        handle._result_future.add_done_callback(done)
        return answer

    def _on_cancel(self, request: Any, response: Any) -> Any:
        wanted = bytes(np.asarray(request.goal_info.goal_id.uuid, dtype=np.uint8))
        with self._lock:
            if any(wanted):
                handles = [self._goals[wanted]] if wanted in self._goals else []
            else:  # zero id: cancel every goal
                handles = list(self._goals.values())
        if not handles:
            response.return_code = CANCEL_UNKNOWN_GOAL
            return response
        canceling = []
        for handle in handles:
            if not handle.is_active:
                continue
            if self._cancel_cb(handle) == CancelResponse.ACCEPT:
                handle._cancel_requested.set()
                handle._set_status(STATUS_CANCELING)
                canceling.append(registry().new("action_msgs/msg/GoalInfo", goal_id=_uuid_msg(handle.goal_id), stamp=handle.stamp))
        response.return_code = CANCEL_NONE if canceling else CANCEL_REJECTED
        response.goals_canceling = canceling
        return response

    def _publish_feedback(self, goal_id: bytes, feedback: Any) -> None:
        self._feedback_pub.publish(registry().new(self.spec.feedback_message, goal_id=_uuid_msg(goal_id), feedback=feedback))

    def _publish_status(self) -> None:
        with self._lock:
            statuses = [
                registry().new(
                    "action_msgs/msg/GoalStatus",
                    goal_info=registry().new("action_msgs/msg/GoalInfo", goal_id=_uuid_msg(h.goal_id), stamp=h.stamp),
                    status=h.status,
                )
                for h in self._goals.values()
            ]
        self._status_pub.publish(registry().new("action_msgs/msg/GoalStatusArray", status_list=statuses))

    def destroy(self) -> None:
        for entity in (self._send_goal, self._cancel, self._get_result, self._feedback_pub, self._status_pub):
            entity.destroy()


# ---------------------------------------------------------------------- client
class ClientGoalHandle:
    def __init__(self, client: ActionClient, goal_id: bytes, accepted: bool) -> None:
        self._client = client
        self.goal_id = goal_id
        self.accepted = accepted

    def get_result_async(self) -> Future:
        """Future of the GetResult response (`.status`, `.result`); fails if the server goes away."""
        return self._client._get_result(self.goal_id)

    def cancel_goal_async(self) -> Future:
        return self._client._cancel(self.goal_id)


class ActionClient:
    def __init__(self, node: Node, action_type: Any, action_name: str, call_timeout: float = 10.0) -> None:
        self.node = node
        self.spec = registry().action(type_name_of(action_type, "__actiontype__"))
        self.name = node.resolve_topic_name(action_name)
        self.call_timeout = call_timeout
        names = graph.action_names(self.name)
        self._send_goal = node.create_client(self.spec.send_goal.name, names["send_goal"])
        self._cancel_client = node.create_client("action_msgs/srv/CancelGoal", names["cancel_goal"])
        self._result_client = node.create_client(self.spec.get_result.name, names["get_result"])
        self._feedback_callbacks: dict[bytes, Callable] = {}
        self._feedback_sub = node.create_subscription(self.spec.feedback_message, names["feedback"], self._on_feedback, 100)

    def server_is_ready(self) -> bool:
        return self._send_goal.service_is_ready()

    def wait_for_server(self, timeout_sec: float | None = None) -> bool:
        return self._send_goal.wait_for_service(timeout_sec)

    def _on_feedback(self, msg: Any) -> None:
        callback = self._feedback_callbacks.get(bytes(np.asarray(msg.goal_id.uuid, dtype=np.uint8)))
        if callback is not None:
            callback(msg)

    def send_goal_async(self, goal: Any, feedback_callback: Callable | None = None) -> Future:
        """Future of a ClientGoalHandle; feedback_callback(FeedbackMessage) runs in the executor."""
        goal_id = uuid.uuid4().bytes
        if feedback_callback is not None:
            self._feedback_callbacks[goal_id] = feedback_callback
        request = registry().new(self.spec.send_goal.request, goal_id=_uuid_msg(goal_id), goal=goal)
        handle_future = Future()

        def accepted(f: Future) -> None:
            if f.exception() is not None:
                handle_future.set_exception(f.exception())
            else:
                handle_future.set_result(ClientGoalHandle(self, goal_id, bool(f.result().accepted)))

        self._send_goal.call_async(request, self.call_timeout).add_done_callback(accepted)
        return handle_future

    def _get_result(self, goal_id: bytes) -> Future:
        """Future of the GetResult response; it fails with ServerGoneError when the server goes away first.

        Two signs of that: the GetResult query ends unanswered long before its
        RESULT_WAIT_S (Zenoh drops a query whose queryable's session closed),
        or the server's get_result service token leaves the graph.
        """
        request = registry().new(self.spec.get_result.request, goal_id=_uuid_msg(goal_id))
        gone = ServerGoneError(f"action server {self.name} went away while goal {goal_id.hex()} was running")
        result = Future()
        asked = time.monotonic()

        def relay(call: Future) -> None:
            exc = call.exception()
            if exc is None:
                result.set_result(call.result())
            elif isinstance(exc, ServiceTimeoutError) and time.monotonic() - asked < RESULT_WAIT_S:
                result.set_exception(gone)
            else:
                result.set_exception(exc)

        self._result_client.fail_when_servers_leave(result, gone)
        self._result_client.call_async(request, timeout_sec=RESULT_WAIT_S).add_done_callback(relay)
        return result

    def _cancel(self, goal_id: bytes) -> Future:
        info = registry().new("action_msgs/msg/GoalInfo", goal_id=_uuid_msg(goal_id))
        request = registry().new("action_msgs/srv/CancelGoal_Request", goal_info=info)
        return self._cancel_client.call_async(request, self.call_timeout)

    def destroy(self) -> None:
        for entity in (self._send_goal, self._cancel_client, self._result_client, self._feedback_sub):
            entity.destroy()


__all__ = ["ActionClass", "ActionClient", "ActionServer", "CancelResponse", "ClientGoalHandle", "GoalResponse",
           "ServerGoalHandle", "ServerGoneError", "STATUS_NAMES", "STATUS_SUCCEEDED", "STATUS_CANCELED",
           "STATUS_ABORTED"]
