"""`edge-llm-ros bench --scenario nav`: the deployment model's arithmetic, the plan's pick, bad input,
and a run through the command line with the camera expert as the navigator (no model: the real
VLM's runs are in docs/navigation.md), which writes the table, the JSON of the issue's shape and
the trajectory PNG."""

from __future__ import annotations

import io
import json

import pytest

from edge_llm_ros.core.nav.deployment import DEPLOYMENTS, EE_GO2, IMAGE_HEADER_BYTES, Link, plan
from edge_llm_ros.core.nav.world import Pose
from edge_llm_ros.tools import bench
from edge_llm_ros.tools.bench_nav import Computed, Decisions, ee_regime, pose_key

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


def test_ee_regime_projects_tokens_and_rounds_onto_table_8_and_gives_back_its_ratio():
    round_s = 0.288 + 0.120 + 0.620  # gamma T_p + T_c + T_q, EE Table 8(a)
    assert EE_GO2.decision_s(DEPLOYMENTS["edge-cloud-sd"], 18, 5) == pytest.approx(5 * round_s)
    assert EE_GO2.decision_s(DEPLOYMENTS["cloud-ar"], 18, 18) == pytest.approx(18 * 0.90 * round_s / 2.92)
    assert EE_GO2.decision_s(DEPLOYMENTS["robot-sd"], 18, 5) is None  # a 7B target does not fit the robot
    # at Table 8(b)'s tau the projection gives back its AR -> SD speedup, 0.90x
    cloud = EE_GO2.decision_s(DEPLOYMENTS["cloud-ar"], 292, 292)
    assert cloud / EE_GO2.decision_s(DEPLOYMENTS["edge-cloud-sd"], 292, 100) == pytest.approx(0.90)
    assert any("Table 8(a)" in s for s in EE_GO2.sources) and any("Table 8(b)" in s for s in EE_GO2.sources)


def test_ee_regime_of_a_run_pairs_the_modes_on_each_pose_and_reads_the_first_motion_at_the_start():
    decisions = Decisions(None, None, {})
    start, later = Pose(1.0, 2.0, 0.5), Pose(1.5, 2.0, 0.5)
    answer = lambda mode, tokens, rounds: Computed(None, True, 0.5, rounds, tokens)  # noqa: E731
    decisions.cache[pose_key(100, start)] = {"ar": answer("ar", 20, 20), "sd": answer("sd", 20, 4)}
    decisions.cache[pose_key(100, later)] = {"ar": answer("ar", 16, 16), "sd": answer("sd", 16, 5)}
    decisions.cache[pose_key(101, start)] = {"sd": answer("sd", 16, 5)}  # no ar on this pose: not a pair
    report = ee_regime(decisions, {pose_key(100, start)})
    cloud, edge = DEPLOYMENTS["cloud-ar"], DEPLOYMENTS["edge-cloud-sd"]
    assert report["decisions"] == 2 and report["tau"] == pytest.approx(36 / 9, abs=0.01)
    assert report["first_motion_s"]["edge-cloud-sd"] == pytest.approx(EE_GO2.decision_s(edge, 20, 4), abs=1e-3)
    assert report["first_motion_cloud_ar_over_edge_cloud_sd"] == pytest.approx(
        EE_GO2.decision_s(cloud, 20, 20) / EE_GO2.decision_s(edge, 20, 4), abs=1e-3)
    assert report["decision_s"]["cloud-ar"] == pytest.approx(EE_GO2.decision_s(cloud, 18, 18), abs=1e-3)
    assert report["label"].startswith("simulated") and "fsd" in report["not_projected"]
    assert ee_regime(Decisions(None, None, {}), set()) is None


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
    assert report["ee_regime"] is None and "EE's Go2 regime" not in out  # the expert has no tokens to project
    assert set(report["trajectories"]) == {f"{r['deployment']}/{r['schedule']}" for r in runs}
