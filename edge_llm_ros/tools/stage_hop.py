"""What one stage hop costs on loopback (issue 14's target: under 2 ms p50 for 64 rows of hidden states).

    python -m edge_llm_ros.tools.stage_hop [--rows 1,8,64] [--count 200] [--width 576] [--json FILE]

A hop is everything between one stage's layers and the next stage's: the rows into HiddenStates
bytes (nodes.wire.StageMessage, float32 as stages.yaml sends them), the publish, Zenoh over
127.0.0.1, the next process's executor, and the bytes back into rows. This process sends one
message at a time to an echo peer (a child process that does the same conversions and sends the
rows straight back) and counts half of each round trip as a hop: the two directions do the same
work. Every echo must equal what was sent, bit for bit. Both processes run on the embedded Zenoh
backend, as the pipeline bench's deployments do; no link is emulated. ``bench --scenario
pipeline`` reports it beside the deployments.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

OUT_TOPIC, BACK_TOPIC = "/edge_llm_hop/out", "/edge_llm_hop/back"
WIDTH = 576  # SmolLM2-135M's hidden size
ROWS = (1, 8, 64)
TARGET_MS, TARGET_ROWS = 2.0, 64


@dataclass
class HopStats:
    rows: int
    bytes: int  # the HiddenStates data field of one message
    count: int
    p50_ms: float
    p90_ms: float
    mean_ms: float


def echo_peer() -> int:
    """The far side: every HiddenStates on OUT_TOPIC back to rows, and back as a message on BACK_TOPIC."""
    from edge_llm_ros import runtime as rt
    from edge_llm_ros.nodes.wire import StageMessage

    rt.init()
    node = rt.Node("stage_hop_peer")
    HiddenStates = rt.message("edge_llm_ros/msg/HiddenStates")
    back = node.create_publisher(HiddenStates, BACK_TOPIC, 10)

    def echo(msg) -> None:
        message = StageMessage.from_msg(msg)
        rows = message.to_rows(int(message.shape[1]))
        back.publish(HiddenStates(**StageMessage.from_rows(rows, message.stage + 1, message.dtype).fields()))

    node.create_subscription(HiddenStates, OUT_TOPIC, echo, 10)
    print("READY", flush=True)
    try:
        rt.spin(node)
    except KeyboardInterrupt:
        pass
    return 0


def measure(rows: tuple[int, ...] = ROWS, count: int = 200, width: int = WIDTH, warmup: int = 20,
            timeout_s: float = 60.0) -> list[HopStats]:
    """Hop times per row count, against an echo peer this call starts and stops. RuntimeError if an echo
    differs from what was sent, or none comes within 5 s (the peer died)."""
    import torch

    from edge_llm_ros.core.pipeline.stages import Rows
    from edge_llm_ros.nodes.wire import StageMessage
    from edge_llm_ros.runtime import embedded
    from edge_llm_ros.tools.deployment import end_process

    peer = subprocess.Popen([sys.executable, "-m", "edge_llm_ros.tools.stage_hop", "--peer"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "EDGE_LLM_BACKEND": "zenoh"})
    # A context of its own (as rclpy's Context()): spinning it runs this subscription's callback and
    # nothing else, also in a process whose global context hosts other nodes (a test worker, a bench).
    context = embedded.Context(args=[])
    node = embedded.Node(f"stage_hop_{os.getpid()}", context=context)
    HiddenStates = embedded.registry().message_class("edge_llm_ros/msg/HiddenStates")
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    out = node.create_publisher(HiddenStates, OUT_TOPIC, 10)
    node.create_subscription(HiddenStates, BACK_TOPIC, inbox.put, 10)
    try:
        deadline = time.monotonic() + timeout_s
        while not (out.get_subscription_count() and node.count_publishers(BACK_TOPIC)):
            if peer.poll() is not None or time.monotonic() > deadline:
                peer.kill()  # its output is complete only once it exited
                raise RuntimeError(f"the echo peer did not come up within {timeout_s:g} s: "
                                   f"{peer.communicate()[0][-2000:]}")
            embedded.spin_once(0.05, context)

        def round_trip(n: int, step: int) -> float:
            sent = Rows("hop", step, 0, 0, torch.arange(n), torch.randn(n, width))
            start = time.perf_counter()
            out.publish(HiddenStates(**StageMessage.from_rows(sent, 1, "float32").fields()))
            wait = time.monotonic() + 5.0
            while True:
                try:
                    msg = inbox.get_nowait()
                    break
                except queue.Empty:
                    if time.monotonic() > wait:
                        raise RuntimeError(f"no echo of {n} rows within 5 s (peer exit code {peer.poll()})") from None
                    embedded.spin_once(0.001, context)  # the subscription's callback runs here
            back = StageMessage.from_msg(msg).to_rows(width)
            end = time.perf_counter()
            if back.step != step or not torch.equal(back.data, sent.data):
                raise RuntimeError(f"the echo of step {step} ({n} rows) differs from what was sent")
            return (end - start) / 2

        step = 0
        for _ in range(warmup):  # the first messages also match the endpoints and fill the caches
            step += 1
            round_trip(max(rows), step)
        results = []
        for n in rows:
            hops = []
            for _ in range(count):
                step += 1
                hops.append(round_trip(n, step))
            hops.sort()
            results.append(HopStats(n, n * width * 4, count, statistics.median(hops) * 1e3,
                                    hops[int(0.9 * (count - 1))] * 1e3, statistics.fmean(hops) * 1e3))
        return results
    finally:
        end_process(peer)
        node.destroy_node()
        context.close()


def report(results: list[HopStats]) -> list[str]:
    lines = [f"stage hop on loopback (embedded Zenoh, float32, {WIDTH} wide; half a round trip to an echo peer)",
             f"{'rows':>6}{'bytes':>9}{'p50 ms':>9}{'p90 ms':>9}{'mean ms':>9}"]
    lines += [f"{r.rows:>6}{r.bytes:>9}{r.p50_ms:>9.2f}{r.p90_ms:>9.2f}{r.mean_ms:>9.2f}" for r in results]
    at = next((r for r in results if r.rows == TARGET_ROWS), None)
    if at is not None:
        verdict = "met" if at.p50_ms < TARGET_MS else "NOT met"
        lines.append(f"target: a hop of {TARGET_ROWS} rows under {TARGET_MS:g} ms p50: {at.p50_ms:.2f} ms, {verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edge_llm_ros.tools.stage_hop", description=__doc__.split("\n")[0])
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts, comma-separated (default %(default)s)")
    p.add_argument("--count", type=int, default=200, help="messages per row count (default %(default)s)")
    p.add_argument("--json", metavar="FILE", help="write the figures here")
    p.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer:
        return echo_peer()
    try:
        rows = tuple(int(r) for r in args.rows.split(","))
        if args.count < 1 or min(rows) < 1:
            raise ValueError
    except ValueError:
        p.error(f"--rows takes positive integers, --count a positive integer (got {args.rows!r}, {args.count})")
    results = measure(rows, args.count)
    print("\n".join(report(results)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scenario": "stage_hop", "width": WIDTH, "dtype": "float32", "backend": "zenoh (loopback)",
                       "hops": [asdict(r) for r in results]}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
