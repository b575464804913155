"""`edge-llm-ros bench --scenario nav`: the deployment model's arithmetic, the plan's pick, bad input,
and a run through the command line with the camera expert as the navigator (no model: the real
VLM's runs are in docs/navigation.md), which writes the table, the JSON of the issue's shape and
the trajectory PNG."""

from __future__ import annotations

import io
import json

import pytest

from edge_llm_ros.nav.deployment import DEPLOYMENTS, IMAGE_HEADER_BYTES, Link, ee_go2_costs, plan
from edge_llm_ros.nav.world import Pose
from edge_llm_ros.tools import bench
from edge_llm_ros.tools.bench_nav import Computed, Decisions, pose_key

FRAME = 128 * 96 * 3


def test_a_model_free_decision_over_the_link_adds_what_the_link_costs():
    link = Link(rtt_s=0.05, bandwidth_bps=8e6)  # a megabyte per second
    up = (FRAME + IMAGE_HEADER_BYTES) / 1e6
    assert DEPLOYMENTS["robot-ar"].modelled_s(0.9, 18, FRAME, link) == 0.9
    assert DEPLOYMENTS["robot-sd"].modelled_s(0.7, 6, FRAME, link) == 0.7
    assert DEPLOYMENTS["cloud-ar"].modelled_s(0.9, 18, FRAME, link) == pytest.approx(0.9 + 0.05 + up)
    for name in ("edge-cloud-sd", "edge-cloud-fsd", "edge-cloud-ee"):
        assert DEPLOYMENTS[name].modelled_s(0.7, 6, FRAME, link) == pytest.approx(0.7 + 6 * 0.05 + up)
    assert plan({"cloud-ar": 1.0, "robot-ar": 0.9, "edge-cloud-sd": 0.9}) == "robot-ar"
    with pytest.raises(ValueError, match="bandwidth"):
        Link(0.05, 0.0)


def test_ee_go2_costs_spread_table_8_over_the_layers_and_give_back_its_ar_to_sd_ratio():
    layers = 30
    costs, inputs = ee_go2_costs(layers)
    t_p, t_q, t_c = 0.288 / 4, 0.620, 0.120  # EE Table 8(a)

    def verification(rows):  # every layer and the head over ``rows`` rows
        return sum(costs.layer_s(layer, rows, 100) for layer in range(layers)) + costs.head_s(rows)

    sd_token = (2 * t_c + 4 * t_p + t_q) / 2.92  # Table 4's SD latency per token at Table 8(b)'s tau
    assert verification(5) == pytest.approx(t_q) and verification(64) == pytest.approx(t_q)
    assert verification(1) == pytest.approx(0.90 * sd_token)  # cloud AR's token: AR -> SD 0.90x
    assert verification(1) < verification(3) < verification(5)
    assert costs.exit_s(5) == costs.head_s(5) > costs.layer_s(0, 5, 0)  # Qwen2-VL-7B's head: 2.3 layers
    assert costs.draft_s == pytest.approx(t_p) and costs.uplink.latency_s == costs.downlink.latency_s == t_c
    sources = " ".join(c.source for c in inputs)
    assert "Table 8(a)" in sources and "Table 8(b)" in sources and all(c.source for c in inputs)


def test_decisions_are_computed_once_per_pose_and_deployment_and_differences_are_lossless_failures():
    decisions = Decisions(None, None, None)
    pose = Pose(1.0, 2.0, 0.5)
    answers = {"robot-ar": "forward", "cloud-ar": "forward", "edge-cloud-sd": "left"}
    calls = []

    def compute(world, at, name):
        calls.append(name)
        return Computed(type("Command", (), {"action": answers[name]})(), True, 0.5, 1, 10)

    decisions.compute = compute
    for name in ("robot-ar", "cloud-ar", "robot-ar", "edge-cloud-sd"):
        decisions.get(100, None, pose, name)
    assert calls == ["robot-ar", "cloud-ar", "edge-cloud-sd"]
    assert decisions.mismatches == [{"seed": 100, "pose": [1.0, 2.0, 0.5], "robot-ar": "forward",
                                     "edge-cloud-sd": "left"}]
    assert list(decisions.cache) == [pose_key(100, pose)]


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
    assert not report["link"]["emulated"] and "modelled link" in report["label"]
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
    assert report["ee_regime"] is None and "EE's Go2 regime" not in out  # the expert has no tokens to project
    assert set(report["trajectories"]) == {f"{r['deployment']}/{r['schedule']}" for r in runs}
