"""monitor_node as a process, read from /diagnostics_agg.

This test process plays two nodes that publish their own statuses on /diagnostics, as every node of
the package does (nodes/diagnostics.py): a serve_node and a go2_bridge. The monitor's
/diagnostics_agg has to show each under its part (/Serving, /Navigation) with its name,
hardware_id and level. A node that stays silent for 3 periods turns STALE while the other stays
as it was, and it is OK again once it reports. The test runs on both backends.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

import pytest
from hosts import BACKENDS, host_for
from support import Diagnostics, Proc, key_values, level_of

pytestmark = pytest.mark.slow  # a node process

PERIOD_S = 0.5  # the monitor's period (1 / pub_rate): STALE after 3 of them without a report
REPORT_S = 0.1  # how often the reporting nodes publish their statuses
UP_S = 120  # a node process starting on 2 busy cores
OK, WARN, STALE = 0, 1, 3  # diagnostic_msgs/DiagnosticStatus levels


@pytest.fixture(params=BACKENDS)
def host(request):
    return host_for(request, request.param)


def stamp_s(array) -> float:
    return array.header.stamp.sec + array.header.stamp.nanosec * 1e-9


def statuses(array) -> dict[str, object]:
    """The array's statuses by name; one each of this test's, or the test fails (other nodes of the
    session's graph, the monitors of other tests among them, may report too)."""
    names = [status.name for status in array.status]
    ours = [n for n in names if n.startswith(("/Serving/serve_node_", "/Navigation/go2_bridge_"))]
    assert len(ours) == len(set(ours)), names
    return {status.name: status for status in array.status}


@pytest.mark.timeout(300)
def test_each_status_under_its_part_stale_after_three_silent_periods_ok_again_when_it_reports(host):
    tag = uuid.uuid4().hex[:8]
    ns = f"/monitor_{tag}"
    serve, bridge = f"serve_node_{tag}: requests", f"go2_bridge_{tag}: motion"
    serve_leaf, bridge_leaf = f"/Serving/{serve}", f"/Navigation/{bridge}"
    monitor = Proc([sys.executable, "-m", "edge_llm_ros.nodes.monitor_node", "--ros-args", "-r", f"__ns:={ns}",
                    "-p", f"pub_rate:={1 / PERIOD_S}"], env=host.child_env)
    node = host.Node(f"reporters_{tag}", namespace=ns)
    aggregated = Diagnostics(node, host.message("diagnostic_msgs/msg/DiagnosticArray"), "/diagnostics_agg",
                             {serve_leaf, bridge_leaf})
    Array = host.message("diagnostic_msgs/msg/DiagnosticArray")
    Status, KeyValue = host.message("diagnostic_msgs/msg/DiagnosticStatus"), host.message("diagnostic_msgs/msg/KeyValue")
    pub = node.create_publisher(Array, "/diagnostics", 10)
    bridge_reports = threading.Event()  # the bridge publishes while set
    bridge_moves = ["idle"]
    bridge_last = [0.0]  # system time just before the bridge's last report left

    def report() -> None:
        out = [Status(level=Status.WARN, name=serve, message="1 busy refusal", hardware_id=f"/{tag}/serve_node",
                      values=[KeyValue(key="running", value="3")])]
        if bridge_reports.is_set():
            bridge_last[0] = time.time()
            out.append(Status(level=Status.OK, name=bridge, message=bridge_moves[0], hardware_id="go2 via /cmd_vel"))
        pub.publish(Array(status=out))

    bridge_reports.set()
    timer = node.create_timer(REPORT_S, report)
    try:
        # each status under its part, with its name, hardware id, level and values; each part's summary
        first = aggregated.wait_for(lambda a: {serve_leaf, bridge_leaf} <= set(statuses(a)), UP_S,
                                                       f"both statuses on /diagnostics_agg\n{monitor.tail(20)}")
        both = statuses(first)
        assert (level_of(both[serve_leaf]), both[serve_leaf].message) == (WARN, "1 busy refusal")
        assert both[serve_leaf].hardware_id == f"/{tag}/serve_node" and key_values(both[serve_leaf]) == {"running": "3"}
        assert (level_of(both[bridge_leaf]), both[bridge_leaf].hardware_id) == (OK, "go2 via /cmd_vel")
        assert level_of(both["/Serving"]) == WARN and level_of(both["/Navigation"]) == OK
        assert list(statuses(first)).index("/Serving") < list(statuses(first)).index(serve_leaf)

        # the bridge goes silent: STALE once 3 periods passed since its last report, the serve_node stays WARN
        bridge_reports.clear()
        stale = aggregated.wait_for(lambda a: level_of(statuses(a)[bridge_leaf]) == STALE, 60, f"{bridge} STALE")
        assert level_of(statuses(stale)[serve_leaf]) == WARN and level_of(statuses(stale)["/Navigation"]) == STALE
        silent_since = bridge_last[0]
        for array in aggregated.seen():
            if level_of(statuses(array)[bridge_leaf]) == STALE:  # the monitor heard the last report after it left
                assert stamp_s(array) >= silent_since + 3 * PERIOD_S, (stamp_s(array), silent_since)

        # the bridge reports again: OK again, saying what it says now
        bridge_moves[0] = "moving: forward"
        bridge_reports.set()
        again = aggregated.wait_for(
            lambda a: stamp_s(a) > stamp_s(stale) and level_of(statuses(a)[bridge_leaf]) == OK, 60, f"{bridge} OK again")
        assert statuses(again)[bridge_leaf].message == "moving: forward"
        assert level_of(statuses(again)["/Navigation"]) == OK
        assert monitor.popen.poll() is None, monitor.tail(20)
    finally:
        timer.cancel()
        node.destroy_node()
        monitor.stop()
