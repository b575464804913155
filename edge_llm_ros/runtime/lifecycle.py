"""Managed (lifecycle) nodes on the embedded backend, shaped like rclpy.lifecycle.

Under rclpy, rcl_lifecycle's state machine runs them (runtime/ros.py). Here the same machine is a
table (the default one of the ROS 2 design article "Managed nodes"): the primary states
unconfigured, inactive, active and finalized, a transition state for each change, and each
change's callback (``on_configure``, ``on_activate``, ...) deciding where it ends. The node
serves rcl_lifecycle's services under its own name (``~/change_state``, ``~/get_state``,
``~/get_available_states``, ``~/get_available_transitions``, ``~/get_transition_graph``) and
publishes ``~/transition_event`` on every change, so `edge-llm-ros lifecycle` (and a launcher)
drive it as `ros2 lifecycle` drives an rclpy one.
"""

from __future__ import annotations

import enum
import threading
import time
from typing import Any, Callable, NamedTuple

from edge_llm_ros.runtime.embedded import Node
from edge_llm_ros.runtime.interfaces import registry

UNCONFIGURED, INACTIVE, ACTIVE, FINALIZED = 1, 2, 3, 4
CONFIGURING, CLEANINGUP, SHUTTINGDOWN, ACTIVATING, DEACTIVATING, ERRORPROCESSING = 10, 11, 12, 13, 14, 15
STATE_LABELS = {1: "unconfigured", 2: "inactive", 3: "active", 4: "finalized", 10: "configuring",
                11: "cleaningup", 12: "shuttingdown", 13: "activating", 14: "deactivating", 15: "errorprocessing"}

# primary transitions: id -> (label, start state, transition state); lifecycle_msgs/msg/Transition's ids
PRIMARY = {1: ("configure", UNCONFIGURED, CONFIGURING), 2: ("cleanup", INACTIVE, CLEANINGUP),
           3: ("activate", INACTIVE, ACTIVATING), 4: ("deactivate", ACTIVE, DEACTIVATING),
           5: ("shutdown", UNCONFIGURED, SHUTTINGDOWN), 6: ("shutdown", INACTIVE, SHUTTINGDOWN),
           7: ("shutdown", ACTIVE, SHUTTINGDOWN)}
# a transition state's outcomes: (success, failure, error), each (transition id, goal state)
OUTCOMES = {CONFIGURING: ((10, INACTIVE), (11, UNCONFIGURED), (12, ERRORPROCESSING)),
            CLEANINGUP: ((20, UNCONFIGURED), (21, INACTIVE), (22, ERRORPROCESSING)),
            ACTIVATING: ((30, ACTIVE), (31, INACTIVE), (32, ERRORPROCESSING)),
            DEACTIVATING: ((40, INACTIVE), (41, ACTIVE), (42, ERRORPROCESSING)),
            SHUTTINGDOWN: ((50, FINALIZED), (51, FINALIZED), (52, ERRORPROCESSING)),
            ERRORPROCESSING: ((60, UNCONFIGURED), (61, FINALIZED), (62, FINALIZED))}
OUTCOME_LABELS = ("transition_success", "transition_failure", "transition_error")


class TransitionCallbackReturn(enum.IntEnum):
    """What a transition callback returns (lifecycle_msgs/msg/Transition's TRANSITION_CALLBACK_*)."""

    SUCCESS = 97
    FAILURE = 98
    ERROR = 99


class LifecycleState(NamedTuple):
    label: str
    state_id: int


class LifecycleNode(Node):
    """A managed node: override ``on_configure``, ``on_activate``, ``on_deactivate``,
    ``on_cleanup``, ``on_shutdown`` and ``on_error`` (each takes the state it leaves and returns a
    TransitionCallbackReturn; the defaults succeed). ``trigger_configure()`` and the others
    change state from code; the services change it from outside. One change at a time."""

    def __init__(self, node_name: str, **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        self._state = UNCONFIGURED
        self._changing = threading.Lock()
        self._TransitionEvent = registry().message_class("lifecycle_msgs/msg/TransitionEvent")
        self._events = self.create_publisher("lifecycle_msgs/msg/TransitionEvent", "~/transition_event", 10)
        for name, srv, callback in (
                ("change_state", "ChangeState", self._on_change_state),
                ("get_state", "GetState", self._on_get_state),
                ("get_available_states", "GetAvailableStates", self._on_get_available_states),
                ("get_available_transitions", "GetAvailableTransitions", self._on_get_available_transitions),
                ("get_transition_graph", "GetAvailableTransitions", self._on_get_transition_graph)):
            self.create_service(f"lifecycle_msgs/srv/{srv}", f"~/{name}", callback)

    # -- the callbacks a node overrides ------------------------------------------------------------

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        return TransitionCallbackReturn.SUCCESS

    on_cleanup = on_shutdown = on_activate = on_deactivate = on_error = on_configure

    # -- changing state ----------------------------------------------------------------------------

    def trigger_configure(self) -> TransitionCallbackReturn:
        return self._change(1)

    def trigger_cleanup(self) -> TransitionCallbackReturn:
        return self._change(2)

    def trigger_activate(self) -> TransitionCallbackReturn:
        return self._change(3)

    def trigger_deactivate(self) -> TransitionCallbackReturn:
        return self._change(4)

    def trigger_shutdown(self) -> TransitionCallbackReturn:
        transition_id = self._transition_named("shutdown")
        if transition_id < 0:
            raise RuntimeError(f"shutdown is not possible from {STATE_LABELS[self._state]}")
        return self._change(transition_id)

    def _transition_named(self, label: str) -> int:
        """The id of the primary transition ``label`` from the current state; -1 if it has none."""
        return next((tid for tid, (name, start, _) in PRIMARY.items() if name == label and start == self._state), -1)

    @property
    def lifecycle_state(self) -> LifecycleState:
        return LifecycleState(STATE_LABELS[self._state], self._state)

    def _callback(self, transition_state: int) -> Callable[[LifecycleState], TransitionCallbackReturn]:
        return {CONFIGURING: self.on_configure, CLEANINGUP: self.on_cleanup, SHUTTINGDOWN: self.on_shutdown,
                ACTIVATING: self.on_activate, DEACTIVATING: self.on_deactivate,
                ERRORPROCESSING: self.on_error}[transition_state]

    def _change(self, transition_id: int) -> TransitionCallbackReturn:
        """Run one primary transition; RuntimeError if the current state has no such transition."""
        with self._changing:
            label, start, transition_state = PRIMARY.get(transition_id, ("", -1, -1))
            if start != self._state:
                raise RuntimeError(f"transition {label or transition_id} is not possible from "
                                   f"{STATE_LABELS[self._state]}")
            left = self.lifecycle_state
            self._move(transition_id, label, transition_state)
            result = self._run(transition_state, left)
            if result == TransitionCallbackReturn.ERROR:
                self._run(ERRORPROCESSING, left)
            return result

    def _run(self, transition_state: int, left: LifecycleState) -> TransitionCallbackReturn:
        """Call the transition state's callback and move to where its result leads."""
        try:
            result = TransitionCallbackReturn(self._callback(transition_state)(left))
        except Exception as exc:  # as rcl_lifecycle: a raising callback is an error
            self.get_logger().error(f"{STATE_LABELS[transition_state]} failed: {exc!r}")
            result = TransitionCallbackReturn.ERROR
        outcome = result - TransitionCallbackReturn.SUCCESS  # 0 success, 1 failure, 2 error
        transition_id, goal = OUTCOMES[transition_state][outcome]
        self._move(transition_id, OUTCOME_LABELS[outcome], goal)
        return result

    def _move(self, transition_id: int, label: str, goal: int) -> None:
        State, Transition = registry().message_class("lifecycle_msgs/msg/State"), \
            registry().message_class("lifecycle_msgs/msg/Transition")
        event = self._TransitionEvent(
            timestamp=time.time_ns(), transition=Transition(id=transition_id, label=label),
            start_state=State(id=self._state, label=STATE_LABELS[self._state]),
            goal_state=State(id=goal, label=STATE_LABELS[goal]))
        self._state = goal
        self._events.publish(event)

    # -- the services ------------------------------------------------------------------------------

    def _on_change_state(self, request: Any, response: Any) -> Any:
        transition_id = request.transition.id
        if request.transition.label:
            transition_id = self._transition_named(request.transition.label)
        try:
            response.success = self._change(transition_id) == TransitionCallbackReturn.SUCCESS
        except RuntimeError as exc:
            self.get_logger().warning(f"change_state refused: {exc}")
            response.success = False
        return response

    def _on_get_state(self, request: Any, response: Any) -> Any:
        response.current_state.id, response.current_state.label = self._state, STATE_LABELS[self._state]
        return response

    def _on_get_available_states(self, request: Any, response: Any) -> Any:
        State = registry().message_class("lifecycle_msgs/msg/State")
        response.available_states = [State(id=i, label=label) for i, label in STATE_LABELS.items()]
        return response

    def _on_get_available_transitions(self, request: Any, response: Any) -> Any:
        response.available_transitions = [d for d in _transition_graph() if d.start_state.id == self._state]
        return response

    def _on_get_transition_graph(self, request: Any, response: Any) -> Any:
        response.available_transitions = _transition_graph()
        return response


def _transition_graph() -> list:
    """Every transition as lifecycle_msgs/msg/TransitionDescription: the primary ones (to their
    transition state) and each transition state's outcomes."""
    cls = registry().message_class
    Description, Transition, State = (cls("lifecycle_msgs/msg/TransitionDescription"),
                                      cls("lifecycle_msgs/msg/Transition"), cls("lifecycle_msgs/msg/State"))

    def describe(tid: int, label: str, start: int, goal: int):
        return Description(transition=Transition(id=tid, label=label),
                           start_state=State(id=start, label=STATE_LABELS[start]),
                           goal_state=State(id=goal, label=STATE_LABELS[goal]))

    graph = [describe(tid, label, start, middle) for tid, (label, start, middle) in PRIMARY.items()]
    for middle, outcomes in OUTCOMES.items():
        graph += [describe(tid, OUTCOME_LABELS[i], middle, goal) for i, (tid, goal) in enumerate(outcomes)]
    return graph
