"""The report of ``bench --scenario pipeline``: measured and simulated rows, the simulator against
the measurement, the issue's targets and the anchors, as JSON, a table and a PNG. Rows are plain
dicts (the JSON's shape); the scenario (tools/bench_pipeline.py) makes them.
"""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import asdict
from pathlib import Path

from edge_llm_ros.tools import stage_hop
from edge_llm_ros.tools.bench_harness import BUSY_CORES, LOSSLESS_MARK, fmt_value, utc_now
from edge_llm_ros.tools.pipeline_deployment import SEGMENT, Goal, LinkSetting, Measured, Setup

MODES = ("ar", "chunk_pp", "flowspec")
PROJECTED_STAGES = (4, 8)
TOLERANCE = 0.15  # the simulator's tokens/s within this of the measured, every mode
LABEL = "emulated link"
ANCHORS = {"SpecPipe": "4.19-5.53x over plain PP", "PipeInfer": "up to 2.15x"}
SHIPPED, ORACLE = "shipped", "oracle: the target drafting for itself (sensitivity)"


def same_tokens(ours: list[int], reference: list[int], eos: tuple[int, ...]) -> bool:
    """Equal, a trailing EOS on one side only not counted."""
    def strip(t):
        return t[:-1] if t and t[-1] in eos else t

    return list(ours) == list(reference) or strip(list(ours)) == strip(list(reference))


def pooled(tokens: list[int], spans: list[float]) -> float | None:
    """Tokens after the first over the seconds after the first token, over requests."""
    total = sum(spans)
    return sum(n - 1 for n in tokens) / total if total > 0 else None


def pooled_ratio(tokens: list[int], values: list[float | None]) -> float | None:
    """ALT or ALR over requests: all tokens after the first over all turns (or rounds)."""
    if any(v is None for v in values):
        return None
    per = [(n - 1) / v for n, v in zip(tokens, values) if v]
    return sum(n - 1 for n, v in zip(tokens, values) if v) / sum(per) if per else None


def measured_row(setup: Setup, mode: str, link: LinkSetting, goals: list[Goal]) -> dict:
    tokens = [len(g.tokens) for g in goals]
    lossless = all(same_tokens(g.tokens, ref, setup.eos) for g, ref in zip(goals, setup.references))
    return {"source": "measured", "stages": len(setup.ranges), "mode": mode, "link": f"{link.name} ({LABEL})",
            "device": "this machine", "draft": SHIPPED,
            "tokens_per_s": pooled(tokens, [g.last - g.first for g in goals]),
            "e2e_tokens_per_s": sum(tokens) / sum(g.done - g.sent for g in goals),
            "alt": pooled_ratio(tokens, [g.alt for g in goals]),
            "alr": pooled_ratio(tokens, [g.alr for g in goals]) if mode != "ar" else None,
            "ttft_s": statistics.mean(g.ttft_s for g in goals), "lossless": lossless, "tokens": sum(tokens),
            "requests": len(goals),
            "per_request": [{"prompt": p.name, "tokens": len(g.tokens), "ttft_s": g.ttft_s,
                             "tokens_per_s": pooled([len(g.tokens)], [g.last - g.first]), "alt": g.alt, "alr": g.alr}
                            for p, g in zip(setup.prompts, goals)]}


def simulated_row(setup: Setup, mode: str, link_name: str, timelines: list, *, stages: int, device: str,
                  references: list[list[int]] | None, draft: str = SHIPPED) -> dict:
    tokens = [len(t.tokens) for t in timelines]
    lossless = (all(same_tokens(t.tokens, ref, setup.eos) for t, ref in zip(timelines, references))
                if references is not None else None)
    busy = [sum(t.busy_s[i] for t in timelines) for i in range(stages)]
    return {"source": "simulated", "stages": stages, "mode": mode, "link": link_name, "device": device, "draft": draft,
            "tokens_per_s": pooled(tokens, [t.total_s - t.ttft_s for t in timelines]),
            "e2e_tokens_per_s": sum(tokens) / sum(t.total_s for t in timelines),
            "alt": pooled_ratio(tokens, [t.alt for t in timelines]),
            "alr": pooled_ratio(tokens, [t.alr for t in timelines]) if mode != "ar" else None,
            "ttft_s": statistics.mean(t.ttft_s for t in timelines), "lossless": lossless, "tokens": sum(tokens),
            "requests": len(timelines), "busy_s": busy, "d0_busy_s": sum(t.d0_busy_s for t in timelines),
            "stage_utilization": sum(busy) / (stages * sum(t.total_s for t in timelines))}


def error(simulated: float | None, measured: float | None) -> float | None:
    return (simulated - measured) / measured if simulated is not None and measured else None


def comparisons(rows: list[dict]) -> list[dict]:
    """Simulated against measured, per link and mode: tokens/s, TTFT, ALT."""
    out = []
    for m in (r for r in rows if r["source"] == "measured"):
        s = next(r for r in rows if r["source"] == "simulated" and r["stages"] == m["stages"]
                 and r["link"] == m["link"] and r["mode"] == m["mode"] and r["draft"] == SHIPPED)
        err = error(s["tokens_per_s"], m["tokens_per_s"])
        out.append({"link": m["link"], "mode": m["mode"], "measured_tokens_per_s": m["tokens_per_s"],
                    "simulated_tokens_per_s": s["tokens_per_s"], "error": err,
                    "within_tolerance": err is not None and abs(err) <= TOLERANCE,
                    "ttft_error": error(s["ttft_s"], m["ttft_s"]), "alt_error": error(s["alt"], m["alt"])})
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def speed(rows: list[dict], source: str, stages: int, link: str, mode: str, draft: str = SHIPPED) -> float | None:
    return next((r["tokens_per_s"] for r in rows if r["source"] == source and r["stages"] == stages
                 and r["link"] == link and r["mode"] == mode and r["draft"] == draft), None)


def targets(report: dict) -> list[dict]:
    """The issue's targets, each with the value reached and whether it was met."""
    rows, out = report["rows"], []

    def add(name: str, goal: str, value, met) -> None:
        out.append({"target": name, "goal": goal, "value": value, "met": met})

    for link in dict.fromkeys(r["link"] for r in rows if r["source"] == "measured"):
        flow_over_chunk = ratio(speed(rows, "measured", 2, link, "flowspec"),
                                speed(rows, "measured", 2, link, "chunk_pp"))
        add(f"measured 2 stages, {link}: FlowSpec / Chunk-PP tokens/s", ">= 1.5", flow_over_chunk,
            flow_over_chunk is not None and flow_over_chunk >= 1.5)
        alt = next((r["alt"] for r in rows if r["source"] == "measured" and r["link"] == link
                    and r["mode"] == "flowspec"), None)
        add(f"measured 2 stages, {link}: FlowSpec ALT", ">= 1.0", alt, alt is not None and alt >= 1.0)
    for p in report["prefill"]:
        if p["source"] == "measured":
            add(f"measured 2 stages, {p['link']}: TTFT of a {p['prompt_tokens']}-token prompt, pipelined / unchunked",
                "< 1", ratio(p["ttft_pipelined_s"], p["ttft_unchunked_s"]),
                p["ttft_pipelined_s"] < p["ttft_unchunked_s"])
    for h in report.get("stage_hop", []):
        if h["rows"] == stage_hop.TARGET_ROWS:
            add(f"a stage hop on loopback, {h['rows']} rows of hidden states: p50 ms", f"< {stage_hop.TARGET_MS:g}",
                h["p50_ms"], h["p50_ms"] < stage_hop.TARGET_MS)
    for c in report["comparisons"]:
        add(f"simulator vs measured, {c['link']}, {c['mode']}: tokens/s error", f"within {TOLERANCE:.0%}",
            c["error"], c["within_tolerance"])
    for stages in PROJECTED_STAGES:
        link = next((r["link"] for r in rows if r["stages"] == stages), None)
        if link is None:
            continue
        value = ratio(speed(rows, "simulated", stages, link, "flowspec"),
                      speed(rows, "simulated", stages, link, "chunk_pp"))
        add(f"simulated {stages} stages (Jetson-class): FlowSpec / Chunk-PP tokens/s", ">= 1.7 (paper: 1.37-1.73)",
            value, value is not None and value >= 1.7)
    return out


def anchors(rows: list[dict]) -> list[dict]:
    """FlowSpec over the naive pipeline (plain PP) where this bench has both, against SpecPipe and PipeInfer."""
    out = []
    for source, stages, link, draft in dict.fromkeys((r["source"], r["stages"], r["link"], r["draft"]) for r in rows):
        value = ratio(speed(rows, source, stages, link, "flowspec", draft), speed(rows, source, stages, link, "ar"))
        if value is not None:
            out.append({"source": source, "stages": stages, "link": link, "draft": draft,
                        "flowspec_over_plain_pp": value, **ANCHORS})
    return out


def report_of(setup: Setup, links: list[LinkSetting], runs: list[Measured], rows: list[dict], prefill: list[dict],
              paper, cores, d0_shares, drift: float, calibration: dict, max_new_tokens: int,
              hop: list[dict] | None = None) -> dict:
    from edge_llm_ros.core.pipeline.schedulers import PAPER_SHAPE
    from edge_llm_ros.core.planning.device_profile import cpu_name

    profile = setup.profile
    report = {
        "scenario": "pipeline",
        "label": LABEL,
        "date": utc_now(),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch_threads_per_process": 1,
                    "load_average_at_end": list(os.getloadavg()),
                    "other_processes_cores": {(m.link.name if m.link else "loopback") + f", chunk {m.chunk}":
                                              m.other_cores for m in runs}},
        "model": "SmolLM2-135M-Instruct (torch, float32)",
        "draft": "shipped trained draft (4 layers), draft_backend torch, one thread",
        "deployment": {"launch": "stages", "layers": setup.layers, "cores": cores, "segment": SEGMENT,
                       "in_flight": len(setup.ranges), "split": f"Jupiter Eq. 1 (plan_layers) over the profile at "
                                                              f"{SEGMENT} rows, head on the last stage"},
        "links": [{"name": link.name, "bandwidth_mbps": link.bandwidth_mbps, "latency_ms_one_way": link.latency_ms,
                   "label": LABEL, "where": "every hop: D0 -> stage 0 (rows, prunes), stage 0 -> stage 1, "
                                            "stage 1 -> D0 (runtime/link.py in the sender)"} for link in links],
        "max_new_tokens": max_new_tokens,
        "prompts": [{"name": p.name, "prompt_tokens": len(i)} for p, i in zip(setup.prompts, setup.prompt_ids)],
        "cost_model": {
            "profile": {"rows": profile.rows, "cached": profile.cached, "layer_s": profile.layer_s,
                        "head_s": profile.head_s, "threads": profile.threads, "source": profile.source},
            "profile_drift": drift, "draft_s_per_forward": setup.draft_s, "draft_s_per_draft": setup.draft_call_s,
            "d0_shares_core_of_stage": d0_shares, **calibration},
        "rows": rows,
        "prefill": prefill,
        "stage_hop": hop or [],
        "projection": {"device": paper.device, "model": paper.model, "layer_s": paper.layer_s,
                       "row_factor": paper.row_factor, "head_layers": paper.head_layers, "draft_s": paper.draft_s,
                       "row_bytes": paper.row_bytes,
                       "link": paper.link.describe(), "derivation": list(paper.derivation),
                       "inputs": [asdict(c) for c in paper.inputs],
                       "trees": {**asdict(PAPER_SHAPE), "in_flight": "the stage count",
                                 "source": "FlowSpec's reference code, config/run_config.py (mode eval), every "
                                           "method alike"}},
        "notes": [
            f"links: {LABEL} (the runtime's token bucket and one-way delay on every hop, in the sending process); "
            "all processes share this machine",
            "tokens_per_s: tokens after the first / (last token - first token), pooled over prompts; "
            "e2e_tokens_per_s: tokens / (goal sent -> result); ttft_s measured: goal sent -> first feedback; "
            "simulated: D0's start -> first token (no action, tokenizer or feedback hop)",
            "ALT: tokens per pipeline turn (an answer of the last stage while decoding), ALR: tokens per SD round, "
            "both without the first token (FlowSpec §V-A); measured from draft_node's line per request; ar has no "
            "rounds (ALR null). chunk_pp sends each round's tree in chunks of the segment's rows (FlowSpec §V-A: one "
            "setting for every method); every chunk's answer is a turn",
            "simulated rows: core.sim.pipeline.simulate, the same schedulers and stages in this process; the 4 and 8 "
            "stage rows take their costs from the papers (projection.inputs, every number cited), FlowSpec's own "
            "tree setting for every method (projection.trees) and SmolLM2's tokens and acceptance (its target and "
            "draft ran in the simulator)",
            "lossless: every request's tokens equal the engine's ar output (a trailing EOS on one side only is "
            "not a difference)",
        ],
    }
    report["comparisons"] = comparisons(rows)
    report["targets"] = targets(report)
    report["anchors"] = anchors(rows)
    report["lossless"] = all(r["lossless"] is not False for r in rows) and all(p["first_token_exact"] for p in prefill)
    busy = [f"{k}: {v:.2f}" for k, v in report["machine"]["other_processes_cores"].items() if v and v > BUSY_CORES]
    if busy:
        report["warning"] = ("other processes kept cores busy while measuring (cores): " + ", ".join(busy)
                             + "; the measured rows and the simulator's errors are unreliable: rerun on an idle "
                               "machine")
        report["notes"].append(report["warning"])
    return report


def format_table(report: dict) -> str:
    from edge_llm_ros.core.planning.costs import RowScale

    d, cm = report["deployment"], report["cost_model"]
    cores = d["cores"]
    placed = (f"cores {cores['stage_0']} and {cores['stage_1']}, D0 on core {cores['draft_node']}" if cores
              else "not pinned")
    lines = [f"pipeline: {report['model']} as {len(d['layers'].split(','))} stages ({d['layers']}), {placed}, one "
             f"thread each; {report['max_new_tokens']} new tokens x {len(report['prompts'])} prompt(s), greedy; "
             f"links: {LABEL}",
             f"cost model: draft {cm['draft_s_per_forward'] * 1e3:.1f} ms/forward + "
             f"{cm['draft_s_per_draft'] * 1e3:.1f} ms/draft ({cm.get('draft_from', 'timed in the bench process')}"
             + (f"; in the bench process {cm['draft_in_process']['draft_s_per_forward'] * 1e3:.1f} + "
                f"{cm['draft_in_process']['draft_s_per_draft'] * 1e3:.1f}" if cm.get("draft_in_process") else "")
             + f"), runtime {cm['message_s'] * 1e3:.2f} ms/message "
             f"({cm['message_s_from']}); per-layer costs drifted {cm['profile_drift']:+.1%} between the profiles "
             "before and after the deployments; the stages ran at "
             + " and ".join(RowScale(tuple(cm["stage_factor_rows"]), tuple(f)).describe()
                            for f in cm.get("stage_factors") or [])
             + f" the profile's seconds (their own profile service), {cm.get('contention') or 1.0:.2f}x that while "
             "both compute",
             f"{'source':<10}{'stages':>6}  {'link':<42}{'mode':<18}{'tok/s':>7}{'err':>6}{'e2e':>7}{'ALT':>6}"
             f"{'ALR':>6}{'TTFT ms':>8}{'util':>6}  lossless"]
    errors = {(c["link"], c["mode"]): c["error"] for c in report["comparisons"]}
    for r in report["rows"]:
        shipped = r["draft"] == SHIPPED
        err = errors.get((r["link"], r["mode"])) if r["source"] == "simulated" and r["stages"] == 2 else None
        flag = "" if err is None or abs(err) <= TOLERANCE else " !"
        mode = r["mode"] + ("" if shipped else " (oracle)")
        lines.append(f"{r['source']:<10}{r['stages']:>6}  {r['link']:<42}{mode:<18}"
                     f"{fmt_value(r['tokens_per_s'], '.2f'):>7}{fmt_value(err, '+.0%') if err is not None else '':>6}"
                     f"{fmt_value(r['e2e_tokens_per_s'], '.2f'):>7}{fmt_value(r['alt'], '.2f'):>6}"
                     f"{fmt_value(r['alr'], '.2f'):>6}{fmt_value(r['ttft_s'], '.0f', 1000):>8}"
                     f"{fmt_value(r.get('stage_utilization'), '.0%'):>6}  {LOSSLESS_MARK[r['lossless']]}{flag}")
    lines.append("err: simulated vs measured tokens/s; util: the stages' mean busy share (simulated)"
                 + ("; (oracle): a draft that is always right, a sensitivity" if any(r["draft"] != SHIPPED
                                                                                    for r in report["rows"]) else ""))
    if report.get("warning"):
        lines.append(f"WARNING: {report['warning']}")
    lines.append("")
    lines.append("time to first token, 512-token prompt (ar): unchunked vs pipelined prefill (Jupiter)")
    for p in report["prefill"]:
        lines.append(f"  {p['source']:<10}{p['link']:<42}whole {p['ttft_unchunked_s'] * 1e3:7.0f} ms   chunks of "
                     f"{p['chunk']:>3} ({len(p['chunks'])}) {p['ttft_pipelined_s'] * 1e3:7.0f} ms   "
                     f"{fmt_value(ratio(p['ttft_pipelined_s'], p['ttft_unchunked_s']), '.2f')}x  first token "
                     f"{LOSSLESS_MARK[p['first_token_exact']]}")
    if report.get("stage_hop"):
        lines += ["", *stage_hop.report([stage_hop.HopStats(**h) for h in report["stage_hop"]])]
    lines.append("")
    lines.append(f"FlowSpec over the naive pipeline (plain PP); anchors: SpecPipe {ANCHORS['SpecPipe']}, PipeInfer "
                 f"{ANCHORS['PipeInfer']}")
    for a in report["anchors"]:
        lines.append(f"  {a['source']:<10}{a['stages']} stages, {a['link']}"
                     f"{'' if a['draft'] == SHIPPED else ', oracle draft'}: {a['flowspec_over_plain_pp']:.2f}x")
    lines.append("targets:")
    for t in report["targets"]:
        value = fmt_value(t["value"], "+.1%") if "error" in t["target"] else fmt_value(t["value"], ".2f")
        lines.append(f"  {'met   ' if t['met'] else 'MISSED'} {t['target']}: {value} (goal {t['goal']})")
    trees = report["projection"]["trees"]
    lines.append(f"projected costs ({report['projection']['device']}, {report['projection']['model']}): "
                 f"{report['projection']['layer_s'] * 1e3:.2f} ms/layer, draft "
                 f"{report['projection']['draft_s'] * 1e3:.1f} ms/forward, {report['projection']['link']}; trees: "
                 f"{trees['init_size']} nodes (top-{trees['branch']}, depth {trees['init_depth']}) in segments of "
                 f"{trees['segment']}, expansions of {trees['expand_size']} (FlowSpec's evaluation setting); inputs "
                 "and derivation in the JSON")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Tokens/s per mode: measured vs simulated per link (2 stages), then the projections."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    groups = list(dict.fromkeys((r["stages"], r["link"]) for r in rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 4.2), squeeze=False)
    for ax, (stages, link) in zip(axes[0], groups):
        sources = [s for s in ("measured", "simulated") if any(r["source"] == s and r["stages"] == stages
                                                               and r["link"] == link for r in rows)]
        for k, source in enumerate(sources):
            values = [speed(rows, source, stages, link, m) or 0.0 for m in MODES]
            label = source if len(sources) > 1 else "projected (simulated, Jetson-class costs)"
            ax.bar([i + 0.4 * k - 0.2 * (len(sources) - 1) for i in range(len(MODES))], values, 0.4, label=label)
        ax.set_xticks(range(len(MODES)), MODES)
        ax.set_title(f"{stages} stages\n{link}", fontsize=8)
        ax.set_ylabel("tokens/s (decoding)")
        ax.legend(fontsize=7)
    fig.suptitle(f"stage pipeline, SmolLM2-135M; {LABEL}s; 4/8 stages: Jetson-class costs from the papers",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
