"""Who sent a message, on both runtimes, and the ownership rule the verifier and stages keep with it
(nodes/ownership.py; the forged-message cases through the node processes are in
test_edge_cloud_nodes.py and test_stage_node.py).

- A subscription callback that takes two parameters gets (message, info), info naming the gid of
  the publisher that sent it, equal to runtime.publisher_gid() of that publisher and not another's;
  one that takes one parameter gets the message alone. Embedded: from rmw_zenoh's attachment. rclpy:
  through rcl (runtime/publisher_gids.py), as runtime.ros.spin's executors take it.
- Owners: a request is open to anyone until bound; then drafts/rows only from its sender, PruneInfos
  only from the pruner it named; every refusal counted and logged (throttled); ending frees the id.
"""

from __future__ import annotations

import pytest
from support import ros_domain, wait_until

from edge_llm_ros.nodes.ownership import Owner, Owners
from edge_llm_ros.runtime.throttle import EVERY, FIRST


class Logger:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, line: str) -> None:
        self.lines.append(line)


def test_a_bound_request_takes_drafts_from_its_sender_and_prunes_from_its_pruner_only():
    owners = Owners(Logger())
    robot, pruner, forger = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16
    assert owners.sends("r", forger, "draft") and owners.prunes("r", forger, "release")  # not open: anyone's
    owners.bind("r", Owner(robot, pruner))
    owners.bind("r", Owner(forger, forger))  # a bound request keeps its owner
    assert owners.of("r") == Owner(robot, pruner)
    assert owners.sends("r", robot, "draft") and owners.prunes("r", pruner, "release")
    assert not owners.sends("r", forger, "draft") and not owners.sends("r", pruner, "rows")
    assert not owners.prunes("r", forger, "release") and not owners.prunes("r", robot, "prune")
    assert owners.refused == 4 and owners.sends("other", forger, "draft")
    assert owners.logger.lines[0] == (f"draft for request 'r' from publisher {forger.hex()} refused: not the owner: "
                                      "request 'r' belongs to another publisher")
    owners.end("r")  # the request ended: its id is free again
    assert owners.prunes("r", forger, "release") and owners.of("r") is None and owners.refused == 4


def test_refusals_are_all_counted_and_logged_under_the_flood_rule():
    owners = Owners(Logger())
    owners.bind("r", Owner(b"a", b"b"))
    for _ in range(2 * EVERY):
        owners.prunes("r", b"x", "release")
    assert owners.refused == 2 * EVERY
    lines = owners.logger.lines
    assert len(lines) == FIRST + 2 and lines[-1].endswith(f"({2 * EVERY} so far; logging every {EVERY}th)")


def test_the_embedded_runtime_gives_a_message_info_callback_its_publishers_gid(rt_session):
    from edge_llm_ros.runtime.interfaces import registry

    node = rt_session.Node("gids", namespace="rt_gids")
    String = registry().message_class("std_msgs/msg/String")
    heard: list[tuple] = []
    try:
        node.create_subscription(String, "said", lambda msg, info: heard.append((msg.data, info)), 10)
        node.create_subscription(String, "said", lambda msg: heard.append((msg.data, None)), 10)
        first, second = (node.create_publisher(String, "said", 10) for _ in range(2))
        wait_until(lambda: first.get_subscription_count() >= 2 and second.get_subscription_count() >= 2, 20,
                   "the subscriptions")
        first.publish(String(data="one"))
        second.publish(String(data="two"))
        wait_until(lambda: len(heard) == 4, 20, "four deliveries")
        infos = {data: info for data, info in heard if info is not None}
        assert sorted(data for data, info in heard if info is None) == ["one", "two"]
        assert infos["one"]["publisher_gid"] == rt_session.publisher_gid(first) != rt_session.publisher_gid(second)
        assert infos["two"]["publisher_gid"] == rt_session.publisher_gid(second) and len(infos["two"]["publisher_gid"]) == 16
        assert infos["one"]["source_timestamp"] > 0 and infos["one"]["publication_sequence_number"] == 1
    finally:
        node.destroy_node()


def test_the_rclpy_runtime_gives_a_message_info_callback_its_publishers_gid(ros2_env):
    """rclpy Jazzy's own take leaves the gid out; runtime.ros.spin's executors take through rcl."""
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from std_msgs.msg import String

    from edge_llm_ros.runtime.publisher_gids import TakesPublisherGids, publisher_gid

    class Executor(TakesPublisherGids, SingleThreadedExecutor):
        pass

    context = Context()
    rclpy.init(context=context, domain_id=ros_domain(30, 60))
    node = Node("gids", context=context)
    executor = Executor(context=context)
    executor.add_node(node)
    heard: list[tuple] = []
    try:
        node.create_subscription(String, "said", lambda msg, info: heard.append((msg.data, info)), 10)
        node.create_subscription(String, "said", lambda msg: heard.append((msg.data, None)), 10)
        first, second = (node.create_publisher(String, "said", 10) for _ in range(2))
        wait_until(lambda: first.get_subscription_count() >= 2 and second.get_subscription_count() >= 2, 20,
                   "the subscriptions")
        first.publish(String(data="one"))
        second.publish(String(data="two"))
        wait_until(lambda: executor.spin_once(timeout_sec=0.1) or len(heard) == 4, 20, "four deliveries")
        infos = {data: info for data, info in heard if info is not None}
        assert sorted(data for data, info in heard if info is None) == ["one", "two"]
        gids = {info["publisher_gid"] for info in infos.values()}
        assert infos["one"]["publisher_gid"] == publisher_gid(first) and infos["two"]["publisher_gid"] == publisher_gid(second)
        assert len(gids) == 2 and all(len(gid) == 16 for gid in gids)
        assert infos["one"]["source_timestamp"] > 0 and set(infos["one"]) >= {"received_timestamp",
                                                                              "publication_sequence_number"}
    finally:
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()


@pytest.mark.parametrize("callback, takes", [(lambda msg: None, False), (lambda msg, info: None, True),
                                             (lambda msg, info=None: None, False), (lambda *args: None, False),
                                             (print, False)])
def test_which_callbacks_take_message_info_follows_rclpy(callback, takes):
    from edge_llm_ros.runtime.embedded import takes_message_info

    assert takes_message_info(callback) is takes
