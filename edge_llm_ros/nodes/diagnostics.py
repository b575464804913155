"""A node's own status on /diagnostics, as ROS 2's diagnostic_updater publishes it.

    self.diagnostics = Updater(self, hardware_id="smollm2 on llama.cpp")
    self.diagnostics.add("requests", self.diagnose_requests)   # task(status) fills one status

    def diagnose_requests(self, status: Status) -> None:
        status.summary(OK, "serving")
        status.add("running", self.running)
        if self.busy_refusals:
            status.merge(WARN, f"{self.busy_refusals} busy refusals")

Every `diagnostic_updater.period` seconds (a parameter, 1 s by default, as diagnostic_updater
names it) each task fills a diagnostic_msgs/DiagnosticStatus named `<node name>: <task>` with the
node's `hardware_id`, and the node publishes them in one DiagnosticArray on `/diagnostics`. A task
that raises gives an ERROR status naming the exception: a broken check is never a silent OK.
diagnostic_updater itself is not installable on these machines (its wheels are not on PyPI); this
keeps its parameter name and message layout, so rqt_robot_monitor and diagnostic_aggregator read
ours as theirs. monitor_node aggregates them per deployment part and marks a silent node STALE.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import stamp
from edge_llm_ros.nodes.parameters import Spec, descriptor

OK, WARN, ERROR, STALE = 0, 1, 2, 3  # diagnostic_msgs/DiagnosticStatus's levels
LEVEL_NAMES = {OK: "OK", WARN: "WARN", ERROR: "ERROR", STALE: "STALE"}
PERIOD_PARAM = "diagnostic_updater.period"
PERIOD_SPEC = Spec("seconds between this node's statuses on /diagnostics", low=0.01, high=3600.0)


def level_of(status: Any) -> int:
    """A DiagnosticStatus's level as an int: rclpy holds the `byte` field as one byte of bytes."""
    level = status.level
    return level[0] if isinstance(level, (bytes, bytearray)) else int(level)


def as_level(message_type: Any, level: int) -> Any:
    """``level`` as ``message_type``'s `level` field takes it (bytes under rclpy, int embedded)."""
    return getattr(message_type, LEVEL_NAMES[level])


class Status:
    """One status being filled by a task (diagnostic_updater's DiagnosticStatusWrapper, in short):
    :meth:`summary` sets level and message, :meth:`merge` raises the level and adds to the message,
    :meth:`add` appends a key and its value (numbers formatted for reading)."""

    def __init__(self) -> None:
        self.level, self.message = OK, ""
        self.values: list[tuple[str, str]] = []

    def summary(self, level: int, message: str) -> None:
        self.level, self.message = level, message

    def merge(self, level: int, message: str) -> None:
        """Keep the worse level; the message says every reason at the worst level."""
        if level > self.level:
            self.level, self.message = level, message
        elif level == self.level and level > OK and message:
            self.message = f"{self.message}; {message}" if self.message else message

    def add(self, key: str, value: Any) -> None:
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, bool):
            value = str(value).lower()
        self.values.append((key, str(value)))


class Updater:
    """See the module docstring."""

    def __init__(self, node: Any, hardware_id: str = "") -> None:
        self.node, self.hardware_id = node, hardware_id
        self.period = float(node.declare_parameter(PERIOD_PARAM, 1.0,
                                                   descriptor(PERIOD_PARAM, 1.0, PERIOD_SPEC)).value)
        PERIOD_SPEC.check(PERIOD_PARAM, self.period)
        self.Array = rt.message("diagnostic_msgs/msg/DiagnosticArray")
        self.StatusMsg = rt.message("diagnostic_msgs/msg/DiagnosticStatus")
        self.KeyValue = rt.message("diagnostic_msgs/msg/KeyValue")
        self.tasks: list[tuple[str, Callable[[Status], None]]] = []
        self.lock = threading.Lock()
        self.pub = node.create_publisher(self.Array, "/diagnostics", 10)
        node.create_timer(self.period, self.update)

    def add(self, name: str, task: Callable[[Status], None]) -> None:
        with self.lock:
            self.tasks.append((name, task))

    def statuses(self) -> list[Any]:
        """Every task's DiagnosticStatus, now."""
        with self.lock:
            tasks = list(self.tasks)
        node_name, out = self.node.get_name(), []
        for name, task in tasks:
            status = Status()
            try:
                task(status)
            except Exception as exc:  # noqa: BLE001 - a broken check is an ERROR, never a silent OK
                status = Status()
                status.summary(ERROR, f"the {name} check failed: {type(exc).__name__}: {exc}")
            out.append(self.StatusMsg(level=as_level(self.StatusMsg, status.level), name=f"{node_name}: {name}",
                                      message=status.message, hardware_id=self.hardware_id,
                                      values=[self.KeyValue(key=k, value=v) for k, v in status.values]))
        return out

    def update(self) -> None:
        """The timer: publish every task's status (also callable to publish at once)."""
        if not rt.ok():
            return
        statuses = self.statuses()
        if statuses:
            self.pub.publish(stamp(self.node, self.Array(status=statuses)))


class Increase:
    """How much a running count grew since the last status: ``new = self.busy.since_last(total)``."""

    def __init__(self) -> None:
        self.seen = 0

    def since_last(self, total: int) -> int:
        new, self.seen = total - self.seen, total
        return new


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Window:
    """The numbers of the last ``seconds`` (at most ``size`` of them), for rates and percentiles."""

    def __init__(self, seconds: float = 60.0, size: int = 1000) -> None:
        self.seconds = seconds
        self.items: deque[tuple[float, Any]] = deque(maxlen=size)
        self.lock = threading.Lock()

    def add(self, item: Any) -> None:
        with self.lock:
            self.items.append((time.monotonic(), item))

    def recent(self) -> list[Any]:
        cutoff = time.monotonic() - self.seconds
        with self.lock:
            while self.items and self.items[0][0] < cutoff:
                self.items.popleft()
            return [item for _, item in self.items]
