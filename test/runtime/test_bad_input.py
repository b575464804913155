"""Bad input on the wire or the command line: a clear error, nothing lost, the node keeps serving."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
import zenoh
from support import Proc, cli, python_module, wait_until

from edge_llm_ros.runtime import graph
from edge_llm_ros.runtime.interfaces import registry


@pytest.fixture()
def echo_node(router_endpoint):
    proc = Proc(python_module("edge_llm_ros.nodes.echo_node", "--ros-args", "-r", "__ns:=/bad_input"))
    proc.wait_for_line("echoing", 60)
    yield proc
    proc.stop()


def raw_session(endpoint: str) -> zenoh.Session:
    conf = zenoh.Config()
    conf.insert_json5("mode", json.dumps("peer"))
    conf.insert_json5("connect/endpoints", json.dumps([endpoint]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    return zenoh.open(conf)


@pytest.mark.slow
def test_garbage_and_wrong_hash_are_logged_and_node_keeps_serving(rt_session, echo_node, router_endpoint):
    reg = registry()
    topic = "/bad_input/instruction"
    good_key = graph.data_key(0, topic, "std_msgs/msg/String", reg.type_hash("std_msgs/msg/String"))
    wrong_key = graph.data_key(0, topic, "std_msgs/msg/String", "RIHS01_" + "0" * 64)
    session = raw_session(router_endpoint)
    try:
        garbage = session.declare_publisher(good_key)
        wrong = session.declare_publisher(wrong_key)
        wait_until(lambda: garbage.matching_status.matching and wrong.matching_status.matching, 20, "echo_node matching")
        att = graph.Attachment(1, 0, b"\x01" * 16).to_bytes()
        garbage.put(b"\x00\x01\x00\x00\xff\xff\xff\x7f", attachment=att)  # string length 2^31: malformed
        wrong.put(reg.serialize(reg.new("std_msgs/msg/String", data="x")), attachment=att)
        line = echo_node.wait_for_line("malformed message on /bad_input/instruction", 20)
        assert "std_msgs/msg/String" in line and "ERROR" in line
        line = echo_node.wait_for_line("expects std_msgs/msg/String", 20)
        assert "/bad_input/instruction" in line and "RIHS01_000" in line
    finally:
        session.close()

    # still serving: a good instruction gets its response
    rt = rt_session
    node = rt.Node("bad_input_check", namespace="bad_input")
    got, done = [], threading.Event()
    node.create_subscription("edge_llm_ros/msg/TokenChunk", "response", lambda m: (got.append(m), m.done and done.set()), 100)
    pub = node.create_publisher("std_msgs/msg/String", "instruction", 10)
    assert pub.wait_for_subscribers(20)
    wait_until(lambda: node.count_publishers("response") >= 1, 20, "echo_node response publisher")
    pub.publish(reg.new("std_msgs/msg/String", data="still alive"))
    assert done.wait(20), f"no response; node output:\n{echo_node.output[-2000:]}"
    assert "".join(c.text for c in got) == "still alive"
    assert echo_node.popen.poll() is None
    node.destroy_node()


@pytest.mark.parametrize("args, needle", [
    (["topic", "pub", "--once", "/x", "edge_llm_ros/msg/NoSuch", "{}"], "unknown message type"),
    (["topic", "pub", "--once", "/x", "std_msgs/msg/String", "{data: [unclosed"], "malformed YAML"),
    (["topic", "pub", "--once", "/x", "std_msgs/msg/String", "{text: hi}"], "no field"),
    (["service", "call", "/x", "edge_llm_ros/srv/Nope", "{}"], "unknown service type"),
    (["bag", "info", "/nonexistent/bag"], "/nonexistent/bag"),
    (["interface", "show", "std_msgs/msg/Nope"], "unknown message type"),
])
@pytest.mark.slow
def test_cli_bad_input_is_one_line_and_exit_2(router_endpoint, args, needle):
    result = cli(*args, timeout=60)
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.stderr


@pytest.mark.slow
def test_cli_service_call_without_server_times_out(router_endpoint):
    result = cli("service", "call", "/nobody/profile", "edge_llm_ros/srv/Profile", "{}", "--timeout", "1", timeout=60)
    assert result.returncode == 1
    assert "not available" in result.stderr and "/nobody/profile" in result.stderr


@pytest.mark.slow
def test_node_with_missing_params_file_exits_2(router_endpoint):
    proc = Proc(python_module("edge_llm_ros.nodes.echo_node", "--ros-args", "--params-file", "/no/such/params.yaml"))
    assert proc.wait(60) == 2
    assert "/no/such/params.yaml" in proc.output
    assert len([line for line in proc.output.splitlines() if line.strip()]) == 1


@pytest.mark.slow
def test_node_with_wrong_parameter_type_exits_2(router_endpoint):
    proc = Proc(python_module("edge_llm_ros.nodes.echo_node", "--ros-args", "-p", "chunk_words:=many"))
    assert proc.wait(60) == 2
    assert "chunk_words" in proc.output


@pytest.mark.slow
@pytest.mark.parametrize("args, line", [
    (["topic", "pub", "--once", "/x", "std_msgs/msg/Int32", "{data: 99999999999}"],
     "edge-llm-ros topic pub: error: std_msgs/msg/Int32.data: 99999999999 is out of range for int32 "
     "[-2147483648, 2147483647]"),
    (["action", "send_goal", "/nobody/generate", "edge_llm_ros/action/Generate", "{prompt: 'hi', max_new_tokens: -3}"],
     "edge-llm-ros action send_goal: error: edge_llm_ros/action/Generate_Goal.max_new_tokens: -3 is out of range "
     "for uint32 [0, 4294967295]"),
    (["service", "call", "/nobody/profile", "edge_llm_ros/srv/Profile", "{token_counts: [1, -5]}"],
     "edge-llm-ros service call: error: edge_llm_ros/srv/Profile_Request.token_counts[1]: -5 is out of range "
     "for uint32 [0, 4294967295]"),
    (["topic", "pub", "--once", "/x", "std_msgs/msg/Float32", "{data: 1e40}"],
     "edge-llm-ros topic pub: error: std_msgs/msg/Float32.data: 1e40 is out of range for float32 "
     "[-3.4028234663852886e+38, 3.4028234663852886e+38]"),
    (["topic", "pub", "--once", "/x", "std_msgs/msg/Bool", "{data: 'yes'}"],
     "edge-llm-ros topic pub: error: std_msgs/msg/Bool.data: 'yes' is not a bool (true/false or 1/0)"),
    (["topic", "pub", "--once", "/x", "std_msgs/msg/UInt8MultiArray", "{data: [1, 2, 300]}"],
     "edge-llm-ros topic pub: error: std_msgs/msg/UInt8MultiArray.data[2]: 300 is out of range for uint8 [0, 255]"),
    (["topic", "pub", "--once", "/x", "std_msgs/msg/Int32", "{data: " + "9" * 5000 + "}"],
     "edge-llm-ros topic pub: error: std_msgs/msg/Int32: Exceeds the limit (4300 digits) for integer string "
     "conversion: value has 5000 digits"),
])
def test_cli_value_out_of_its_field_range_is_one_line_and_exit_2(router_endpoint, args, line):
    result = cli(*args, timeout=60)
    assert result.returncode == 2, result
    assert result.stderr.strip() == line, result.stderr
    assert result.stdout == ""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_send_goal_says_when_the_server_dies_mid_goal(router_endpoint):
    """The server's process is killed while the goal runs: one line naming server and goal, exit 1, at once."""
    peer = Proc([sys.executable, str(Path(__file__).parent / "peers" / "echo_peer.py"), "--ros-args", "-r",
                 "__ns:=/server_gone"])
    client = None
    try:
        peer.wait_for_line("READY", 60)
        client = Proc(python_module("edge_llm_ros.runtime.cli", "action", "send_goal", "/server_gone/generate",
                                    "edge_llm_ros/action/Generate", "{prompt: hold}"))
        goal_id = client.wait_for_line("Goal accepted with ID:", 60).split(":", 1)[1].strip()
        peer.popen.kill()
        killed = time.monotonic()
        assert client.wait(30) == 1, client.output[-2000:]
        assert time.monotonic() - killed < 5.0
        line = client.wait_for_line("went away", 10)  # the reader may still hold the last lines
        assert line == (f"edge-llm-ros action send_goal: error: action server /server_gone/generate went away "
                        f"while goal {goal_id} was running"), client.output[-2000:]
        assert "error:" not in client.output.replace(line, "") and "Traceback" not in client.output
    finally:
        if client is not None:
            client.stop()
        peer.stop()
