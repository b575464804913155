"""Managed nodes on the embedded backend (runtime/lifecycle.py): rcl_lifecycle's state machine, its
services and transition events, and `edge-llm-ros lifecycle` (worded as `ros2 lifecycle`).

The heavy nodes' own lifecycle (refusing requests while inactive, freeing the model on cleanup)
is tested on real processes under both backends in test_serve_node.py.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from support import cli, wait_until


def toy_node(rt_session):
    """A managed node that records its callbacks; ``fail`` makes the next configure fail or raise."""
    from edge_llm_ros.runtime.lifecycle import LifecycleNode, TransitionCallbackReturn

    class Toy(LifecycleNode):
        def __init__(self) -> None:
            super().__init__("toy", namespace=f"/lifecycle_{uuid.uuid4().hex[:8]}")
            self.calls: list[tuple[str, str]] = []
            self.fail = ""

        def record(self, name: str, state) -> TransitionCallbackReturn:
            self.calls.append((name, state.label))
            if self.fail == "raise":
                raise RuntimeError("cannot load")
            return TransitionCallbackReturn.FAILURE if self.fail == "fail" else TransitionCallbackReturn.SUCCESS

        def on_configure(self, state):
            return self.record("configure", state)

        def on_activate(self, state):
            return self.record("activate", state)

        def on_error(self, state):
            self.calls.append(("error", state.label))
            return TransitionCallbackReturn.SUCCESS

    return Toy()


@pytest.fixture
def toy(rt_session):
    node = toy_node(rt_session)
    yield node
    node.destroy_node()


@pytest.fixture
def probe(rt_session):
    node = rt_session.Node(f"probe_{uuid.uuid4().hex[:8]}")
    yield node
    node.destroy_node()


def call(probe, toy, service: str, srv_type: str, **request):
    from edge_llm_ros.runtime.interfaces import registry

    srv = registry().service(f"lifecycle_msgs/srv/{srv_type}")
    client = probe.create_client(srv.name, f"{toy.get_fully_qualified_name()}/{service}")
    try:  # the service is this process's own: no discovery to wait for
        return client.call(registry().from_dict(srv.request, request), timeout_sec=10)
    finally:
        probe.destroy_client(client)


def test_services_drive_the_state_machine_and_every_change_is_an_event(toy, probe):
    events, lock = [], threading.Lock()

    def on_event(msg) -> None:
        with lock:
            events.append((msg.start_state.label, msg.goal_state.label, msg.transition.label))

    probe.create_subscription("lifecycle_msgs/msg/TransitionEvent",
                              f"{toy.get_fully_qualified_name()}/transition_event", on_event, 10)
    wait_until(lambda: probe.count_subscribers(f"{toy.get_fully_qualified_name()}/transition_event") >= 1, 10,
               "the event subscription")
    assert call(probe, toy, "get_state", "GetState").current_state.label == "unconfigured"

    assert call(probe, toy, "change_state", "ChangeState", transition={"label": "configure"}).success
    assert call(probe, toy, "change_state", "ChangeState", transition={"id": 3}).success  # activate
    assert toy.lifecycle_state.label == "active"
    assert toy.calls == [("configure", "unconfigured"), ("activate", "inactive")]
    wait_until(lambda: len(events) >= 4, 10, "four transition events")
    assert events == [("unconfigured", "configuring", "configure"),
                      ("configuring", "inactive", "transition_success"),
                      ("inactive", "activating", "activate"),
                      ("activating", "active", "transition_success")]

    available = call(probe, toy, "get_available_transitions", "GetAvailableTransitions").available_transitions
    assert sorted((t.transition.label, t.goal_state.label) for t in available) == [
        ("deactivate", "deactivating"), ("shutdown", "shuttingdown")]
    assert not call(probe, toy, "change_state", "ChangeState", transition={"label": "configure"}).success
    assert toy.lifecycle_state.label == "active"  # a transition the state does not have changes nothing
    graph = call(probe, toy, "get_transition_graph", "GetAvailableTransitions").available_transitions
    assert len(graph) == 7 + 6 * 3  # the primary transitions, and each transition state's three outcomes


def test_a_failing_configure_stays_unconfigured_and_a_raising_one_goes_through_error_processing(toy):
    from edge_llm_ros.runtime.lifecycle import TransitionCallbackReturn

    toy.fail = "fail"
    assert toy.trigger_configure() == TransitionCallbackReturn.FAILURE
    assert toy.lifecycle_state.label == "unconfigured"
    toy.fail = "raise"
    assert toy.trigger_configure() == TransitionCallbackReturn.ERROR
    assert toy.lifecycle_state.label == "unconfigured"  # on_error succeeded
    assert toy.calls[-1] == ("error", "unconfigured")
    toy.fail = ""
    assert toy.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert toy.trigger_shutdown() == TransitionCallbackReturn.SUCCESS
    assert toy.lifecycle_state.label == "finalized"
    with pytest.raises(RuntimeError, match="not possible from finalized"):
        toy.trigger_configure()


@pytest.mark.slow
def test_the_cli_lists_gets_and_sets_as_ros2_lifecycle_does(toy):
    fqn = toy.get_fully_qualified_name()
    # one graph snapshot of a new CLI session may not hold every token yet (as `ros2 node list` may miss one)
    wait_until(lambda: fqn in cli("lifecycle", "nodes").stdout.split(), 30, f"`lifecycle nodes` to list {fqn}",
               interval=0.5)
    out = cli("lifecycle", "set", fqn, "configure")
    assert (out.returncode, out.stdout.strip()) == (0, "Transitioning successful"), out.stderr
    assert cli("lifecycle", "get", fqn).stdout.strip() == "inactive [2]"
    out = cli("lifecycle", "set", fqn, "deactivate")
    assert out.returncode == 1
    assert "Unknown transition requested, available ones are: cleanup [2], activate [3], shutdown [6]" in out.stderr
    listed = cli("lifecycle", "list", fqn).stdout
    assert "- activate [3]\n\tStart: inactive\n\tGoal: activating" in listed
