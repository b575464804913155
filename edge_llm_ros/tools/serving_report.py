"""The report of ``bench --scenario serving`` read out: its table, its plot and its failures (the
scenario, tools/bench_serving.py, makes the report; its docstring says what each key means).
"""

from __future__ import annotations

from pathlib import Path

from edge_llm_ros.tools.bench_harness import LOSSLESS_MARK, fmt_value

FOXGLOVE_RATIO = 0.95  # issue 29: serving tokens/s with a Foxglove client on every channel, over without


def format_table(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"serving ({report['label']}): {' + '.join(report['deployment']['nodes'])}, {m['cpu']}, llama.cpp "
        f"{m['llama_cpp_python']} with {m['threads']} threads, {report['max_new_tokens']} new tokens x "
        f"{report['requests_per_client']} requests per client",
        f"baseline llama_cpp sequential: {report['baseline']['tokens_per_s']:.1f} tok/s; one client / baseline "
        f"{fmt_value(report['one_client_over_baseline'], '.2f')}",
        *(f"serve_node: {line}" for line in report["deployment"].get("serve_node_said", [])[-1:]),
        f"{'clients':>7}{'reqs':>6}{'node tok/s':>12}{'batch tok/s':>13}{'node/batch':>12}{'x1 client':>11}"
        f"{'x baseline':>12}{'req tok/s':>11}{'ttft p50 ms':>13}{'ttft p95 ms':>13}  exact",
    ]
    for r in report["runs"]:
        lines.append(
            f"{r['clients']:>7}{r['requests']:>6}{r['aggregate_tokens_per_s']:>12.1f}"
            f"{fmt_value(r['llama_cpp_batch_tokens_per_s'], '.1f'):>13}"
            f"{fmt_value(r['node_over_llama_cpp_batch'], '.2f'):>12}"
            f"{fmt_value(r['over_one_client'], '.2f'):>11}{fmt_value(r['over_baseline'], '.2f'):>12}"
            f"{fmt_value(r['per_request_tokens_per_s'], '.1f'):>11}{fmt_value(r['ttft_p50_s'], '.0f', 1000):>13}"
            f"{fmt_value(r['ttft_p95_s'], '.0f', 1000):>13}  {LOSSLESS_MARK[r['exact']]}"
            + ("" if r["llama_cpp_batch_exact"] else "  (llama_cpp_batch not exact)"))
    fox = report.get("foxglove")
    if fox is not None:
        lines.append(
            f"foxglove ({fox['clients']} clients, {fox['rounds']} rounds; a client on all {fox['channels']} channels: "
            f"{fox['messages']} messages, {fox['bytes'] / 1e6:.2f} MB): {fmt_value(fox['tokens_per_s_with'], '.1f')} tok/s "
            f"with the bridge ({', '.join(f'{v:.1f}' for v in fox['passes_with'])}), "
            f"{fmt_value(fox['tokens_per_s_without'], '.1f')} without ({', '.join(f'{v:.1f}' for v in fox['passes_without'])}), "
            f"ratio {fmt_value(fox['ratio'], '.3f')} "
            f"(target >= {FOXGLOVE_RATIO}); the bridge used {fox['bridge_cpu_s']:.2f} CPU s "
            f"({fmt_value(fox['bridge_cores'], '.2f')} cores)  {LOSSLESS_MARK[fox['exact']]}")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Aggregate tokens/s against clients: the node and llama_cpp_batch; the baseline as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    xs = [r["clients"] for r in runs]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [r["aggregate_tokens_per_s"] for r in runs], "o-", label="edge_llm pipeline (serve_node)")
    ax.plot(xs, [r["llama_cpp_batch_tokens_per_s"] for r in runs], "s--", label="llama_cpp_batch (raw loop, no node)")
    ax.axhline(report["baseline"]["tokens_per_s"], color="grey", linestyle=":",
               label="llama.cpp sequential (Llama.generate)")
    ax.set_ylim(bottom=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_title(f"serving, {report['label']}, {report['max_new_tokens']} new tokens", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def failures(report: dict) -> list[str]:
    """A NOT EXACT line per request whose tokens differ from llama.cpp's sequential output (or that failed);
    with --foxglove, a line when the bridge's pass served under FOXGLOVE_RATIO of the tokens/s without it."""
    lines = []
    fox = report.get("foxglove")
    if fox is not None and (fox["ratio"] is None or fox["ratio"] < FOXGLOVE_RATIO):
        lines.append(f"foxglove ratio: {fmt_value(fox['ratio'], '.3f')} of the tokens/s without the bridge, with a "
                     f"Foxglove client on every channel (target >= {FOXGLOVE_RATIO})")
    if fox is not None and not fox["exact"]:
        lines.append("NOT EXACT: a request of the Foxglove pass differs from llama.cpp sequential")
    for run in report["runs"]:
        for bad in run["inexact"]:
            why = bad["error"] or f"differs from llama.cpp sequential at token {bad['first_difference']}"
            lines.append(f"NOT EXACT: {run['clients']} clients, client {bad['client']} request {bad['request']} "
                         f"({bad['prompt']}): {why}")
    return lines
