"""Bag verbs of the CLI against real ROS 2 bags and a running pipeline."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from support import TESTDATA, Proc, cli, python_module, wait_until

from edge_llm_ros.runtime.bag import BagReader
from edge_llm_ros.runtime.interfaces import registry

BAGS = TESTDATA / "ros2_bags"


@pytest.mark.parametrize("bag", ["talker_mcap", "talker_sqlite3"])
@pytest.mark.slow
def test_bag_info_reads_real_ros2_bags(bag):
    result = cli("bag", "info", str(BAGS / bag))
    assert result.returncode == 0, result.stderr
    assert "Messages:" in result.stdout and "20" in result.stdout.split("Messages:")[1].splitlines()[0]
    assert "std_msgs/msg/String" in result.stdout and "rcl_interfaces/msg/Log" in result.stdout


@pytest.mark.parametrize("bag", ["talker_mcap", "talker_sqlite3"])
@pytest.mark.slow
def test_bag_play_publishes_every_message(rt_session, bag):
    rt = rt_session
    node = rt.Node(f"play_check_{bag}")
    strings, logs = [], []
    node.create_subscription("std_msgs/msg/String", "/topic", lambda m: strings.append(m.data), 100)
    node.create_subscription("rcl_interfaces/msg/Log", "/rosout", lambda m: logs.append(m.msg), 100)
    try:
        result = cli("bag", "play", str(BAGS / bag), "--rate", "20")
        assert result.returncode == 0, result.stderr
        assert "published 20 messages" in result.stderr
        wait_until(lambda: len(strings) == 10 and len(logs) == 10, 20, "all 20 played messages")
        assert strings == [f"Hello, world! {i}" for i in range(10)]
    finally:
        node.destroy_node()


def responses_by_instruction(chunks) -> list[str]:
    texts: dict[str, str] = {}
    for c in chunks:
        texts[c.request_id] = texts.get(c.request_id, "") + c.text
    return list(texts.values())


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_record_then_replay_reproduces_responses(rt_session, router_endpoint, tmp_path, storage):
    rt = rt_session
    reg = registry()
    ns = f"/rec_{storage}"
    instructions = ["go to the red chair", "stop", "turn left then walk two meters"]
    bag_dir = tmp_path / "run1"

    node = rt.Node(f"rec_driver_{storage}")
    live: list = []
    node.create_subscription("edge_llm_ros/msg/TokenChunk", f"{ns}/response", live.append, 1000)
    pub = node.create_publisher("std_msgs/msg/String", f"{ns}/instruction", 10)

    first = Proc(python_module("edge_llm_ros.nodes.echo_node", "--ros-args", "-r", f"__ns:={ns}", "-p", "chunk_words:=2"))
    recorder = None
    try:
        first.wait_for_line("echoing", 60)
        recorder = Proc([sys.executable, "-m", "edge_llm_ros.runtime.cli", "bag", "record", "-o", str(bag_dir), "-s", storage,
                         f"{ns}/instruction", f"{ns}/response"])
        recorder.wait_for_line(f"subscribed to {ns}/instruction", 30)
        recorder.wait_for_line(f"subscribed to {ns}/response", 30)
        assert pub.wait_for_subscribers(20)
        wait_until(lambda: node.count_subscribers(f"{ns}/instruction") >= 2, 20, "echo node and recorder subscribed")
        wait_until(lambda: node.count_subscribers(f"{ns}/response") >= 2, 20, "this node and the recorder hear responses")
        for text in instructions:
            pub.publish(reg.new("std_msgs/msg/String", data=text))
        wait_until(lambda: sum(c.done for c in live) == 3, 20, "three live responses")
        recorder.popen.send_signal(signal.SIGINT)
        assert recorder.wait(30) == 0, recorder.output
    finally:
        first.stop()
        if recorder is not None:
            recorder.stop()

    recorded = list(BagReader(bag_dir).messages())
    recorded_chunks = [reg.deserialize(m.data, m.typename) for m in recorded if m.topic == f"{ns}/response"]
    assert [reg.deserialize(m.data, m.typename).data for m in recorded if m.topic == f"{ns}/instruction"] == instructions
    assert responses_by_instruction(recorded_chunks) == instructions

    # a fresh pipeline fed from the bag answers the same
    replayed: list = []
    node.create_subscription("edge_llm_ros/msg/TokenChunk", f"{ns}/response", replayed.append, 1000)
    second = Proc(python_module("edge_llm_ros.nodes.echo_node", "--ros-args", "-r", f"__ns:={ns}", "-p", "chunk_words:=2"))
    try:
        second.wait_for_line("echoing", 60)
        wait_until(lambda: node.count_publishers(f"{ns}/response") >= 1, 20, "fresh echo node")
        result = cli("bag", "play", str(bag_dir), "--topics", f"{ns}/instruction", "--rate", "5")
        assert result.returncode == 0, result.stderr
        wait_until(lambda: sum(c.done for c in replayed) == 3, 30, "three replayed responses")
    finally:
        second.stop()
        node.destroy_node()
    assert responses_by_instruction(replayed) == responses_by_instruction(recorded_chunks)
    assert [(c.round, c.text, c.done) for c in replayed] == [(c.round, c.text, c.done) for c in recorded_chunks]


NAV_BAGS = Path(__file__).resolve().parents[1] / "data" / "nav_bags"  # python -m edge_llm_ros.tools.nav_bags


@pytest.mark.slow
def test_bag_play_require_fails_before_publishing_naming_the_missing_topic(router_endpoint):
    bag = NAV_BAGS / "no_camera"
    result = cli("bag", "play", str(bag), "--require", "/camera/image_raw:sensor_msgs/msg/Image",
                 "/edge_llm/instruction:std_msgs/msg/String")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"edge-llm-ros bag play: error: bag '{bag}' has no /camera/image_raw (sensor_msgs/msg/Image); "
        "its topics: /edge_llm/instruction (std_msgs/msg/String, 2 messages)")
    assert "published" not in result.stderr

    bad = cli("bag", "play", str(bag), "--require", "camera/image_raw")
    assert bad.returncode == 2 and "--require: expected /topic or /topic:pkg/msg/Type" in bad.stderr, bad.stderr
