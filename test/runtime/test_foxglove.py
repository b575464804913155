"""foxglove_bridge_node checked with a client this project did not write: Foxglove's own npm packages
(test/foxglove/client.js: @foxglove/ws-protocol's client over ws, @foxglove/rosmsg and
@foxglove/rosmsg2-serialization to decode), under node.js, against the launched pipeline with
`foxglove:=true`: every advertised channel is cdr with a ros2msg schema and every message decodes with
its channel's schema; /diagnostics carries a status per running node; an instruction the client
publishes is answered on /edge_llm/response with the target's greedy text (llama.cpp's own, computed
here); a channel on a topic clients may not publish is refused with a warning; the bridge subscribes
to a topic only while a client does."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from hosts import BACKENDS, host_for, start_launch, stop_launch
from support import Diagnostics, foxglove_layout, in_ci, key_values, wait_until

pytestmark = pytest.mark.slow  # the launched pipeline (SmolLM2) and node.js

CLIENT = Path(__file__).resolve().parents[1] / "foxglove"
INSTRUCTION = "Name one thing a robot needs to walk."
MAX_NEW_TOKENS = 16
# every node the pipeline runs with foxglove:=true, by the name of its status on /diagnostics
STATUSES = {"planner_node: plan", "serve_node: requests", "monitor: aggregator", "foxglove_bridge: bridge"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def node_client():
    """`node` and the npm packages `make test` installs into test/foxglove (npm ci)."""
    missing = [what for what, ok in (("node.js (node 20)", shutil.which("node")),
                                     ("Foxglove's npm packages (npm ci --prefix test/foxglove)",
                                      (CLIENT / "node_modules" / "@foxglove" / "ws-protocol").is_dir())) if not ok]
    if missing:
        message = "the Foxglove client check needs " + " and ".join(missing) + "; `make test` installs them"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return CLIENT / "client.js"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.timeout(600)
def test_foxgloves_client_decodes_every_channel_and_its_instruction_is_answered(request, backend, node_client,
                                                                                 router_endpoint, references,
                                                                                 monkeypatch, tmp_path):
    if backend == "rclpy":
        request.getfixturevalue("ros2_env")
    host = host_for(request, backend)
    monkeypatch.setenv("EDGE_LLM_ROS_PLAN", str(tmp_path / "no-plan.json"))  # serve_node: ar on llama.cpp
    port = free_port()
    launch = start_launch(host, router_endpoint, "pipeline", "foxglove:=true", f"foxglove_port:={port}",
                          f"max_new_tokens:={MAX_NEW_TOKENS}", "calibrate:=never")
    probe = host.Node("foxglove_probe", namespace="edge_llm")
    diagnostics = Diagnostics(probe, host.message("diagnostic_msgs/msg/DiagnosticArray"))
    try:
        launch.wait_for_line(f"Foxglove WebSocket server on ws://127.0.0.1:{port}", 120)
        for name in STATUSES - {"planner_node: plan"}:  # all up (the planner reports from its start)
            diagnostics.status(name, timeout=180)
        wait_until(lambda: key_values(diagnostics.status("serve_node: requests"))["lifecycle state"] == "active", 180,
                   "serve_node active")
        expected = references.Greedy("llama.cpp").text(INSTRUCTION, MAX_NEW_TOKENS)
        ran = subprocess.run(["node", str(node_client), f"ws://127.0.0.1:{port}", "90", INSTRUCTION],
                             capture_output=True, text=True, timeout=150, cwd=CLIENT)
        assert ran.returncode == 0, ran.stderr
        seen = json.loads(ran.stdout)
        assert seen["errors"] == [] and seen["failures"] == [], (seen["errors"], seen["failures"])

        # the server: cdr, and clients may publish
        assert "cdr" in seen["serverInfo"]["supportedEncodings"] and "clientPublish" in seen["serverInfo"]["capabilities"]
        # every topic of the graph is a channel, cdr with its ros2msg schema; each message decoded with it
        topics = {c["topic"]: c for c in seen["channels"]}
        for topic, type_name in (("/edge_llm/response", "edge_llm_ros/msg/TokenChunk"),
                                 ("/edge_llm/stats", "edge_llm_ros/msg/InferenceStats"),
                                 ("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray"),
                                 ("/diagnostics_agg", "diagnostic_msgs/msg/DiagnosticArray"),
                                 ("/edge_llm/instruction", "std_msgs/msg/String")):
            assert topics[topic]["schemaName"] == type_name, topics.get(topic)
        assert all((c["encoding"], c["schemaEncoding"]) == ("cdr", "ros2msg") for c in seen["channels"]), seen["channels"]
        assert seen["decoded"].get("/diagnostics", 0) > 0 and seen["decoded"].get("/edge_llm/response", 0) > 0
        # the layout (config/foxglove/edge_llm.json): its serving topics are channels, each field it reads is there
        layout = foxglove_layout()
        publish_topic, publish_type = layout.pop("publish")
        assert topics[publish_topic]["schemaName"] == publish_type
        for topic, fields in layout.items():
            if topic.startswith(("/camera/", "/sim/", "/edge_llm/navigator/")):
                continue  # the robot's: test_go2_sim checks those against the launched go2_sim
            assert topic in topics, (topic, sorted(topics))
            assert {f for f in fields if f} <= set(seen["fields"].get(topic, [])), (topic, fields, seen["fields"].get(topic))
        # a status per running node, as the client decoded them
        assert STATUSES <= set(seen["diagnostics"]), sorted(seen["diagnostics"])
        # the instruction the client published, answered: the target's greedy text
        response = seen["response"]
        assert response["done"] and response["status"] == 0 and response["text"] == expected, (response, expected)
        # a channel on a topic clients may not publish: refused, with a warning to the client
        assert any(s["message"].startswith("publishing on /cmd_vel is not allowed (client_topics: /edge_llm/instruction)")
                   for s in seen["statuses"]), seen["statuses"]

        # the client gone, the bridge holds no subscription; it says what it served
        after = diagnostics.status("foxglove_bridge: bridge", lambda s: key_values(s)["subscribed channels"] == "0",
                                   timeout=30, after=diagnostics.mark())
        served = key_values(after)
        assert int(served["messages sent"]) > 0 and int(served["client messages published"]) >= 1
        assert int(served["client channels refused"]) >= 1
        if backend == "zenoh":  # rclpy: a destroyed reader may linger in DDS's graph for a while
            assert probe.count_subscribers("/edge_llm/stats") == 0
    finally:
        probe.destroy_node()
        stop_launch(launch)
