"""`edge-llm-ros bench --scenario nav`: the deployment model's arithmetic, the plan's pick, bad input,
and a run through the command line with the camera expert as the navigator (no model: the real
VLM's runs are in docs/navigation.md), which writes the table, the JSON of the issue's shape and
the trajectory PNG."""

from __future__ import annotations

import io
import json

import pytest

from edge_llm_ros.core.nav.deployment import DEPLOYMENTS, IMAGE_HEADER_BYTES, Link, plan
from edge_llm_ros.tools import bench

FRAME = 128 * 96 * 3


def test_decision_time_per_deployment_adds_what_the_link_costs():
    link = Link(rtt_s=0.05, bandwidth_bps=8e6)  # a megabyte per second
    up = (FRAME + IMAGE_HEADER_BYTES) / 1e6
    assert DEPLOYMENTS["robot-ar"].decision_s(0.9, 18, FRAME, link) == 0.9
    assert DEPLOYMENTS["robot-sd"].decision_s(0.7, 6, FRAME, link) == 0.7
    assert DEPLOYMENTS["cloud-ar"].decision_s(0.9, 18, FRAME, link) == pytest.approx(0.9 + 0.05 + up)
    assert DEPLOYMENTS["edge-cloud-sd"].decision_s(0.7, 6, FRAME, link) == pytest.approx(0.7 + 6 * 0.05 + up)
    assert plan({"cloud-ar": 1.0, "robot-ar": 0.9, "edge-cloud-sd": 0.9}) == "robot-ar"
    with pytest.raises(ValueError, match="bandwidth"):
        Link(0.05, 0.0)


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = bench.main(["--scenario", "nav", "--no-progress", *argv], out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "105-101"], "--seeds: 101 < 105"),
    (["--seeds", "a-b"], "--seeds: expected FIRST-LAST"),
    (["--deployments", "robot-ar,warp"], "--deployments: expected a subset of"),
    (["--schedules", "sometimes"], "--schedules: expected a subset of"),
    (["--rtt", "-1"], "--rtt must be >= 0"),
    (["--json", "/no/such/folder/x.json"], "folder /no/such/folder does not exist"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, message):
    code, _, err = run(["--policy", "expert", *argv])
    assert code == 2 and message in err, err


def test_expert_run_writes_the_table_the_json_and_the_png(tmp_path):
    path = tmp_path / "nav.json"
    code, out, err = run(["--policy", "expert", "--decide-s", "0.3", "--seeds", "100-102", "--rtt", "50",
                          "--json", str(path)])
    assert code == 0, err
    report = json.loads(path.read_text())
    assert report["scenario"] == "nav" and report["seeds"] == [100, 101, 102] and report["link"]["modelled"]
    assert (tmp_path / "nav.png").stat().st_size > 10_000 and "wrote" in err
    runs = report["runs"]
    assert {(r["deployment"], r["overlap"]) for r in runs} == {(d, o) for d in DEPLOYMENTS for o in (True, False)}
    for r in runs:
        for key in ("mode", "overlap", "seeds", "success_rate", "waiting_s_per_episode", "first_motion_s", "backend",
                    "planned", "time_to_goal_s", "path_m"):
            assert key in r, key
        assert r["success_rate"] == 1.0 and r["seeds"] == [100, 101, 102]
        assert all(e["outcome"] == "reached" and not e["touched"] for e in r["episodes"].values())
    # the same compute everywhere: the link only adds, so the plan keeps the target on the robot
    assert report["planned"] in ("robot-ar", "robot-sd") and sum(r["planned"] for r in runs) == 2
    assert report["predicted_decision_s"]["cloud-ar"] > report["predicted_decision_s"]["robot-ar"]
    for schedule, ratio in report["ratios"]["first_motion_cloud_ar_over_planned"].items():
        assert ratio > 1.0, (schedule, ratio)
    for name, ratio in report["ratios"]["waiting_stop_and_go_over_overlap"].items():
        assert ratio >= 3.0, (name, ratio)  # decisions of 0.3 s, shorter than every motion
    assert report["lossless"] and "the plan picks" in out and "waiting, stop-and-go / overlap" in out
    assert set(report["trajectories"]) == {f"{r['deployment']}/{r['schedule']}" for r in runs}
