"""The launcher, the nodes and the CLI together, each a real process on one Zenoh router."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest
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
    ros__parameters: {pub_rate: 2.0}
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


@pytest.mark.slow
@pytest.mark.timeout(420)
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
        assert "\ntext: go to the red chair\nprobs: []\ndone: true\n" in echo.output
        sec = re.match(r"header:\n  stamp:\n    sec: (\d+)\n", echo.output)  # echo_node stamps each chunk
        assert sec and abs(int(sec[1]) - time.time()) < 120, echo.output
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


@pytest.mark.slow
def test_unknown_launch_argument_is_exit_2(router_endpoint):
    result = cli("launch", "pipeline", "no_such_param:=1", "--router", router_endpoint)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "no_such_param" in result.stderr


DEMO_LINE = re.compile(r"\[demo\] mode (\w+) on (llama\.cpp|torch): (\d+) tokens, ([\d.]+) tokens/s, "
                       r"time to first token (\d+) ms \(finish: (eos|length)\)")


@pytest.mark.slow  # the real pipeline: planner_node calibrates this machine, serve_node runs SmolLM2
@pytest.mark.serial  # calibration measures the machine; beside the other worker it took 120 s (16 s alone)
@pytest.mark.timeout(660)
def test_demo_answers_with_smollm2_through_the_launched_pipeline(router_endpoint, tmp_path):
    instruction = "Name one thing a robot needs to see."
    plan = tmp_path / "plan.json"  # none yet: planner_node calibrates and saves one
    demo = Proc([sys.executable, "-m", "edge_llm_ros.cli", "demo", instruction, "--quiet"],
                env={"EDGE_LLM_ROS_PLAN": str(plan)})
    assert demo.wait(400) == 0, demo.output
    out = demo.output
    figures = DEMO_LINE.search(out)
    assert figures, out
    assert int(figures[3]) > 0 and float(figures[4]) > 0 and int(figures[5]) > 0
    # SmolLM2's greedy text on the backend that served it (every mode is lossless), token for token
    expected = cli("generate", "--backend", figures[2], "--mode", "ar", "--no-plan", instruction, timeout=180)
    assert expected.returncode == 0, expected.stderr
    answer = out.split("[demo] 3/3 sending", 1)[1].split("\n", 2)[2].rsplit("\n\n[demo] mode", 1)[0]
    assert answer == expected.stdout.rstrip("\n")
    assert plan.is_file()  # the planner's calibration was saved
    assert "pipeline stopped" in out
