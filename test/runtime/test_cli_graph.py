"""CLI verbs that read the graph or drive a node: node/topic/service/action list, hz, send_goal."""

from __future__ import annotations

import re
import threading
import time

import pytest
from support import Proc, cli, python_module, stamped_now, wait_until

NS = "/cli_graph"


@pytest.fixture(scope="module")
def echo_node(router_endpoint):
    proc = Proc(python_module("edge_llm_ros.nodes.echo_node", "--ros-args", "-r", f"__ns:={NS}",
                              "-p", "stats_period_s:=0.1"))
    proc.wait_for_line("echoing", 60)
    yield proc
    proc.stop()


@pytest.mark.slow
def test_lists_show_the_node_and_its_endpoints(echo_node):
    nodes = cli("node", "list")
    assert nodes.returncode == 0 and f"{NS}/echo_node" in nodes.stdout.splitlines()
    topics = cli("topic", "list", "-t")
    assert f"{NS}/instruction [std_msgs/msg/String]" in topics.stdout.splitlines()
    assert f"{NS}/response [edge_llm_ros/msg/TokenChunk]" in topics.stdout.splitlines()
    services = cli("service", "list")
    assert f"{NS}/generate/_action/send_goal" in services.stdout.splitlines()
    actions = cli("action", "list", "-t")
    assert f"{NS}/generate [edge_llm_ros/action/Generate]" in actions.stdout.splitlines()
    info = cli("topic", "info", f"{NS}/instruction")
    assert "Type: std_msgs/msg/String" in info.stdout and "Subscription count: 1" in info.stdout


@pytest.mark.slow
def test_action_send_goal_streams_text_and_reports_success(echo_node):
    result = cli("action", "send_goal", f"{NS}/generate", "edge_llm_ros/action/Generate",
                 "{prompt: 'walk to the kitchen door'}")
    assert result.returncode == 0, result.stderr
    assert "Goal accepted with ID:" in result.stdout
    assert "walk to the kitchen door\n" in result.stdout  # streamed feedback, then a newline
    assert "Sending goal:\n     prompt: walk to the kitchen door\nimages: []\n" in result.stdout  # ros2's layout
    assert "Result:\n    text: walk to the kitchen door\ntoken_ids: []\n" in result.stdout
    assert "Goal finished with status: SUCCEEDED" in result.stdout
    sec = re.search(r"\nstats:\n  header:\n    stamp:\n      sec: (\d+)\n", result.stdout)
    assert sec and abs(int(sec[1]) - time.time()) < 120, result.stdout  # the result's stats are stamped


@pytest.mark.slow
@pytest.mark.serial
def test_topic_hz_measures_the_stats_rate(echo_node):
    result = cli("topic", "hz", f"{NS}/stats", "--duration", "3")
    assert result.returncode == 0, result.stderr
    rates = [float(line.split(":")[1]) for line in result.stdout.splitlines() if line.startswith("average rate:")]
    assert rates and 5.0 < rates[-1] < 20.0, result.stdout  # published every 0.1 s


@pytest.mark.slow
def test_topic_echo_learns_the_type_from_the_graph(echo_node):
    result = cli("topic", "echo", "--once", f"{NS}/stats", "--timeout", "30")
    assert result.returncode == 0, result.stderr
    assert "\nnode_name: echo_node\nrequest_id: ''\nmode: echo\n" in result.stdout
    sec = re.match(r"header:\n  stamp:\n    sec: (\d+)\n    nanosec: \d+\n  frame_id: ''\n", result.stdout)
    assert sec and abs(int(sec[1]) - time.time()) < 120, result.stdout
    assert result.stdout.endswith("\nignored_results: 0\n---\n") and "__msgtype__" not in result.stdout


@pytest.mark.slow
def test_topic_echo_field_and_csv(echo_node):
    field = cli("topic", "echo", "--once", f"{NS}/stats", "--field", "node_name", "--timeout", "30")
    assert (field.returncode, field.stdout) == (0, "echo_node\n---\n"), field.stderr
    csv = cli("topic", "echo", "--once", "--csv", "--field", "header", f"{NS}/stats", "--timeout", "30")
    assert csv.returncode == 0 and re.fullmatch(r"[1-9]\d*,\d+,\n", csv.stdout), csv.stdout + csv.stderr
    bad = cli("topic", "echo", "--once", f"{NS}/stats", "--field", "header.nope", "--timeout", "30")
    assert bad.returncode == 2 and "std_msgs/msg/Header has no field 'nope'" in bad.stderr, bad.stderr


@pytest.mark.slow
def test_echo_node_stamps_what_it_publishes(echo_node, rt_session):
    from edge_llm_ros.runtime.interfaces import registry

    node = rt_session.Node("stamp_probe", namespace=NS)
    chunks, stats, got_chunk, got_stats = [], [], threading.Event(), threading.Event()
    node.create_subscription("edge_llm_ros/msg/TokenChunk", "response",
                             lambda msg: (chunks.append(msg), got_chunk.set()), 10)
    node.create_subscription("edge_llm_ros/msg/InferenceStats", "stats",
                             lambda msg: (stats.append(msg), got_stats.set()), 10)
    pub = node.create_publisher("std_msgs/msg/String", "instruction", 10)
    try:
        wait_until(lambda: node.count_subscribers(f"{NS}/response") >= 1, 20, "the probe's response subscription")
        assert pub.wait_for_subscribers(20), "echo_node never subscribed to instruction"
        for _ in range(40):  # until a chunk comes back (echo_node may still be matching the probe)
            pub.publish(registry().new("std_msgs/msg/String", data="stamp me"))
            if got_chunk.wait(0.5):
                break
        assert got_chunk.wait(0) and got_stats.wait(20), "no TokenChunk or InferenceStats from echo_node"
        assert stamped_now(chunks[0]) and stamped_now(stats[0]), (chunks[0].header, stats[0].header)
    finally:
        node.destroy_node()


@pytest.mark.slow
def test_interface_show_prints_definitions():
    result = cli("interface", "show", "edge_llm_ros/action/Generate")
    assert result.returncode == 0
    assert result.stdout.count("---") == 2 and "string[] choices" in result.stdout
