"""The edge-cloud bench's simulated rows (tools/edge_cloud_sim.py) on tiny random models: the costs
are measured (profile, verifier overhead, draft, a message's hop through the router), every
measured run's modes are simulated and compared with what was measured, every simulated mode is
lossless, and EE's regime is projected from cited inputs. SmolLM2 and real deployments:
`edge-llm-ros bench --scenario edge-cloud --simulate`."""

from __future__ import annotations

import math

import pytest

from edge_llm_ros.core.drafts.exits import build_exits
from edge_llm_ros.core.edge_cloud import DraftRequest
from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.models import tiny_llama
from edge_llm_ros.core.planning.costs import RowScale
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
    assert model.round_s >= 0 and 0 < model.message_s < math.inf  # measured and finite; its speed is bench's
    assert described["exit_layers"] == [1, 2] and described["predraft_workers"] == 1
    assert described["server_from"] == "a whole forward timed in the bench process"  # no node asked
    assert all(f > 0 for f in described["server_factors"]) and described["server_rows"] == [1, 5, 8]


def test_the_server_runs_at_the_speed_of_a_whole_forward(model):
    """RowScale: a whole forward (the deployed verifier's own profile, here a fake one) over what the
    per-layer costs add up to, by rows, interpolated between the measured counts; the server's layers,
    exits and head scale by it, the robot's costs do not."""
    from dataclasses import replace

    from edge_llm_ros.core.sim.edge_cloud import EdgeCloudCosts

    layers = model.verifier.target.layer_ids
    flat = EdgeCloudCosts(lambda layer, rows, cached: 0.001 * rows, head_s=lambda rows: 0.002 * rows)
    summed = [(0.001 * len(layers) + 0.002) * n for n in ecs.SERVER_ROWS]  # (1, 5, 8) rows
    speed = RowScale.of(ecs.SERVER_ROWS, [3 * summed[0], 2 * summed[1], 1.5 * summed[2]], summed)
    assert speed.factors == pytest.approx((3.0, 2.0, 1.5))
    assert speed(1) == pytest.approx(3.0) and speed(3) == pytest.approx(2.5) and speed(64) == pytest.approx(1.5)
    draft = DraftRequest("r", 1, [], 9, [5, 6, 7, 8], [-1, 0, 1, 2], [0.5] * 4)  # 5 tree rows: factor 2
    ready, final = flat.verification(draft, layers, (1,))
    ready2, final2 = flat.server_scaled(speed).verification(draft, layers, (1,))
    assert final2 == pytest.approx(2 * final) and ready2[1] == pytest.approx(2 * ready[1])
    doubled = replace(model, server=RowScale((1,), (2.0,))).costs(50.0, 100.0, None)
    alone = replace(model, server=RowScale((1,), (1.0,))).costs(50.0, 100.0, None)
    compute = [c.verification(draft, layers, ())[1] - model.round_s for c in (doubled, alone)]  # the round's own: as is
    assert compute[0] == pytest.approx(2 * compute[1])
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

    from edge_llm_ros.core.engine.decoding import eos_ids
    from edge_llm_ros.core.planning.costs import TimedDrafter

    drafter = ModelDrafter(tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, seed=1))
    drafter.tokenizer = SimpleNamespace(eos_token_id=7)
    assert eos_ids(TimedDrafter(drafter)) == eos_ids(drafter) == (7,)
