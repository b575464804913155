"""monitor_node as a process, read from /diagnostics.

This test process plays two reporting nodes: it publishes their InferenceStats on the monitor's
`stats` topic. The monitor's DiagnosticArray has to show one DiagnosticStatus per reporting node
(name, hardware_id, level OK). A node that stays silent for 3 periods turns STALE while the other
stays OK, and it is OK again once it reports. The test runs on both backends.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

import pytest
from hosts import BACKENDS, host_for
from support import Proc, wait_until

pytestmark = pytest.mark.slow  # a node process

PERIOD_S = 0.5  # the monitor's stats_period_s: STALE after 3 of them without a report
REPORT_S = 0.1  # how often the reporting nodes publish their stats
UP_S = 120  # a node process starting on 2 busy cores
OK, STALE = 0, 3  # diagnostic_msgs/DiagnosticStatus levels


@pytest.fixture(params=BACKENDS)
def host(request):
    return host_for(request, request.param)


def level_of(status) -> int:
    """A status's level as a number (rclpy holds a `byte` field as one byte of bytes)."""
    return status.level[0] if isinstance(status.level, bytes) else int(status.level)


def stamp_s(array) -> float:
    return array.header.stamp.sec + array.header.stamp.nanosec * 1e-9


class Diagnostics:
    """The /diagnostics arrays that report on ``names``, in order of arrival."""

    def __init__(self, host, node, names: set[str]) -> None:
        self.names, self.arrays = names, []
        self._lock = threading.Lock()
        node.create_subscription(host.message("diagnostic_msgs/msg/DiagnosticArray"), "/diagnostics", self._on_array, 10)

    def _on_array(self, array) -> None:
        if any(status.hardware_id in self.names for status in array.status):
            with self._lock:
                self.arrays.append(array)

    def wait_for(self, predicate, timeout: float, what: str):
        """The first array heard for which ``predicate`` holds (waiting up to ``timeout``)."""
        def found():
            with self._lock:
                return next((a for a in self.arrays if predicate(a)), None)
        return wait_until(found, timeout, what)

    def seen(self) -> list:
        with self._lock:
            return list(self.arrays)


def statuses(array) -> dict[str, object]:
    """The array's statuses by hardware id; one each, or the test fails."""
    by_id = {status.hardware_id: status for status in array.status}
    assert len(by_id) == len(array.status), [s.hardware_id for s in array.status]
    return by_id


def values(status) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


@pytest.mark.timeout(300)
def test_one_status_per_reporting_node_stale_after_three_silent_periods_ok_again_when_it_reports(host):
    tag = uuid.uuid4().hex[:8]
    ns, alpha, beta = f"/monitor_{tag}", f"alpha_{tag}", f"beta_{tag}"
    monitor = Proc([sys.executable, "-m", "edge_llm_ros.nodes.monitor_node", "--ros-args", "-r", f"__ns:={ns}",
                    "-p", f"stats_period_s:={PERIOD_S}"], env=host.child_env)
    node = host.Node(f"reporters_{tag}", namespace=ns)
    diagnostics = Diagnostics(host, node, {alpha, beta})
    Stats = host.message("edge_llm_ros/msg/InferenceStats")
    stats_pub = node.create_publisher(Stats, "stats", 10)
    beta_reports = threading.Event()  # beta publishes while set
    beta_tokens = [7]
    beta_last = [0.0]  # system time just before beta's last report left

    def report() -> None:
        stats_pub.publish(Stats(node_name=alpha, tokens=3, tokens_per_s=12.5))
        if beta_reports.is_set():
            beta_last[0] = time.time()
            stats_pub.publish(Stats(node_name=beta, tokens=beta_tokens[0], tokens_per_s=4.0))

    beta_reports.set()
    timer = node.create_timer(REPORT_S, report)
    try:
        # one status per reporting node, named after it, OK
        first = diagnostics.wait_for(lambda a: len(a.status) == 2, UP_S, f"both reporters on /diagnostics\n{monitor.tail(20)}")
        both = statuses(first)
        assert set(both) == {alpha, beta}
        for name, status in both.items():
            assert level_of(status) == OK and name in status.name, status
        assert values(both[alpha])["tokens"] == "3" and values(both[beta])["tokens"] == "7"

        # beta goes silent: STALE once 3 periods passed since its last report, while alpha stays OK
        beta_reports.clear()
        stale = diagnostics.wait_for(lambda a: level_of(statuses(a)[beta]) == STALE, 60, f"{beta} STALE")
        assert level_of(statuses(stale)[alpha]) == OK
        silent_since = beta_last[0]
        for array in diagnostics.seen():
            if level_of(statuses(array)[beta]) == STALE:  # the monitor heard beta's last report after it left
                assert stamp_s(array) >= silent_since + 3 * PERIOD_S, (stamp_s(array), silent_since)

        # beta reports again: OK again, with its new figures
        beta_tokens[0] = 9
        beta_reports.set()
        again = diagnostics.wait_for(
            lambda a: stamp_s(a) > stamp_s(stale) and level_of(statuses(a)[beta]) == OK, 60, f"{beta} OK again")
        assert values(statuses(again)[beta])["tokens"] == "9"
        assert level_of(statuses(again)[alpha]) == OK and set(statuses(again)) == {alpha, beta}
        assert monitor.popen.poll() is None, monitor.tail(20)
    finally:
        timer.cancel()
        node.destroy_node()
        monitor.stop()
