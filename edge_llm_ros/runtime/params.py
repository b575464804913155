"""ROS 2 command-line arguments, parameter files and name resolution, without ROS.

The embedded backend's nodes get the argv a ROS 2 node gets and read the same
params YAML, so one deployment description serves both backends:

    python -m edge_llm_ros.nodes.echo_node --ros-args -r __node:=echo_node -r __ns:=/edge_llm \\
        --params-file config/pipeline.yaml -p mode:=tree -r response:=/out

The rules are rcl's (arguments.c, rcl_yaml_param_parser, remap.c, rclcpp's
parameter_map):

- `-p name:=value` values are YAML scalars or flow lists, typed the YAML way
  (`1` int, `1.0` float, `true` bool, `[1, 2]` int list, anything else a
  string). Parameter values are never null, dicts or mixed-type lists, and
  integers are 64-bit (a longer one is an error here, where rcl would retype
  it as a double that an integer parameter then refuses).
- A params file maps node keys to `ros__parameters`. Keys nest as namespaces
  (`edge_llm: echo_node: ros__parameters:` is `/edge_llm/echo_node`); a bare
  `echo_node` means `/echo_node`, i.e. a node in the root namespace. In a key,
  `/*` stands for one name token and `/**` for any number (`/**` matches every
  node, `/**/echo_node` every node named echo_node).
- Every entry of a file that matches the node applies, in file order, later
  entries overriding earlier ones (rcl does not rank by specificity, so put
  wildcard entries first). Later files override earlier ones; `-p` overrides
  all files.
- Names: `foo` is `<ns>/foo`, `~/foo` is `<ns>/<node>/foo`, `/foo` stays;
  `{node}` and `{ns}` substitute. A remap rule `[node:]from:=to` matches when
  its expanded `from` equals the expanded name; the first matching rule wins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LOG_LEVELS = ("debug", "info", "warn", "warning", "error", "fatal", "unset")
_VALUE_FLAGS = {"-r": "remap", "--remap": "remap", "-p": "param", "--param": "param",
                "--params-file": "params-file", "--log-level": "log-level",
                "-e": "enclave", "--enclave": "enclave", "--log-config-file": "log-config-file",
                "--log-file-name": "log-file-name"}
_SWITCHES = {f"--{state}-{what}-logs" for state in ("enable", "disable")
             for what in ("rosout", "stdout", "external-lib")}
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT64 = (-(2**63), 2**63 - 1)


class ParamsError(ValueError):
    """A bad ROS argument, parameter value, parameters file or name; the message is one line."""


class _Loader(yaml.SafeLoader):
    """YAML 1.1 as rcl reads it, minus dates: `2024-01-01` stays a string."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


# ------------------------------------------------------------------ arguments
@dataclass(frozen=True)
class Remap:
    """One `-r [node:]src:=dst` rule; `node` limits it to the node of that (original) name."""

    src: str
    dst: str
    node: str | None = None


@dataclass
class RosArgs:
    """What `--ros-args ... [--]` sections of an argv say, plus the argv's other arguments."""

    remaps: list[Remap] = field(default_factory=list)  # includes __node / __ns rules, in order
    params: dict[str, Any] = field(default_factory=dict)  # -p, typed
    params_files: list[str] = field(default_factory=list)
    log_level: str | None = None
    log_levels: dict[str, str] = field(default_factory=dict)  # --log-level logger:=level
    options: dict[str, Any] = field(default_factory=dict)  # accepted, no effect here (--enclave, rosout...)
    args: list[str] = field(default_factory=list)  # everything outside --ros-args

    @property
    def node_name(self) -> str | None:
        """The node name from the first `-r __node:=NAME` without a node prefix."""
        return _first(self.remaps, "__node", None)

    @property
    def namespace(self) -> str | None:
        """The namespace from the first `-r __ns:=/NS` without a node prefix, normalized to '/NS'."""
        ns = _first(self.remaps, "__ns", None)
        return None if ns is None else normalize_namespace(ns)

    def node_identity(self, default_name: str, default_namespace: str = "/") -> tuple[str, str]:
        """(name, namespace) after remapping, honouring node-prefixed rules like `-r talker:__node:=x`."""
        name = _first(self.remaps, "__node", default_name) or default_name
        ns = _first(self.remaps, "__ns", default_name)
        return name, normalize_namespace(default_namespace if ns is None else ns)

    def parameters(self, node_fqn: str) -> dict[str, Any]:
        """The node's parameter overrides: every --params-file in order, then -p."""
        return {**load_params_files(self.params_files, node_fqn), **self.params}


def _first(remaps: Iterable[Remap], src: str, node_name: str | None) -> str | None:
    for rule in remaps:
        if rule.src == src and (rule.node is None or rule.node == node_name):
            return rule.dst
    return None


def parse_ros_args(argv: Iterable[str]) -> RosArgs:
    """Parse an argv (with or without the program name) the way rcl_parse_arguments does."""
    out = RosArgs()
    argv = list(argv)
    in_ros, i = False, 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--ros-args":
            in_ros = True
        elif not in_ros:
            out.args.append(arg)
        elif arg == "--":
            in_ros = False
        elif arg in _SWITCHES:
            out.options[arg.lstrip("-")] = True
        elif arg in _VALUE_FLAGS:
            if i >= len(argv) or argv[i] in ("--", "--ros-args"):
                raise ParamsError(f"ROS argument {arg} needs a value")
            _apply(out, _VALUE_FLAGS[arg], argv[i])
            i += 1
        else:
            raise ParamsError(f"unknown ROS argument '{arg}'")
    return out


def _apply(out: RosArgs, kind: str, value: str) -> None:
    if kind == "remap":
        out.remaps.append(_parse_remap(value))
    elif kind == "param":
        name, sep, text = value.partition(":=")
        if not sep or not name:
            raise ParamsError(f"-p expects name:=value, got '{value}'")
        out.params[name] = parse_param_value(text, f"parameter '{name}'")
    elif kind == "params-file":
        out.params_files.append(value)
    elif kind == "log-level":
        logger, sep, level = value.rpartition(":=")
        level = _log_level(level)
        if sep:
            out.log_levels[logger] = level
        else:
            out.log_level = level
    else:
        out.options[kind] = value


def _parse_remap(text: str) -> Remap:
    lhs, sep, dst = text.partition(":=")
    node, _, src = lhs.rpartition(":") if ":" in lhs else (None, "", lhs)
    if not sep or not src or not dst or node == "":
        raise ParamsError(f"-r expects [node:]from:=to, got '{text}'")
    if src in ("__node", "__name") and not _TOKEN.fullmatch(dst):
        raise ParamsError(f"invalid node name '{dst}' in -r {text}")
    return Remap("__node" if src == "__name" else src, dst, node)


def _log_level(level: str) -> str:
    if level.lower() not in LOG_LEVELS:
        raise ParamsError(f"unknown log level '{level}' (expected one of {', '.join(LOG_LEVELS)})")
    return "warn" if level.lower() == "warning" else level.lower()


# --------------------------------------------------------------------- values
def parse_param_value(text: str, what: str = "parameter") -> Any:
    """A `-p` value as rcl types it: YAML scalar or flow list."""
    try:
        value = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{what}: cannot parse value '{_clip(text)}' ({_yaml_problem(exc)})") from None
    except ValueError as exc:  # an integer of more than 4300 digits, which Python will not convert
        raise ParamsError(f"{what}: cannot parse value '{_clip(text)}' ({_value_problem(exc)})") from None
    return check_value(value, what)


def format_param_value(value: Any) -> str:
    """The `-p` text that parse_param_value reads back as `value` (strings quoted where YAML would retype them)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
    return text[:-3].rstrip() if text.endswith("\n...") else text


def check_value(value: Any, what: str) -> Any:
    """A valid ROS parameter value (bool, int, float, str or a list of one of them), else ParamsError."""
    if isinstance(value, (bool, int, float, str)):
        _check_int64(value, what)
        return value
    if isinstance(value, list):
        types = {type(item) for item in value}
        if len(types) > 1 or not types <= {bool, int, float, str}:
            raise ParamsError(f"{what}: a list must hold values of one type (bool, int, float or string), "
                              f"got {_clip(repr(value))}")
        for item in value:
            _check_int64(item, what)
        return value
    if value is None:
        raise ParamsError(f"{what} has no value")
    raise ParamsError(f"{what}: unsupported value {value!r} (expected a scalar or a list)")


def _check_int64(value: Any, what: str) -> None:
    """ROS integer parameters are int64."""
    lo, hi = _INT64
    if isinstance(value, int) and not isinstance(value, bool) and not lo <= value <= hi:
        shown = str(value) if value.bit_length() <= 128 else f"an integer of {value.bit_length()} bits"
        raise ParamsError(f"{what}: {shown} is out of range for an integer parameter (int64 [{lo}, {hi}])")


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _value_problem(exc: ValueError) -> str:
    return str(exc).split(";")[0]  # not Python's advice to raise its limit


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"


# ---------------------------------------------------------------- params file
def read_params_file(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """Every node entry of a params file, in file order: (node key like '/ns/name' or '/**', flat params)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such parameters file") from None
    except OSError as exc:
        raise ParamsError(f"{path}: cannot read parameters file ({exc.strerror})") from None
    try:
        doc = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: malformed YAML ({_yaml_problem(exc)})") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise ParamsError(f"{path}: cannot read a value ({_value_problem(exc)})") from None
    if doc is None:
        return []
    if not isinstance(doc, dict):
        raise ParamsError(f"{path}: a parameters file maps node names to ros__parameters, "
                          f"got a {type(doc).__name__}")
    entries: list[tuple[str, dict[str, Any]]] = []
    _collect_nodes(doc, [], path, entries)
    return entries


def _collect_nodes(mapping: dict, parts: list[str], path: Path, entries: list) -> None:
    for key, value in mapping.items():
        key = str(key)
        if key == "ros__parameters":
            raise ParamsError(f"{path}: ros__parameters needs a node name above it")
        here = parts + [key.strip("/")]
        where = "/".join(here)
        if not isinstance(value, dict) or not value:
            raise ParamsError(f"{path}: node entry '{where}' has no ros__parameters")
        if "ros__parameters" not in value:
            _collect_nodes(value, here, path, entries)
            continue
        extra = sorted(str(k) for k in value if k != "ros__parameters")
        if extra:
            raise ParamsError(f"{path}: node entry '{where}' has keys beside ros__parameters: {', '.join(extra)}")
        params = value["ros__parameters"] or {}
        if not isinstance(params, dict):
            raise ParamsError(f"{path}: ros__parameters of '{where}' must be a mapping")
        flat: dict[str, Any] = {}
        _flatten(params, "", flat, f"{path}: parameter", where)
        entries.append(("/" + where, flat))


def _flatten(params: dict, prefix: str, flat: dict, what: str, node: str) -> None:
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            _flatten(value, f"{name}.", flat, what, node)
        else:
            flat[name] = check_value(value, f"{what} '{name}' of '{node}'")


def node_key_matches(key: str, node_fqn: str) -> bool:
    """Does a params-file node key ('/ns/name', '/**', '/**/name', '/*') match a fully qualified node name?"""
    pattern = ""
    for token in key.strip("/").split("/"):
        if token == "**":
            pattern += r"(?:/[A-Za-z0-9_]+)*"
        elif token == "*":
            pattern += r"/[A-Za-z0-9_]+"
        else:
            pattern += "/" + re.escape(token)
    return re.fullmatch(pattern, node_fqn) is not None


def load_params_files(paths: Iterable[str | Path], node_fqn: str) -> dict[str, Any]:
    """The parameters params files give the node `node_fqn`, in order: a later file overrides an earlier one."""
    values: dict[str, Any] = {}
    for path in paths:
        values.update(load_params_file(path, node_fqn))
    return values


def load_params_file(path: str | Path, node_fqn: str) -> dict[str, Any]:
    """The parameters a params file gives the node `node_fqn` ('/ns/name'), dotted names, typed values."""
    node_fqn = "/" + node_fqn.strip("/")
    values: dict[str, Any] = {}
    for key, params in read_params_file(path):
        if node_key_matches(key, node_fqn):
            values.update(params)
    return values


def list_nodes(path: str | Path) -> list[str]:
    """The fully qualified names of the concrete (wildcard-free) node entries of a params file, in order."""
    return list(dict.fromkeys(key for key, _ in read_params_file(path) if "*" not in key))


# ---------------------------------------------------------------------- names
def normalize_namespace(namespace: str | None) -> str:
    """'', '/' -> '/'; 'ns', '/ns/' -> '/ns'."""
    inner = (namespace or "").strip("/")
    return f"/{inner}" if inner else "/"


def node_fqn(namespace: str | None, name: str) -> str:
    return f"{normalize_namespace(namespace).rstrip('/')}/{name}"


def expand_name(name: str, namespace: str, node_name: str) -> str:
    """A topic or service name made fully qualified (rcl_expand_topic_name)."""
    namespace = normalize_namespace(namespace)
    ns_prefix = namespace.rstrip("/")
    expanded = name.replace("{node}", node_name).replace("{ns}", namespace).replace("{namespace}", namespace)
    if expanded == "~" or expanded.startswith("~/"):
        expanded = f"{ns_prefix}/{node_name}{expanded[1:]}"
    elif not expanded.startswith("/"):
        expanded = f"{ns_prefix}/{expanded}"
    tokens = expanded[1:].split("/")
    if not name or not all(_TOKEN.fullmatch(t) for t in tokens):
        raise ParamsError(f"invalid name '{name}' (tokens are letters, digits and underscores, "
                          f"not starting with a digit)")
    return expanded


def _remap_rules(remaps: Mapping[str, str] | Iterable[Remap] | None) -> Iterable[Remap]:
    if not remaps:
        return ()
    if isinstance(remaps, Mapping):
        return [Remap(src, dst) for src, dst in remaps.items()]
    return remaps


def resolve_name(name: str, namespace: str, node_name: str,
                 remaps: Mapping[str, str] | Iterable[Remap] | None = None) -> str:
    """The fully qualified name after expansion and the first matching remap rule."""
    expanded = expand_name(name, namespace, node_name)
    for rule in _remap_rules(remaps):
        if rule.src.startswith("__") or (rule.node is not None and rule.node != node_name):
            continue
        if expand_name(rule.src, namespace, node_name) == expanded:
            return expand_name(rule.dst, namespace, node_name)
    return expanded


__all__ = [
    "LOG_LEVELS", "ParamsError", "Remap", "RosArgs", "check_value", "expand_name", "format_param_value", "list_nodes",
    "load_params_file", "load_params_files", "node_fqn", "node_key_matches", "normalize_namespace", "parse_param_value",
    "parse_ros_args", "read_params_file", "resolve_name",
]
