"""monitor_node: turns InferenceStats into /diagnostics and a console line.

Subscribes to `stats` (edge_llm_ros/msg/InferenceStats) under its namespace
and publishes diagnostic_msgs/DiagnosticArray on `/diagnostics` every
`stats_period_s`, one status per reporting node, so rqt_runtime_monitor
shows the pipeline. A node that has not reported for 3 periods is marked STALE.
"""

from __future__ import annotations

import dataclasses
import time

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import run_node, stamp
from edge_llm_ros.nodes.parameters import declare, param


@dataclasses.dataclass(frozen=True)
class MonitorParams:
    stats_period_s: float = param(1.0, "period of /diagnostics; a node silent for 3 periods is STALE", low=0.001)


class MonitorNode(rt.Node):
    def __init__(self) -> None:
        super().__init__("monitor", namespace="edge_llm")
        self.period = declare(self, MonitorParams).stats_period_s
        self.Array = rt.message("diagnostic_msgs/msg/DiagnosticArray")
        self.Status = rt.message("diagnostic_msgs/msg/DiagnosticStatus")
        self.KeyValue = rt.message("diagnostic_msgs/msg/KeyValue")
        self.latest: dict[str, tuple[float, object]] = {}
        self.create_subscription(rt.message("edge_llm_ros/msg/InferenceStats"), "stats", self.on_stats, 10)
        self.diag_pub = self.create_publisher(self.Array, "/diagnostics", 10)
        self.create_timer(self.period, self.publish)

    def on_stats(self, msg) -> None:
        self.latest[msg.node_name] = (time.monotonic(), msg)

    def status_of(self, name: str, seen: float, msg) -> object:
        stale = time.monotonic() - seen > 3 * self.period
        fields = ("mode", "tokens", "tokens_per_s", "ttft_s", "tau", "acceptance_rate", "active_requests")
        return self.Status(
            # the type's own constants: a `byte` field, which rclpy holds as one byte of bytes (an int there
            # went out as garbage) and the embedded backend as an int
            level=self.Status.STALE if stale else self.Status.OK,
            name=f"edge_llm_ros: {name}", hardware_id=name,
            message="stale" if stale else f"{msg.tokens_per_s:.1f} tok/s",
            values=[self.KeyValue(key=f, value=str(getattr(msg, f))) for f in fields],
        )

    def publish(self) -> None:
        statuses = [self.status_of(name, seen, msg) for name, (seen, msg) in sorted(self.latest.items())]
        self.diag_pub.publish(stamp(self, self.Array(status=statuses)))


def main(args: list[str] | None = None) -> int:
    return run_node(MonitorNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
