"""Message, service and action types for the embedded backend.

One definition: the `.msg`, `.srv` and `.action` files in the package's
`msg/`, `srv/` and `action/` folders (the files colcon builds under ROS 2) are
parsed here with rosbags' type system, on top of rosbags' copy of the standard
ROS 2 (Jazzy) interfaces, and with them the vendored interface packages under
`interfaces/` (unitree_api: the Go2's sport API). The same store gives CDR
(de)serialisation, the message definitions rosbag2 writes into bags, and RIHS01
type hashes.

Services and actions are composed the way rosidl composes them, so their
hashes are computed over the same type descriptions:

    pkg/srv/X            {request_message: X_Request, response_message: X_Response, event_message: X_Event}
    pkg/srv/X_Event      {info: service_msgs/ServiceEventInfo, request: X_Request[<=1], response: X_Response[<=1]}
    pkg/action/A         {goal, result, feedback, send_goal_service, get_result_service, feedback_message}
    pkg/action/A_SendGoal  request {goal_id: UUID, goal: A_Goal}   response {accepted: bool, stamp: Time}
    pkg/action/A_GetResult request {goal_id: UUID}                 response {status: int8, result: A_Result}
    pkg/action/A_FeedbackMessage {goal_id: UUID, feedback: A_Feedback}

Values are checked against their field types where they enter (from_dict,
assignment to a numeric array field, serialize), so a bad one is an
InterfaceError naming the field; values.py says what each ROS type takes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.base import Nodetype

# InterfaceError is defined beside the value checks that raise it; the runtime imports it from here.
from edge_llm_ros.runtime.values import (
    NUMPY_DTYPES,
    InterfaceError,
    as_array,
    misfit,
    yaml_array,
    yaml_field,
    yaml_list,
)

PACKAGE = "edge_llm_ros"
# Interface packages kept in this repository beside this one (interfaces/<name>/msg), for robots whose
# own packages define them: unitree_api, as unitreerobotics/unitree_ros2 does (go2_bridge_node).
VENDORED = ("unitree_api",)


def interface_dirs(package: str = PACKAGE) -> list[Path]:
    """Where a package's msg/, srv/ and action/ folders may be, in order: the source tree (this
    package's root, or interfaces/<package> for a vendored one); the share/<package> of the install
    prefix this module is in (colcon's install/edge_llm_ros, whose lib/python3.x/site-packages holds
    it); the virtual environment's (where pip puts setup.py's data_files); every AMENT_PREFIX_PATH's."""
    here = Path(__file__).resolve().parents[2]
    prefix = here.parents[2] if len(here.parents) > 2 else here  # here is <prefix>/lib/python3.x/site-packages
    source = here if package == PACKAGE else here / "interfaces" / package
    ament = [Path(p) for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    return list(dict.fromkeys([source, *(p / "share" / package for p in (prefix, Path(sys.prefix), *ament))]))


def _find_interface_root(package: str = PACKAGE) -> Path | None:
    """The first of interface_dirs(package) with a msg/ folder; None where none has one."""
    return next((root for root in interface_dirs(package) if (root / "msg").is_dir()), None)


def _split_sections(text: str, count: int, path: Path) -> list[str]:
    sections: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip() == "---":
            sections.append([])
        else:
            sections[-1].append(line)
    if len(sections) != count:
        raise InterfaceError(f"{path}: expected {count} sections separated by '---', found {len(sections)}")
    return ["\n".join(s) + "\n" for s in sections]


@dataclass(frozen=True)
class ServiceType:
    """A service: its name and the names of its request and response messages."""

    name: str
    request: str
    response: str


@dataclass(frozen=True)
class ActionType:
    """An action and the message/service types rosidl derives from it."""

    name: str
    goal: str
    result: str
    feedback: str
    send_goal: ServiceType
    get_result: ServiceType
    feedback_message: str


class Registry:
    """All types the runtime can send: standard ROS 2 interfaces plus this package's and VENDORED's."""

    def __init__(self, root: Path | None = None):
        self.store = get_typestore(Stores.ROS2_JAZZY)
        _char_as_uint8(self.store.fielddefs)
        self.services: dict[str, ServiceType] = {}
        self.actions: dict[str, ActionType] = {}
        self._classes: dict[str, type] = {}
        self._lock = threading.Lock()
        root = root or _find_interface_root()
        if root is None:
            raise InterfaceError(f"cannot find the {PACKAGE} msg/ folder in {[str(p) for p in interface_dirs()]}")
        self._load_package(root)
        for package in VENDORED:  # where one is missing, only its types are unknown (go2_bridge's sport output)
            vendored = _find_interface_root(package)
            if vendored is not None:
                self._load_package(vendored, package)
        self._add_standard_services()

    # ----------------------------------------------------------------- loading
    def _register_msg(self, name: str, text: str, source: Path | str) -> None:
        try:
            types = get_types_from_msg(text, name)
        except Exception as exc:  # rosbags raises several parser error types
            raise InterfaceError(f"{source}: cannot parse {name}: {exc}") from exc
        self.store.register(_undo_srv_rename(types))

    def _register_service(self, name: str, request_text: str, response_text: str, source: Path | str) -> ServiceType:
        srv = ServiceType(name, f"{name}_Request", f"{name}_Response")
        self._register_msg(srv.request, request_text, source)
        self._register_msg(srv.response, response_text, source)
        event = (
            "service_msgs/ServiceEventInfo info\n"
            f"{srv.request}[<=1] request\n{srv.response}[<=1] response\n"
        )
        self._register_msg(f"{name}_Event", event, source)
        self._register_msg(
            name,
            f"{srv.request} request_message\n{srv.response} response_message\n{name}_Event event_message\n",
            source,
        )
        self.services[name] = srv
        return srv

    def _register_action(self, name: str, text: str, path: Path) -> None:
        goal_text, result_text, feedback_text = _split_sections(text, 3, path)
        goal, result, feedback = f"{name}_Goal", f"{name}_Result", f"{name}_Feedback"
        self._register_msg(goal, goal_text, path)
        self._register_msg(result, result_text, path)
        self._register_msg(feedback, feedback_text, path)
        send_goal = self._register_service(
            f"{name}_SendGoal",
            f"unique_identifier_msgs/UUID goal_id\n{goal} goal\n",
            "bool accepted\nbuiltin_interfaces/Time stamp\n",
            path,
        )
        get_result = self._register_service(
            f"{name}_GetResult",
            "unique_identifier_msgs/UUID goal_id\n",
            f"int8 status\n{result} result\n",
            path,
        )
        feedback_message = f"{name}_FeedbackMessage"
        self._register_msg(feedback_message, f"unique_identifier_msgs/UUID goal_id\n{feedback} feedback\n", path)
        self._register_msg(
            name,
            f"{goal} goal\n{result} result\n{feedback} feedback\n"
            f"{send_goal.name} send_goal_service\n{get_result.name} get_result_service\n"
            f"{feedback_message} feedback_message\n",
            path,
        )
        self.actions[name] = ActionType(name, goal, result, feedback, send_goal, get_result, feedback_message)

    def _load_package(self, root: Path, package: str = PACKAGE) -> None:
        # Messages first (services and actions refer to them), in name order so
        # that a message referring to another registers after it.
        pending = {f"{package}/msg/{p.stem}": p for p in sorted((root / "msg").glob("*.msg"))}
        while pending:
            progress = False
            for name, path in list(pending.items()):
                try:
                    self._register_msg(name, path.read_text(), path)
                except InterfaceError:
                    continue
                del pending[name]
                progress = True
            if not progress:  # report the first real parse error
                name, path = next(iter(pending.items()))
                self._register_msg(name, path.read_text(), path)
        for path in sorted((root / "srv").glob("*.srv")):
            request, response = _split_sections(path.read_text(), 2, path)
            self._register_service(f"{package}/srv/{path.stem}", request, response, path)
        for path in sorted((root / "action").glob("*.action")):
            self._register_action(f"{package}/action/{path.stem}", path.read_text(), path)

    def _add_standard_services(self) -> None:
        # The standard services the action protocol and managed nodes (runtime/lifecycle.py) need.
        lifecycle = {
            "ChangeState": ("lifecycle_msgs/Transition transition\n", "bool success\n"),
            "GetState": ("", "lifecycle_msgs/State current_state\n"),
            "GetAvailableStates": ("", "lifecycle_msgs/State[] available_states\n"),
            "GetAvailableTransitions": ("", "lifecycle_msgs/TransitionDescription[] available_transitions\n"),
        }
        for name, (request, response) in lifecycle.items():
            self._register_service(f"lifecycle_msgs/srv/{name}", request, response, f"lifecycle_msgs/srv/{name}.srv")
        self._register_service(
            "action_msgs/srv/CancelGoal",
            "action_msgs/GoalInfo goal_info\n",
            "int8 ERROR_NONE=0\nint8 ERROR_REJECTED=1\nint8 ERROR_UNKNOWN_GOAL_ID=2\nint8 ERROR_GOAL_TERMINATED=3\n"
            "int8 return_code\naction_msgs/GoalInfo[] goals_canceling\n",
            "action_msgs/srv/CancelGoal.srv",
        )

    # ----------------------------------------------------------------- lookup
    def check_message(self, name: str) -> str:
        name = normalize_name(name, "msg")
        if name not in self.store.fielddefs:
            raise InterfaceError(f"unknown message type '{name}'")
        return name

    def service(self, name: str) -> ServiceType:
        name = normalize_name(name, "srv")
        if name not in self.services:
            raise InterfaceError(f"unknown service type '{name}'")
        return self.services[name]

    def action(self, name: str) -> ActionType:
        name = normalize_name(name, "action")
        if name not in self.actions:
            raise InterfaceError(f"unknown action type '{name}'")
        return self.actions[name]

    def type_hash(self, name: str) -> str:
        """RIHS01 hash of a message, service or action type (as rosidl computes it)."""
        return self.store.hash_rihs01(name)

    def msgdef(self, name: str) -> str:
        """The concatenated definition rosbag2 stores for a topic of this type."""
        return self.store.generate_msgdef(self.check_message(name), ros_version=2)[0]

    # ------------------------------------------------------------ construction
    def message_class(self, name: str) -> type:
        """A class for `name` whose fields all have ROS defaults (zeros, empty strings/arrays)."""
        name = self.check_message(name)
        with self._lock:
            cls = self._classes.get(name)
            if cls is None:
                cls = self._make_class(name)
                self._classes[name] = cls
        return cls

    def _make_class(self, name: str) -> type:
        base = self.store.types[name]
        consts, fields = self.store.fielddefs[name]
        defaults = {fname: self._default_factory(desc) for fname, desc in fields}
        # Numeric arrays are numpy arrays on the wire side (rosbags); accept
        # lists and tuples like rclpy does and convert them on assignment.
        coerce = {}
        for fname, (kind, detail) in fields:
            if kind in (Nodetype.ARRAY, Nodetype.SEQUENCE):
                ekind, edetail = detail[0]
                if ekind == Nodetype.BASE and edetail[0] in NUMPY_DTYPES:
                    coerce[fname] = NUMPY_DTYPES[edetail[0]]

        def __init__(self, **kwargs: Any) -> None:  # noqa: N807 - dataclass-style init
            unknown = set(kwargs) - set(defaults)
            if unknown:
                raise TypeError(f"{name} has no field(s) {sorted(unknown)}; fields: {list(defaults)}")
            for fname, factory in defaults.items():
                setattr(self, fname, kwargs[fname] if fname in kwargs else factory())

        def __setattr__(self, fname: str, value: Any) -> None:  # noqa: N807
            dtype = coerce.get(fname)
            if dtype is not None and not (isinstance(value, np.ndarray) and value.dtype == dtype):
                value = as_array(value, dtype, f"{name}.{fname}")
            object.__setattr__(self, fname, value)

        namespace = {"__init__": __init__, "__setattr__": __setattr__, "__msgtype__": name}
        for cname, _ctype, cvalue in consts:
            namespace[cname] = cvalue
        cls = type(name.rsplit("/", 1)[-1], (base,), namespace)
        cls.__qualname__ = cls.__name__
        return cls

    def _default_factory(self, desc: tuple) -> Any:
        kind, detail = desc
        if kind == Nodetype.BASE:
            typ = detail[0]
            if typ == "string" or typ == "wstring":
                return str
            if typ == "bool":
                return bool
            if typ.startswith("float"):
                return float
            return int
        if kind == Nodetype.NAME:
            return lambda: self.message_class(detail)()
        elem, size = detail
        if kind == Nodetype.ARRAY:
            return self._array_factory(elem, size)
        return self._array_factory(elem, 0)  # SEQUENCE: empty

    def _array_factory(self, elem: tuple, size: int) -> Any:
        ekind, edetail = elem
        if ekind == Nodetype.BASE and edetail[0] in NUMPY_DTYPES:
            dtype = NUMPY_DTYPES[edetail[0]]
            return lambda: np.zeros(size, dtype=dtype)
        item = self._default_factory(elem)
        return lambda: [item() for _ in range(size)]

    def new(self, name: str, **fields: Any) -> Any:
        return self.message_class(name)(**fields)

    def from_dict(self, name: str, values: dict | None) -> Any:
        """Build a message from nested dicts/lists, as `ros2 topic pub` takes YAML; every value is checked."""
        name = self.check_message(name)
        return self._from_dict(name, values, name)

    def _from_dict(self, name: str, values: Any, where: str) -> Any:
        values = {} if values is None else values
        if not isinstance(values, dict):
            raise InterfaceError(f"{where}: expected a mapping of {name} fields, got {values!r}")
        _consts, fields = self.store.fielddefs[name]
        known = dict(fields)
        unknown = set(values) - set(known)
        if unknown:
            raise InterfaceError(f"{where} has no field(s) {sorted(unknown)}; fields: {list(known)}")
        out = {fname: self._convert(known[fname], value, f"{where}.{fname}") for fname, value in values.items()}
        return self.new(name, **out)

    def _convert(self, desc: tuple, value: Any, where: str) -> Any:
        kind, detail = desc
        if kind == Nodetype.BASE:
            return yaml_field(detail[0], value, where)
        if kind == Nodetype.NAME:
            return self._from_dict(detail, value, where)
        elem, size = detail
        yaml_list(kind, size, value, where)
        ekind, edetail = elem
        if ekind == Nodetype.BASE:
            return yaml_array(edetail[0], value, where)
        return [self._convert(elem, v, f"{where}[{i}]") for i, v in enumerate(value)]

    def to_dict(self, msg: Any) -> dict:
        """Nested plain-Python view of a message (for `topic echo`)."""
        _consts, fields = self.store.fielddefs[msg.__msgtype__]
        out = {}
        for fname, _desc in fields:
            out[fname] = _plain(getattr(msg, fname))
        return out

    # ------------------------------------------------------------------- CDR
    def serialize(self, msg: Any, name: str | None = None) -> bytes:
        """CDR bytes; a value that does not fit its field is an InterfaceError naming the field."""
        name = name or msg.__msgtype__
        try:
            return bytes(self.store.serialize_cdr(msg, name))
        except Exception as exc:  # the packer fails with struct.error, OverflowError, TypeError, ...
            problem = misfit(self.store.fielddefs, name, msg, name) if name in self.store.fielddefs else None
            raise InterfaceError(problem or f"{name}: cannot serialize: {exc}") from exc

    def deserialize(self, data: bytes | memoryview, name: str) -> Any:
        return self.store.deserialize_cdr(bytes(data), name)


def _char_as_uint8(fielddefs: dict) -> None:
    """rosidl turns a .msg `char` into uint8 before hashing (rosbags keeps 'char').

    Same bytes on the wire; with it, service hashes match ROS 2 (checked
    against example_interfaces/srv/AddTwoInts in the tests).
    """

    def fix(desc: tuple) -> tuple:
        kind, detail = desc
        if kind == Nodetype.BASE and detail[0] == "char":
            return (kind, ("uint8", detail[1]))
        if kind in (Nodetype.ARRAY, Nodetype.SEQUENCE):
            return (kind, (fix(detail[0]), detail[1]))
        return desc

    for name, (consts, fields) in list(fielddefs.items()):
        if any("char" in str(desc) for _f, desc in fields):
            fielddefs[name] = (consts, [(fname, fix(desc)) for fname, desc in fields])


def _undo_srv_rename(types: dict) -> dict:
    """rosbags files 'pkg/srv/X' under 'pkg/srv/msg/X'; rosidl hashes the former name."""

    def fix(name: str) -> str:
        return name.replace("/srv/msg/", "/srv/")

    def fix_desc(desc: tuple) -> tuple:
        kind, detail = desc
        if kind == Nodetype.NAME:
            return (kind, fix(detail))
        if kind in (Nodetype.ARRAY, Nodetype.SEQUENCE):
            return (kind, (fix_desc(detail[0]), detail[1]))
        return desc

    return {
        fix(name): (consts, [(fname, fix_desc(desc)) for fname, desc in fields])
        for name, (consts, fields) in types.items()
    }


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def normalize_name(name: str, kind: str) -> str:
    """Accept 'pkg/kind/Name' and the short 'pkg/Name'; return the full form."""
    parts = name.strip("/").split("/")
    if len(parts) == 2:
        return f"{parts[0]}/{kind}/{parts[1]}"
    if len(parts) == 3:
        return "/".join(parts)
    raise InterfaceError(f"malformed interface name '{name}' (expected pkg/{kind}/Name)")


@functools.lru_cache(maxsize=1)
def registry() -> Registry:
    """The process-wide registry (parsing the interface files takes ~0.2 s)."""
    return Registry()
