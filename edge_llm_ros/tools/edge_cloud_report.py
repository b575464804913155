"""The report of ``bench --scenario edge-cloud`` read out: its table, its plot and its failures
(the scenario, tools/bench_edge_cloud.py, makes the report; its docstring says what each key means).

A run (one link setting) holds the first draft backend's results; each further backend's are under
its key (:func:`backend_key`), and :func:`backend_results` lists them in the report's order.
"""

from __future__ import annotations

from pathlib import Path

from edge_llm_ros.core.drafts.loading import LLAMA_CPP
from edge_llm_ros.tools.bench_harness import LOSSLESS_MARK, fmt_value

LABEL = "emulated link"


def backend_key(backend: str) -> str:
    """A draft backend's key in a run: ``llama.cpp`` -> ``llama_cpp``."""
    return backend.replace(".", "_")


def backend_results(run: dict, backends: list[str]) -> list[dict]:
    """A run's results per draft backend, in ``backends`` order (the first is the run itself)."""
    return [run, *(run[backend_key(b)] for b in backends[1:])]


def format_table(report: dict) -> str:
    """The report as text: a row per link setting and draft backend, the time split per round, and
    (both backends run) torch against llama.cpp; the simulation's lines when it ran."""
    modes = report["modes"]
    backends = report.get("draft_backends") or [report["runs"][0].get("draft_backend", "torch")]
    cores = report["deployment"].get("cores")
    pinned = (f"on cores {cores['verifier_node']} and {cores['draft_node']}" if cores else "sharing every core")
    lines = [f"edge-cloud ({report['label']}): verifier_node + draft_node, 1 thread each, {pinned}, gamma "
             f"{report['deployment']['gamma']}, {len(report['prompts'])} prompts x {report['max_new_tokens']} tokens, "
             f"draft on {', '.join(backends)}"]
    head = f"{'RTT ms':>7}{'Mbit/s':>8}  {'draft':<10}" + "".join(f"{m + ' ms/tok':>13}" for m in modes)
    head += f"{'AR>SD':>7}{'SD>FSD':>8}{'SD>EE':>7}{'AR>EE':>7}{'tau':>6}{'miss':>6}{'exit':>6}{'B-model':>8}  lossless"
    lines.append(head)
    for run in report["runs"]:
        for backend, result in zip(backends, backend_results(run, backends)):
            s, b = result["speedup"], result["appendix_b"] or {}
            ee = result.get("ee") or result.get("fsd") or {}
            row = f"{run['rtt_ms']:>7g}{run['bandwidth_mbps']:>8g}  {backend:<10}"
            row += "".join(f"{fmt_value((result.get(m) or run.get(m) or {}).get('ms_per_token'), '.1f'):>13}"
                           for m in modes)  # ar: the first backend's, shared
            row += (f"{fmt_value(s['ar_to_sd'], '.2f'):>7}{fmt_value(s['sd_to_fsd'], '.2f'):>8}"
                    f"{fmt_value(s['sd_to_ee'], '.2f'):>7}{fmt_value(s['ar_to_ee'], '.2f'):>7}"
                    f"{fmt_value(ee.get('tau'), '.2f'):>6}{fmt_value(ee.get('cache_miss_rate'), '.2f'):>6}"
                    f"{fmt_value(ee.get('avg_exit'), '.1f'):>6}{fmt_value(b.get('projected_sd_to_fsd'), '.2f'):>8}"
                    f"  {LOSSLESS_MARK[result['lossless']]}")
            lines.append(row)
    lines.append("")
    lines.append("time per round (ms): draft on the critical path / verify on the server / link and queues")
    for run in report["runs"]:
        for backend, result in zip(backends, backend_results(run, backends)):
            parts = [f"{m} {fmt_value(result[m]['draft_ms_per_round'], '.0f')}/"
                     f"{fmt_value(result[m]['verify_ms_per_round'], '.0f')}/"
                     f"{fmt_value(result[m]['link_ms_per_round'], '.0f')}" for m in modes if m in result]
            where = f"RTT {run['rtt_ms']:g} ms, {run['bandwidth_mbps']:g} Mbit/s, {backend}"
            lines.append(f"  {where}: " + "   ".join(parts))
    lines.append("B-model: EE Appendix B, (gamma c + 1) / (r gamma c + 1) with c and r measured in that row "
                 "(compare with SD>FSD)")
    compared = [run for run in report["runs"] if run.get("torch_over_llama_cpp")]
    if compared:
        drafting = [m for m in modes if m != "ar"]
        lines.append("")
        lines.append("torch vs llama.cpp drafts: draft ms per drafted token (in sd) on each and torch / llama.cpp, "
                     "then torch / llama.cpp of each mode's ms per token (> 1: llama.cpp faster)")
        lines.append(f"{'RTT ms':>7}{'Mbit/s':>8}{'torch':>8}{'llama.cpp':>11}{'ratio':>7}"
                     + "".join(f"{m + ' ratio':>13}" for m in drafting))
        for run in compared:
            results = dict(zip(backends, backend_results(run, backends)))
            ratio = run["torch_over_llama_cpp"]
            lines.append(f"{run['rtt_ms']:>7g}{run['bandwidth_mbps']:>8g}"
                         f"{fmt_value(results['torch']['draft_ms_per_token'], '.2f'):>8}"
                         f"{fmt_value(results[LLAMA_CPP]['draft_ms_per_token'], '.2f'):>11}"
                         f"{fmt_value(ratio['draft_ms_per_token'], '.2f'):>7}"
                         + "".join(f"{fmt_value(ratio['ms_per_token'].get(m), '.2f'):>13}" for m in drafting))
    if report.get("simulated"):
        from edge_llm_ros.tools.edge_cloud_sim import format_lines

        lines += format_lines(report["simulated"])
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Speedups against RTT, one line per ratio and bandwidth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {bw: style for bw, style in zip(sorted({r["bandwidth_mbps"] for r in report["runs"]}, reverse=True),
                                             ("-", "--", ":", "-."))}
    backends = report.get("draft_backends") or ["torch"]
    for key, label, color in (("ar_to_sd", "AR → SD", "tab:blue"), ("sd_to_fsd", "SD → FSD (EE Alg. 1)", "tab:orange"),
                              ("sd_to_ee", "SD → EE (pre-drafts sent ahead)", "tab:green"),
                              ("ar_to_ee", "AR → EE", "tab:red")):
        for i, backend in enumerate(backends):
            for bw, style in styles.items():
                points = [(r["rtt_ms"], result["speedup"][key]) for r in report["runs"]
                          for result in backend_results(r, backends)[i:i + 1]
                          if r["bandwidth_mbps"] == bw and result["speedup"].get(key) is not None]
                if points:
                    xs, ys = zip(*sorted(points))
                    ax.plot(xs, ys, style, marker="os^v"[i % 4], color=color,
                            label=f"{label}, {bw:g} Mbit/s" + (f", draft on {backend}" if len(backends) > 1 else ""))
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("round-trip time, ms (emulated link)")
    ax.set_ylabel("speedup (latency per token ratio)")
    ax.set_title(f"edge-cloud decoding, SmolLM2-135M, {LABEL}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def failures(report: dict) -> list[str]:
    """A LOSSLESS FAILURE line per mode, backend and prompt whose tokens differ from ar (measured or
    simulated)."""
    return [f"LOSSLESS FAILURE: {mm['mode']} (draft on {backend}, RTT {run['rtt_ms']:g} ms) differs from ar "
            f"on prompt {mm['prompt']}"
            for run in report["runs"]
            for backend, result in zip(report["draft_backends"], backend_results(run, report["draft_backends"]))
            for mm in result["mismatches"]] + [
        f"LOSSLESS FAILURE: simulated {mode} (RTT {run['rtt_ms']:g} ms) differs from the simulated ar"
        for run in (report.get("simulated") or {}).get("runs", []) for mode, m in run["modes"].items()
        if m["lossless"] is False]
