"""The embedded launcher: `edge-llm-ros launch <name|file.launch.py|file.yaml> [name:=value ...]`.

Runs a deployment without ROS 2 from the same files `ros2 launch` reads. A
launch file `launch/<name>.launch.py` defines plain data at module level,

    CONFIG = "pipeline.yaml"             # a ROS 2 params file under config/
    NODES = [{"executable": "echo_node", "name": "echo_node", "namespace": "edge_llm",
              "remappings": [("response", "/out")], "required": True}, ...]

and a `generate_launch_description()` for ROS 2 that this launcher never
calls. Each node runs as its own process,

    python -m edge_llm_ros.nodes.<executable> --ros-args -r __node:=<name> -r __ns:=/<namespace>
        --params-file <config> [-p key:=value ...] [-r from:=to ...]

(a NODES entry may name another `module`, or a whole `cmd`; its `prefix`, as in
launch_ros, goes before the command, e.g. "taskset -c 1" or "nice -n 5"). A
`name:=value` launch argument overrides that parameter on every node whose
entries in the params file have it; any other name is an error.

Processes:
- A Zenoh router (`python -m edge_llm_ros.runtime.router`) starts first when
  none answers at the endpoint; every child gets EDGE_LLM_ZENOH_ROUTER.
- Each child runs in its own session, so a terminal's Ctrl-C reaches only the
  launcher, which forwards SIGINT once; PR_SET_PDEATHSIG makes a child get
  SIGTERM if the launcher dies without cleaning up (even SIGKILL).
- Output lines are forwarded as they come, prefixed `[<name>-<pid>] `
  (colored on a terminal); the launcher's own lines start with `[launcher]`.
- Shutdown (SIGINT/SIGTERM/SIGHUP to the launcher): SIGINT to every node,
  SIGTERM after --sigterm-timeout, SIGKILL after --sigkill-timeout (a second
  signal skips ahead); the router goes last.
- Exit code: 0 after a requested shutdown, 1 when a required process exits
  on its own, 2 for bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import queue
import re
import runpy
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .params import (
    ParamsError, format_param_value, list_nodes, load_params_file, node_fqn, parse_param_value,
)
from .router import ENDPOINT_ENV, router_endpoint, router_reachable

PACKAGE = "edge_llm_ros"
NODES_PACKAGE = f"{PACKAGE}.nodes"
ROUTER_NAME = "zenoh_router"
ROUTER_TIMEOUT_S = 10.0
_NODE_KEYS = ("executable", "name", "namespace", "remappings", "required", "module", "cmd", "prefix")
_COLORS = (36, 33, 35, 32, 34, 91, 96, 93, 95, 92, 94)
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENDPOINT = re.compile(r"tcp/(\[[0-9A-Fa-f:.]+\]|[^:/\[\]]+):\d{1,5}")


class LaunchError(ValueError):
    """A launch file, params file or launch argument that cannot be used; the message is one line."""


def search_roots() -> list[Path]:
    """Where launch/ and config/ are looked up: the source tree, then the install prefix."""
    return [Path(__file__).resolve().parents[2], Path(sys.prefix) / "share" / PACKAGE]


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


# ------------------------------------------------------------------ the plan
@dataclass
class NodeSpec:
    """One node process of a deployment."""

    executable: str
    name: str
    namespace: str = ""
    remappings: list[tuple[str, str]] = field(default_factory=list)
    required: bool = True
    module: str | None = None  # default edge_llm_ros.nodes.<executable>
    cmd: list[str] | None = None  # replaces [python, -m, module]
    prefix: list[str] = field(default_factory=list)  # before the command (launch_ros' prefix): taskset, nice ...
    parameters: dict[str, str] = field(default_factory=dict)  # launch-argument overrides, `-p` text

    @property
    def fqn(self) -> str:
        return node_fqn(self.namespace, self.name)

    @property
    def module_name(self) -> str:
        return self.module or f"{NODES_PACKAGE}.{self.executable}"

    @classmethod
    def from_entry(cls, entry: Any, source: Path) -> NodeSpec:
        """A NODES entry of a launch file, checked."""
        if not isinstance(entry, dict):
            raise LaunchError(f"{source}: each NODES entry is a dict, got {entry!r}")
        unknown = sorted(set(entry) - set(_NODE_KEYS))
        if unknown:
            raise LaunchError(f"{source}: unknown NODES key(s) {', '.join(unknown)} (known: {', '.join(_NODE_KEYS)})")
        executable = entry.get("executable")
        if not isinstance(executable, str) or not executable:
            raise LaunchError(f"{source}: NODES entry {entry!r} needs an 'executable'")
        remappings = []
        for pair in entry.get("remappings") or []:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise LaunchError(f"{source}: remappings are (from, to) pairs, got {pair!r}")
            remappings.append((pair[0], pair[1]))
        name, namespace = str(entry.get("name") or executable), str(entry.get("namespace") or "").strip("/")
        if not all(_TOKEN.fullmatch(t) for t in [name] + (namespace.split("/") if namespace else [])):
            raise LaunchError(f"{source}: invalid node name or namespace {namespace!r}/{name!r} "
                              "(letters, digits and underscores, not starting with a digit)")
        cmd = entry.get("cmd")
        if cmd is not None and not (isinstance(cmd, (list, tuple)) and cmd and all(isinstance(c, str) for c in cmd)):
            raise LaunchError(f"{source}: 'cmd' is a non-empty list of strings, got {cmd!r}")
        prefix = entry.get("prefix") or []
        if isinstance(prefix, str):
            prefix = shlex.split(prefix)
        if not (isinstance(prefix, (list, tuple)) and all(isinstance(p, str) for p in prefix)):
            raise LaunchError(f"{source}: 'prefix' is a string or a list of strings, got {prefix!r}")
        return cls(executable=executable, name=name, namespace=namespace, remappings=remappings,
                   required=bool(entry.get("required", True)), module=entry.get("module"),
                   cmd=list(cmd) if cmd else None, prefix=list(prefix))

    def command(self, params_file: Path | None) -> list[str]:
        base = self.prefix + (list(self.cmd) if self.cmd else [sys.executable, "-m", self.module_name])
        ros = ["--ros-args", "-r", f"__node:={self.name}"]
        if self.namespace:
            ros += ["-r", f"__ns:=/{self.namespace}"]
        if params_file is not None:
            ros += ["--params-file", str(params_file)]
        for key, text in self.parameters.items():
            ros += ["-p", f"{key}:={text}"]
        for src, dst in self.remappings:
            ros += ["-r", f"{src}:={dst}"]
        return base + ros


@dataclass
class LaunchPlan:
    """What to run: the nodes and the params file they share."""

    source: Path
    nodes: list[NodeSpec]
    params_file: Path | None = None

    def node_params(self) -> dict[str, dict[str, Any]]:
        """Node fqn -> the parameters the params file gives it."""
        if self.params_file is None:
            return {node.fqn: {} for node in self.nodes}
        return {node.fqn: load_params_file(self.params_file, node.fqn) for node in self.nodes}

    def launch_arguments(self) -> dict[str, dict[str, Any]]:
        """Parameter name -> {node fqn: value in the params file}: what `name:=value` may override."""
        declared: dict[str, dict[str, Any]] = {}
        for fqn, params in self.node_params().items():
            for key, value in params.items():
                declared.setdefault(key, {})[fqn] = value
        return declared


def read_launch_file(path: Path) -> tuple[list[NodeSpec], str | None]:
    """NODES and CONFIG of a launch file, read without calling generate_launch_description()."""
    try:
        scope = runpy.run_path(str(path), run_name="__edge_llm_launch__")
    except FileNotFoundError:
        raise LaunchError(f"{path}: no such launch file") from None
    except Exception as exc:  # a launch file is user code: any failure is a bad input
        raise LaunchError(f"{path}: cannot load launch file ({type(exc).__name__}: {_one_line(exc)})") from None
    nodes, config = scope.get("NODES"), scope.get("CONFIG")
    if not isinstance(nodes, (list, tuple)):
        raise LaunchError(f"{path}: a launch file defines NODES = [{{'executable': ..., 'name': ...}}, ...]")
    if config is not None and not isinstance(config, str):
        raise LaunchError(f"{path}: CONFIG is the name of a params file under config/, got {config!r}")
    specs = [NodeSpec.from_entry(entry, path) for entry in nodes]
    seen: set[str] = set()
    for spec in specs:
        if spec.fqn in seen:
            raise LaunchError(f"{path}: two nodes named {spec.fqn}")
        seen.add(spec.fqn)
    return specs, config


def find_config(config: str, launch_file: Path) -> Path:
    """CONFIG of a launch file: config/ next to its launch/, then config/ under each search root."""
    if Path(config).is_absolute():
        candidates = [Path(config)]
    else:
        candidates = [launch_file.resolve().parent.parent / "config" / config]
        candidates += [root / "config" / config for root in search_roots()]
    for candidate in dict.fromkeys(candidates):
        if candidate.is_file():
            return candidate
    raise LaunchError(f"{launch_file}: params file '{config}' not found "
                      f"(looked in {', '.join(str(c.parent) for c in dict.fromkeys(candidates))})")


def find_launch_file(name: str) -> Path:
    """launch/<name>.launch.py under the search roots."""
    dirs = [root / "launch" for root in search_roots()]
    for folder in dirs:
        if (folder / f"{name}.launch.py").is_file():
            return folder / f"{name}.launch.py"
    raise LaunchError(f"no launch file '{name}.launch.py' (looked in {', '.join(map(str, dirs))})")


def _launch_file_for(params_file: Path) -> Path | None:
    """A launch file whose CONFIG is this params file's name, if any."""
    dirs = [params_file.resolve().parent.parent / "launch"] + [root / "launch" for root in search_roots()]
    for folder in dict.fromkeys(dirs):
        for candidate in sorted(folder.glob("*.launch.py")):
            try:
                _, config = read_launch_file(candidate)
            except LaunchError:
                continue
            if config and Path(config).name == params_file.name:
                return candidate
    return None


def plan_from_params_file(path: Path) -> LaunchPlan:
    """A params file alone: its launch file's NODES if one names it, else one process per node entry."""
    entries = list_nodes(path)  # also reports a missing or malformed file
    launch_file = _launch_file_for(path)
    if launch_file is not None:
        nodes, _ = read_launch_file(launch_file)
        return LaunchPlan(path, nodes, path.resolve())
    if not entries:
        raise LaunchError(f"{path}: no node entries to run (only wildcard entries?)")
    nodes = []
    for fqn in entries:
        namespace, _, name = fqn.rpartition("/")
        nodes.append(NodeSpec(executable=name, name=name, namespace=namespace.strip("/")))
    return LaunchPlan(path, nodes, path.resolve())


def load_plan(target: str) -> LaunchPlan:
    """`target` is a launch file name, a .launch.py path or a params .yaml path."""
    path = Path(target)
    if path.suffix in (".yaml", ".yml"):
        return plan_from_params_file(path)
    if path.suffix != ".py" and "/" not in target:
        path = find_launch_file(target)
    nodes, config = read_launch_file(path)
    if not nodes:
        raise LaunchError(f"{path}: NODES is empty")
    params_file = find_config(config, path) if config else None
    if params_file is not None:
        list_nodes(params_file)  # a missing or malformed params file fails here, before anything runs
    return LaunchPlan(path, nodes, params_file)


def apply_launch_args(plan: LaunchPlan, arguments: list[str]) -> None:
    """`name:=value` launch arguments become `-p` overrides on every node whose parameters have that name."""
    declared = plan.launch_arguments()
    for item in arguments:
        key, sep, raw = item.partition(":=")
        if not sep or not key:
            raise LaunchError(f"launch arguments look like name:=value, got '{item}'")
        if key not in declared:
            where = plan.params_file or plan.source
            known = ", ".join(sorted(declared)) or "none"
            raise LaunchError(f"unknown launch argument '{key}': no node has that parameter in {where} "
                              f"(known: {known})")
        for node in plan.nodes:
            if node.fqn in declared[key]:
                node.parameters[key] = _override_text(key, raw, declared[key][node.fqn], plan.params_file)


def _override_text(key: str, raw: str, default: Any, params_file: Path | None) -> str:
    """The `-p` text for a launch argument, typed like the parameter it overrides."""
    if isinstance(default, str):
        return format_param_value(raw)
    value = parse_param_value(raw, f"launch argument '{key}'")
    if type(default) is float and type(value) is int:
        value = float(value)
    if isinstance(default, list) and isinstance(value, list) and default and value:
        if type(default[0]) is float and all(type(v) is int for v in value):
            value = [float(v) for v in value]
        if type(value[0]) is not type(default[0]):
            raise LaunchError(f"launch argument {key}:={raw} is a list of {type(value[0]).__name__}, but '{key}' "
                              f"is a list of {type(default[0]).__name__} in {params_file}")
    if type(value) is not type(default):
        raise LaunchError(f"launch argument {key}:={raw} is a {type(value).__name__}, but '{key}' "
                          f"is a {type(default).__name__} in {params_file}")
    return format_param_value(value)


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def check_executables(plan: LaunchPlan) -> None:
    for node in plan.nodes:
        if node.cmd is None and not _module_exists(node.module_name):
            raise LaunchError(f"no executable '{node.executable}' for node {node.fqn} "
                              f"(module {node.module_name} not found)")


# ------------------------------------------------------------------ processes
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


@dataclass(eq=False)
class _Child:
    name: str
    proc: subprocess.Popen
    required: bool
    color: int
    is_router: bool = False
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
        self._children: list[_Child] = []
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
            if self._spawn(node.name, node.command(self.plan.params_file), node.required) is None:
                return 1
        self._log(f"{len(self.plan.nodes)} node(s) running; Ctrl-C to stop")
        if ready_event is not None:
            ready_event.set()
        return self._supervise()

    def _ensure_router(self) -> int | None:
        if router_reachable(self.endpoint):
            self._log(f"using the zenoh router at {self.endpoint}")
            return None
        # = python -m edge_llm_ros.runtime.router, minus runpy's warning when the package imports the module
        script = f"import sys; from {PACKAGE}.runtime.router import main; sys.exit(main(sys.argv[1:]))"
        cmd = [sys.executable, "-c", script, "--listen", self.endpoint]
        router = self._spawn(ROUTER_NAME, cmd, required=True, is_router=True)
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
        self._log(f"zenoh router ready at {self.endpoint}")
        return None

    def _supervise(self) -> int:
        while True:
            event = self._next_event()
            code = self._handle(event) if event is not None else None
            if code is not None:
                return code
            if not any(not c.exited for c in self._children if not c.is_router):
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
        child.exited = True
        self._log(f"process {child.name} died (exit code {child.proc.returncode})", error=True)
        return 1 if child.required else None

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
    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[ENDPOINT_ENV] = self.endpoint
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("EDGE_LLM_BACKEND", "zenoh")
        root = str(search_roots()[0])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def _spawn(self, name: str, cmd: list[str], required: bool, is_router: bool = False) -> _Child | None:
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=self._child_env(), start_new_session=True,
                                    preexec_fn=_die_with_parent(os.getpid()))
        except OSError as exc:
            self._log(f"cannot start {name} ({' '.join(cmd)}): {exc.strerror or exc}", error=True)
            return None
        child = _Child(name, proc, required, _COLORS[len(self._children) % len(_COLORS)], is_router)
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


# ------------------------------------------------------------------------ CLI
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {_one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="edge-llm-ros launch", description="Run a deployment: one process per node.")
    parser.add_argument("target", help="launch file name (launch/<name>.launch.py), a .launch.py path, "
                                       "or a ROS 2 params .yaml (one process per node entry)")
    parser.add_argument("arguments", nargs="*", metavar="name:=value",
                        help="override a parameter on every node that has it in the params file")
    parser.add_argument("--router", metavar="ENDPOINT", default=None,
                        help=f"zenoh router endpoint, started if none answers (default ${ENDPOINT_ENV} "
                             f"or {router_endpoint()})")
    parser.add_argument("-s", "--show-args", action="store_true", help="list the launch arguments and exit")
    parser.add_argument("--sigterm-timeout", type=float, default=5.0, metavar="S",
                        help="seconds after SIGINT before SIGTERM on shutdown (default %(default)s)")
    parser.add_argument("--sigkill-timeout", type=float, default=5.0, metavar="S",
                        help="seconds after SIGTERM before SIGKILL on shutdown (default %(default)s)")
    return parser


def _show_args(plan: LaunchPlan) -> None:
    for key, values in sorted(plan.launch_arguments().items()):
        defaults = {format_param_value(v) for v in values.values()}
        default = defaults.pop() if len(defaults) == 1 else "(differs per node)"
        print(f"{key}:={default}    nodes: {', '.join(values)}")


def main(argv: list[str] | None = None) -> int:
    """`edge-llm-ros launch ...` (argv without the verb)."""
    args = build_parser().parse_intermixed_args(argv)
    endpoint = args.router or router_endpoint()
    try:
        if not _ENDPOINT.fullmatch(endpoint):
            raise LaunchError(f"router endpoint must look like tcp/HOST:PORT, got '{endpoint}'")
        plan = load_plan(args.target)
        apply_launch_args(plan, args.arguments)
        check_executables(plan)
    except (LaunchError, ParamsError) as exc:
        print(f"edge-llm-ros launch: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    if args.show_args:
        _show_args(plan)
        return 0
    launcher = Launcher(plan, router=endpoint, sigterm_timeout=args.sigterm_timeout,
                        sigkill_timeout=args.sigkill_timeout)
    return launcher.run()


if __name__ == "__main__":
    raise SystemExit(main())
