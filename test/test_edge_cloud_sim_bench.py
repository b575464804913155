"""The edge-cloud bench's simulated rows (tools/edge_cloud_sim.py) on tiny random models: the costs
are measured (profile, verifier overhead, draft, a message's hop through the router), every
measured run's modes are simulated and compared with what was measured, every simulated mode is
lossless, and EE's regime is projected from cited inputs. SmolLM2 and real deployments:
`edge-llm-ros bench --scenario edge-cloud --simulate`."""

from __future__ import annotations

import pytest

from edge_llm_ros.core import ModelDrafter, build_exits, tiny_llama
from edge_llm_ros.core.edge_cloud import DraftRequest
from edge_llm_ros.tools import edge_cloud_sim as ecs

PROMPT = [1, 2, 3, 4, 5, 6, 7]
MODES = ["ar", "sd", "fsd", "ee"]


@pytest.fixture(scope="module")
def model(router_endpoint):
    target = tiny_llama(vocab_size=64, hidden_size=32, num_layers=4, max_context=128, seed=0)
    exits = build_exits(target, (1, 2), bottleneck=8)
    drafters = [ModelDrafter(target.truncated(2)) for _ in range(2)]
    calibrated = ecs.calibrate(target, exits, drafters, [PROMPT], gamma=4, max_new_tokens=12, exit_layers=(1, 2),
                               profile_rows=(1, 4, 8, 16), profile_cached=(0, 32))
    yield calibrated
    calibrated.robot.close()


def test_the_costs_are_measured(model):
    described = model.describe()
    assert described["layer_ms_1_row"] > 0 and described["draft_ms_per_forward"] > 0
    assert model.round_s >= 0 and 0 < model.message_s < 0.05  # one small message on loopback
    assert described["exit_layers"] == [1, 2] and described["predraft_workers"] == 1
    assert described["server_factor"] == 1.0  # no deployed server asked


def test_the_server_runs_at_the_speed_the_deployed_verifier_measured(model, monkeypatch):
    """server_factor: verifier_node's own seconds over this process's for the same rows (the median);
    every server cost of the simulation is scaled by it, the robot's are not."""
    from dataclasses import replace

    from edge_llm_ros.core import device_profile

    here_ms = {1: 10.0, 5: 20.0, 8: 40.0}
    monkeypatch.setattr(device_profile, "row_costs", lambda target, rows, repeats, prefix: here_ms)
    node_s = [0.030, 0.040, 0.060]  # 3x, 2x and 1.5x what this process took
    assert ecs.server_factor(model.verifier.target, node_s) == pytest.approx(2.0)
    draft = DraftRequest("r", 1, [], 9, [5, 6, 7, 8], [-1, 0, 1, 2], [0.5] * 4)
    layers = model.verifier.target.layer_ids
    alone, doubled = model.costs(50.0, 100.0, None), replace(model, server_factor=2.0).costs(50.0, 100.0, None)
    ready, final = alone.verification(draft, layers, (1,))
    ready2, final2 = doubled.verification(draft, layers, (1,))
    assert final2 == pytest.approx(2 * final) and ready2[1] == pytest.approx(2 * ready[1])
    assert doubled.draft_s == alone.draft_s and doubled.uplink == alone.uplink


def test_measured_runs_are_simulated_compared_and_ee_regime_projected(model):
    runs = [{"rtt_ms": 50.0, "bandwidth_mbps": 100.0, "ar": {"ms_per_token": 40.0}, "sd": {"ms_per_token": 30.0}}]
    report = ecs.simulate_report(model, runs, MODES, [PROMPT], gamma=4, max_new=12, pinned=False)
    modes = report["runs"][0]["modes"]
    assert list(modes) == MODES and all(m["lossless"] is True and m["tokens"] == 12 for m in modes.values())
    assert modes["sd"]["error"] == pytest.approx(30.0 / modes["sd"]["ms_per_token"] - 1)
    assert modes["fsd"]["error"] is None and modes["fsd"]["measured_ms_per_token"] is None
    assert modes["ar"]["ms_per_token"] * 12 > 50.0  # cloud decoding: one round trip, then the tokens stream
    assert report["within_tolerance"] == all(abs(modes[m]["error"]) <= ecs.TOLERANCE for m in ("ar", "sd"))
    regime = report["ee_regime"]["modes"]
    assert all(m["lossless"] is True for m in regime.values())
    assert regime["sd"]["ms_per_token"] > regime["ar"]["ms_per_token"] / 4  # 497 ms a verification
    assert all(i["source"] for i in report["ee_regime"]["inputs"])
    costs, _ = ecs.ee_regime_costs(model)  # a round's verification takes EE's T_q, the exits cost heads on top
    draft = DraftRequest("r", 1, [], 9, [5, 6, 7, 8], [-1, 0, 1, 2], [0.5] * 4)
    layers = model.verifier.target.layer_ids
    assert costs.verification(draft, layers, ())[1] == pytest.approx(0.497)
    assert costs.verification(draft, layers, (1,))[1] > 0.497
    lines = ecs.format_lines(report)
    assert lines[1].startswith("  RTT 50 ms, 100 Mbit/s: ar ") and "EE's regime" in lines[-1]


def test_a_timed_drafter_ends_requests_where_its_drafter_would():
    """The robot reads the EOS tokens off its first drafter: a TimedDrafter (calibration) passes them
    through. Before it did, a cloud request that hit EOS waited for a round that never came."""
    from types import SimpleNamespace

    from edge_llm_ros.core.decoding import eos_ids
    from edge_llm_ros.core.pipesim import TimedDrafter

    drafter = ModelDrafter(tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, seed=1))
    drafter.tokenizer = SimpleNamespace(eos_token_id=7)
    assert eos_ids(TimedDrafter(drafter)) == eos_ids(drafter) == (7,)
