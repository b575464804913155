"""The package's launch files as launched, with launch_pytest: the LaunchDescription that
`ros2 launch edge_llm_ros edge_cloud.launch.py` runs, included from the colcon install and started
by a LaunchService in this process. launch's own process events (gathered by launch_testing's IO and
process-info handlers) say what each node wrote and how it ended.

- edge_cloud.launch.py: verifier_node and draft_node come up under rclpy, with the loopback-only DDS
  environment and a ROS domain of this module's own; a Generate goal sent to /edge_llm/generate by
  edge_llm_ros.client on an rclpy node streams feedback that adds up to the result, and the result is the target's
  greedy text (`edge-llm-ros generate --mode ar`); no node socket is connected off loopback; at
  shutdown every node exits 0 without a traceback, and so does the launch.

The nodes run from the colcon install (this checkout is not on their PYTHONPATH). A goal is sent
once the action server is there and, where the launch file starts a node as a launch_ros
LifecycleNode, once launch saw that node's transition to active (its StateTransition event): the
server of a lifecycle node exists, refusing goals, from before it is configured.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hosts import RclpyHost
from support import (
    REPO,
    Followed,
    assert_loopback_only,
    check_loopback_only,
    require,
    ros_domain,
    setup_budget,
)

# installed with ROS 2 (make ros2); under CI a missing one fails the run, as ros2_env does
launch_pytest = require("launch_pytest", "make ros2 (ROS 2 Jazzy installs it)")

pytestmark = pytest.mark.slow  # launched node processes with SmolLM2
NODES = ("verifier_node", "draft_node")
PROMPT = "Name three colours."
MAX_NEW_TOKENS = 24
UP_S = 240  # both nodes loading SmolLM2 side by side on 2 cores


@pytest.fixture(scope="module")
def domain_id() -> int:
    return ros_domain()


class Transitions:
    """The lifecycle states launch saw its LifecycleNodes reach (launch_ros' StateTransition events)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.state: dict[str, str] = {}  # node name -> goal state of its latest transition

    def record(self, context) -> None:  # an OpaqueFunction run for each StateTransition event
        event = context.locals.event
        with self._cond:
            self.state[event.action.node_name] = event.goal_state
            self._cond.notify_all()

    def wait_for(self, node_name: str, state: str, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.state.get(node_name) == state, timeout)


@pytest.fixture(scope="module")
def transitions() -> Transitions:
    return Transitions()


@pytest.fixture(scope="module")
def io():
    """Everything the launched processes write, by process (launch_testing's ActiveIoHandler)."""
    from launch_testing.io_handler import ActiveIoHandler

    return ActiveIoHandler()


@pytest.fixture(scope="module")
def proc_info():
    """The launched processes' start and exit events (launch_testing's ActiveProcInfoHandler)."""
    from launch_testing.proc_info_handler import ActiveProcInfoHandler

    return ActiveProcInfoHandler()


@pytest.fixture(scope="module")
def launch_env(ros2_env, domain_id, tmp_path_factory) -> dict[str, str]:
    """What the launch sets for its nodes, on top of this process's (sourced, loopback-only) environment."""
    return {
        "ROS_DOMAIN_ID": str(domain_id),
        "EDGE_LLM_BACKEND": "",  # empty is unset (conftest set it in this process)
        "PYTHONPATH": os.pathsep.join(p for p in ros2_env.get("PYTHONPATH", "").split(os.pathsep)
                                      if p and os.path.realpath(p) != str(REPO)),
        "PYTHONUNBUFFERED": "1",
        "EDGE_LLM_ROS_PLAN": str(tmp_path_factory.mktemp("plan") / "plan.json"),
    }


@pytest.fixture(scope="module")
def outer_env(launch_env) -> dict[str, str | None]:
    """This process's values of those variables before the launch."""
    return {name: os.environ.get(name) for name in launch_env}


def installed_launch(name: str, arguments: dict[str, str], launch_env, io, proc_info, transitions):
    """The LaunchDescription that includes launch/``name`` from the installed share folder with
    ``arguments``, in ``launch_env``, its processes' output, start and exit events and lifecycle
    transitions recorded in ``io``, ``proc_info`` and ``transitions``."""
    from ament_index_python.packages import get_package_share_directory
    from launch.actions import (
        GroupAction,
        IncludeLaunchDescription,
        OpaqueFunction,
        RegisterEventHandler,
        SetEnvironmentVariable,
    )
    from launch.event_handlers import OnProcessExit, OnProcessIO, OnProcessStart
    from launch.launch_description_sources import PythonLaunchDescriptionSource
    from launch_ros.event_handlers import OnStateTransition

    from launch import LaunchDescription

    launch_file = Path(get_package_share_directory("edge_llm_ros")) / "launch" / name
    return LaunchDescription([
        RegisterEventHandler(OnProcessStart(on_start=lambda event, _: proc_info.append(event))),
        RegisterEventHandler(OnProcessIO(on_stdout=io.append, on_stderr=io.append)),
        RegisterEventHandler(OnProcessExit(on_exit=lambda event, _: proc_info.append(event))),
        RegisterEventHandler(OnStateTransition(entities=[OpaqueFunction(function=transitions.record)])),
        # launch sets variables in this process's os.environ; the scoped group restores it after
        # the included nodes have taken their environment
        GroupAction([
            *(SetEnvironmentVariable(key, value) for key, value in launch_env.items()),
            IncludeLaunchDescription(PythonLaunchDescriptionSource(str(launch_file)),
                                     launch_arguments=arguments.items()),
        ], scoped=True),
        launch_pytest.actions.ReadyToTest(),
    ])


@launch_pytest.fixture(scope="module")
def edge_cloud(launch_env, outer_env, io, proc_info, transitions):
    """edge_cloud.launch.py from the installed share folder (max_new_tokens:=24 draft_backend:=torch),
    in the environment of test_ros2's `ros2 launch`: no backend forced, the install's package on
    PYTHONPATH, a ROS domain of this module's own, no saved device plan."""
    return installed_launch("edge_cloud.launch.py", {"max_new_tokens": str(MAX_NEW_TOKENS), "draft_backend": "torch"},
                            launch_env, io, proc_info, transitions)


@pytest.fixture(scope="module")
@setup_budget(240)
def client(ros2_env, domain_id):
    """(host, LLMClient of /edge_llm/generate): an rclpy node on a context of its own in the launch's domain."""
    from edge_llm_ros.client import LLMClient

    host = RclpyHost(domain_id=domain_id)
    node = host.Node("launch_test_client", namespace="edge_llm")
    llm = LLMClient("/edge_llm", node=node, timeout=240.0)
    yield host, llm
    llm.close()
    node.destroy_node()
    host.close()


def output(io, node: str) -> str:
    """All that the launched process of ``node`` wrote so far, stdout and stderr as they came."""
    return "".join(event.text.decode(errors="replace") for event in io if node in event.process_name)


def wait_for_log(io, node: str, needle: str, timeout: float) -> None:
    """Wait for ``needle`` in what ``node`` logged (rclpy logs to stderr); fail with its output."""
    if not io.waitFor(needle, process=node, timeout=timeout, stream="stderr"):
        pytest.fail(f"{node} did not log {needle!r} within {timeout:g} s; it wrote:\n{output(io, node)[-3000:]}")


def wait_until_serving(io, proc_info, transitions, node: str) -> None:
    """``node``'s process started under rclpy and, if the launch runs it as a LifecycleNode, launch saw
    it become active."""
    from launch_ros.actions import LifecycleNode

    proc_info.assertWaitForStartup(process=node, timeout=30)
    wait_for_log(io, node, f"[edge_llm.{node}]: runtime: rclpy (ROS 2 jazzy is sourced)", UP_S)
    action = next(a for a in proc_info.processes() if node in a.process_details["name"])
    if isinstance(action, LifecycleNode) and not transitions.wait_for(action.node_name, "active", UP_S):
        pytest.fail(f"{node} is {transitions.state.get(action.node_name, 'unconfigured')}, not active, after "
                    f"{UP_S} s; it wrote:\n{output(io, node)[-3000:]}")


def ready(llm, io) -> str:
    """Until /edge_llm/generate answers and its node is active (LLMClient.wait_until_ready); fail with
    the nodes' output if not within UP_S."""
    from edge_llm_ros.client import NoAnswer

    try:
        return llm.wait_until_ready(UP_S)
    except NoAnswer as exc:
        pytest.fail(f"{exc}: " + "\n".join(f"{node}:\n{output(io, node)[-1500:]}" for node in NODES))


def process(proc_info, node: str):
    import psutil

    return psutil.Process(proc_info[node].pid)


@pytest.mark.launch(fixture=edge_cloud)
def test_edge_cloud_launch_brings_both_nodes_up_under_rclpy_on_loopback(io, proc_info, transitions, ros2_env,
                                                                        launch_env, outer_env):
    for node in NODES:
        wait_until_serving(io, proc_info, transitions, node)
        env = process(proc_info, node).environ()
        check_loopback_only(env)  # discovery range LOCALHOST, the Fast DDS loopback profile
        assert env["FASTRTPS_DEFAULT_PROFILES_FILE"] == ros2_env["FASTRTPS_DEFAULT_PROFILES_FILE"]
        assert {name: env.get(name, "") for name in launch_env} == launch_env
    assert {name: os.environ.get(name) for name in launch_env} == outer_env  # the group scoped them


@pytest.mark.launch(fixture=edge_cloud)
@pytest.mark.timeout(600)
def test_a_goal_to_the_launched_nodes_streams_the_target_greedy_text(client, io, proc_info, transitions, references):
    host, llm = client
    with ThreadPoolExecutor(1) as pool:
        # transformers' own greedy decoding of the same weights, while the nodes come up
        expected = pool.submit(references.Greedy("torch").text, PROMPT, MAX_NEW_TOKENS)
        for node in NODES:
            wait_until_serving(io, proc_info, transitions, node)
        ready(llm, io)
        sent = Followed(llm.stream(PROMPT, max_new_tokens=MAX_NEW_TOKENS))
        result = sent.wait(240)
        assert sent.streamed()[1] == result.text  # the feedback adds up to the result
        assert len(sent.chunks) > 1 and result.text == expected.result(300)
    for node in NODES:
        assert_loopback_only(process(proc_info, node))


@pytest.mark.launch(fixture=edge_cloud, shutdown=True)
def test_launch_shutdown_ends_every_node_cleanly(io, proc_info):
    """Runs after launch_pytest shut the launch down (and checked that it ended with 0)."""
    from launch_testing.asserts import assertExitCodes

    for node in NODES:
        proc_info.assertWaitForShutdown(process=node, timeout=60)
        assert "Traceback" not in output(io, node), output(io, node)[-3000:]
    assertExitCodes(proc_info)
