"""The launch plan: what a deployment runs, read from a launch file, a params file and launch arguments.

A launch file `launch/<name>.launch.py` gives NODES and CONFIG as plain data
(see the package docstring); each NODES entry becomes a NodeSpec, and a
LaunchPlan holds them with the params file they share. `name:=value` launch
arguments become `-p` overrides, typed like the parameters they replace.
Nothing here starts a process; any bad input raises LaunchError (one line).
"""

from __future__ import annotations

import importlib.util
import re
import runpy
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_llm_ros.runtime.params import format_param_value, list_nodes, load_params_files, node_fqn, parse_param_value

PACKAGE = "edge_llm_ros"
FOXGLOVE_PORT = 8765  # foxglove_port's default: the Foxglove app's default connection
NODES_PACKAGE = f"{PACKAGE}.nodes"
_NODE_KEYS = ("executable", "name", "namespace", "remappings", "required", "module", "cmd", "prefix",
              "respawn", "respawn_delay", "respawn_max_retries", "lifecycle")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class LaunchError(ValueError):
    """A launch file, params file or launch argument that cannot be used; the message is one line."""


def search_roots() -> list[Path]:
    """Where launch/ and config/ are looked up: the source tree, then the install prefix."""
    return [Path(__file__).resolve().parents[3], Path(sys.prefix) / "share" / PACKAGE]


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


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
    respawn: bool = False  # launch's ExecuteProcess: start it again when it exits on its own ...
    respawn_delay: float = 0.0  # ... this many seconds later ...
    respawn_max_retries: int = -1  # ... at most this many times (negative: no limit)
    lifecycle: bool = False  # a managed node: `ros2 launch` drives it to active; here it starts itself (autostart)

    def may_respawn(self, respawns_so_far: int) -> bool:
        return self.respawn and (self.respawn_max_retries < 0 or respawns_so_far < self.respawn_max_retries)

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
        respawn, delay, retries = (entry.get(key, default) for key, default in (
            ("respawn", False), ("respawn_delay", 0.0), ("respawn_max_retries", -1)))
        if not isinstance(respawn, bool):
            raise LaunchError(f"{source}: node {name}: 'respawn' is True or False, got {respawn!r}")
        delay = 0.0 if delay is None else delay  # launch's default: None, no delay
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay < float("inf"):
            raise LaunchError(f"{source}: node {name}: 'respawn_delay' is seconds >= 0, got {delay!r}")
        if isinstance(retries, bool) or not isinstance(retries, int):
            raise LaunchError(f"{source}: node {name}: 'respawn_max_retries' is an int (-1: no limit), "
                              f"got {retries!r}")
        lifecycle = entry.get("lifecycle", False)
        if not isinstance(lifecycle, bool):
            raise LaunchError(f"{source}: node {name}: 'lifecycle' is True or False, got {lifecycle!r}")
        return cls(executable=executable, name=name, namespace=namespace, remappings=remappings,
                   required=bool(entry.get("required", True)), module=entry.get("module"),
                   cmd=list(cmd) if cmd else None, prefix=list(prefix),
                   respawn=respawn, respawn_delay=float(delay), respawn_max_retries=retries, lifecycle=lifecycle)

    def command(self, params_files: Sequence[Path] = ()) -> list[str]:
        """The node's command line: ``params_files`` in order (a later one overrides an earlier one), then
        the launch arguments' ``-p`` overrides."""
        base = self.prefix + (list(self.cmd) if self.cmd else [sys.executable, "-m", self.module_name])
        ros = ["--ros-args", "-r", f"__node:={self.name}"]
        if self.namespace:
            ros += ["-r", f"__ns:=/{self.namespace}"]
        for params_file in params_files:
            ros += ["--params-file", str(params_file)]
        for key, text in self.parameters.items():
            ros += ["-p", f"{key}:={text}"]
        for src, dst in self.remappings:
            ros += ["-r", f"{src}:={dst}"]
        return base + ros


@dataclass
class LaunchPlan:
    """What to run: the nodes and the params file they share (with the overlays a launch argument named)."""

    source: Path
    nodes: list[NodeSpec]
    params_file: Path | None = None
    # The launch file's select_nodes(arguments) -> names of the NODES entries to start, given every
    # launch argument's value as text (the params file's where none was given): a launch file whose
    # node count depends on an argument (launch/stages.launch.py). ValueError: the arguments are bad.
    select: Callable[[dict[str, str]], list[str]] | None = None
    # The launch file's OVERLAY: the launch argument (`plan` in stages.launch.py) whose value is a params
    # file layered over params_file; the files it named so far.
    overlay: str | None = None
    overlays: list[Path] = field(default_factory=list)
    # The launch file's RVIZ: an rviz2 config under config/ that `rviz:=true` opens; whether it was asked.
    rviz: str | None = None
    rviz_asked: bool = False
    foxglove_port: int | None = None  # foxglove:=true: a foxglove_bridge_node on this port
    keystore: Path | None = None  # keystore:=DIR: the secured router and one enclave per node (runtime/security.py)
    enclaves: dict[str, str] = field(default_factory=dict)  # with a keystore: node fqn -> its enclave

    @property
    def params_files(self) -> list[Path]:
        """Every params file the nodes get, in order: a later one overrides an earlier one."""
        return ([self.params_file] if self.params_file is not None else []) + self.overlays

    def node_params(self) -> dict[str, dict[str, Any]]:
        """Node fqn -> the parameters the params files give it."""
        return {node.fqn: load_params_files(self.params_files, node.fqn) for node in self.nodes}

    def launch_arguments(self) -> dict[str, dict[str, Any]]:
        """Parameter name -> {node fqn: value in the params file}: what `name:=value` may override."""
        declared: dict[str, dict[str, Any]] = {}
        for fqn, params in self.node_params().items():
            for key, value in params.items():
                declared.setdefault(key, {})[fqn] = value
        return declared


def read_launch_file(path: Path) -> tuple[list[NodeSpec], str | None]:
    """NODES and CONFIG of a launch file, read without calling generate_launch_description()."""
    nodes, config, _, _, _ = _read_launch_scope(path)
    return nodes, config


def _read_launch_scope(path: Path) -> tuple[list[NodeSpec], str | None, Callable | None, str | None, str | None]:
    """NODES, CONFIG, select_nodes, OVERLAY and RVIZ (None where the file has none) of a launch file."""
    try:
        scope = runpy.run_path(str(path), run_name="__edge_llm_launch__")
    except FileNotFoundError:
        raise LaunchError(f"{path}: no such launch file") from None
    except Exception as exc:  # a launch file is user code: any failure is a bad input
        raise LaunchError(f"{path}: cannot load launch file ({type(exc).__name__}: {_one_line(exc)})") from None
    nodes, config, select = scope.get("NODES"), scope.get("CONFIG"), scope.get("select_nodes")
    overlay, rviz = scope.get("OVERLAY"), scope.get("RVIZ")
    if rviz is not None and not (isinstance(rviz, str) and rviz.endswith(".rviz")):
        raise LaunchError(f"{path}: RVIZ is the name of an rviz2 config under config/, got {rviz!r}")
    if select is not None and not callable(select):
        raise LaunchError(f"{path}: select_nodes is a function of the launch arguments, got {select!r}")
    if overlay is not None and not (isinstance(overlay, str) and _TOKEN.fullmatch(overlay)):
        raise LaunchError(f"{path}: OVERLAY is the name of a launch argument, got {overlay!r}")
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
    return specs, config, select, overlay, rviz


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
    nodes, config, select, overlay, rviz = _read_launch_scope(path)
    if not nodes:
        raise LaunchError(f"{path}: NODES is empty")
    params_file = find_config(config, path) if config else None
    if params_file is not None:
        list_nodes(params_file)  # a missing or malformed params file fails here, before anything runs
    return LaunchPlan(path, nodes, params_file, select, overlay, rviz=rviz)


def _flag(key: str, raw: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise LaunchError(f"launch argument {key}:={raw}: must be true or false")
    return raw.lower() == "true"


def launcher_arguments(plan: LaunchPlan, arguments: list[str]) -> list[str]:
    """Take the arguments every launch has (``foxglove``, ``foxglove_port``, ``keystore``; ``rviz`` where
    the launch file names an RVIZ config) off ``arguments``; the rest, which set parameters."""
    rest, foxglove, port = [], False, FOXGLOVE_PORT
    for item in arguments:
        key, _, raw = item.partition(":=")
        if key == "keystore":
            plan.keystore = Path(raw).expanduser().resolve() if raw else None
        elif key == "rviz" and plan.rviz is not None:
            plan.rviz_asked = _flag(key, raw)
        elif key == "foxglove":
            foxglove = _flag(key, raw)
        elif key == "foxglove_port":
            if not (raw.isdigit() and int(raw) <= 65535):
                raise LaunchError(f"launch argument foxglove_port:={raw}: must be a port number in [0, 65535]")
            port = int(raw)
        else:
            rest.append(item)
    plan.foxglove_port = port if foxglove else None
    return rest


def apply_launch_args(plan: LaunchPlan, arguments: list[str]) -> None:
    """`name:=value` launch arguments become `-p` overrides on every node whose parameters have that name;
    the launch file's OVERLAY argument names a params file layered over its CONFIG (before the overrides).
    `foxglove:=true` adds a foxglove_bridge_node (on `foxglove_port`, 8765 by default) to any launch."""
    arguments = launcher_arguments(plan, arguments)
    for item in arguments:
        key, sep, raw = item.partition(":=")
        if not sep or not key:
            raise LaunchError(f"launch arguments look like name:=value, got '{item}'")
        if key == plan.overlay and raw:
            path = Path(raw).expanduser()
            if not path.is_file():
                raise LaunchError(f"launch argument {key}:={raw}: no such params file")
            list_nodes(path)  # a malformed params file fails here, before anything runs
            plan.overlays.append(path.resolve())
    declared = plan.launch_arguments()
    for item in arguments:
        key, _, raw = item.partition(":=")
        if key == plan.overlay:
            continue
        if key not in declared:
            where = plan.params_file or plan.source
            known = ", ".join(sorted([*declared, *([plan.overlay] if plan.overlay else [])])) or "none"
            raise LaunchError(f"unknown launch argument '{key}': no node has that parameter in {where} "
                              f"(known: {known})")
        for node in plan.nodes:
            if node.fqn in declared[key]:
                node.parameters[key] = _override_text(key, raw, declared[key][node.fqn], plan.params_file)
    if plan.select is not None:
        select_nodes(plan, declared, arguments)
    if plan.foxglove_port is not None:
        namespace = next((n.namespace for n in plan.nodes if n.namespace), "edge_llm")
        plan.nodes.append(NodeSpec("foxglove_bridge_node", "foxglove_bridge", namespace, required=False,
                                   parameters={"port": str(plan.foxglove_port)}))
    if plan.keystore is not None:
        check_keystore(plan)


def check_keystore(plan: LaunchPlan) -> None:
    """keystore:=DIR: an enclave for every node, and every certificate, key and CA good, before anything starts."""
    from edge_llm_ros.runtime.security import Keystore, SecurityError, check_secured_config

    store = Keystore(plan.keystore)
    try:
        if not plan.keystore.is_dir():
            raise SecurityError(f"keystore {plan.keystore}: no such directory (make one: edge-llm-ros security create)")
        plan.enclaves = {node.fqn: store.enclave_of(node.fqn) for node in plan.nodes}
        for config in [store.router_config, *{store.session_config(e) for e in plan.enclaves.values()}]:
            check_secured_config(config)
    except SecurityError as exc:
        raise LaunchError(f"keystore:={plan.keystore}: {exc}") from None


def select_nodes(plan: LaunchPlan, declared: dict[str, dict[str, Any]], arguments: list[str]) -> None:
    """Keep the nodes the launch file's select_nodes names for these launch arguments."""
    values = {}
    for key, per_node in declared.items():
        default = next(iter(per_node.values()))
        values[key] = default if isinstance(default, str) else format_param_value(default)
    values.update(item.partition(":=")[::2] for item in arguments)
    try:
        names = set(plan.select(values))
    except ValueError as exc:
        raise LaunchError(f"{plan.source}: {exc}") from None
    unknown = names - {node.name for node in plan.nodes}
    if unknown or not names:
        raise LaunchError(f"{plan.source}: select_nodes named {sorted(unknown) or 'no node'}; NODES has "
                          f"{', '.join(node.name for node in plan.nodes)}")
    plan.nodes = [node for node in plan.nodes if node.name in names]


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
