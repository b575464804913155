"""`edge-llm-ros demo` (`make demo`): launch the pipeline, ask SmolLM2 one thing, stream its answer.

What a new user would do in two terminals, done in one:
  1. `edge-llm-ros launch pipeline`            (router, planner_node, serve_node, monitor)
  2. `python examples/generate.py "..."`       (here: this process, with edge_llm_ros.client's
                                                LLMClient: wait until ready, stream the answer)
then Ctrl-C on the launch, which stops every node. It prints the mode and backend that served
the answer, its tokens/s and time to first token (the result's InferenceStats), and exits 0 only
if a complete answer arrived.

Readiness is the nodes' lifecycle state: planner_node is active once its device plan is published
(the first run on a machine calibrates it first, under a minute, so the answer is not timed
against the calibration), serve_node once it serves (LLMClient.wait_until_ready).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading

from edge_llm_ros.runtime.router import ENDPOINT_ENV, free_endpoint, router_reachable

PLANNER = "/edge_llm/planner_node"
SERVING = re.compile(r"\[serve_node-\d+\].*serving ")  # what it serves, said at start (shown with --quiet)
NODE_LOGS = re.compile(r"^\[launcher\]|^\[(planner_node|serve_node)-\d+\] \[(INFO|WARN|ERROR)\]")
ALL = re.compile("")


class _Launch:
    """`edge-llm-ros launch pipeline` as a child process; its lines shown with a prefix and kept."""

    def __init__(self, env: dict, shown: re.Pattern | None) -> None:
        argv = [sys.executable, "-m", "edge_llm_ros.runtime.cli", "launch", "pipeline"]
        self.env = env
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.lock = threading.Lock()
        self.shown = shown  # lines shown as they come (None: none)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.popen.stdout:
            if self.shown is not None and self.shown.search(line):
                print(f"  launch | {line.rstrip()}", flush=True)
            with self.lock:
                self.lines.append(line)

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
        return _ask(args, launch)
    finally:
        launch.stop()
        print("[demo] pipeline stopped", flush=True)


def _fail(message: str, launch: _Launch) -> int:
    if launch.shown is not ALL:
        print("".join(launch.lines[-30:]), file=sys.stderr, end="")
    print(f"[demo] {message}", file=sys.stderr, flush=True)
    return 1


def _ask(args: argparse.Namespace, launch: _Launch) -> int:
    """Wait until planner_node and serve_node are active, stream the answer to the instruction, print
    the figures."""
    from edge_llm_ros.client import LLMClient, NoAnswer, RequestError
    from edge_llm_ros.runtime.launcher.supervisor import child_backend

    def launch_alive() -> None:
        if launch.popen.poll() is not None:
            raise NoAnswer("the launch ended")

    with LLMClient("/edge_llm", timeout=args.timeout, backend=child_backend(launch.env)) as llm:
        print("[demo]     waiting for the device plan (a first run calibrates this machine: under a minute)",
              flush=True)
        try:
            llm.wait_until_active(PLANNER, args.timeout, check=launch_alive)  # active: the plan is published
        except NoAnswer as exc:
            return _fail(f"planner_node did not publish the device plan: {exc}; see the launch log above", launch)
        try:
            server = llm.wait_until_ready(args.timeout, check=launch_alive)
        except NoAnswer as exc:
            return _fail(f"serve_node did not come up: {exc}; see the launch log above", launch)
        if launch.shown is None and (said := [line for line in launch.lines if SERVING.search(line)]):
            print(f"[demo]     {said[-1].split(']: ', 1)[-1].strip()}", flush=True)  # --quiet: what serves
        print(f"[demo] 2/3 {server} is active; connected to /edge_llm/generate with edge_llm_ros.client.LLMClient "
              "(examples/generate.py)", flush=True)
        print(f"[demo] 3/3 sending {args.instruction!r}: llm.stream(...) prints the answer as it comes", flush=True)
        launch.shown = None  # the answer, not the nodes' logs, from here on
        print()
        stream = llm.stream(args.instruction)
        try:
            for chunk in stream:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
            result = stream.result()
        except (RequestError, TimeoutError) as exc:
            print(file=sys.stderr)
            return _fail(f"no complete answer: {exc}", launch)
        print("\n")
        s = result.stats
        print(f"[demo] mode {s.mode} on {s.backend}: {s.tokens} tokens, {s.tokens_per_s:.1f} tokens/s, "
              f"time to first token {s.ttft_s * 1000:.0f} ms (finish: {result.finish_reason})", flush=True)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
