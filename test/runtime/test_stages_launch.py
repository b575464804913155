"""stages.launch.py as `ros2 launch` runs it (launch_pytest, rclpy on Fast DDS, loopback only), with a
plan that `edge-llm-ros plan --pipeline` wrote for two devices: `plan:=FILE` starts the plan's two
stages and draft_node with the plan's parameters (a launch argument still overrides one), and a
Generate goal answers with the target's greedy text (`edge-llm-ros generate --mode ar`), in the
plan's mode. The launch machinery (fixtures, waits) is test_launch_files.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import assert_loopback_only, require, setup_budget
from test_launch_files import (  # noqa: F401  (fixtures, used by name)
    UP_S,
    client,
    domain_id,
    installed_launch,
    io,
    launch_env,
    outer_env,
    proc_info,
    ready,
    transitions,
)

launch_pytest = require("launch_pytest", "make ros2 (ROS 2 Jazzy installs it)")

pytestmark = pytest.mark.slow  # launched stage processes with SmolLM2
PROMPT = "Name three colours."
MAX_NEW_TOKENS = 16
NODES = ("stage_0", "stage_1", "draft_node")
DEVICES = """devices:
  - {name: jetson_a, memory_mb: 4000, layer_ms: 1.0, link: {latency_ms: 1.0, bandwidth_mbps: 1000}}
  - {name: jetson_b, memory_mb: 4000, layer_ms: 1.0, link: {latency_ms: 1.0, bandwidth_mbps: 1000}}
"""


@pytest.fixture(scope="module")
@setup_budget(120)
def plan(tmp_path_factory, launch_env):
    """The plan `edge-llm-ros plan --pipeline` writes for two devices (no device plan: τ assumed)."""
    from edge_llm_ros.core.planning.pipeline_plan import PipelinePlan

    folder = tmp_path_factory.mktemp("pipeline_plan")
    (folder / "devices.yaml").write_text(DEVICES)
    path = folder / "plan.yaml"
    done = subprocess.run([sys.executable, "-m", "edge_llm_ros.cli", "plan", "--pipeline", "--devices",
                           str(folder / "devices.yaml"), "--prompt-len", "32", "--out", str(path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "EDGE_LLM_ROS_PLAN": launch_env["EDGE_LLM_ROS_PLAN"]})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"ros2 launch edge_llm_ros stages.launch.py plan:={path}" in done.stdout
    return path, PipelinePlan.from_yaml(path.read_text())


@launch_pytest.fixture(scope="module")
def stages(plan, launch_env, outer_env, io, proc_info, transitions):
    """stages.launch.py from the installed share folder with plan:=FILE and max_new_tokens:=16 (a
    draft_node parameter the plan does not set), in test_launch_files' environment."""
    return installed_launch("stages.launch.py", {"plan": str(plan[0]), "max_new_tokens": str(MAX_NEW_TOKENS)},
                            launch_env, io, proc_info, transitions)


def parameters(node, fqn: str, names: list[str]) -> list:
    """``names`` of node ``fqn`` through its get_parameters service (rcl_interfaces), as Python values."""
    from rcl_interfaces.srv import GetParameters
    from rclpy.parameter import parameter_value_to_python

    from edge_llm_ros.runtime.goals import wait_for

    service = node.create_client(GetParameters, f"{fqn}/get_parameters")
    try:
        assert service.wait_for_service(timeout_sec=30), f"no {fqn}/get_parameters"
        answer = wait_for(service.call_async(GetParameters.Request(names=names)), UP_S, f"{fqn}/get_parameters")
        return [parameter_value_to_python(value) for value in answer.values]
    finally:
        node.destroy_client(service)


def launched(proc_info, name: str):
    """The launch action of node /edge_llm/``name`` (stage processes share their executable's name)."""
    found = [a for a in proc_info.processes() if getattr(a, "node_name", "") == f"/edge_llm/{name}"]
    return found[0] if found else None


def wait_until_active(io, proc_info, transitions, name: str) -> None:
    """Node /edge_llm/``name`` runs under rclpy and launch saw it become active."""
    if not io.waitFor(f"[edge_llm.{name}]: runtime: rclpy (ROS 2 jazzy is sourced)", timeout=UP_S, stream="stderr"):
        pytest.fail(f"{name} did not start under rclpy within {UP_S} s")
    action = launched(proc_info, name)
    assert action is not None and transitions.wait_for(action.node_name, "active", UP_S), \
        f"{name} is {transitions.state.get(getattr(action, 'node_name', ''), 'unconfigured')}, not active"


@pytest.mark.launch(fixture=stages)
@pytest.mark.timeout(600)
def test_the_plan_launches_its_stages_and_answers_with_the_target_greedy_text(plan, client, io, proc_info,
                                                                            transitions, references):
    import psutil

    path, planned = plan
    assert len(planned.stages) == 2
    host, llm = client
    with ThreadPoolExecutor(1) as pool:
        # transformers' own greedy decoding of the same weights, while the nodes come up
        expected = pool.submit(references.Greedy("torch").text, PROMPT, MAX_NEW_TOKENS)
        for name in NODES:
            wait_until_active(io, proc_info, transitions, name)
        assert launched(proc_info, "stage_2") is None  # one stage per range of the plan
        assert ready(llm, io) == "/edge_llm/draft_node"
        probe = host.Node("stages_launch_probe")
        got = parameters(probe, "/edge_llm/draft_node",
                         ["layers", "mode", "segment", "in_flight", "prefill_chunk", "max_new_tokens"])
        assert got == [planned.layers, planned.mode, planned.segment, planned.in_flight, planned.prefill_chunk,
                       MAX_NEW_TOKENS]
        assert parameters(probe, "/edge_llm/stage_1", ["layers", "index"]) == [planned.layers, 1]
        result = llm.generate(PROMPT, timeout=240)  # max_new_tokens: the node's
        assert result.text == expected.result(300)
        assert result.stats.mode == planned.mode
    for name in NODES:
        assert_loopback_only(psutil.Process(proc_info[launched(proc_info, name)].pid))
