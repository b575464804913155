"""``bench --scenario pipeline`` without a launch: the parts that need no node process.

- The projected Jetson-class costs follow from their cited inputs by the written derivation, and
  every input names its source.
- The simulator's link: a lap of the naive pipeline costs exactly its three hops (latency,
  bytes over bandwidth, the runtime's cost per message); a sender's messages stay in order on its
  link (a large prefill chunk is not overtaken by a small one sent after it).
- Simulated rows on a tiny model (saved to a temporary folder, as test/core/test_pipeline.py does):
  every mode lossless against transformers' own greedy generate on the same weights, the fields of
  the report's shape; D0 sharing stage 0's core costs Chunk-PP nothing (it drafts while every stage waits for the draft).
- The report: its JSON shape, the comparisons (error per mode, flagged beyond 15%), the targets
  (met or missed, as computed from the rows), and the table.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from references import hf_greedy

from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.models import load_model, tiny_llama
from edge_llm_ros.core.pipeline.schedulers import PipelineAR
from edge_llm_ros.core.planning.costs import CostModel, DraftCost, LayerProfile, Link, even_ranges, jetson_costs
from edge_llm_ros.core.sim.pipeline import simulate
from edge_llm_ros.tools import bench_pipeline as bp
from edge_llm_ros.tools.pipeline_deployment import Goal
from edge_llm_ros.tools.pipeline_report import TOLERANCE
from edge_llm_ros.tools.prompts import BenchPrompt

PROMPTS = [[3, 17, 22, 9, 41, 5, 30, 12, 7], [1, 8, 2, 60, 33, 4]]
NEW_TOKENS = 24


def test_projected_costs_follow_from_their_cited_inputs():
    costs = jetson_costs(latency_s=1e-3)
    cited = {c.name: c.value for c in costs.inputs}
    assert all(c.source for c in costs.inputs)
    sources = " ".join(c.source for c in costs.inputs)
    assert "flowspec.txt Table I" in sources and "flowspec.txt Table II" in sources
    assert "jupiter.txt Table IV" in sources and "edge_cloud_early_exit.txt Table 5" in sources
    # Jupiter: P + 64 t = EdgeShard, (P / 4)(1 + comm) + 64 t = SP -> a row's share of an INT4 pass, / 4 for fp16
    new, prompt = cited["generated tokens"], cited["prompt tokens"]
    sp_share = (1 + cited["SP communication / computation"]) / 4
    prefill = (cited["EdgeShard latency"] - cited["SP latency"]) / (1 - sp_share)
    decode = (cited["EdgeShard latency"] - prefill) / new
    row = prefill / prompt / decode * cited["Jupiter's precision"] / cited["precision"]
    assert costs.row_factor == pytest.approx(row) and 0.005 < row < 0.05
    # FlowSpec: a Chunk-PP turn = the slowest stage (8 layers + head) over one 16-row chunk
    h, m, v = cited["LLaMA2-7B hidden size"], cited["LLaMA2-7B MLP size"], cited["LLaMA2-7B vocabulary"]
    head = v * h / (4 * h * h + 3 * h * m)
    turn = cited["Chunk-PP ALT"] / cited["Chunk-PP throughput"]  # 0.54 / 6.08 s
    per_stage = cited["LLaMA2-7B layers"] / cited["verification stages"]
    chunk = cited["segment rows"]
    assert costs.head_layers == pytest.approx(head)
    assert costs.layer_s == pytest.approx(turn / ((per_stage + head) * (1 + row * (chunk - 1))))
    assert costs.draft_s == pytest.approx(turn / cited["draft tree depth"])
    assert costs.link.bandwidth_bps == cited["bandwidth"] * 1e6 and costs.row_bytes == h * 2
    assert any(f"{turn * 1e3:.1f} ms" in step for step in costs.derivation)
    four, eight = costs.cost_model(4), costs.cost_model(8)
    assert four.stage_s(0, 16, 0) == pytest.approx(turn * 8 / (8 + head))
    assert four.stage_s(3, 16, 500) == pytest.approx(turn)  # the slowest stage: the head on the last
    assert eight.stage_s(7, 1, 0) == pytest.approx((4 + head) * costs.layer_s)
    assert [len(r) for r in costs.ranges(8)] == [4] * 8 and four.d0_shares is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A bench Setup on a 5-layer random model: its profile, two stages, a shallow draft."""
    folder = tmp_path_factory.mktemp("tiny")
    tiny_llama(vocab_size=64, hidden_size=32, num_layers=5, seed=3).hf.save_pretrained(folder)
    target = load_model(folder, with_tokenizer=False)
    profile = LayerProfile.measure(target, rows=(1, 8, 32), cached=(0, 64), repeats=1)
    references = [hf_greedy(target, p, NEW_TOKENS) for p in PROMPTS]  # transformers' own greedy generate
    long_ids = list(range(1, 41))
    first = hf_greedy(target, long_ids, 1)[0]
    return bp.Setup(target, folder, ModelDrafter(target.truncated(2)), profile, [range(0, 2), range(2, 5)],
                    [BenchPrompt(f"p{i}", "robot", "") for i in range(len(PROMPTS))], PROMPTS, references, "",
                    long_ids, first, draft_s=0.004, draft_call_s=0.001)


def test_a_lap_of_the_naive_pipeline_costs_its_three_hops(tiny):
    link = Link(0.005, 100e6)
    costs = CostModel(stage_s=lambda stage, rows, cached: 0.0, row_bytes=128, link=link, message_s=0.001)
    timeline = bp.simulate_one(tiny, "ar", PROMPTS[0], 6, costs)
    lap = 3 * (0.005 + 0.001) + link.serialization_s(8 + 128 + 12)  # ids in, hidden states, argmax + its p out
    assert timeline.tokens_per_s == pytest.approx(1 / lap)


def test_a_senders_messages_stay_in_order_on_its_link(tiny):
    """At 1 kbit/s the 8-token chunk takes 0.51 s, the 2-token one behind it 0.13 s: it must wait."""
    costs = CostModel(stage_s=lambda stage, rows, cached: 0.01, row_bytes=128, link=Link(0.0, 1e3))
    scheduler = PipelineAR("fifo", PROMPTS[0][:-1] + [7, 7], max_new_tokens=2, prefill_chunks=[8, 2])
    timeline = simulate(scheduler, bp.stages_of(tiny, tiny.ranges), costs)  # out of order: a StageError
    assert len(timeline.tokens) == 2 and timeline.ttft_s > 0.5 + 0.128


def test_simulated_rows_on_a_tiny_model_are_lossless_and_shaped(tiny):
    costs = bp.measured_costs(tiny, bp.LinkSetting(100, 5), 0.001, d0_shares=0)
    alone = bp.measured_costs(tiny, bp.LinkSetting(100, 5), 0.001, d0_shares=None)
    for mode in bp.MODES:
        timelines = [bp.simulate_one(tiny, mode, ids, NEW_TOKENS, costs) for ids in PROMPTS]
        row = bp.simulated_row(tiny, mode, "100 Mbit/s, 5 ms (emulated link)", timelines, stages=2,
                               device="tiny", references=tiny.references)
        assert row["lossless"] is True, mode
        assert {"source", "stages", "mode", "tokens_per_s", "alt", "alr", "ttft_s", "lossless"} <= row.keys()
        assert row["source"] == "simulated" and row["tokens_per_s"] > 0 and row["ttft_s"] > 0
        assert (row["alr"] is None) == (mode == "ar") and (row["alt"] == 1.0 or mode != "ar")
        assert (row["d0_busy_s"] > 0) == (mode != "ar")
        if mode == "chunk_pp":  # D0 drafts while every stage waits for the draft: sharing a core costs nothing
            solo = [bp.simulate_one(tiny, mode, ids, NEW_TOKENS, alone) for ids in PROMPTS]
            assert all(s.times == pytest.approx(t.times) for s, t in zip(solo, timelines))


def fake_goal(mode: str, tokens: list[int], ttft: float, rate: float) -> Goal:
    span = (len(tokens) - 1) / rate
    return Goal(mode, tokens, 0.0, ttft, ttft + span, ttft + span + 0.01, 1.0 if mode == "ar" else 2.0,
                   0.0 if mode == "ar" else 3.0)


def test_the_report_has_the_issues_shape_and_says_which_targets_are_met(tiny):
    link = bp.LinkSetting(100, 5)
    costs = bp.measured_costs(tiny, link, 0.001, 0)
    rows = []
    for mode, rate in (("ar", 20.0), ("chunk_pp", 8.0), ("flowspec", 13.0)):
        goals = [fake_goal(mode, ref, 0.3, rate) for ref in tiny.references]
        rows.append(bp.measured_row(tiny, mode, link, goals))
        timelines = [bp.simulate_one(tiny, mode, ids, NEW_TOKENS, costs) for ids in PROMPTS]
        rows.append(bp.simulated_row(tiny, mode, f"{link.name} ({bp.LABEL})", timelines, stages=2, device="tiny",
                                     references=tiny.references))
    prefill = [{"source": s, "stages": 2, "link": f"{link.name} ({bp.LABEL})", "prompt_tokens": 40, "chunk": 10,
                "chunks": [10] * 4, "jupiter_plan": {"chunks": [12, 10, 9, 9], "latency_s": 0.1},
                "ttft_unchunked_s": 0.4, "ttft_pipelined_s": 0.3, "first_token_exact": True}
               for s in ("measured", "simulated")]
    runs = [bp.Measured(None, 0, other_cores=0.01), bp.Measured(link, 0, other_cores=0.5)]
    report = bp.report_of(tiny, [link], runs, rows, prefill, jetson_costs(), None, None, 0.02,
                          {"message_s": 0.001, "message_s_from": "test"}, NEW_TOKENS,
                          [{"rows": 64, "bytes": 147456, "count": 5, "p50_ms": 0.8, "p90_ms": 1.1, "mean_ms": 0.9}])
    decoded = json.loads(json.dumps(report))
    assert decoded["scenario"] == "pipeline" and decoded["lossless"] is True
    assert {(r["source"], r["mode"]) for r in decoded["rows"]} == {(s, m) for s in ("measured", "simulated")
                                                                   for m in bp.MODES}
    assert all(r["link"].endswith("(emulated link)") for r in decoded["rows"])
    assert all(i["source"] for i in decoded["projection"]["inputs"])
    assert (decoded["projection"]["trees"]["init_size"], decoded["projection"]["trees"]["segment"]) == (80, 16)
    assert [c["mode"] for c in decoded["comparisons"]] == list(bp.MODES)
    flow = next(c for c in decoded["comparisons"] if c["mode"] == "flowspec")
    assert flow["error"] == pytest.approx(flow["simulated_tokens_per_s"] / 13.0 - 1)
    assert flow["within_tolerance"] == (abs(flow["error"]) <= TOLERANCE)
    met = {t["target"].split(": ", 1)[1]: t for t in decoded["targets"]}
    assert met["FlowSpec / Chunk-PP tokens/s"]["value"] == pytest.approx(13 / 8) and met[
        "FlowSpec / Chunk-PP tokens/s"]["met"]
    assert met["FlowSpec ALT"]["met"] and met["TTFT of a 40-token prompt, pipelined / unchunked"]["met"]
    assert met["p50 ms"]["target"].startswith("a stage hop on loopback, 64 rows") and met["p50 ms"]["met"]
    assert any("other processes kept cores busy" in note for note in decoded["notes"]) and decoded["warning"]
    table = bp.format_table(decoded)
    assert "met    measured 2 stages, 100 Mbit/s, 5 ms (emulated link): FlowSpec / Chunk-PP tokens/s" in table
    assert "time to first token, 512-token prompt" in table and "WARNING: other processes" in table
    assert "target: a hop of 64 rows under 2 ms p50: 0.80 ms, met" in table
    assert "trees: 80 nodes (top-10, depth 6) in segments of 16, expansions of 64" in table


def test_plans_and_settings():
    assert bp.link_settings("100:5,1000:1") == [bp.LinkSetting(100, 5), bp.LinkSetting(1000, 1)]
    with pytest.raises(bp.ToolError, match="--links"):
        bp.link_settings("fast")
    profile = LayerProfile([1, 8, 64], [0, 512], [[1e-3, 1e-3], [2e-3, 2e-3], [8e-3, 8e-3]], [6e-3, 12e-3, 40e-3])
    ranges = bp.plan_split(profile, 30, 8)  # 2 ms a layer, the head 6 layers' worth on the last stage
    assert [len(r) for r in ranges] == [18, 12]
    assert even_ranges(30, 4) == [range(0, 8), range(8, 16), range(16, 23), range(23, 30)]
    fitted = DraftCost.fit([(1, f, 0.01 + 0.012 * f) for f in (4, 6, 4, 6, 7)])
    assert fitted.per_draft_s == pytest.approx(0.01) and fitted.per_forward_s == pytest.approx(0.012)
    assert DraftCost.fit([(1, 6, 0.06), (1, 6, 0.072)]) == DraftCost(0.0, pytest.approx(0.011))  # one depth
    totals = DraftCost.fit([(d, f, 0.01 * d + 0.012 * f) for d, f in ((10, 60), (14, 70), (9, 50))])  # per request
    assert totals.per_draft_s == pytest.approx(0.01) and totals.per_forward_s == pytest.approx(0.012)
    assert DraftCost.fit([(10, 60, 0.6), (20, 120, 1.2)]) == DraftCost(0.0, pytest.approx(0.01))  # proportional
    doubled = profile.averaged(LayerProfile([1, 8, 64], [0, 512], [[3e-3] * 2, [2e-3] * 2, [8e-3] * 2], [6e-3] * 3))
    assert doubled.layer_s[0] == [2e-3, 2e-3] and doubled.head_s[2] == pytest.approx(23e-3)


def test_a_stage_takes_its_cores_as_taskset_lists_them():
    from edge_llm_ros.nodes.common import cpu_set
    from edge_llm_ros.nodes.stage_node import StageParams

    assert cpu_set("1") == {1} and cpu_set("0,2-3") == {0, 2, 3} and cpu_set("") == set()
    assert StageParams(cpus="0-1").cpus == "0-1"
    with pytest.raises(ValueError, match="parameter 'cpus' takes cores as taskset -c lists them"):
        StageParams(cpus="first")


def test_each_stage_is_scaled_by_its_own_profile_in_the_deployment(tiny):
    """calibrate: a stage that measured itself 2x, 1.5x and 1x as slow as the in-process profile at 1,
    8 and 24 rows (and one twice as fast) gets its seconds scaled so in the simulation, interpolated
    between the row counts; the message cost is then what is left; the profiles asked of both stages
    at once give the contention."""
    base = tiny.profile.stage_s(tiny.ranges)
    by_rows = [(2.0, 1.5, 1.0), (0.5, 0.5, 0.5)]  # at STAGE_PROFILE_ROWS (1, 8, 24)
    own = [[np.float32(f * base(i, n, bp.STAGE_PROFILE_CACHED)) for n, f in zip(bp.STAGE_PROFILE_ROWS, factors)]
           for i, factors in enumerate(by_rows)]  # float32, as a Profile answer carries them
    together = [[1.25 * s for s in stage] for stage in own]  # each slower while the other computes too
    goals = [fake_goal("ar", ref, 0.3, 20.0) for ref in tiny.references]
    try:
        calibration = bp.calibrate(tiny, bp.Measured(None, 0, goals={"ar": goals}, stage_s=own,
                                                     stage_s_together=together), d0_shares=0)
        assert calibration["stage_factors"] == [pytest.approx(list(f), rel=1e-5) for f in by_rows]
        assert calibration["contention"] == pytest.approx(1.25)
        json.dumps(calibration)  # the report's cost_model
        costs = bp.measured_costs(tiny, None, calibration["message_s"], 0)
        assert costs.stage_s(0, 8, 64) == pytest.approx(1.5 * base(0, 8, 64), rel=1e-5)
        assert costs.stage_s(0, 16, 64) == pytest.approx(1.25 * base(0, 16, 64), rel=1e-5)  # halfway to 24
        assert costs.stage_s(0, 64, 64) == pytest.approx(1.0 * base(0, 64, 64), rel=1e-5)  # beyond: the nearest
        assert costs.stage_s(1, 8, 64) == pytest.approx(0.5 * base(1, 8, 64), rel=1e-5)
        assert costs.contention == pytest.approx(1.25)  # the simulator slows stages that compute at once
        assert calibration["message_s"] >= 0
    finally:
        tiny.stage_factors = tiny.contention = None


def test_the_simulator_drafts_at_the_cost_draft_node_timed_in_the_deployment(tiny):
    """draft_calibration: D0's (drafts, forwards, CPU seconds) per request of the deployments, fitted
    and set on the setup the simulator reads; the bench process's own fit stays in the report; with
    no timed request (ar only) the bench process's fit is kept."""
    before = (tiny.draft_call_s, tiny.draft_s)
    link = bp.LinkSetting(100, 5)
    timed = {"chunk_pp": [(10, 60), (12, 72)], "flowspec": [(14, 56), (9, 40)]}
    goals = {mode: [dataclasses.replace(fake_goal(mode, tiny.references[0], 0.3, 10.0),
                                        drafts=(d, f, 0.002 * d + 0.011 * f)) for d, f in pairs]
             for mode, pairs in timed.items()}
    goals["ar"] = [dataclasses.replace(fake_goal("ar", tiny.references[0], 0.3, 20.0), drafts=(0, 0, 0.0))]
    try:
        assert bp.draft_calibration(tiny, [bp.Measured(None, 0, goals={"ar": goals["ar"]})]) == {
            "draft_from": "drafts timed in the bench process (no deployment timed its own)",
            "draft_in_process": {"draft_s_per_forward": before[1], "draft_s_per_draft": before[0]}}
        assert (tiny.draft_call_s, tiny.draft_s) == before
        calibration = bp.draft_calibration(tiny, [bp.Measured(None, 0), bp.Measured(link, 0, goals=goals)])
        assert (tiny.draft_call_s, tiny.draft_s) == (pytest.approx(0.002), pytest.approx(0.011))
        assert calibration["draft_from"].startswith("draft_node's own CPU seconds drafting, 4 requests")
        assert calibration["draft_in_process"]["draft_s_per_forward"] == before[1]
        assert bp.measured_costs(tiny, link, 0.001, 0).draft_s == pytest.approx(0.011)
    finally:
        tiny.draft_call_s, tiny.draft_s = before
