"""The supervisor: Launcher runs a LaunchPlan as processes until the deployment is over.

It starts the Zenoh router when none answers, one process per node in its own
session, forwards their output line by line, respawns the nodes that ask for
it, keeps a router at the endpoint (the watchdog), and shuts everything down
in order: SIGINT, SIGTERM, SIGKILL, the router last. The package docstring
gives the rules and exit codes.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from edge_llm_ros.runtime.launcher.plan import PACKAGE, LaunchPlan, NodeSpec, search_roots
from edge_llm_ros.runtime.router import ENDPOINT_ENV, router_endpoint, router_reachable
from edge_llm_ros.runtime.security import ROUTER_CONFIG_ENV, SESSION_CONFIG_ENV, Keystore

ROUTER_NAME = "zenoh_router"
ROUTER_TIMEOUT_S = 10.0
ROUTER_CHECK_S = 1.0  # the watchdog knocks at the router endpoint this often ...
ROUTER_MISSES = 2  # ... and starts a new router after this many unanswered knocks in a row
_COLORS = (36, 33, 35, 32, 34, 91, 96, 93, 95, 92, 94)

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int):
    """preexec_fn: SIGTERM this child when the thread that forked it dies (Linux)."""

    def setup() -> None:
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os._exit(1)

    return setup


def child_backend(env: Mapping[str, str] = os.environ) -> str:
    """The runtime of the nodes this launcher starts: EDGE_LLM_BACKEND when set, else the embedded one,
    also in a shell where ROS 2 is sourced (a program that talks to them, such as a bench's client,
    picks the same)."""
    return env.get("EDGE_LLM_BACKEND", "").strip().lower() or "zenoh"


@dataclass(eq=False)
class _Child:
    name: str
    proc: subprocess.Popen
    required: bool
    color: int
    is_router: bool = False
    node: NodeSpec | None = None  # None for the router
    respawns: int = 0  # how many times this node was started again before this process
    respawn_at: float | None = None  # exited, to be started again at this time.monotonic()
    readers: list[threading.Thread] = field(default_factory=list)
    exited: bool = False


class Launcher:
    """Runs a LaunchPlan: router, one process per node, forwarding, supervision, shutdown.

    `run()` blocks until the deployment is over and returns the exit code. Call
    it from the thread that should own the children (PR_SET_PDEATHSIG is tied
    to the forking thread); from the main thread it also handles SIGINT,
    SIGTERM and SIGHUP. `stop()` asks for a shutdown from any thread.
    """

    def __init__(self, plan: LaunchPlan, *, router: str | None = None, sigterm_timeout: float = 5.0,
                 sigkill_timeout: float = 5.0, router_timeout: float = ROUTER_TIMEOUT_S,
                 stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self.plan = plan
        self.endpoint = router or router_endpoint()
        self.sigterm_timeout = sigterm_timeout
        self.sigkill_timeout = sigkill_timeout
        self.router_timeout = router_timeout
        self._out = stdout or sys.stdout
        self._err = stderr or sys.stderr
        self._events: queue.SimpleQueue = queue.SimpleQueue()  # put() is safe inside signal handlers
        self._children: list[_Child] = []  # one per node and router; a respawn replaces the dead one
        self._router_misses = 0
        self._write_lock = threading.Lock()

    # ---- public
    def run(self, ready_event: threading.Event | None = None) -> int:
        previous = self._install_signal_handlers()
        try:
            return self._run(ready_event)
        finally:
            self._shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop(self) -> None:
        self._events.put(("stop", None))

    # ---- the steps
    def _run(self, ready_event: threading.Event | None) -> int:
        code = self._ensure_router()
        if code is not None:
            return code
        for node in self.plan.nodes:
            if self._spawn(node.name, node.command(self.plan.params_files), node.required, node=node) is None:
                return 1
        self._log(f"{len(self.plan.nodes)} node(s) running; Ctrl-C to stop")
        if ready_event is not None:
            ready_event.set()
        return self._supervise()

    def _ensure_router(self) -> int | None:
        """A router answering at the endpoint: the one found there, else one started (replacing a dead one)."""
        if router_reachable(self.endpoint):
            self._log(f"using the zenoh router at {self.endpoint}")
            return None
        # = python -m edge_llm_ros.runtime.router, minus runpy's warning when the package imports the module
        script = f"import sys; from {PACKAGE}.runtime.router import main; sys.exit(main(sys.argv[1:]))"
        cmd = [sys.executable, "-c", script, "--listen", self.endpoint]
        router = self._spawn(ROUTER_NAME, cmd, required=True, is_router=True, replace=self._router())
        if router is None:
            return 1
        deadline = time.monotonic() + self.router_timeout
        while not router_reachable(self.endpoint, timeout=0.2):
            if time.monotonic() > deadline:
                self._log(f"the zenoh router did not accept connections at {self.endpoint} "
                          f"within {self.router_timeout:g} s", error=True)
                return 1
            event = self._next_event(0.05)
            if event is not None and (code := self._handle(event)) is not None:
                return code
            if router.exited:  # cannot bind the endpoint, or crashed
                return 1
        self._log(f"zenoh router ready at {self.endpoint}")
        return None

    def _supervise(self) -> int:
        """Events, due respawns and the router watchdog, until something asks for a shutdown."""
        next_check = time.monotonic() + ROUTER_CHECK_S
        while True:
            wake = min([next_check] + [c.respawn_at for c in self._children if c.respawn_at is not None])
            event = self._next_event(wake - time.monotonic())
            if event is not None and (code := self._handle(event)) is not None:
                return code
            if (code := self._respawn_due()) is not None:
                return code
            router = self._router()
            if time.monotonic() >= next_check or (router is not None and router.exited):
                if (code := self._watch_router()) is not None:
                    return code
                next_check = time.monotonic() + ROUTER_CHECK_S
            if not any(not c.exited or c.respawn_at is not None for c in self._children if not c.is_router):
                self._log("no nodes left")
                return 0

    def _handle(self, event: tuple[str, Any]) -> int | None:
        """Apply one event while running; an exit code means: shut down now."""
        kind, item = event
        if kind == "signal":
            self._log(f"received {signal.Signals(item).name}, shutting down")
            return 0
        if kind == "stop":
            self._log("stop requested, shutting down")
            return 0
        child: _Child = item
        if child.exited:  # a router the watchdog already put down
            return None
        child.exited = True
        died = f"process {child.name} died (exit code {child.proc.returncode})"
        if child.node is not None and child.node.may_respawn(child.respawns):
            delay = child.node.respawn_delay
            child.respawn_at = time.monotonic() + delay
            self._log(f"{died}; respawning in {delay:g} s (attempt {child.respawns + 1})", error=True)
            return None
        self._log(died, error=True)
        if child.is_router:  # _ensure_router fails on it; while supervising, the watchdog starts a new one
            return None
        return 1 if child.required else None

    def _respawn_due(self) -> int | None:
        """Start again, with the same command, the nodes whose respawn delay has passed."""
        now = time.monotonic()
        for child in [c for c in self._children if c.respawn_at is not None and c.respawn_at <= now]:
            child.respawn_at = None
            node = child.node
            fresh = self._spawn(node.name, node.command(self.plan.params_files), node.required, node=node,
                                replace=child)
            if fresh is None:
                if node.required:
                    return 1
                continue
            fresh.respawns = child.respawns + 1
        return None

    def _watch_router(self) -> int | None:
        """The router watchdog: a new router at the endpoint when the one there is gone.

        Gone means: the router this launcher started exited, or nothing answered
        at the endpoint ROUTER_MISSES checks in a row (also a router found
        there). Without a router the nodes cannot reach each other, so when no
        new one comes up the deployment stops, exit code 1.
        """
        router = self._router()
        if router is not None and router.exited:
            self._router_misses = ROUTER_MISSES
        elif router_reachable(self.endpoint):
            self._router_misses = 0
        else:
            self._router_misses += 1
        if self._router_misses < ROUTER_MISSES:
            return None
        self._router_misses = 0
        self._log(f"zenoh router at {self.endpoint} is gone; starting a new one", error=True)
        if router is not None and not router.exited:  # alive but not answering: free the endpoint
            self._kill(router)
        code = self._ensure_router()
        if code == 1 and not router_reachable(self.endpoint):
            self._log(f"no zenoh router at {self.endpoint} and a new one did not come up; the nodes cannot "
                      "reach each other, stopping the deployment", error=True)
        return code

    def _router(self) -> _Child | None:
        """The router process this launcher started, if any."""
        return next((c for c in self._children if c.is_router), None)

    def _kill(self, child: _Child) -> None:
        try:
            os.killpg(child.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            child.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            pass
        child.exited = True

    def _shutdown(self) -> None:
        self._stop_group([c for c in self._children if not c.is_router])
        self._stop_group([c for c in self._children if c.is_router])

    def _stop_group(self, group: list[_Child]) -> None:
        steps = ((signal.SIGINT, self.sigterm_timeout), (signal.SIGTERM, self.sigkill_timeout),
                 (signal.SIGKILL, 5.0))
        for sig, timeout in steps:
            alive = [c for c in group if not c.exited]
            if not alive:
                return
            if sig != signal.SIGINT:
                names = ", ".join(f"{c.name} (pid {c.proc.pid})" for c in alive)
                self._log(f"{names} still running, sending {sig.name}")
            for child in alive:
                if child.proc.returncode is None:
                    try:
                        os.killpg(child.proc.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            self._await_exits(alive, timeout)
        stuck = [c.name for c in group if not c.exited]
        if stuck:
            self._log(f"giving up on {', '.join(stuck)}", error=True)

    def _await_exits(self, group: list[_Child], timeout: float) -> None:
        """Until every child of `group` exited, `timeout` passed, or another signal asks to hurry."""
        deadline = time.monotonic() + timeout
        while any(not c.exited for c in group):
            event = self._next_event(deadline - time.monotonic())
            if event is None:
                return
            kind, item = event
            if kind == "exit":
                item.exited = True
                self._log(f"process {item.name} exited (exit code {item.proc.returncode})")
            else:
                return

    def _next_event(self, timeout: float | None = None) -> tuple[str, Any] | None:
        """The next event, or None after `timeout` seconds (waits in short slices so signal handlers run)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if wait <= 0:
                return None
            try:
                return self._events.get(timeout=wait)
            except queue.Empty:
                continue

    # ---- children
    def _child_env(self, node: NodeSpec | None = None) -> dict[str, str]:
        """The launcher's environment, plus the router endpoint; with a keystore, the router's config
        (node None) or the node's enclave's."""
        env = dict(os.environ)
        env[ENDPOINT_ENV] = self.endpoint
        if self.plan.keystore is not None:
            store = Keystore(self.plan.keystore)
            env.pop(SESSION_CONFIG_ENV if node is None else ROUTER_CONFIG_ENV, None)
            if node is None:
                env[ROUTER_CONFIG_ENV] = str(store.router_config)
            else:
                env[SESSION_CONFIG_ENV] = str(store.session_config(self.plan.enclaves[node.fqn]))
        env["PYTHONUNBUFFERED"] = "1"
        env["EDGE_LLM_BACKEND"] = child_backend(env)
        root = str(search_roots()[0])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def _spawn(self, name: str, cmd: list[str], required: bool, *, is_router: bool = False,
               node: NodeSpec | None = None, replace: _Child | None = None) -> _Child | None:
        """Start a process; `replace`: the exited child it takes the place (and color) of."""
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=self._child_env(node), start_new_session=True,
                                    preexec_fn=_die_with_parent(os.getpid()))
        except OSError as exc:
            self._log(f"cannot start {name} ({' '.join(cmd)}): {exc.strerror or exc}", error=True)
            return None
        if replace is not None and replace.exited and replace in self._children:
            child = _Child(name, proc, required, replace.color, is_router, node)
            self._children[self._children.index(replace)] = child
        else:
            child = _Child(name, proc, required, _COLORS[len(self._children) % len(_COLORS)], is_router, node)
            self._children.append(child)
        self._log(f"started {name} (pid {proc.pid})")
        for pipe, stream in ((proc.stdout, self._out), (proc.stderr, self._err)):
            reader = threading.Thread(target=self._pump, args=(pipe, stream, child), daemon=True,
                                      name=f"launcher-{name}-pump")
            reader.start()
            child.readers.append(reader)
        threading.Thread(target=self._reap, args=(child,), daemon=True, name=f"launcher-{name}-wait").start()
        return child

    def _reap(self, child: _Child) -> None:
        child.proc.wait()
        for reader in child.readers:  # its last lines come before the news of its exit
            reader.join(timeout=2.0)
        self._events.put(("exit", child))

    def _pump(self, pipe, stream: TextIO, child: _Child) -> None:
        prefix = f"[{child.name}-{child.proc.pid}]"
        if _isatty(stream):
            prefix = f"\033[{child.color}m{prefix}\033[0m"
        with pipe:
            for raw in iter(pipe.readline, b""):
                self._write(stream, f"{prefix} {raw.decode(errors='replace').rstrip(chr(13) + chr(10))}\n")

    # ---- output
    def _write(self, stream: TextIO, text: str) -> None:
        with self._write_lock:
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):  # closed or broken pipe: keep supervising
                pass

    def _log(self, message: str, error: bool = False) -> None:
        self._write(self._err if error else self._out, f"[launcher] {message}\n")

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, lambda signum, _frame: self._events.put(("signal", signum)))
        return previous


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def run_launch(plan: LaunchPlan, *, ready_event: threading.Event | None = None, **options: Any) -> int:
    """Run a plan in this process until it ends; `options` are Launcher's keyword arguments."""
    return Launcher(plan, **options).run(ready_event)
