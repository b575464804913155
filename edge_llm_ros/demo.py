"""`edge-llm-ros demo` (`make demo`): launch the pipeline, ask SmolLM2 one thing, stream its answer.

What a new user would do in three terminals, done in one:
  1. `edge-llm-ros launch pipeline`                 (router, planner_node, serve_node, monitor)
  2. `edge-llm-ros topic echo /edge_llm/response`   (here: this process listens and prints the text)
  3. `edge-llm-ros topic pub --once /edge_llm/instruction std_msgs/msg/String "{data: ...}"`
then Ctrl-C on the launch, which stops every node. It prints the mode and backend that served
the answer, its tokens/s and time to first token (from serve_node's InferenceStats for the
request), and exits 0 only if a complete answer arrived.

The first run on a machine waits for planner_node to calibrate it (under a minute), so the
answer is not timed against the calibration.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from edge_llm_ros.runtime.router import ENDPOINT_ENV, free_endpoint, router_reachable

PLANNED = re.compile(r"\[planner_node-\d+\].*(published the device plan|no plan published)")
SERVING = re.compile(r"\[serve_node-\d+\].*serving ")  # up, on its own choice
NODE_LOGS = re.compile(r"^\[launcher\]|^\[(planner_node|serve_node)-\d+\] \[(INFO|WARN|ERROR)\]")
ALL = re.compile("")
REPLANNED = re.compile(r"\[serve_node-\d+\].*(plan: |plan refused)")  # it took (or refused) the planner's plan


class _Launch:
    """`edge-llm-ros launch pipeline` as a child process; its lines shown with a prefix and kept."""

    def __init__(self, env: dict, shown: re.Pattern | None) -> None:
        argv = [sys.executable, "-m", "edge_llm_ros.runtime.cli", "launch", "pipeline"]
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.shown = shown  # lines shown as they come (None: none)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.popen.stdout:
            if self.shown is not None and self.shown.search(line):
                print(f"  launch | {line.rstrip()}", flush=True)
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pattern: re.Pattern, timeout: float, start: int = 0) -> int | None:
        """Index of the first line from ``start`` on that matches (None: timeout, or the launch ended)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(start, len(self.lines)):
                    if pattern.search(self.lines[i]):
                        return i
                start = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or self.popen.poll() is not None:
                    return None
                self.cond.wait(min(left, 0.5))

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge-llm-ros demo", description=__doc__.splitlines()[0])
    parser.add_argument("instruction", nargs="?", default="In two sentences: how does a robot find its way "
                                                          "to a red chair in a house it has never seen?")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for each stage (default 180)")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="show none of the launch's lines")
    shown.add_argument("--verbose", action="store_true", help="show every line of the launch (default: the "
                                                               "launcher's and the planner's and server's logs)")
    args = parser.parse_args(argv)

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if ENDPOINT_ENV not in env and router_reachable():
        env[ENDPOINT_ENV] = free_endpoint()  # keep clear of a router someone else runs
    os.environ.update({k: v for k, v in env.items() if k == ENDPOINT_ENV})
    print("[demo] 1/3 launching the pipeline: edge-llm-ros launch pipeline", flush=True)
    launch = _Launch(env, None if args.quiet else ALL if args.verbose else NODE_LOGS)
    try:
        print("[demo]     waiting for the device plan (a first run calibrates this machine: under a minute)",
              flush=True)
        if (planned := launch.wait_for(PLANNED, args.timeout)) is None:
            return _fail("planner_node did not finish; see the launch log above", launch)
        ready = REPLANNED if "published the device plan" in launch.lines[planned] else SERVING
        if (line := launch.wait_for(ready, args.timeout)) is None:
            return _fail("serve_node did not come up; see the launch log above", launch)
        return _ask(args, launch, line)
    finally:
        launch.stop()
        print("[demo] pipeline stopped", flush=True)


def _fail(message: str, launch: _Launch) -> int:
    if launch.shown is not ALL:
        print("".join(launch.lines[-30:]), file=sys.stderr, end="")
    print(f"[demo] {message}", file=sys.stderr, flush=True)
    return 1


def _ask(args: argparse.Namespace, launch: _Launch, ready_line: int) -> int:
    """Listen on response and stats, send the instruction, stream the answer, print the figures."""
    from edge_llm_ros import runtime as rt

    rt.init(args=[])
    node = rt.Node("demo")
    chunks: queue.SimpleQueue = queue.SimpleQueue()
    stats: dict[str, object] = {}
    got_stats = threading.Event()
    String, TokenChunk = rt.message("std_msgs/msg/String"), rt.message("edge_llm_ros/msg/TokenChunk")

    def on_stats(msg) -> None:
        if msg.request_id:
            stats[msg.request_id] = msg
            got_stats.set()

    node.create_subscription(TokenChunk, "/edge_llm/response", chunks.put, 100)
    node.create_subscription(rt.message("edge_llm_ros/msg/InferenceStats"), "/edge_llm/stats", on_stats, 100)
    pub = node.create_publisher(String, "/edge_llm/instruction", 10)
    threading.Thread(target=rt.spin, args=(node,), daemon=True, name="spin").start()
    try:
        deadline = time.monotonic() + args.timeout
        while pub.get_subscription_count() == 0 or node.count_publishers("/edge_llm/response") == 0:
            if time.monotonic() > deadline or launch.popen.poll() is not None:
                return _fail("serve_node's topics did not appear in the graph", launch)
            time.sleep(0.05)
        if launch.shown is None:  # --quiet: say at least what serves
            print(f"[demo]     {launch.lines[ready_line].split(']: ', 1)[-1].strip()}", flush=True)
        print("[demo] 2/3 listening on /edge_llm/response (as: edge-llm-ros topic echo /edge_llm/response)", flush=True)
        print(f"[demo] 3/3 sending on /edge_llm/instruction: {args.instruction!r}", flush=True)
        launch.shown = None  # the answer, not the nodes' logs, from here on
        pub.publish(String(data=args.instruction))
        request, last = None, None
        print()
        while last is None or not last.done:
            try:
                last = chunks.get(timeout=max(deadline - time.monotonic(), 0.1) if request else args.timeout)
            except queue.Empty:
                print(file=sys.stderr)
                return _fail("no complete answer arrived", launch)
            request = request or last.request_id
            if last.request_id == request:
                sys.stdout.write(last.text)
                sys.stdout.flush()
        print("\n")
        if last.finish_reason == "error":
            return _fail(f"serve_node answered with an error: {last.error}", launch)
        got_stats.wait(10)
        s = stats.get(request)
        if s is None:
            print(f"[demo] answer complete (finish: {last.finish_reason}); no stats arrived for it", flush=True)
        else:
            print(f"[demo] mode {s.mode} on {s.backend}: {s.tokens} tokens, {s.tokens_per_s:.1f} tokens/s, "
                  f"time to first token {s.ttft_s * 1000:.0f} ms (finish: {last.finish_reason})", flush=True)
        return 0
    finally:
        node.destroy_node()
        rt.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
