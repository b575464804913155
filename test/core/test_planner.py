"""core.planner: scoring deployments from measurements (single, throughput with n requests, edge-cloud),
the reason sentence, bad requests; core.device_profile's τ(γ) from one chain run. Pure helpers, no models."""

from __future__ import annotations

import math

import pytest

from edge_llm_ros.core.engine.drafters import TreeSpec
from edge_llm_ros.core.planning.device_plan import candidate, load_plan, plan_record, save_plan
from edge_llm_ros.core.planning.device_profile import chain_taus
from edge_llm_ros.core.planning.planner import (
    ANSWER_TOKENS,
    DeploymentRequest,
    DraftMeasure,
    Measurements,
    TreeMeasure,
    choose,
    cost_at,
    load_measurements,
    plan_deployment,
)

TREE = TreeSpec(depth=4, branch=2, expand=2, width=7)
# A 2-core CPU as measured: llama.cpp 5x faster per row than torch, rows get dearer fast (ar wins
# there), while torch verifies a few rows for nearly the price of one (speculation wins there).
LLAMA = {1: 8.0, 2: 14.0, 3: 19.0, 4: 24.0, 5: 29.0, 8: 40.0}
TORCH = {1: 40.0, 2: 42.0, 3: 44.0, 4: 47.0, 5: 50.0, 8: 60.0}
TAU = {1: 1.6, 2: 2.0, 3: 2.2, 4: 2.3}


def measurements(llama=True) -> Measurements:
    drafts = [DraftMeasure("torch", "draft", 5.0, TAU, [TreeMeasure(TREE, 2.4, 20.0)])]
    costs = {"torch": TORCH}
    if llama:
        drafts.append(DraftMeasure("llama.cpp", "gguf draft", 2.0, TAU, [TreeMeasure(TREE, 2.4, 8.0)]))
        costs["llama.cpp"] = LLAMA
    return Measurements(costs, drafts, {"torch": {7: 55.0}, "llama.cpp": {7: 45.0}} if llama else {})


def test_single_scores_every_candidate_as_choose_does_and_says_why_ar_won():
    m = measurements()
    answer = plan_deployment(m, DeploymentRequest())
    chosen = choose(m.costs, m.drafts, m.tree_costs)
    assert [p.candidate for p in answer.candidates] == chosen["candidates"]  # one scoring for plan --device and the node
    assert answer.choice.candidate == chosen["choice"]
    # 2 backends x (ar + 2 drafts x (4 gammas + 1 tree))
    assert len(answer.candidates) == 2 * (1 + 2 * (len(TAU) + 1))
    assert answer.choice.text == "ar on llama.cpp" and answer.choice.tokens_per_s == pytest.approx(1000 / 8.0)
    best_sd = 1000 * TAU[1] / (LLAMA[2] + 2.0)  # sd γ=1 on llama.cpp, llama.cpp draft
    assert answer.reason == (f"ar on llama.cpp: 125 tok/s predicted; best speculative candidate sd γ=1 on "
                             f"llama.cpp, draft on llama.cpp predicts {best_sd:.0f} tok/s: one row costs 8.0 ms; "
                             "verifying 2 rows costs 1.8x one row here (+ 2 ms drafting) while τ is 1.60")


def test_without_llama_cpp_the_plan_is_on_torch_and_speculative_where_rows_are_cheap():
    answer = plan_deployment(measurements().without("llama.cpp"), DeploymentRequest())
    assert {p.candidate["backend"] for p in answer.candidates} == {"torch"}
    assert {p.candidate["draft_backend"] for p in answer.candidates} == {None, "torch"}
    best = answer.choice.candidate
    assert (best["backend"], best["mode"]) == ("torch", "sd")
    assert answer.reason.startswith(f"{answer.choice.text}: ") and "best ar candidate ar on torch" in answer.reason
    assert plan_deployment(measurements(llama=False), DeploymentRequest()).choice.candidate == best


def test_throughput_batches_ar_on_llama_cpp_and_serializes_speculation():
    m = measurements()
    answer = plan_deployment(m, DeploymentRequest(objective="throughput", concurrency=8))
    by_text = {p.text: p.tokens_per_s for p in answer.candidates}
    assert answer.choice.text == "ar on llama.cpp, 8 requests batched"
    assert answer.choice.tokens_per_s == pytest.approx(8 * 1000 / LLAMA[8])
    single = {p.text: p.tokens_per_s for p in plan_deployment(m, DeploymentRequest()).candidates}
    sd = "sd γ=1 on llama.cpp, draft on llama.cpp"
    assert by_text[sd + ", one request at a time"] == pytest.approx(single[sd])  # one at a time: no gain
    assert by_text["ar on torch, requests interleaved, unbatched"] == pytest.approx(single["ar on torch"])
    assert "tok/s in all" in answer.reason and "8 rows cost 5.0x one row" in answer.reason
    # a batch of 8 that costs 10x one row does not pay where a few rows are cheap: speculation wins
    steep = Measurements({"llama.cpp": {1: 8.0, 2: 8.4, 3: 8.8, 4: 9.2, 5: 9.6, 8: 80.0}}, m.drafts[1:], {})
    assert plan_deployment(steep, DeploymentRequest(objective="throughput", concurrency=8)).choice.speculative
    # latency with 8 requests: one request's share
    share = plan_deployment(m, DeploymentRequest(objective="latency", concurrency=8))
    assert share.choice.tokens_per_s == pytest.approx(1000 / LLAMA[8]) and "tok/s per request" in share.reason


def test_edge_cloud_pays_the_link_per_round_and_cloud_decoding_once():
    m = measurements()
    answer = plan_deployment(m, DeploymentRequest("edge_cloud", link_latency_ms=25.0))
    by_text = {p.text: p.tokens_per_s for p in answer.candidates}
    assert by_text["ar on llama.cpp (cloud decoding)"] == pytest.approx(1000 * ANSWER_TOKENS / (50 + ANSWER_TOKENS * 8))
    sd = 1000 * TAU[2] / (2 * 2.0 + 50 + LLAMA[3])  # no bandwidth limit: no transfer time
    assert by_text["sd γ=2 on llama.cpp, draft on llama.cpp over the link"] == pytest.approx(sd)
    assert answer.choice.text == "ar on llama.cpp (cloud decoding)"
    assert "one round trip (50 ms)" in answer.reason and "pays 50 ms of link" in answer.reason
    # a slow server and no latency: speculation wins; a thin link makes each round dearer
    slow = Measurements({"torch": {n: 100.0 + n for n in range(1, 9)}}, m.drafts[:1], {})
    near = plan_deployment(slow, DeploymentRequest("edge_cloud", link_latency_ms=0.0))
    assert near.choice.speculative
    thin = plan_deployment(slow, DeploymentRequest("edge_cloud", link_bandwidth_mbps=0.01))
    assert thin.choice.tokens_per_s < near.choice.tokens_per_s


@pytest.mark.parametrize("fields, message", [
    ({"deployment": "mesh"}, "deployment must be one of single | edge_cloud | pipeline, got 'mesh'"),
    ({"objective": "cost"}, "objective must be one of latency | throughput"),
    ({"link_latency_ms": -1.0}, "link_latency_ms must be a finite number >= 0, got -1.0"),
    ({"link_bandwidth_mbps": math.nan}, "link_bandwidth_mbps must be a finite number >= 0, got nan"),
    ({"link_latency_ms": math.inf}, "link_latency_ms must be a finite number >= 0"),
    ({"concurrency": 0}, "concurrency must be in 1..1024"),
    ({"deployment": "pipeline"}, "pipeline stages do not exist (issue 14)"),
])
def test_bad_requests_say_what_is_wrong(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("|", r"\|")):
        DeploymentRequest(**fields)


def test_cost_curve_interpolates_and_extrapolates():
    assert cost_at(LLAMA, 5) == 29.0
    assert cost_at(LLAMA, 6) == pytest.approx(29.0 + 11.0 / 3) and cost_at(LLAMA, 7) == pytest.approx(29.0 + 22.0 / 3)
    assert cost_at(LLAMA, 16) == pytest.approx(40.0 + 8 * 11.0 / 3)  # the last two points' slope
    assert cost_at({1: 8.0}, 4) == 32.0


def test_measurements_round_trip_through_the_plan_file(tmp_path):
    m = measurements()
    scored = choose(m.costs, m.drafts, m.tree_costs)
    record = plan_record(scored["choice"], model="/models/a.gguf", threads=2, draft_backend="llama.cpp",
                         row_costs_ms={b: {str(n): c for n, c in cost.items()} for b, cost in m.costs.items()},
                         tree_costs_ms={b: {str(w): c for w, c in cost.items()} for b, cost in m.tree_costs.items()},
                         drafts=[d.record() for d in m.drafts], candidates=scored["candidates"])
    path = save_plan(record, tmp_path / "plan.json")
    assert load_measurements(path) == m and load_plan(path).mode == "ar"
    bare = save_plan(plan_record(candidate("torch", "ar", 25.0), model="m", threads=1, draft_backend="torch"),
                     tmp_path / "bare.json")
    with pytest.raises(ValueError, match="keeps no usable measurements"):
        load_measurements(bare)


def test_tau_per_gamma_from_one_chain_run():
    # rounds of a γ=4 run accepted 0, 1, 4 and 2 drafted tokens
    assert chain_taus([0, 1, 4, 2], 4) == {1: 1 + 3 / 4, 2: 1 + 5 / 4, 3: 1 + 6 / 4, 4: 1 + 7 / 4}
    assert chain_taus([], 2) == {1: 1.0, 2: 1.0}
