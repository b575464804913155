"""The command line: `edge-llm-ros launch <name|file.launch.py|file.yaml> [name:=value ...]`."""

from __future__ import annotations

import argparse
import re
import sys

from edge_llm_ros.runtime.launcher.plan import (
    FOXGLOVE_PORT,
    PACKAGE,
    LaunchError,
    LaunchPlan,
    _one_line,
    apply_launch_args,
    check_executables,
    load_plan,
)
from edge_llm_ros.runtime.launcher.supervisor import Launcher
from edge_llm_ros.runtime.params import ParamsError, format_param_value
from edge_llm_ros.runtime.router import ENDPOINT_ENV, router_endpoint

_ENDPOINT = re.compile(r"(tcp|tls)/(\[[0-9A-Fa-f:.]+\]|[^:/\[\]]+):\d{1,5}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {_one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="edge-llm-ros launch", description="Run a deployment: one process per node.")
    parser.add_argument("target", help="launch file name (launch/<name>.launch.py), a .launch.py path, "
                                       "or a ROS 2 params .yaml (one process per node entry)")
    parser.add_argument("arguments", nargs="*", metavar="name:=value",
                        help="override a parameter on every node that has it in the params file")
    parser.add_argument("--router", metavar="ENDPOINT", default=None,
                        help=f"zenoh router endpoint, started if none answers (default ${ENDPOINT_ENV} "
                             f"or {router_endpoint()})")
    parser.add_argument("-s", "--show-args", action="store_true", help="list the launch arguments and exit")
    parser.add_argument("--sigterm-timeout", type=float, default=5.0, metavar="S",
                        help="seconds after SIGINT before SIGTERM on shutdown (default %(default)s)")
    parser.add_argument("--sigkill-timeout", type=float, default=5.0, metavar="S",
                        help="seconds after SIGTERM before SIGKILL on shutdown (default %(default)s)")
    return parser


def _show_args(plan: LaunchPlan) -> None:
    print("foxglove:=false    true: a foxglove_bridge_node (Foxglove's WebSocket protocol) on foxglove_port")
    print(f"foxglove_port:={FOXGLOVE_PORT}")
    print("keystore:=    a keystore (edge-llm-ros security create): mutual TLS, the policy's access control, "
          "an enclave per node")
    if plan.rviz:
        print(f"rviz:=false    true: rviz2 with config/{plan.rviz} (under ROS 2)")
    if plan.overlay:
        given = ", ".join(map(str, plan.overlays)) or "none"
        print(f"{plan.overlay}:=FILE    a params file layered over {plan.params_file} (given: {given})")
    for key, values in sorted(plan.launch_arguments().items()):
        defaults = {format_param_value(v) for v in values.values()}
        default = defaults.pop() if len(defaults) == 1 else "(differs per node)"
        print(f"{key}:={default}    nodes: {', '.join(values)}")


def main(argv: list[str] | None = None) -> int:
    """`edge-llm-ros launch ...` (argv without the verb)."""
    args = build_parser().parse_intermixed_args(argv)
    endpoint = args.router or router_endpoint()
    try:
        if not _ENDPOINT.fullmatch(endpoint):
            raise LaunchError(f"router endpoint must look like tcp/HOST:PORT, got '{endpoint}'")
        plan = load_plan(args.target)
        apply_launch_args(plan, args.arguments)
        check_executables(plan)
        if plan.keystore is not None:  # the secured router listens on tls/ only, at the same address
            endpoint = "tls/" + endpoint.partition("/")[2]
        elif endpoint.startswith("tls/"):
            raise LaunchError(f"router endpoint {endpoint}: a tls/ router needs keystore:=DIR")
    except (LaunchError, ParamsError) as exc:
        print(f"edge-llm-ros launch: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    if args.show_args:
        _show_args(plan)
        return 0
    if plan.rviz_asked:  # rviz2 is a ROS 2 (DDS) program; this launcher's nodes speak Zenoh
        print(f"edge-llm-ros launch: rviz:=true: rviz2 does not run under the embedded launcher; on a machine with "
              f"ROS 2 and rviz2, `ros2 launch {PACKAGE} {plan.source.name} rviz:=true` opens "
              f"config/{plan.rviz} (or `rviz2 -d config/{plan.rviz}` beside a running ROS 2 deployment)",
              file=sys.stderr)
    launcher = Launcher(plan, router=endpoint, sigterm_timeout=args.sigterm_timeout,
                        sigkill_timeout=args.sigkill_timeout)
    return launcher.run()
