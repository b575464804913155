"""Diagnostics in this process (embedded backend): a node's own statuses on /diagnostics
(nodes/diagnostics.py), the go2 bridge's levels, and monitor_node's tree on /diagnostics_agg.

The process tests (a busy serve_node WARN, a draft_node without its verifier ERROR, the monitor as a
process on both backends, `ros2 topic echo /diagnostics`) live beside the deployments they watch:
test_serve_node, test_edge_cloud_nodes, test_monitor_node, test_ros2.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from support import Diagnostics, key_values, level_of, wait_until

REPO = Path(__file__).resolve().parents[2]
OK, WARN, ERROR, STALE = 0, 1, 2, 3


class Heard(Diagnostics):
    """The statuses a probe node of this process hears on ``topic``."""

    def __init__(self, rt_session, topic: str = "/diagnostics") -> None:
        from edge_llm_ros import runtime as rt

        self.node = rt_session.Node(f"diag_probe_{uuid.uuid4().hex[:8]}", namespace="/diag_test")
        super().__init__(self.node, rt.message("diagnostic_msgs/msg/DiagnosticArray"), topic)

    def close(self) -> None:
        self.node.destroy_node()


@pytest.fixture
def heard(rt_session):
    probe = Heard(rt_session)
    yield probe
    probe.close()


def test_a_status_merges_to_its_worst_level_and_says_every_reason_at_that_level():
    from edge_llm_ros.nodes.diagnostics import Status, percentile

    status = Status()
    status.summary(OK, "serving")
    status.merge(WARN, "2 busy refusals")
    status.merge(OK, "fine")
    status.merge(WARN, "inactive")
    assert (status.level, status.message) == (WARN, "2 busy refusals; inactive")
    status.merge(ERROR, "no verifier")
    assert (status.level, status.message) == (ERROR, "no verifier")
    status.add("tokens/s", 12.3456)
    status.add("e-stop", True)
    status.add("running", 3)
    assert status.values == [("tokens/s", "12.35"), ("e-stop", "true"), ("running", "3")]
    assert percentile([], 0.5) == 0.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile([float(v) for v in range(1, 101)], 0.95) == 95.0


def test_a_node_publishes_each_task_as_node_colon_task_with_its_hardware_id_and_a_failing_check_is_an_error(
        rt_session, heard):
    from edge_llm_ros.nodes.diagnostics import Updater

    name = f"diag_node_{uuid.uuid4().hex[:8]}"
    node = rt_session.Node(name, namespace="/diag_test", parameter_overrides={"diagnostic_updater.period": 0.2})
    try:
        updater = Updater(node, hardware_id="test rig")
        assert updater.period == pytest.approx(0.2)

        def fine(status) -> None:
            status.summary(WARN, "warming up")
            status.add("answer", 42)

        def broken(status) -> None:
            raise RuntimeError("sensor unplugged")

        updater.add("fine", fine)
        updater.add("broken", broken)
        good = heard.status(f"{name}: fine")
        assert (level_of(good), good.message, good.hardware_id, key_values(good)) == (WARN, "warming up", "test rig",
                                                                             {"answer": "42"})
        bad = heard.status(f"{name}: broken")
        assert level_of(bad) == ERROR and bad.message == "the broken check failed: RuntimeError: sensor unplugged"
    finally:
        node.destroy_node()


def test_a_bad_period_is_refused_naming_the_parameter(rt_session):
    from edge_llm_ros.nodes.diagnostics import Updater

    node = rt_session.Node(f"diag_bad_{uuid.uuid4().hex[:8]}", namespace="/diag_test",
                           parameter_overrides={"diagnostic_updater.period": 0.0})
    try:
        with pytest.raises(ValueError, match=r"parameter 'diagnostic_updater.period' must be in \[0.01, 3600\], got 0.0"):
            Updater(node)
    finally:
        node.destroy_node()


def test_the_bridge_is_an_error_while_its_estop_is_latched_and_warns_when_a_motion_is_clamped(rt_session, heard):
    from edge_llm_ros import runtime as rt
    from edge_llm_ros.nodes.go2_bridge_node import Go2BridgeNode

    namespace = f"/bridge_{uuid.uuid4().hex[:8]}"
    bridge = Go2BridgeNode(namespace=namespace, parameter_overrides={"diagnostic_updater.period": 0.2,
                                                                     "max_frame_age_s": 1e9})
    probe = rt_session.Node(f"bridge_probe_{uuid.uuid4().hex[:8]}", namespace=namespace)
    try:
        name = "go2_bridge: motion"
        assert level_of(heard.status(name, lambda s: s.hardware_id == "go2 via /cmd_vel")) == OK
        estop = probe.create_publisher(rt.message("std_msgs/msg/Bool"), "/estop", 10)
        wait_until(lambda: estop.get_subscription_count() >= 1, 20, "the bridge on /estop")
        estop.publish(rt.message("std_msgs/msg/Bool")(data=True))
        latched = heard.status(name, lambda s: level_of(s) == ERROR)
        assert "e-stop latched" in latched.message and key_values(latched)["e-stop latched"] == "true"
        estop.publish(rt.message("std_msgs/msg/Bool")(data=False))
        heard.status(name, lambda s: level_of(s) == OK and key_values(s)["e-stop latched"] == "false")

        NavAction = rt.message("edge_llm_ros/msg/NavAction")
        actions = probe.create_publisher(NavAction, "nav_action", 10)
        wait_until(lambda: actions.get_subscription_count() >= 1, 20, "the bridge on nav_action")
        action = NavAction(request_id="far", action="forward", distance_m=5.0, valid=True)  # max_distance_m 2
        action.frame_stamp = probe.get_clock().now().to_msg()
        actions.publish(action)
        clamped = heard.status(name, lambda s: level_of(s) == WARN)
        assert "1 motion(s) clamped to the limits" in clamped.message
        assert key_values(clamped)["limits applied (clamped motions)"] == "1"
    finally:
        probe.destroy_node()
        bridge.destroy_node()


def test_the_monitor_groups_statuses_by_part_marks_a_silent_one_stale_and_ok_again_when_heard(rt_session):
    from edge_llm_ros import runtime as rt
    from edge_llm_ros.nodes.monitor_node import MonitorNode

    period = 0.2
    monitor = MonitorNode(namespace=f"/monitor_{uuid.uuid4().hex[:8]}", parameter_overrides={"pub_rate": 1 / period})
    agg = Heard(rt_session, "/diagnostics_agg")
    Array, Status = rt.message("diagnostic_msgs/msg/DiagnosticArray"), rt.message("diagnostic_msgs/msg/DiagnosticStatus")
    pub = agg.node.create_publisher(Array, "/diagnostics", 10)
    tag = uuid.uuid4().hex[:6]
    serve, bridge = f"serve_node_{tag}: requests", f"go2_bridge_{tag}: motion"
    quiet = threading.Event()  # the bridge stops reporting while set
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(period / 2):
            statuses = [Status(level=Status.WARN, name=serve, message="1 busy refusal", hardware_id="serve")]
            if not quiet.is_set():
                statuses.append(Status(level=Status.OK, name=bridge, message="idle", hardware_id="bridge"))
            pub.publish(Array(status=statuses))

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        leaf = agg.status(f"/Serving/{serve}")
        assert (level_of(leaf), leaf.message, leaf.hardware_id) == (WARN, "1 busy refusal", "serve")
        part = agg.status("/Serving", lambda s: level_of(s) == WARN)
        assert part.message.startswith("serve_node_") and part.message.endswith(": 1 busy refusal")
        assert level_of(agg.status(f"/Navigation/{bridge}")) == OK

        quiet.set()
        silent_at = time.monotonic()
        stale = agg.status(f"/Navigation/{bridge}", lambda s: level_of(s) == STALE, timeout=30)
        assert time.monotonic() - silent_at >= 3 * period - 0.05 and stale.message.startswith("stale: nothing heard")
        assert level_of(agg.status("/Navigation", lambda s: level_of(s) == STALE)) == STALE

        quiet.clear()
        assert level_of(agg.status(f"/Navigation/{bridge}", lambda s: level_of(s) == OK, timeout=30)) == OK
    finally:
        stop.set()
        reporter.join(5)
        agg.close()
        monitor.destroy_node()


def test_the_aggregator_yaml_groups_as_the_monitor_does():
    from edge_llm_ros.nodes.monitor_node import PARTS, part_of

    analyzers = yaml.safe_load((REPO / "config" / "diagnostic_analyzers.yaml").read_text())["analyzers"]["ros__parameters"]
    groups = {a["path"]: tuple(a["startswith"]) for key, a in analyzers.items() if isinstance(a, dict)}
    assert groups == dict(PARTS)
    for node, part in (("serve_node", "Serving"), ("draft_node", "Edge-cloud"), ("verifier_node", "Edge-cloud"),
                       ("stage_node", "Pipeline"), ("planner_node", "Planning"), ("navigator", "Navigation"),
                       ("go2_bridge", "Navigation"), ("echo_node", "Serving"),
                       ("foxglove_bridge", "Operator"), ("monitor", "Operator"), ("my_node", "Other")):
        assert part_of(f"{node}: requests") == part
