"""CLI verbs that read the graph or drive a node: node/topic/service/action list, hz, send_goal."""

from __future__ import annotations

import pytest

from support import Proc, cli, python_module

NS = "/cli_graph"


@pytest.fixture(scope="module")
def echo_node(router_endpoint):
    proc = Proc(python_module("edge_llm_ros.nodes.echo_node", "--ros-args", "-r", f"__ns:={NS}",
                              "-p", "stats_period_s:=0.1"))
    proc.wait_for_line("echoing", 60)
    yield proc
    proc.stop()


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


def test_action_send_goal_streams_text_and_reports_success(echo_node):
    result = cli("action", "send_goal", f"{NS}/generate", "edge_llm_ros/action/Generate",
                 "{prompt: 'walk to the kitchen door'}")
    assert result.returncode == 0, result.stderr
    assert "Goal accepted with ID:" in result.stdout
    assert "walk to the kitchen door\n" in result.stdout  # streamed feedback, then a newline
    assert "text: walk to the kitchen door" in result.stdout
    assert "Goal finished with status: SUCCEEDED" in result.stdout


def test_topic_hz_measures_the_stats_rate(echo_node):
    result = cli("topic", "hz", f"{NS}/stats", "--duration", "3")
    assert result.returncode == 0, result.stderr
    rates = [float(line.split(":")[1]) for line in result.stdout.splitlines() if line.startswith("average rate:")]
    assert rates and 5.0 < rates[-1] < 20.0, result.stdout  # published every 0.1 s


def test_topic_echo_learns_the_type_from_the_graph(echo_node):
    result = cli("topic", "echo", "--once", f"{NS}/stats", "--timeout", "30")
    assert result.returncode == 0, result.stderr
    assert "node_name: echo_node" in result.stdout and "mode: echo" in result.stdout


def test_interface_show_prints_definitions():
    result = cli("interface", "show", "edge_llm_ros/action/Generate")
    assert result.returncode == 0
    assert result.stdout.count("---") == 2 and "string[] choices" in result.stdout
