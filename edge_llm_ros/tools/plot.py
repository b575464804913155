"""`edge-llm-ros plot BAG [--out F.png]`: tokens/s, TTFT and tau over time from a recorded bag.

    edge-llm-ros bag record -o run1 /edge_llm/stats     # while the deployment serves
    edge-llm-ros plot run1 --out run1.png

Reads every edge_llm_ros/msg/InferenceStats in the bag (any topic of that type; a per-request
message has a request id, an aggregate none) and draws three panels against the time since the
bag's first message, one line per node and mode: tokens/s, time to first token, and tau (tokens
per verification round; 1 in `ar`). Without --out it prints the series' summary only. Bags from
`ros2 bag record` (rosbag2's MCAP or sqlite3) are read the same way.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

STATS_TYPE = "edge_llm_ros/msg/InferenceStats"
PANELS = (("tokens_per_s", "tokens/s"), ("ttft_s", "TTFT (s)"), ("tau", "tau (tokens per round)"))


def read_series(path: str | Path, requests_only: bool = False) -> dict[tuple[str, str], list[tuple[float, object]]]:
    """(node name, mode) -> [(seconds since the bag's start, InferenceStats)], in time order."""
    from edge_llm_ros.runtime.bag import BagReader
    from edge_llm_ros.runtime.interfaces import registry

    series: dict[tuple[str, str], list[tuple[float, object]]] = defaultdict(list)
    with BagReader(path) as bag:
        topics = [t.name for t in bag.topics() if _typename(t.type) == STATS_TYPE]
        if not topics:
            raise ValueError(f"{path}: no {STATS_TYPE} topic (topics: {', '.join(t.name for t in bag.topics()) or 'none'})")
        start = bag.start_ns
        for message in bag.messages(topics):
            stats = registry().deserialize(message.data, STATS_TYPE)
            if requests_only and not stats.request_id:
                continue
            if stats.tokens == 0 and not stats.request_id:  # an aggregate of a period without requests
                continue
            series[(stats.node_name, stats.mode)].append(((message.timestamp_ns - start) / 1e9, stats))
    return dict(series)


def _typename(name: str) -> str:
    return name if "/msg/" in name else name.replace("/", "/msg/", 1)  # rosbag2's "pkg/msg/T" or "pkg/T"


def summary(series: dict) -> str:
    lines = [f"{'node':<20} {'mode':<8} {'msgs':>5} {'tokens/s (mean)':>16} {'TTFT s (mean)':>14} {'tau (mean)':>11}"]
    for (node, mode), points in sorted(series.items()):
        means = {field: sum(getattr(s, field) for _, s in points) / len(points) for field, _ in PANELS}
        lines.append(f"{node:<20} {mode or '-':<8} {len(points):>5} {means['tokens_per_s']:>16.2f} "
                     f"{means['ttft_s']:>14.3f} {means['tau']:>11.2f}")
    return "\n".join(lines)


def draw(series: dict, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(PANELS), 1, figsize=(9, 7), sharex=True)
    for ax, (field, label) in zip(axes, PANELS):
        for (node, mode), points in sorted(series.items()):
            ax.plot([t for t, _ in points], [getattr(s, field) for _, s in points], marker=".",
                    label=f"{node} ({mode})" if mode else node)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    axes[0].set_title(title)
    axes[-1].set_xlabel("seconds since the bag's first message")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edge-llm-ros plot", description="tokens/s, TTFT and tau over time from "
                                "the InferenceStats in a recorded bag")
    p.add_argument("bag", help="a bag folder or file (edge-llm-ros bag record, or ros2 bag record)")
    p.add_argument("--out", type=Path, metavar="F.png", help="write the figure here (needs matplotlib)")
    p.add_argument("--requests-only", action="store_true",
                   help="only the per-request messages (leave out the periodic aggregates)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from edge_llm_ros.runtime.bag import BagError

    try:
        series = read_series(args.bag, args.requests_only)
    except (BagError, ValueError, OSError) as exc:
        print(f"edge-llm-ros plot: error: {exc}", file=sys.stderr)
        return 2
    if not series:
        print(f"edge-llm-ros plot: error: {args.bag}: its InferenceStats carry no tokens (nothing was served)",
              file=sys.stderr)
        return 1
    print(summary(series))
    if args.out is not None:
        try:
            draw(series, args.out, Path(args.bag).name)
        except ImportError:
            print("edge-llm-ros plot: error: --out needs matplotlib (pip install 'edge_llm_ros[bench]')",
                  file=sys.stderr)
            return 2
        print(f"wrote {args.out}")
    return 0
