"""The launcher, the nodes and the CLI together, each a real process on one Zenoh router."""

from __future__ import annotations

import os
import re
import signal
import sys

from support import Proc, cli, wait_until

THREE_NODES = '''
CONFIG = "three.yaml"
NODES = [
    {"executable": "echo_node", "name": "echo_node", "namespace": "edge_llm"},
    {"executable": "monitor_node", "name": "monitor", "namespace": "edge_llm"},
    {"executable": "echo_node", "name": "echo_b", "namespace": "edge_llm_b"},
]
'''
THREE_PARAMS = '''
edge_llm:
  echo_node:
    ros__parameters: {chunk_words: 1, stats_period_s: 0.5}
  monitor:
    ros__parameters: {stats_period_s: 0.5}
edge_llm_b:
  echo_b:
    ros__parameters: {chunk_words: 1, stats_period_s: 0.5}
'''


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it has exited
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_three_nodes_cli_instruction_response_and_clean_sigterm(rt_session, router_endpoint, tmp_path):
    (tmp_path / "launch").mkdir()
    (tmp_path / "config").mkdir()
    (tmp_path / "launch" / "three.launch.py").write_text(THREE_NODES)
    (tmp_path / "config" / "three.yaml").write_text(THREE_PARAMS)
    launch = Proc([sys.executable, "-m", "edge_llm_ros.runtime.cli", "launch", str(tmp_path / "launch" / "three.launch.py"),
                   "chunk_words:=20", "--router", router_endpoint])
    probe = rt_session.Node("launch_probe")
    echo = None
    try:
        launch.wait_for_line("[echo_node-", 60)
        launch.wait_for_line("[echo_b-", 60)
        wait_until(lambda: {"/edge_llm/echo_node", "/edge_llm/monitor", "/edge_llm_b/echo_b"}
                   <= {f"{ns.rstrip('/')}/{n}" for n, ns in probe.get_node_names_and_namespaces()}, 30, "three nodes")
        wait_until(lambda: probe.count_subscribers("/edge_llm/instruction") >= 1, 30, "echo_node subscription")

        echo = Proc([sys.executable, "-m", "edge_llm_ros.runtime.cli", "topic", "echo", "--once", "/edge_llm/response",
                     "--timeout", "60"])
        wait_until(lambda: probe.count_subscribers("/edge_llm/response") >= 1, 30, "topic echo subscribed")
        pub = cli("topic", "pub", "--once", "/edge_llm/instruction", "std_msgs/msg/String", "{data: 'go to the red chair'}")
        assert pub.returncode == 0, pub.stderr
        assert echo.wait(60) == 0, echo.output
        assert "text: go to the red chair" in echo.output and "done: true" in echo.output
        launch.wait_for_line("[echo_node-", 5)

        pids = [int(p) for p in re.findall(r"started \S+ \(pid (\d+)\)", launch.output)]
        assert len(pids) == 3, launch.output  # the session's router is reused: three node processes
        launch.popen.send_signal(signal.SIGTERM)
        assert launch.wait(60) == 0, launch.output
        wait_until(lambda: not any(alive(p) for p in pids), 10, "every child to exit")
    finally:
        probe.destroy_node()
        for proc in (echo, launch):
            if proc is not None:
                proc.stop()


def test_unknown_launch_argument_is_exit_2(router_endpoint):
    result = cli("launch", "pipeline", "no_such_param:=1", "--router", router_endpoint)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "no_such_param" in result.stderr


def test_demo_shows_an_instruction_through_launched_processes(router_endpoint):
    demo = Proc([sys.executable, "-m", "edge_llm_ros.runtime.cli", "demo", "turn left at the door"])
    assert demo.wait(120) == 0, demo.output
    assert "response received through launched processes: 'turn left at the door'" in demo.output
    assert "pipeline stopped" in demo.output
