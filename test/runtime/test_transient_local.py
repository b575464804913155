"""Transient-local durability on the embedded backend, as ROS 2 defines it: a subscription made after
the messages were published gets the publisher's last `depth` of them, in order, then the live ones; a
volatile subscription gets only live ones; a volatile publisher keeps nothing for late subscribers.
(Across processes: test_planner_node's calibration test subscribes to a running planner_node late.)"""

from __future__ import annotations

import threading
import uuid

import pytest


class Inbox:
    """Messages a subscription got, and an event per count reached."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.cond = threading.Condition()

    def __call__(self, msg) -> None:
        with self.cond:
            self.items.append(msg.data)
            self.cond.notify_all()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[str]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.items) >= count, timeout)
            return list(self.items)


@pytest.fixture
def node(rt_session):
    node = rt_session.Node(f"latch_{uuid.uuid4().hex[:8]}", namespace=f"/latch_{uuid.uuid4().hex[:8]}")
    yield node
    node.destroy_node()


def subscribe(node, topic: str, qos) -> Inbox:
    from edge_llm_ros import runtime as rt

    inbox = Inbox()
    node.create_subscription(rt.message("std_msgs/msg/String"), topic, inbox, qos)
    return inbox


def test_a_late_subscriber_gets_the_last_depth_messages_then_live_ones(node):
    from edge_llm_ros import runtime as rt
    from edge_llm_ros.nodes.common import latched_qos

    String = rt.message("std_msgs/msg/String")
    pub = node.create_publisher(String, "latched", latched_qos(depth=2))
    for text in ("one", "two", "three"):
        pub.publish(String(data=text))
    late = subscribe(node, "latched", latched_qos(depth=2))
    assert late.wait_for(2) == ["two", "three"]
    assert pub.wait_for_subscribers(10)  # a transient-local publisher has no matching status: the graph says
    pub.publish(String(data="four"))
    assert late.wait_for(3) == ["two", "three", "four"]
    volatile = subscribe(node, "latched", 10)  # durability volatile: nothing from before it existed
    pub.publish(String(data="five"))
    assert volatile.wait_for(1) == ["five"]


def test_a_volatile_publisher_keeps_nothing_for_late_subscribers(node):
    from edge_llm_ros import runtime as rt
    from edge_llm_ros.nodes.common import latched_qos

    String = rt.message("std_msgs/msg/String")
    pub = node.create_publisher(String, "volatile", 10)
    pub.publish(String(data="gone"))
    late = subscribe(node, "volatile", latched_qos())
    assert pub.wait_for_subscribers(10)
    pub.publish(String(data="live"))
    assert late.wait_for(1) == ["live"]
