"""`edge-llm-ros demo`: the path instruction -> response through launched processes.

What a new user would type in three terminals, done in one:
  1. `edge-llm-ros launch pipeline`                 (router + nodes)
  2. `edge-llm-ros topic echo /edge_llm/response`   (a separate process)
  3. `edge-llm-ros topic pub --once /edge_llm/instruction std_msgs/msg/String "{data: ...}"`
then Ctrl-C on the launch, which stops every node.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from .runtime.router import ENDPOINT_ENV, free_endpoint, router_reachable


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "edge_llm_ros.runtime.cli", *args]


class _Child:
    """A child process whose output is shown with a prefix and kept for waiting."""

    def __init__(self, label: str, argv: list[str], env: dict) -> None:
        self.label = label
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.popen.stdout:
            print(f"  {self.label} | {line.rstrip()}", flush=True)
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait_for(self, needle: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not any(needle in line for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.popen.poll() is not None:
                    return any(needle in line for line in self.lines)
                self.cond.wait(min(left, 0.2))
        return True


def _wait_subscribed(topic: str, env: dict, timeout: float) -> bool:
    """Ask the graph (`topic info`) until the topic has a subscriber."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = subprocess.run(_cli("topic", "info", topic), env=env, capture_output=True, text=True)
        if "Subscription count: 0" not in info.stdout and "Subscription count:" in info.stdout:
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge-llm-ros demo", description=__doc__.splitlines()[0])
    parser.add_argument("instruction", nargs="?", default="go to the red chair and wait there")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if ENDPOINT_ENV not in env and router_reachable():
        env[ENDPOINT_ENV] = free_endpoint()  # keep clear of a router someone else runs
    print("[demo] 1/3 launching the pipeline: edge-llm-ros launch pipeline", flush=True)
    launch = _Child("launch", _cli("launch", "pipeline"), env)
    echo = None
    try:
        if not launch.wait_for("echoing", args.timeout):
            print("[demo] the pipeline did not come up; see the launch log above", file=sys.stderr)
            return 1
        print("[demo] 2/3 listening: edge-llm-ros topic echo /edge_llm/response", flush=True)
        echo = _Child("echo  ", _cli("topic", "echo", "/edge_llm/response", "edge_llm_ros/msg/TokenChunk",
                                      "--timeout", str(args.timeout)), env)
        if not _wait_subscribed("/edge_llm/response", env, args.timeout):
            print("[demo] the listener did not join the graph", file=sys.stderr)
            return 1
        print(f"[demo] 3/3 sending: {args.instruction!r}", flush=True)
        pub = subprocess.run(_cli("topic", "pub", "--once", "/edge_llm/instruction", "std_msgs/msg/String",
                                  f"{{data: {args.instruction!r}}}"), env=env, capture_output=True, text=True)
        if pub.returncode != 0:
            print(f"[demo] publishing failed: {pub.stderr.strip()}", file=sys.stderr)
            return 1
        if not echo.wait_for("done: true", args.timeout):
            print("[demo] no complete response arrived", file=sys.stderr)
            return 1
        text = "".join(line.split("text:", 1)[1].strip().strip("'\"") + " " for line in echo.lines if line.startswith("text:"))
        print(f"[demo] response received through launched processes: {' '.join(text.split())!r}", flush=True)
        return 0
    finally:
        for child in (echo, launch):
            if child is not None and child.popen.poll() is None:
                child.popen.send_signal(signal.SIGINT)
        for child in (echo, launch):
            if child is not None:
                try:
                    child.popen.wait(20)
                except subprocess.TimeoutExpired:
                    child.popen.kill()
        print("[demo] pipeline stopped", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
