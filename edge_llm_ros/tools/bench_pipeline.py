"""``edge-llm-ros bench --scenario pipeline``: the stage pipeline measured on two pinned cores over
emulated links, simulated with the same schedulers, and projected to 4 and 8 Jetson-class stages.

    edge-llm-ros bench --scenario pipeline --json pipeline.json     # 2 links x 3 prompts x 64 tokens
    edge-llm-ros bench --scenario pipeline --quick                  # 1 link, 1 prompt, 32 tokens

Measured: ``launch/stages.launch.py`` for real, two stage_node processes (layers split by Jupiter's
plan_layers over this machine's measured per-layer costs), each pinned to a core of its own
(``cpus:=``) with one torch thread, and draft_node as D0 on the first stage's core (taskset). Every
hop crosses an emulated link (the runtime's, ``link_emulation.hop``: one-way latency and bandwidth,
labelled "emulated link"). Each prompt runs in every mode (ar: the naive pipeline, chunk_pp,
flowspec), greedy; per mode: decoding tokens/s (after the first token), end-to-end tokens/s, time to
first token, ALT and ALR (draft_node's figures), and lossless: the tokens equal the engine's ar
output. A 512-token prompt measures time to first token with the whole prompt in one message and
with Jupiter's pipelined prefill (chunks of the size plan_sequence gives, back to back).

Simulated: core.sim.pipeline.simulate runs the same schedulers on in-process stages with the costs
measured here: per-layer and head seconds (LayerProfile, one thread), D0's seconds per draft and
per draft forward (draft_node's own CPU seconds drafting in the deployments), the link, D0
sharing the first stage's core, and the runtime's cost per message, measured on loopback (a
deployment with the links off: its ar lap minus the profile's compute, per hop). Each simulated
mode is compared with the measured one: within 15% or flagged.

Projected: the same simulation on 4 and 8 stages with Jetson-class costs derived from the papers'
tables (core.planning.costs.jetson_costs: every input cited in the report) and FlowSpec's own tree setting
for every method (core.pipeline.schedulers.PAPER_SHAPE: 80-node trees in segments of 16, 64-node expansions);
the tokens and acceptance are still SmolLM2's (its target and shipped draft run in the simulator).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from pathlib import Path

from edge_llm_ros.tools import stage_hop
from edge_llm_ros.tools.bench_harness import Scenario, progress_bar, register, scenario_parser
from edge_llm_ros.tools.deployment import EventLog, local_router
from edge_llm_ros.tools.loading import ToolError
from edge_llm_ros.tools.pipeline_deployment import (
    SEGMENT,
    STAGE_PROFILE_CACHED,
    STAGE_PROFILE_ROWS,
    TTFT_REPEATS,
    Client,
    LinkSetting,
    Measured,
    Setup,
    node_cores,
    run_deployment,
)
from edge_llm_ros.tools.pipeline_report import (
    LABEL,
    MODES,
    ORACLE,
    PROJECTED_STAGES,
    SHIPPED,
    format_table,
    measured_row,
    plot,
    pooled,
    report_of,
    simulated_row,
)
from edge_llm_ros.tools.prompts import BENCH_PROMPTS, BenchPrompt

LINKS = ((100.0, 5.0), (1000.0, 1.0))  # (Mbit/s, one-way ms) per hop
PROMPTS, QUICK_PROMPTS = 3, 1
MAX_NEW_TOKENS, QUICK_MAX_NEW_TOKENS = 64, 32
PROJECTED_PROMPTS = 2
LONG_PROMPT_TOKENS = 512
HOP_MESSAGES = 200  # messages per row count when timing a stage hop
PROFILE_ROWS = (1, 4, 8, 16, 24, 32, 64, 128, 256, 512)
PROFILE_CACHED = (0, 256, 1024)


# -- this process: the model, its costs, the plans ------------------------------------------------------


def long_prompt(tokenizer, tokens: int) -> str:
    """A prompt of about ``tokens`` tokens once the chat template is applied: a paragraph repeated."""
    from edge_llm_ros.core.engine.models import chat_prompt

    unit, ask = " ".join(p.text for p in BENCH_PROMPTS), " Summarize the above in one line."
    text = unit
    while len(chat_prompt(tokenizer, text + ask)) < tokens:
        text += " " + unit
    words = text.split(" ")
    while len(chat_prompt(tokenizer, " ".join(words) + ask)) > tokens:
        words.pop()
    return " ".join(words) + ask


def plan_split(profile, num_layers: int, rows: int) -> list[range]:
    """Jupiter Eq. 1 over two identical cores, each layer costing what the profile measured for
    ``rows`` rows, the head on the last stage."""
    from edge_llm_ros.core.planning.partition import ModelCost, StageDevice, plan_layers

    layer = float(profile.q()([rows], [0])[0])
    devices = [StageDevice(f"core {i}", [layer] * num_layers, 1 << 62, head_s=profile.head(rows) if i else 0.0)
               for i in range(2)]
    return list(plan_layers(devices, ModelCost([1] * num_layers)).ranges)


def stage_cost(profile, ranges: list[range]):
    """q(rows, prefix) of the slowest of ``ranges``'s stages (vectorised, for plan_sequence)."""
    import numpy as np

    q = profile.q()

    def seconds(rows, prefix):
        layer = q(rows, prefix)
        last = len(ranges[-1]) * layer + np.interp(rows, profile.rows, profile.head_s)
        return np.maximum(len(ranges[0]) * layer, last)

    return seconds


def prefill_chunk(setup: Setup, link: LinkSetting) -> tuple[int, object]:
    """Jupiter Eq. 2-4 for the long prompt on these stages and link (a stage's time includes its hop):
    (the chunk size the nodes take, ceil(prompt / k), and the plan)."""
    from edge_llm_ros.core.planning.partition import plan_sequence

    q, hop = stage_cost(setup.profile, setup.ranges), link.link()

    def with_hop(rows, prefix):
        return q(rows, prefix) + hop.seconds(rows * setup.row_bytes)

    plan = plan_sequence(len(setup.long_ids), with_hop, len(setup.ranges))
    return math.ceil(len(setup.long_ids) / plan.k), plan


def prepare(prompts: list[BenchPrompt], max_new_tokens: int, progress) -> Setup:
    """Load SmolLM2 and its draft, measure the profile (one thread), plan the split, time the draft,
    compute the engine's reference tokens."""
    from edge_llm_ros.core.drafts.draft_models import load_drafter
    from edge_llm_ros.core.drafts.loading import set_threads
    from edge_llm_ros.core.engine.config import preset
    from edge_llm_ros.core.engine.decoding import eos_ids, generate_all
    from edge_llm_ros.core.engine.models import chat_prompt, load_model, weights_folder
    from edge_llm_ros.core.planning.costs import DraftCost, LayerProfile, TimedDrafter

    set_threads(1)
    progress.set_postfix_str("profile")
    target = load_model()
    drafter = load_drafter(target)
    profile = LayerProfile.measure(target, rows=PROFILE_ROWS, cached=PROFILE_CACHED, repeats=5)
    ranges = plan_split(profile, target.config.num_hidden_layers, SEGMENT)
    ids = [chat_prompt(target.tokenizer, p.text) for p in prompts]
    references = [generate_all(target, i, preset("ar", max_new_tokens=max_new_tokens)).tokens for i in ids]
    text = long_prompt(target.tokenizer, LONG_PROMPT_TOKENS)
    long_ids = chat_prompt(target.tokenizer, text)
    first = generate_all(target, long_ids, preset("ar", max_new_tokens=1)).tokens[0]
    setup = Setup(target, weights_folder(), drafter, profile, ranges, prompts, ids, references, text, long_ids, first,
                  eos=eos_ids(target))
    progress.set_postfix_str("timing the draft")
    timed = TimedDrafter(drafter)
    for mode in ("chunk_pp", "flowspec"):
        simulate_one(setup, mode, ids[0], min(max_new_tokens, 32), free_costs(), drafter=timed)
    cost = DraftCost.fit(timed.log)
    setup.draft_call_s, setup.draft_s = cost.per_draft_s, cost.per_forward_s
    progress.update(1)
    return setup


def remeasure(setup: Setup) -> float:
    """Measure the profile again (after the deployments) and keep the mean of both measurements; the
    drift between them (after / before - 1, the median over the grid): how steady this machine was."""
    from edge_llm_ros.core.planning.costs import LayerProfile

    before = setup.profile
    after = LayerProfile.measure(setup.target, rows=PROFILE_ROWS, cached=PROFILE_CACHED, repeats=5)
    setup.profile = before.averaged(after)
    return statistics.median(b / a for la, lb in zip(before.layer_s, after.layer_s) for a, b in zip(la, lb)) - 1


# -- the simulation -----------------------------------------------------------------------------------


def free_costs():
    from edge_llm_ros.core.planning.costs import CostModel

    return CostModel(stage_s=lambda stage, rows, cached: 0.0)


def stages_of(setup: Setup, ranges: list[range]) -> list:
    """In-process stages over ``ranges``, loaded once."""
    from edge_llm_ros.core.engine.partial import load_stage_model
    from edge_llm_ros.core.pipeline.stages import Stage

    key = tuple((r.start, r.stop) for r in ranges)
    if key not in setup.stages:
        last = len(ranges) - 1
        setup.stages[key] = [Stage(load_stage_model(setup.folder, r, first=i == 0, last=i == last), r,
                                   first=i == 0, last=i == last) for i, r in enumerate(ranges)]
    return setup.stages[key]


def simulate_one(setup: Setup, mode: str, prompt: list[int], max_new_tokens: int, costs, *, ranges=None,
                 drafter=None, chunk: int = 0, shape=None):
    """One request of ``mode`` through in-process stages (``ranges``: the measured split) under ``costs``;
    ``shape``: the trees (default: the deployments', draft_node's)."""
    from edge_llm_ros.core.pipeline.schedulers import make_scheduler
    from edge_llm_ros.core.planning.costs import CountingDrafter
    from edge_llm_ros.core.sim.pipeline import simulate

    ranges = ranges or setup.ranges
    scheduler = make_scheduler(mode, f"sim-{mode}", prompt, CountingDrafter(drafter or setup.drafter),
                               max_new_tokens=max_new_tokens, eos=setup.eos,
                               segment=shape.segment if shape else SEGMENT, in_flight=len(ranges),
                               prefill_chunk=chunk, shape=shape)
    return simulate(scheduler, stages_of(setup, ranges), costs)


def measured_costs(setup: Setup, link: LinkSetting | None, message_s: float, d0_shares: int | None):
    """The cost model of this machine: the profile, D0's draft costs, the link, the runtime's per-message cost."""
    from edge_llm_ros.core.planning.costs import CostModel, Link

    base = setup.profile.stage_s(setup.ranges)
    factors = setup.stage_factors or [lambda rows: 1.0] * len(setup.ranges)
    return CostModel(stage_s=lambda stage, rows, cached: factors[stage](rows) * base(stage, rows, cached),
                     draft_s=setup.draft_s,
                     draft_call_s=setup.draft_call_s, row_bytes=setup.row_bytes,
                     link=link.link() if link else Link(), message_s=message_s, d0_shares=d0_shares,
                     contention=setup.contention or 1.0)


# -- the scenario -------------------------------------------------------------------------------------


def measure(setup: Setup, links: list[LinkSetting], chunks: dict, cores: dict[str, int] | None, modes: list[str],
            max_new_tokens: int, log_path: Path | None, bar) -> tuple[list[Measured], list[dict]]:
    """A stage hop on loopback (tools/stage_hop.py), then every deployment: loopback first (ar only: the
    runtime's cost per message), then each link with the whole prompt in one message (every mode, the
    long prompt) and with pipelined prefill (the long prompt)."""
    runs = [Measured(None, 0), *(Measured(link, c) for link in links for c in (0, chunks[link][0]))]
    with local_router("pipeline-router") as endpoint:
        bar.set_postfix_str("measuring: a stage hop on loopback")
        hop = [dataclasses.asdict(h) for h in stage_hop.measure(count=HOP_MESSAGES)]
        log, client = EventLog(log_path), Client()
        try:
            for measured in runs:
                bar.set_postfix_str(f"measuring: {measured.link.name if measured.link else 'loopback'}, "
                                    f"prefill chunk {measured.chunk or 'whole'}")
                if measured.link is None:
                    calibration = dataclasses.replace(setup, prompts=setup.prompts[:2], long_text="")
                    run_deployment(calibration, client, endpoint, log, measured, cores, ["ar"],
                                   min(max_new_tokens, 32), bar)
                else:
                    run_deployment(setup, client, endpoint, log, measured, cores, [] if measured.chunk else modes,
                                   max_new_tokens, bar)
                bar.update(1)
        finally:
            client.close()
            log.close()
    return runs, hop


def calibrate(setup: Setup, loopback: Measured, d0_shares: int | None) -> dict:
    """Each stage's speed in the deployment (its own `profile` over what the profile gives for its
    layers, by rows; set on ``setup``), how much the two cores slow each other, then the runtime's
    cost per message: the loopback ar lap measured, minus the simulated one without it, over the
    hops of a lap (D0 -> stages -> D0)."""
    from edge_llm_ros.core.planning.costs import RowScale

    stage_s = setup.profile.stage_s(setup.ranges)
    setup.stage_factors = [RowScale.of(STAGE_PROFILE_ROWS, seconds,
                                       [stage_s(i, n, STAGE_PROFILE_CACHED) for n in STAGE_PROFILE_ROWS])
                           for i, seconds in enumerate(loopback.stage_s)] or None
    ratios = [t / a for alone, together in zip(loopback.stage_s, loopback.stage_s_together)
              for a, t in zip(alone, together)]
    setup.contention = float(statistics.median(ratios)) if ratios else None
    goals = loopback.goals["ar"]
    free = measured_costs(setup, None, 0.0, d0_shares)
    sims = [simulate_one(setup, "ar", ids, len(g.tokens), free) for ids, g in zip(setup.prompt_ids, goals)]
    measured = 1 / pooled([len(g.tokens) for g in goals], [g.last - g.first for g in goals])
    simulated = 1 / pooled([len(t.tokens) for t in sims], [t.total_s - t.ttft_s for t in sims])
    hops = len(setup.ranges) + 1
    return {"message_s": max(0.0, (measured - simulated) / hops),
            "message_s_from": f"loopback deployment (links off), ar: {measured * 1e3:.1f} ms a token measured, "
                              f"{simulated * 1e3:.1f} ms simulated without it, over {hops} hops",
            "stage_factors": [list(f.factors) for f in setup.stage_factors or []],
            "stage_factor_rows": list(STAGE_PROFILE_ROWS),
            "stage_factors_from": f"each stage's own profile service in the loopback deployment ({STAGE_PROFILE_ROWS} "
                                  f"rows over {STAGE_PROFILE_CACHED} cached) over the in-process profile's, by rows "
                                  "(interpolated between them)",
            "contention": setup.contention,
            "contention_from": "the same profiles asked of every stage at once over each asked alone (median): "
                               "a stage's slowdown while the other core computes, applied by the simulator "
                               "whenever both stages compute (processor sharing)"}


def draft_calibration(setup: Setup, runs: list[Measured]) -> dict:
    """D0's draft cost as draft_node timed it in the deployments: the CPU seconds its one thread drafted
    for each request of a drafting mode (with the forwards and drafts it ran), fitted the way the
    simulator takes it and set on ``setup``; the fit over drafts timed in this process beforehand
    stays in the report beside it."""
    from edge_llm_ros.core.planning.costs import DraftCost

    in_process = {"draft_s_per_forward": setup.draft_s, "draft_s_per_draft": setup.draft_call_s}
    entries = [g.drafts for m in runs for goals in m.goals.values() for g in goals if g.drafts and g.drafts[0]]
    if not entries:
        return {"draft_from": "drafts timed in the bench process (no deployment timed its own)",
                "draft_in_process": in_process}
    cost = DraftCost.fit(entries)
    setup.draft_call_s, setup.draft_s = cost.per_draft_s, cost.per_forward_s
    drafts, forwards = sum(e[0] for e in entries), sum(e[1] for e in entries)
    return {"draft_from": f"draft_node's own CPU seconds drafting, {len(entries)} requests of the deployments "
                          f"({drafts} drafts, {forwards} forwards), least squares",
            "draft_in_process": in_process}


def link_rows(setup: Setup, link: LinkSetting, runs: list[Measured], costs, chunking: tuple, modes: list[str],
              max_new_tokens: int, bar) -> tuple[list[dict], list[dict]]:
    """Measured and simulated rows of one link, and its prefill rows (the long prompt, whole and chunked)."""
    whole = next(m for m in runs if m.link == link and not m.chunk)
    piped = next(m for m in runs if m.link == link and m.chunk)
    name, rows = f"{link.name} ({LABEL})", []
    for mode in modes:
        rows.append(measured_row(setup, mode, link, whole.goals[mode]))
        timelines = []
        for ids in setup.prompt_ids:
            timelines.append(simulate_one(setup, mode, ids, max_new_tokens, costs))
            bar.update(1)
        rows.append(simulated_row(setup, mode, name, timelines, stages=len(setup.ranges),
                                  device="this machine (simulated)", references=setup.references))
    size, plan = chunking
    sim = {c: simulate_one(setup, "ar", setup.long_ids, 1, costs, chunk=c) for c in (0, size)}
    bar.update(2)
    common = {"stages": len(setup.ranges), "link": name, "prompt_tokens": len(setup.long_ids), "chunk": size,
              "chunks": [min(size, len(setup.long_ids) - a) for a in range(0, len(setup.long_ids), size)],
              "jupiter_plan": {"chunks": list(plan.chunks), "latency_s": plan.latency_s}}
    prefill = [
        {"source": "measured", **common, "ttft_unchunked_s": statistics.median(g.ttft_s for g in whole.long),
         "ttft_pipelined_s": statistics.median(g.ttft_s for g in piped.long),
         "first_token_exact": all(g.tokens[:1] == [setup.long_reference] for g in whole.long + piped.long)},
        {"source": "simulated", **common, "ttft_unchunked_s": sim[0].ttft_s, "ttft_pipelined_s": sim[size].ttft_s,
         "first_token_exact": all(t.tokens[:1] == [setup.long_reference] for t in sim.values())},
    ]
    return rows, prefill


def projected_rows(setup: Setup, paper, modes: list[str], max_new_tokens: int, prompts: int, bar,
                   oracle: bool = False) -> list[dict]:
    """4 and 8 stages with the papers' Jetson-class costs and FlowSpec's own tree setting (PAPER_SHAPE,
    every method alike); SmolLM2's tokens and acceptance. ``oracle``: the drafting modes again with a
    draft that is always right (the target drafting for itself, at the same draft cost): what the
    schedules make of the pipeline once acceptance is no limit."""
    from edge_llm_ros.core.engine.drafters import ModelDrafter
    from edge_llm_ros.core.pipeline.schedulers import PAPER_SHAPE
    from edge_llm_ros.core.planning.costs import even_ranges

    drafts = [(SHIPPED, setup.drafter, modes)]
    if oracle:
        drafts.append((ORACLE, ModelDrafter(setup.target), [m for m in modes if m != "ar"]))
    rows = []
    for stages in PROJECTED_STAGES:
        bar.set_postfix_str(f"projecting {stages} stages")
        ranges = even_ranges(setup.target.config.num_hidden_layers, stages)  # SmolLM2's, for the tokens
        for draft, drafter, drafting in drafts:
            for mode in drafting:
                timelines = []
                for ids in setup.prompt_ids[:prompts]:
                    timelines.append(simulate_one(setup, mode, ids, max_new_tokens, paper.cost_model(stages),
                                                  ranges=ranges, drafter=drafter, shape=PAPER_SHAPE))
                    bar.update(1)
                rows.append(simulated_row(setup, mode, f"{paper.link.describe()} (simulated link)", timelines,
                                          stages=stages, device=paper.device, references=setup.references,
                                          draft=draft))
    return rows


def run_scenario(prompts: list[BenchPrompt], links: list[LinkSetting], max_new_tokens: int, projected_prompts: int,
                 log_path: Path | None, progress: bool, oracle: bool = False, modes: tuple[str, ...] = MODES) -> dict:
    """Prepare, measure, calibrate, simulate, project; the report."""
    from edge_llm_ros.core.planning.costs import jetson_costs

    started, cores, modes = time.perf_counter(), node_cores(), list(modes)
    d0_shares = 0 if cores else None
    steps = (3 + min(2, len(prompts)) + len(links) * (2 * len(modes) * len(prompts) + 2 * TTFT_REPEATS + 4)
             + len(PROJECTED_STAGES) * (2 * len(modes) - 1 if oracle else len(modes)) * projected_prompts)
    with progress_bar(steps, "pipeline", "step", progress) as bar:
        setup = prepare(prompts, max_new_tokens, bar)
        chunks = {link: prefill_chunk(setup, link) for link in links}
        runs, hop = measure(setup, links, chunks, cores, modes, max_new_tokens, log_path, bar)
        bar.set_postfix_str("profile again")
        drift = remeasure(setup)
        bar.set_postfix_str("simulating")
        calibration = {**calibrate(setup, runs[0], d0_shares), **draft_calibration(setup, runs)}
        bar.update(1)
        rows, prefill = [], []
        for link in links:
            costs = measured_costs(setup, link, calibration["message_s"], d0_shares)
            more, more_prefill = link_rows(setup, link, runs, costs, chunks[link], modes, max_new_tokens, bar)
            rows += more
            prefill += more_prefill
        paper = jetson_costs(latency_s=1e-3)
        rows += projected_rows(setup, paper, modes, max_new_tokens, projected_prompts, bar, oracle)
    report = report_of(setup, links, runs, rows, prefill, paper, cores, d0_shares, drift, calibration, max_new_tokens,
                       hop)
    report["wall_s"] = time.perf_counter() - started
    return report


# -- command line -------------------------------------------------------------------------------------


def link_settings(text: str) -> list[LinkSetting]:
    """'100:5,1000:1' -> (Mbit/s, one-way ms) settings."""
    try:
        out = [LinkSetting(float(a), float(b)) for a, _, b in (item.partition(":") for item in text.split(",")
                                                                if item.strip())]
    except ValueError:
        raise ToolError(f"--links takes MBIT_S:MS pairs, comma-separated (e.g. 100:5,1000:1), got {text!r}") from None
    if not out or any(link.bandwidth_mbps <= 0 or link.latency_ms < 0 for link in out):
        raise ToolError(f"--links needs a bandwidth > 0 and a latency >= 0, got {text!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = scenario_parser("pipeline", "The stage pipeline measured over emulated links, simulated, and projected to 4 "
                        "and 8 Jetson-class stages.", quick="one link, one prompt, fewer tokens",
                        png="plot tokens/s per mode", log=True)
    p.add_argument("--links", default=",".join(f"{b:g}:{m:g}" for b, m in LINKS),
                   help="emulated links as MBIT_S:MS (one-way), comma-separated (default 100:5,1000:1; --quick: the "
                        "first)")
    p.add_argument("--prompts", type=int, default=None,
                   help=f"bench prompts (default {PROMPTS}; --quick {QUICK_PROMPTS})")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"new tokens per prompt (default {MAX_NEW_TOKENS}; --quick {QUICK_MAX_NEW_TOKENS})")
    p.add_argument("--oracle", action="store_true",
                   help="also project chunk_pp and flowspec with a draft that is always right (the target drafting "
                        "for itself, at the same draft cost): a sensitivity, not a target row (adds 1-2 minutes)")
    return p


def run(args: argparse.Namespace, progress: bool) -> dict:
    """The scenario on the parsed command line (the harness resolved --json, --png and --log); the
    report. ToolError for bad input, before anything starts."""
    links = link_settings(args.links)[: 1 if args.quick else None]
    count = args.prompts or (QUICK_PROMPTS if args.quick else PROMPTS)
    max_new = args.max_new_tokens or (QUICK_MAX_NEW_TOKENS if args.quick else MAX_NEW_TOKENS)
    if not 1 <= count <= len(BENCH_PROMPTS) or max_new < 1:
        raise ToolError(f"--prompts must be in 1..{len(BENCH_PROMPTS)} and --max-new-tokens >= 1")
    return run_scenario(list(BENCH_PROMPTS[:count]), links, max_new, min(count, PROJECTED_PROMPTS), args.log,
                        progress=progress, oracle=args.oracle)


def failures(report: dict) -> list[str]:
    """A LOSSLESS FAILURE line per row whose tokens differ from the engine's ar, and per link where the
    long prompt's first token (unchunked or pipelined prefill) differs from the engine's."""
    return [f"LOSSLESS FAILURE: {r['source']} {r['mode']} ({r['stages']} stages, {r['link']}) differs from the "
            "engine's ar" for r in report["rows"] if r["lossless"] is False] + [
        f"LOSSLESS FAILURE: {p['source']} prefill of the long prompt ({p['link']}): its first token differs from "
        "the engine's ar" for p in report["prefill"] if not p["first_token_exact"]]


SCENARIO = register(Scenario(
    name="pipeline", help="the stage pipeline over emulated links: measured, simulated, projected to 4 and 8 stages",
    build_parser=build_parser, run=run, format_table=format_table, failures=failures, plot=plot,
    sends_goals=True, writes_log=True,
))
