"""The embedded launcher: `edge-llm-ros launch <name|file.launch.py|file.yaml> [name:=value ...]`.

Runs a deployment without ROS 2 from the same files `ros2 launch` reads. A
launch file `launch/<name>.launch.py` defines plain data at module level,

    CONFIG = "pipeline.yaml"             # a ROS 2 params file under config/
    NODES = [{"executable": "echo_node", "name": "echo_node", "namespace": "edge_llm",
              "remappings": [("response", "/out")], "required": True}, ...]

and a `generate_launch_description()` for ROS 2 that this launcher never
calls. Each node runs as its own process,

    python -m edge_llm_ros.nodes.<executable> --ros-args -r __node:=<name> -r __ns:=/<namespace>
        --params-file <config> [-p key:=value ...] [-r from:=to ...]

(a NODES entry may name another `module`, or a whole `cmd`; its `prefix`, as in
launch_ros, goes before the command, e.g. "taskset -c 1" or "nice -n 5"; and
launch_ros' `respawn`, `respawn_delay`, `respawn_max_retries`, see below). A
`name:=value` launch argument overrides that parameter on every node whose
entries in the params file have it; any other name is an error.

Processes:
- A Zenoh router (`python -m edge_llm_ros.runtime.router`) starts first when
  none answers at the endpoint; every child gets EDGE_LLM_ZENOH_ROUTER.
- Each child runs in its own session, so a terminal's Ctrl-C reaches only the
  launcher, which forwards SIGINT once; PR_SET_PDEATHSIG makes a child get
  SIGTERM if the launcher dies without cleaning up (even SIGKILL).
- Output lines are forwarded as they come, prefixed `[<name>-<pid>] `
  (colored on a terminal); the launcher's own lines start with `[launcher]`.
- A node that exits on its own (crash, kill, or exit 0): with `respawn: True`
  it is started again with the same command `respawn_delay` seconds later
  (default 0), at most `respawn_max_retries` times (default -1: no limit), as
  launch's ExecuteProcess does; then, or without respawn, a `required` node
  (the default) stops the deployment and any other is only logged.
- The router watchdog: about once a second the launcher knocks at the router
  endpoint. When the router it started exits, or the endpoint (its own router
  or one it found there) fails to answer twice in a row, it starts a new
  router at the same endpoint; the nodes' Zenoh sessions reconnect to it
  (runtime/embedded.py). If none comes up within the router timeout the
  deployment stops with exit code 1: it never runs on with nodes that cannot
  reach each other.
- Shutdown (SIGINT/SIGTERM/SIGHUP to the launcher): SIGINT to every node,
  SIGTERM after --sigterm-timeout, SIGKILL after --sigkill-timeout (a second
  signal skips ahead); the router goes last. Nothing is respawned from then
  on; a pending respawn delay is cancelled.
- Exit code: 0 after a requested shutdown (or when no node is left); 1 when a
  required node exits on its own with no respawn left, or the router is gone
  and cannot be replaced; 2 for bad input (one line on stderr).

The modules: plan.py reads what to run (NodeSpec, LaunchPlan, LaunchError),
supervisor.py runs it (Launcher), command.py is the command line.
"""

from __future__ import annotations

from edge_llm_ros.runtime.launcher.command import build_parser, main
from edge_llm_ros.runtime.launcher.plan import (
    NODES_PACKAGE,
    PACKAGE,
    LaunchError,
    LaunchPlan,
    NodeSpec,
    apply_launch_args,
    check_executables,
    find_config,
    find_launch_file,
    load_plan,
    plan_from_params_file,
    read_launch_file,
    search_roots,
)
from edge_llm_ros.runtime.launcher.supervisor import (
    ROUTER_CHECK_S,
    ROUTER_MISSES,
    ROUTER_NAME,
    ROUTER_TIMEOUT_S,
    Launcher,
    run_launch,
)

__all__ = [
    "PACKAGE", "NODES_PACKAGE", "LaunchError", "NodeSpec", "LaunchPlan", "search_roots", "read_launch_file",
    "find_config", "find_launch_file", "plan_from_params_file", "load_plan", "apply_launch_args",
    "check_executables",
    "ROUTER_NAME", "ROUTER_TIMEOUT_S", "ROUTER_CHECK_S", "ROUTER_MISSES", "Launcher", "run_launch",
    "build_parser", "main",
]
