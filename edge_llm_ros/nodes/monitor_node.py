"""monitor_node: every node's /diagnostics gathered into one tree, as diagnostic_aggregator does.

Each node of the package publishes its own statuses on `/diagnostics` (nodes/diagnostics.py). The
monitor listens there and, every 1/`pub_rate` seconds, publishes on `/diagnostics_agg`
(diagnostic_msgs/DiagnosticArray) a tree for rqt_robot_monitor: one status per deployment part
(`/Serving`, `/Edge-cloud`, `/Pipeline`, `/Planning`, `/Navigation`, `/Operator`, `/Other`; its level the worst
of its members') and under it each status it heard, named `/<part>/<status name>`. A status not
heard for 3 periods is STALE, and OK again (or whatever it says) once it is heard. The worst of all
goes on `/diagnostics_toplevel_state` (diagnostic_msgs/DiagnosticStatus).

Where diagnostic_aggregator is installed, `config/diagnostic_analyzers.yaml` gives it the same
parts (test_monitor_node checks that both group alike); the monitor is then optional.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import run_node, stamp
from edge_llm_ros.nodes.diagnostics import LEVEL_NAMES, OK, STALE, Status, Updater, as_level, level_of
from edge_llm_ros.nodes.parameters import declare, param

STALE_PERIODS = 3
# (part, the node names its statuses start with), in the tree's order; a status matching none is /Other
PARTS = (("Serving", ("serve_node", "echo_node")),
         ("Edge-cloud", ("draft_node", "verifier_node")),
         ("Pipeline", ("stage_",)),
         ("Planning", ("planner",)),
         ("Navigation", ("navigator", "go2_bridge", "sim")),
         ("Operator", ("monitor", "foxglove_bridge")))


def part_of(status_name: str) -> str:
    """The part a status belongs to, by the node name it starts with (`<node>: <task>`)."""
    node = status_name.split(":", 1)[0].strip().lstrip("/").rsplit("/", 1)[-1]
    return next((part for part, starts in PARTS if node.startswith(starts)), "Other")


@dataclasses.dataclass(frozen=True)
class MonitorParams:
    pub_rate: float = param(1.0, "/diagnostics_agg per second; a status not heard for 3 periods is STALE",
                            low=0.001, high=1000.0)


class MonitorNode(rt.Node):
    def __init__(self, **node_options) -> None:
        """``node_options``: rt.Node's (namespace, parameter_overrides: how tests start it in-process)."""
        super().__init__("monitor", **{"namespace": "edge_llm", **node_options})
        self.period = 1.0 / declare(self, MonitorParams).pub_rate
        self.Array = rt.message("diagnostic_msgs/msg/DiagnosticArray")
        self.Status = rt.message("diagnostic_msgs/msg/DiagnosticStatus")
        self.lock = threading.Lock()
        # (status name, hardware id) -> (when, the status): two nodes of one name in two namespaces
        # (two robots' draft_nodes) name their statuses alike; their hardware ids tell them apart
        self.heard: dict[tuple[str, str], tuple[float, object]] = {}
        self.create_subscription(self.Array, "/diagnostics", self.on_diagnostics, 100)
        self.agg_pub = self.create_publisher(self.Array, "/diagnostics_agg", 10)
        self.top_pub = self.create_publisher(self.Status, "/diagnostics_toplevel_state", 10)
        self.create_timer(self.period, self.publish)
        self.diagnostics = Updater(self, hardware_id=f"{self.get_fully_qualified_name()} (aggregator)")
        self.diagnostics.add("aggregator", self.diagnose)

    def diagnose(self, status: Status) -> None:
        """Its own status: how many statuses it gathers and how many of them are stale."""
        now = time.monotonic()
        with self.lock:
            heard = list(self.heard.values())
        stale = sum(1 for seen, _ in heard if now - seen > STALE_PERIODS * self.period)
        status.summary(OK, f"{len(heard)} statuses, {stale} stale")
        status.add("statuses", len(heard))
        status.add("stale", stale)

    def on_diagnostics(self, array) -> None:
        now = time.monotonic()
        with self.lock:
            for status in array.status:
                self.heard[(status.name, status.hardware_id)] = (now, status)

    def leaf(self, part: str, name: str, seen: float, status, now: float):
        silent = now - seen
        if silent <= STALE_PERIODS * self.period:
            level, message = level_of(status), status.message
        else:
            level, message = STALE, f"stale: nothing heard for {silent:.1f} s"
        return self.Status(level=as_level(self.Status, level), name=f"/{part}/{name}", message=message,
                           hardware_id=status.hardware_id, values=list(status.values))

    def tree(self) -> list:
        """The /diagnostics_agg statuses: each part's summary, then its members."""
        now = time.monotonic()
        with self.lock:
            heard = sorted(self.heard.items())
        leaves: dict[str, list] = {}
        for (name, _), (seen, status) in heard:
            part = part_of(name)
            leaves.setdefault(part, []).append(self.leaf(part, name, seen, status, now))
        out = []
        for part in [p for p, _ in PARTS] + ["Other"]:
            members = leaves.get(part)
            if not members:
                continue
            worst = max(members, key=level_of)
            level = level_of(worst)
            message = LEVEL_NAMES[OK] if level == OK else f"{worst.name.rsplit('/', 1)[-1]}: {worst.message}"
            out.append(self.Status(level=as_level(self.Status, level), name=f"/{part}", message=message))
            out.extend(members)
        return out

    def publish(self) -> None:
        statuses = self.tree()
        if not statuses:
            return
        self.agg_pub.publish(stamp(self, self.Array(status=statuses)))
        parts = [s for s in statuses if s.name.count("/") == 1]
        worst = max(parts, key=level_of)
        self.top_pub.publish(self.Status(level=worst.level, name="/", message=worst.message))


def main(args: list[str] | None = None) -> int:
    return run_node(MonitorNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
