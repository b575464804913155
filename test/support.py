"""Helpers the tests share: child processes with collected output, event-style waits, the CLI, a
client request followed to its end (Followed).

A module of its own (not conftest) so that `from support import ...` is unambiguous.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Test data from real ROS 2 installations: shared/ beside the checkout (as CI lays it out).
TESTDATA = Path(os.environ.get("EDGE_LLM_TESTDATA", REPO.parent / "shared" / "testdata"))


DOMAINS_DRAWN: set[int] = set()  # by ros_domain(): the ros2 CLI may have left a daemon on each


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to 1, true or yes, in any case): there nothing may skip
    (conftest turns a skip into a failure), and what a test needs must be installed."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require(module: str, install: str):
    """The module ``module``, imported; when it is missing, the test (or the module, called at its
    top) fails under CI (in_ci) and is skipped elsewhere, naming it and ``install``, what installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        message = f"needs {module} ({exc}); install it: {install}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)


def setup_budget(seconds: float):
    """Declare, under ``@pytest.fixture``, how long a fixture's setup may take: every test that uses
    it, directly or through other fixtures, gets ``seconds`` more than its own timeout (conftest's
    pytest_collection_modifyitems; pyproject.toml says the policy), so a long session fixture fits
    inside the timeout of whichever test happens to set it up first."""
    def declare(fixture_function):
        fixture_function.setup_budget_s = float(seconds)
        return fixture_function
    return declare


def ros_domain(first: int = 100, count: int = 100) -> int:
    """A ROS domain id in ``first`` .. ``first + count - 1`` for a test's DDS participants: drawn at
    random (another suite may run on the machine), from a half of its own for each of `make test`'s
    two pytest-xdist workers, so that the two workers' rclpy tests never share one."""
    import random

    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    half = count // 2
    low = first + half * (worker % 2)
    domain = random.randint(low, low + half - 1)
    DOMAINS_DRAWN.add(domain)
    return domain


def python_path() -> str:
    """PYTHONPATH for child processes: this checkout first, then what the environment has (a sourced
    ROS 2 install: rclpy, and the msg/srv/action modules colcon generated for this package)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll `predicate` until it returns a truthy value; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def default_sigint() -> None:
    """In a child before it runs: SIGINT back to its default, as in a terminal. A suite started in
    the background (`cmd &` in a script, as CI runners may) passes SIGINT down ignored; Python then
    installs no SIGINT handler, and `ros2 launch` (which hears signals only through Python's)
    ignores the tests' Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Proc:
    """A child process whose output lines are collected as they come, to wait on them. A failing
    test's report shows the last lines of those still running and of those stopped since the test
    began (conftest): ``Proc.running``, ``Proc.stopped`` (the last few, with when)."""

    running: "weakref.WeakSet[Proc]" = weakref.WeakSet()
    stopped: "collections.deque[tuple[float, Proc]]" = collections.deque(maxlen=8)

    def __init__(self, args: list[str], env: dict | None = None, cwd: Path = REPO) -> None:
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=python_path())
        full_env.update(env or {})
        self.popen = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=full_env, cwd=cwd, start_new_session=True, preexec_fn=default_sigint)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        Proc.running.add(self)

    def _read(self) -> None:
        for line in self.popen.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for_line(self, needle: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or (self.popen.poll() is not None and not any(needle in l for l in self.lines)):
                    if self.popen.poll() is not None:
                        self._cond.wait(0.2)  # drain what the reader still holds
                        if any(needle in l for l in self.lines):
                            continue
                    raise AssertionError(f"timed out waiting for {needle!r}; output so far:\n{self.output[-3000:]}")
                self._cond.wait(min(left, 0.2))

    def wait(self, timeout: float = 30.0) -> int:
        """The exit code, once the process has ended and its output is read to the end (a process
        that exits right after its last line: that line is in ``output`` when this returns; a
        grandchild that keeps the pipe open is given 5 s)."""
        code = self.popen.wait(timeout)
        self._reader.join(5)
        return code

    def tail(self, lines: int) -> str:
        with self._cond:
            return "\n".join(self.lines[-lines:])

    def stop(self) -> None:
        if self in Proc.running:
            Proc.running.discard(self)
            Proc.stopped.append((time.monotonic(), self))
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


class Followed:
    """A request of edge_llm_ros.client (``LLMClient.stream(...)``) read to its end on a thread of its
    own: its chunks as they come (``first`` set at the first), then its result or what it raised."""

    def __init__(self, request) -> None:
        self.request, self.chunks = request, []
        self.first, self.ended = threading.Event(), threading.Event()
        self.result, self.error = None, None
        threading.Thread(target=self._follow, daemon=True, name="followed").start()

    def _follow(self) -> None:
        try:
            for chunk in self.request:
                self.chunks.append(chunk)
                self.first.set()
            self.result = self.request.result()
        except BaseException as exc:  # noqa: BLE001 - handed to the test by wait()
            self.error = exc
        finally:
            self.ended.set()

    def wait(self, timeout: float):
        """The request's Result, or what it raised (an edge_llm_ros.errors exception, NoAnswer, ...)."""
        if not self.ended.wait(timeout):
            raise AssertionError(f"the request did not end within {timeout:g} s")
        if self.error is not None:
            raise self.error
        return self.result

    def streamed(self) -> tuple[list[int], str]:
        """The token ids and text that came as feedback (never the result's own tail, which a stream
        yields as a filled chunk when feedback went missing)."""
        assert not any(c.filled for c in self.chunks), "feedback went missing: the stream filled it from the result"
        return [t for c in self.chunks for t in c.token_ids], "".join(c.text for c in self.chunks)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def cli(*args: str, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
    """Run `edge-llm-ros ARGS` as a separate process."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=python_path())
    return subprocess.run([sys.executable, "-m", "edge_llm_ros.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO, input=input)


def assert_loopback_only(process) -> None:
    """No socket of ``process`` (a psutil.Process) is connected to an address other than loopback."""
    for conn in process.net_connections(kind="inet"):
        if conn.raddr:
            assert conn.raddr.ip in ("127.0.0.1", "::1"), (process.cmdline()[:2], conn)


def stamped_now(msg, within_s: float = 120.0) -> bool:
    """True when ``msg.header.stamp`` is the system time of about now (a node stamped it as it published)."""
    stamp = msg.header.stamp
    return abs(stamp.sec + stamp.nanosec * 1e-9 - time.time()) < within_s


def check_loopback_only(env: dict) -> None:
    """Fail unless DDS in ``env`` stays on this machine: discovery range LOCALHOST and a Fast DDS
    profile (the default participant profile) with no builtin transports, UDP only through
    127.0.0.1, every locator and initial peer 127.0.0.1, no multicast."""
    problems = []
    if env.get("ROS_AUTOMATIC_DISCOVERY_RANGE") != "LOCALHOST":
        problems.append(f"ROS_AUTOMATIC_DISCOVERY_RANGE is {env.get('ROS_AUTOMATIC_DISCOVERY_RANGE')!r}, not LOCALHOST")
    if env.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp") != "rmw_fastrtps_cpp":
        problems.append(f"RMW_IMPLEMENTATION is {env['RMW_IMPLEMENTATION']!r}: the loopback profile is Fast DDS's")
    if any(peer.strip() not in ("", "127.0.0.1", "localhost") for peer in env.get("ROS_STATIC_PEERS", "").split(";")):
        problems.append(f"ROS_STATIC_PEERS names other hosts: {env['ROS_STATIC_PEERS']!r}")
    profile = Path(env.get("FASTRTPS_DEFAULT_PROFILES_FILE", ""))
    if not profile.is_file():
        problems.append(f"FASTRTPS_DEFAULT_PROFILES_FILE is not a file: {str(profile)!r}")
    else:
        root = ET.parse(profile).getroot()
        tags = {el.tag.split("}")[-1] for el in root.iter()}

        def texts(tag: str) -> list[str]:
            return [el.text.strip() for el in root.iter() if el.tag.split("}")[-1] == tag and el.text]

        participants = [el for el in root.iter() if el.tag.endswith("participant") and el.get("is_default_profile") == "true"]
        if not participants:
            problems.append(f"{profile}: no default participant profile")
        if texts("useBuiltinTransports") != ["false"]:
            problems.append(f"{profile}: builtin transports are not off")
        if any(addr != "127.0.0.1" for addr in texts("address")) or not texts("address"):
            problems.append(f"{profile}: an address other than 127.0.0.1: {texts('address')}")
        if any("ulticast" in tag for tag in tags):
            problems.append(f"{profile}: a multicast setting")
        for desc in (el for el in root.iter() if el.tag.endswith("transport_descriptor")):
            kind = next((c.text for c in desc if c.tag.endswith("type")), "")
            white = [c for c in desc.iter() if c.tag.endswith("interfaceWhiteList")]
            if kind.startswith("UDP") and not white:
                problems.append(f"{profile}: a {kind} transport without an interface whitelist")
    if problems:
        pytest.fail("refusing to run DDS off loopback: " + "; ".join(problems))


def level_of(status) -> int:
    """A DiagnosticStatus's level as a number (rclpy holds the `byte` field as one byte of bytes)."""
    return status.level[0] if isinstance(status.level, (bytes, bytearray)) else int(status.level)


def key_values(status) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


class Diagnostics:
    """Every diagnostic_msgs/DiagnosticArray ``node`` hears on ``topic`` (/diagnostics, or the
    monitor's /diagnostics_agg), in order of arrival; ``names``: keep only arrays carrying one of them."""

    def __init__(self, node, array_type, topic: str = "/diagnostics", names: set[str] | None = None) -> None:
        self.names, self._arrays = names, []
        self._lock = threading.Lock()
        node.create_subscription(array_type, topic, self._on_array, 100)

    def _on_array(self, array) -> None:
        if self.names is None or any(status.name in self.names for status in array.status):
            with self._lock:
                self._arrays.append(array)

    def seen(self) -> list:
        with self._lock:
            return list(self._arrays)

    def wait_for(self, predicate, timeout: float, what: str):
        """The first array heard for which ``predicate`` holds (waiting up to ``timeout``)."""
        return wait_until(lambda: next((a for a in self.seen() if predicate(a)), None), timeout, what)

    def mark(self) -> int:
        """Where the arrays heard so far end: ``status(..., after=mark)`` looks only at later ones."""
        with self._lock:
            return len(self._arrays)

    def status(self, name: str, where=lambda status: True, timeout: float = 20.0, after: int = 0):
        """The newest status named ``name`` for which ``where`` holds, in an array heard after
        ``after`` (a :meth:`mark`), waiting up to ``timeout``."""
        def found():
            return next((s for a in reversed(self.seen()[after:]) for s in a.status if s.name == name and where(s)), None)
        return wait_until(found, timeout, f"a status {name!r} on /diagnostics")


def foxglove_layout() -> dict[str, list[str]]:
    """config/foxglove/edge_llm.json: each topic its panels name, with the fields they read ('' for a
    whole message), and the Publish panel's topic under the key 'publish'."""
    import json

    config = json.loads((REPO / "config" / "foxglove" / "edge_llm.json").read_text())["configById"]
    named: dict[str, list[str]] = collections.defaultdict(list)

    def add(path: str) -> None:
        topic, _, field = path.partition(".")
        named[topic].append(field)

    for panel, settings in config.items():
        kind = panel.split("!")[0]
        if kind == "Image":
            add(settings["imageMode"]["imageTopic"])
        elif kind == "3D":
            for topic in settings["topics"]:
                add(topic)
        elif kind == "Plot":
            for path in settings["paths"]:
                add(path["value"])
        elif kind == "RawMessages":
            add(settings["topicPath"])
        elif kind == "DiagnosticSummary":
            add(settings["topicToRender"])
        elif kind == "Publish":
            named["publish"] = [settings["topicName"], settings["datatype"]]
    return dict(named)
