"""A launched deployment for the benches: the embedded launcher on a thread of this process.

Contract: :class:`Deployment` runs a LaunchPlan (``runtime/launcher``) until it is left, and knows
each process by the launcher's own lines (pid, RSS, a kill on request, deaths nobody asked for);
:class:`EventLog` is the text stream the launcher writes to, every line kept with the time it
came, so a bench can wait for a line and time what happened between two; :func:`ask_profile`
asks a deployed node to measure itself (srv/Profile); :func:`local_router` runs a Zenoh router in
this process and :func:`router_named` points this process's sessions and the nodes it launches at
one, through :func:`environment` (the variables as they were once the bench is done);
:func:`node_backend` is the runtime the launched nodes run on, for the bench's own client
(edge_llm_ros.client) to meet them there.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edge_llm_ros.tools.loading import ToolError


@contextmanager
def environment(**changes: str) -> Iterator[None]:
    """``os.environ`` with ``changes`` (for this process and the nodes it launches) until the block is
    left; then every variable is as it was."""
    before = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def node_backend() -> str:
    """The runtime of the nodes the embedded launcher starts (EDGE_LLM_BACKEND when set, else the
    embedded one, also in a shell where ROS 2 is sourced)."""
    from edge_llm_ros.runtime.launcher.supervisor import child_backend

    return child_backend()


@contextmanager
def router_named(endpoint: str) -> Iterator[str]:
    """This process's sessions and the nodes it launches meet at ``endpoint`` (EDGE_LLM_ZENOH_ROUTER)
    until the block is left."""
    from edge_llm_ros.runtime.router import ENDPOINT_ENV

    with environment(**{ENDPOINT_ENV: endpoint}):
        yield endpoint


@contextmanager
def local_router(name: str) -> Iterator[str]:
    """A Zenoh router on a free loopback port, on a thread of this process (``name``), named for this
    process's sessions and the nodes it launches (:func:`router_named`); its endpoint. On leaving, the
    router stops and its session is closed before this returns (a process exiting under a closing
    Zenoh session aborts)."""
    from edge_llm_ros.runtime.router import free_endpoint, serve

    endpoint = free_endpoint()
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(endpoint, ready, stop), daemon=True, name=name)
    thread.start()
    try:
        if not ready.wait(20):
            raise ToolError(f"could not start a zenoh router at {endpoint}")
        with router_named(endpoint):
            yield endpoint
    finally:
        stop.set()
        thread.join(20)


class EventLog:
    """The launcher's output, every line with the time it came (a text stream for the Launcher),
    copied to ``path`` when given."""

    def __init__(self, path: Path | None = None, keep: int = 50_000) -> None:
        self.lines: deque[tuple[float, str]] = deque(maxlen=keep)
        self._file = open(path, "a") if path is not None else None  # noqa: SIM115 - closed in close()
        self._cond = threading.Condition()

    def write(self, text: str) -> int:
        now = time.monotonic()
        with self._cond:
            self.lines.extend((now, line) for line in text.splitlines() if line)
            if self._file is not None:
                self._file.write(text)
                self._file.flush()
            self._cond.notify_all()
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def find(self, pattern: str, since: float = 0.0) -> list[tuple[float, re.Match]]:
        """Every line since ``since`` that matches, with its time."""
        regex = re.compile(pattern)
        with self._cond:
            return [(t, m) for t, line in self.lines if t >= since and (m := regex.search(line))]

    def wait_for(self, pattern: str, timeout: float, since: float = 0.0) -> tuple[float, re.Match]:
        """The first line since ``since`` that matches, waiting up to ``timeout`` for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = self.find(pattern, since)
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ToolError(f"timed out after {timeout:g} s waiting for /{pattern}/; last lines:\n"
                                    + self.tail())
                self._cond.wait(min(left, 0.5))

    def tail(self, n: int = 20) -> str:
        with self._cond:
            return "\n".join(line for _, line in list(self.lines)[-n:])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class Deployment:
    """A LaunchPlan run by the embedded launcher on a thread (``with Deployment(...) as d:``)."""

    def __init__(self, plan, endpoint: str, log: EventLog, name: str = "deployment") -> None:
        from edge_llm_ros.runtime.launcher import Launcher

        self.name, self.log = name, log
        self.launcher = Launcher(plan, router=endpoint, stdout=log, stderr=log, sigterm_timeout=10.0)
        self.code: int | None = None
        self.killed: list[str] = []  # processes killed on request (their deaths are not crashes)
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"{name}-launcher")

    def _run(self) -> None:
        self.code = self.launcher.run()

    def __enter__(self) -> Deployment:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.launcher.stop()
        self.thread.join(60)

    def alive(self) -> bool:
        return self.thread.is_alive()

    def check_alive(self) -> None:
        if not self.alive():
            raise ToolError(f"the {self.name} stopped (exit {self.code}); its last lines:\n{self.log.tail()}")

    def pid(self, name: str) -> int:
        """The pid of ``name``'s newest process (from the launcher's "started NAME (pid N)" lines)."""
        found = self.log.find(rf"\[launcher\] started {re.escape(name)} \(pid (\d+)\)")
        if not found:
            raise ToolError(f"{name} was never started; last lines:\n{self.log.tail()}")
        return int(found[-1][1].group(1))

    def rss_mb(self, name: str) -> float:
        """Resident memory of ``name``'s process, MiB (VmRSS)."""
        with open(f"/proc/{self.pid(name)}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise ToolError(f"no VmRSS for {name}")

    def kill(self, name: str) -> float:
        """SIGKILL ``name``'s process; returns when."""
        pid = self.pid(name)
        self.killed.append(name)
        os.kill(pid, signal.SIGKILL)
        return time.monotonic()

    def crashes(self) -> list[str]:
        """The launcher's "process NAME died" lines beyond the kills of NAME made on request."""
        kills = {name: self.killed.count(name) for name in set(self.killed)}
        crashed = []
        for _, match in self.log.find(r"\[launcher\] process (\S+) died.*"):
            name = match.group(1)
            if kills.get(name, 0) > 0:
                kills[name] -= 1
            else:
                crashed.append(match.group(0))
        return crashed


def ask_profile(node, service: str, rows: tuple[int, ...], cached: int,
                together: threading.Barrier | None = None) -> list[float]:
    """The seconds a deployed node's `profile` service (stage_node, verifier_node) measures for each
    count of ``rows`` over ``cached`` cached rows; asked when every party of ``together`` is ready."""
    from edge_llm_ros.runtime import service as srv_type

    Profile = srv_type("edge_llm_ros/srv/Profile")
    client = node.create_client(Profile, service)
    try:
        if not client.wait_for_service(30.0):
            raise ToolError(f"nothing serves {service}")
        if together is not None:
            together.wait(30.0)
        answer = client.call(Profile.Request(token_counts=list(rows), prefix_len=cached), timeout_sec=120.0)
    finally:
        client.destroy()
    if not answer.success:
        raise ToolError(f"{service} failed: {answer.message}")
    return [float(ms) / 1e3 for ms in answer.latency_ms]  # float32 in the message


def end_process(proc, timeout: float = 10.0) -> None:
    """SIGTERM a subprocess.Popen, and SIGKILL it if it is still there ``timeout`` seconds later."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
