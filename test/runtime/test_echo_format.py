"""Messages as `ros2 topic echo` prints them: the expected texts are what ROS 2 Jazzy's
rosidl_runtime_py (message_to_yaml / message_to_csv, as ros2topic's echo calls them) printed for
the same messages after a round trip through rclpy."""

from __future__ import annotations

import math

import pytest

from edge_llm_ros.runtime.cli import CliError, field_steps
from edge_llm_ros.runtime.echo_format import TRUNCATE_LENGTH, Shown, message_to_csv, message_to_yaml, rclpy_value
from edge_llm_ros.runtime.interfaces import registry

ECHO = Shown(TRUNCATE_LENGTH)  # what `topic echo` shows with no options


def received(name: str, **fields):
    """The message as a subscriber gets it: through CDR (float32 values widened from their float32 bits)."""
    reg = registry()
    return reg.deserialize(reg.serialize(reg.new(name, **fields)), name)


def token_chunk(**fields):
    reg = registry()
    header = reg.new("std_msgs/msg/Header", frame_id="base_link",
                     stamp=reg.new("builtin_interfaces/msg/Time", sec=1700000000, nanosec=5))
    return received("edge_llm_ros/msg/TokenChunk", header=header, request_id="r-1", round=3, token_ids=[1, -2, 3],
                    text='say: "hi" it\'s', probs=[0.5, 0.1], done=True, finish_reason="eos", **fields)


def test_a_nested_message_in_field_order_block_style():
    assert message_to_yaml(token_chunk(), ECHO) == """\
header:
  stamp:
    sec: 1700000000
    nanosec: 5
  frame_id: base_link
request_id: r-1
round: 3
token_ids:
- 1
- -2
- 3
text: 'say: "hi" it''s'
probs:
- 0.5
- 0.10000000149011612
done: true
finish_reason: eos
error: ''
status:
  code: 0
"""


def test_empty_sequences_multiline_strings_and_floats():
    chunk = received("edge_llm_ros/msg/TokenChunk", request_id="r-2", text="two\nlines")
    assert message_to_yaml(chunk, ECHO) == """\
header:
  stamp:
    sec: 0
    nanosec: 0
  frame_id: ''
request_id: r-2
round: 0
token_ids: []
text: 'two

  lines'
probs: []
done: false
finish_reason: ''
error: ''
status:
  code: 0
"""
    stats = received("edge_llm_ros/msg/InferenceStats", node_name="draft_node", mode="ee", tokens=42,
                     tokens_per_s=12.3, ttft_s=1e-5, tau=2.5, acceptance_rate=math.nan, avg_exit_layer=-0.0)
    lines = message_to_yaml(stats, ECHO).splitlines()
    for line in ("node_name: draft_node", "request_id: ''", "tokens: 42", "tokens_per_s: 12.300000190734863",
                 "ttft_s: 9.999999747378752e-06", "tau: 2.5", "acceptance_rate: .nan", "draft_time_s: 0.0",
                 "avg_exit_layer: -0.0"):
        assert line in lines, (line, lines)


def test_messages_nested_two_deep_and_string_sequences():
    reg = registry()
    nav = received("edge_llm_ros/msg/NavAction", request_id="n", frame_stamp=reg.new(
        "builtin_interfaces/msg/Time", sec=3, nanosec=5), action="turn_left", magnitude="small", angle_rad=1.5,
        valid=True, raw_text="- turn left: 90°")
    assert message_to_yaml(nav, ECHO).split("frame_id: ''\n")[1] == """\
request_id: n
frame_stamp:
  sec: 3
  nanosec: 5
action: turn_left
magnitude: small
distance_m: 0.0
angle_rad: 1.5
reason: ''
confidence: 0.0
latency_s: 0.0
valid: true
raw_text: '- turn left: 90°'
error: ''
"""
    twist = received("geometry_msgs/msg/TwistStamped", twist=reg.new(
        "geometry_msgs/msg/Twist", angular=reg.new("geometry_msgs/msg/Vector3", z=0.75)))
    assert message_to_yaml(twist, ECHO).split("frame_id: ''\n")[1] == """\
twist:
  linear:
    x: 0.0
    y: 0.0
    z: 0.0
  angular:
    x: 0.0
    y: 0.0
    z: 0.75
"""
    plan = received("edge_llm_ros/msg/Plan", mode="tree", stage_layer_begin=[0, 15], stage_layer_end=[15, 30],
                    stage_nodes=["edge", "cloud"])
    assert "\nstage_layer_end:\n- 15\n- 30\nstage_nodes:\n- edge\n- cloud\nprefill_chunks: []\n" in \
        message_to_yaml(plan, ECHO)


def test_strings_quoted_only_where_yaml_needs_it():
    shown = {text: message_to_yaml(received("std_msgs/msg/String", data=text)) for text in
             ("hello", "yes", "", "123", "a: b", "é")}
    assert shown == {"hello": "data: hello\n", "yes": "data: 'yes'\n", "": "data: ''\n", "123": "data: '123'\n",
                     "a: b": "data: 'a: b'\n", "é": "data: é\n"}


def test_empty_messages_and_bytes():
    assert message_to_yaml(received("std_msgs/msg/Empty")) == "{}\n"
    assert message_to_yaml(received("std_msgs/msg/Byte", data=65)) == "data: A\n"
    assert message_to_yaml(received("std_msgs/msg/ByteMultiArray", data=[1, 65])) == \
        'layout:\n  dim: []\n  data_offset: 0\ndata:\n- "\\x01"\n- A\n'


def test_long_sequences_and_strings_are_cut_at_the_truncate_length():
    chunk = received("edge_llm_ros/msg/TokenChunk", token_ids=list(range(130)), text="x" * 130)
    text = message_to_yaml(chunk, ECHO)
    assert "\n- 127\n- '...'\ntext: " + "x" * 128 + "...\nprobs: []\n" in text
    assert "\n- 129\ntext: " + "x" * 130 + "\n" in message_to_yaml(chunk)  # --full-length


def test_flow_style_no_arr_no_str_and_csv():
    chunk = token_chunk()
    flow = message_to_yaml(chunk, ECHO, flow_style=True)
    assert "\nround: 3\ntoken_ids: [1, -2, 3]\n" in flow and "\nprobs: [0.5, 0.10000000149011612]\n" in flow
    assert flow.startswith("header:\n  stamp:\n    sec: 1700000000\n")  # messages stay in block style
    assert message_to_yaml(chunk, Shown(TRUNCATE_LENGTH, no_arr=True, no_str=True)).split("nanosec: 5\n")[1] == """\
  frame_id: '<string length: <9>>'
request_id: '<string length: <3>>'
round: 3
token_ids: '<sequence type: int32, length: 3>'
text: '<string length: <14>>'
probs: '<sequence type: float, length: 2>'
done: true
finish_reason: '<string length: <3>>'
error: '<string length: <0>>'
status:
  code: 0
"""
    assert message_to_csv(chunk, ECHO) == \
        "1700000000,5,base_link,r-1,3,1,-2,3,say: \"hi\" it's,0.5,0.10000000149011612,True,eos,,0"
    assert message_to_csv(received("edge_llm_ros/msg/TokenChunk", request_id="r-2", text="two\nlines"), ECHO) == \
        "0,0,,r-2,0,,two\nlines,,False,,,0"
    # ros2 adds no comma after an empty start: the empty layout.dim leaves no trace
    assert message_to_csv(received("std_msgs/msg/ByteMultiArray", data=[1, 65]), ECHO) == "0,b'\\x01',b'A'"


def test_field_values_print_as_rclpy_holds_them():
    chunk = token_chunk()
    shown = {}
    for path in ("token_ids", "probs", "text", "done", "header.frame_id"):
        steps = field_steps("edge_llm_ros/msg/TokenChunk", path)
        value = chunk
        for name, _ in steps:
            value = getattr(value, name)
        shown[path] = str(rclpy_value(steps[-1][1], value))
    assert shown == {"token_ids": "array('i', [1, -2, 3])", "probs": "array('f', [0.5, 0.10000000149011612])",
                     "text": 'say: "hi" it\'s', "done": "True", "header.frame_id": "base_link"}
    assert str(rclpy_value(field_steps("std_msgs/msg/Byte", "data")[0][1], 65)) == "b'A'"
    with pytest.raises(CliError, match="'text' is no message, it has no field 'x'"):
        field_steps("edge_llm_ros/msg/TokenChunk", "text.x")
