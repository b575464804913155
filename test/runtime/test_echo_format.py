"""Messages as `ros2 topic echo` prints them (issue 28: against the real tool, not stored text).

Each case is a list of messages of one type and the options echo gets. The test builds the messages
with our registry, serializes them to CDR, and publishes those bytes from a real rclpy publisher
(transient local, so a late echo gets them all). A real `ros2 topic echo` (ROS 2 Jazzy's ros2topic,
a process of its own) prints them: that is the reference. Our side deserializes the same bytes and
prints them as `edge-llm-ros topic echo` does (runtime/echo_format.py through cmd_topic_echo's
separators): the two texts must be equal, character for character.
"""

from __future__ import annotations

import math
import subprocess
import threading
from dataclasses import dataclass, field

import pytest
from support import wait_until

from edge_llm_ros.runtime.cli import field_steps
from edge_llm_ros.runtime.echo_format import TRUNCATE_LENGTH, Shown, message_to_csv, message_to_yaml, rclpy_value
from edge_llm_ros.runtime.interfaces import registry

pytestmark = pytest.mark.slow  # `ros2 topic echo` processes against an rclpy publisher


def built(name: str, **fields):
    return registry().new(name, **fields)


def stamp(sec: int, nanosec: int):
    return built("builtin_interfaces/msg/Time", sec=sec, nanosec=nanosec)


def token_chunks() -> list:
    header = built("std_msgs/msg/Header", frame_id="base_link", stamp=stamp(1700000000, 5))
    return [
        built("edge_llm_ros/msg/TokenChunk", header=header, request_id="r-1", round=3, token_ids=[1, -2, 3],
              text='say: "hi" it\'s', probs=[0.5, 0.1], done=True, finish_reason="eos"),
        built("edge_llm_ros/msg/TokenChunk", request_id="r-2", text="two\nlines"),
        built("edge_llm_ros/msg/TokenChunk", token_ids=list(range(130)), text="x" * 130, probs=[0.25] * 129),
    ]


@dataclass
class Case:
    name: str
    ros_type: str
    messages: list
    options: list[str] = field(default_factory=list)


CASES = [
    Case("chunk", "edge_llm_ros/msg/TokenChunk", token_chunks()),
    Case("chunk_full", "edge_llm_ros/msg/TokenChunk", token_chunks(), ["--full-length"]),
    Case("chunk_l5", "edge_llm_ros/msg/TokenChunk", token_chunks(), ["--truncate-length", "5"]),
    Case("chunk_flow", "edge_llm_ros/msg/TokenChunk", token_chunks(), ["--flow-style"]),
    Case("chunk_no", "edge_llm_ros/msg/TokenChunk", token_chunks(), ["--no-arr", "--no-str"]),
    Case("chunk_csv", "edge_llm_ros/msg/TokenChunk", token_chunks(), ["--csv"]),
    Case("chunk_ids", "edge_llm_ros/msg/TokenChunk", token_chunks(), ["--field", "token_ids"]),
    Case("chunk_probs", "edge_llm_ros/msg/TokenChunk", token_chunks(), ["--field", "probs"]),
    Case("chunk_frame", "edge_llm_ros/msg/TokenChunk", token_chunks(), ["--field", "header.frame_id"]),
    Case("chunk_done", "edge_llm_ros/msg/TokenChunk", token_chunks(), ["--field", "done"]),
    Case("stats", "edge_llm_ros/msg/InferenceStats", [built(
        "edge_llm_ros/msg/InferenceStats", node_name="draft_node", mode="ee", tokens=42, tokens_per_s=12.3,
        ttft_s=1e-5, tau=2.5, acceptance_rate=math.nan, avg_exit_layer=-0.0)]),
    Case("nav", "edge_llm_ros/msg/NavAction", [built(
        "edge_llm_ros/msg/NavAction", request_id="n", frame_stamp=stamp(3, 5), action="turn_left", magnitude="small",
        angle_rad=1.5, valid=True, raw_text="- turn left: 90°")]),
    Case("twist", "geometry_msgs/msg/TwistStamped", [built("geometry_msgs/msg/TwistStamped", twist=built(
        "geometry_msgs/msg/Twist", angular=built("geometry_msgs/msg/Vector3", z=0.75)))]),
    Case("plan", "edge_llm_ros/msg/Plan", [built(
        "edge_llm_ros/msg/Plan", mode="tree", stage_layer_begin=[0, 15], stage_layer_end=[15, 30],
        stage_nodes=["edge", "cloud"])]),
    Case("strings", "std_msgs/msg/String",
         [built("std_msgs/msg/String", data=t) for t in ("hello", "yes", "", "123", "a: b", "é", "null", "- x")]),
    Case("empty", "std_msgs/msg/Empty", [built("std_msgs/msg/Empty")]),
    Case("byte", "std_msgs/msg/Byte", [built("std_msgs/msg/Byte", data=65), built("std_msgs/msg/Byte", data=1)]),
    Case("byte_field", "std_msgs/msg/Byte", [built("std_msgs/msg/Byte", data=65)], ["--field", "data"]),
    Case("bytes", "std_msgs/msg/ByteMultiArray", [built("std_msgs/msg/ByteMultiArray", data=[1, 65])]),
    Case("bytes_csv", "std_msgs/msg/ByteMultiArray", [built("std_msgs/msg/ByteMultiArray", data=[1, 65])], ["--csv"]),
]


def option(options: list[str], name: str) -> str | None:
    return options[options.index(name) + 1] if name in options else None


def ours(case: Case, data: list[bytes]) -> str:
    """What `edge-llm-ros topic echo` prints for these bytes (cmd_topic_echo's show())."""
    o = case.options
    length = option(o, "--truncate-length")
    shown = Shown(None if "--full-length" in o else int(length) if length else TRUNCATE_LENGTH,
                  "--no-arr" in o, "--no-str" in o)
    steps = field_steps(case.ros_type, option(o, "--field"))
    out = []
    for raw in data:
        value = registry().deserialize(raw, case.ros_type)
        if steps:
            for name, _ in steps:
                value = getattr(value, name)
            out.append(f"{rclpy_value(steps[-1][1], value)}\n---\n")
        elif "--csv" in o:
            out.append(message_to_csv(value, shown) + "\n")
        else:
            out.append(message_to_yaml(value, shown, "--flow-style" in o) + "---\n")
    return "".join(out)


class Echo:
    """A real `ros2 topic echo` process; its stdout as it comes."""

    def __init__(self, topic: str, case: Case, env: dict) -> None:
        qos = ["--qos-durability", "transient_local", "--qos-reliability", "reliable", "--qos-depth",
               str(len(case.messages))]
        self.popen = subprocess.Popen(["ros2", "topic", "echo", "--no-daemon", *qos, *case.options, topic,
                                       case.ros_type], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env, start_new_session=True)
        self.text, self.lock = "", threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while chunk := self.popen.stdout.read(1):
            with self.lock:
                self.text += chunk

    def printed(self) -> str:
        with self.lock:
            return self.text

    def stop(self) -> str:
        self.popen.terminate()
        try:
            self.popen.wait(20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)
        return self.popen.stderr.read()


@pytest.mark.timeout(300)
def test_echo_prints_what_the_real_ros2_topic_echo_prints(rclpy_host, ros2_env):
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from rclpy.serialization import deserialize_message

    node = rclpy_host.Node("echo_format_source")
    env = {**ros2_env, **rclpy_host.child_env, "PYTHONUNBUFFERED": "1"}
    echoes, publishers = {}, []
    try:
        for case in CASES:
            topic = f"/echo_format/{case.name}"
            data = [bytes(registry().serialize(m, case.ros_type)) for m in case.messages]
            cls = rclpy_host.message(case.ros_type)
            qos = QoSProfile(depth=len(data), durability=DurabilityPolicy.TRANSIENT_LOCAL,
                             reliability=ReliabilityPolicy.RELIABLE)
            pub = node.create_publisher(cls, topic, qos)
            publishers.append(pub)
            for raw in data:
                pub.publish(deserialize_message(raw, cls))
            echoes[case.name] = (Echo(topic, case, env), ours(case, data), case)
        for name, (echo, want, _) in echoes.items():
            try:  # as much text as ours, or the echo ended; a shorter text fails below, with both shown
                wait_until(lambda e=echo, w=want: len(e.printed()) >= len(w) or e.popen.poll() is not None, 120,
                           f"ros2 topic echo of case {name}", interval=0.1)
            except AssertionError:
                pass
        for name, (echo, want, case) in echoes.items():
            errors = echo.stop()
            assert echo.printed() == want, \
                f"case {name} {case.options}: ros2 printed\n{echo.printed()!r}\nours\n{want!r}\n{errors}"
    finally:
        for echo, _, _ in echoes.values():
            if echo.popen.poll() is None:
                echo.stop()
        for pub in publishers:
            node.destroy_publisher(pub)
        rclpy_host.executor.remove_node(node)
        node.destroy_node()
