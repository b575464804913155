"""Messages as text, the way `ros2 topic echo` prints them (rosidl_runtime_py's message_to_yaml and
message_to_csv): fields in declaration order, nested messages indented two spaces, sequences as
`- item` lines, strings quoted only where YAML needs it, long arrays and strings cut as ros2 cuts
them. The CLI's echo, service call and send_goal print through it.
"""

from __future__ import annotations

import array
import sys
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import yaml
from rosbags.typesys.base import Nodetype

from edge_llm_ros.runtime.interfaces import registry

TRUNCATE_LENGTH = 128  # ros2 topic echo's default --truncate-length
EMPTY_MEMBER = "structure_needs_at_least_one_member"  # rosidl's placeholder in an empty message; rclpy hides it
IDL_NAMES = {"bool": "boolean", "byte": "octet", "float32": "float", "float64": "double"}  # as --no-arr names them
ARRAY_TYPECODES = {"float32": "f", "float64": "d", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H",
                   "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q"}  # sequences rclpy keeps as array.array


@dataclass(frozen=True)
class Shown:
    """How much of each field echo shows: strings and sequences cut after `truncate_length` (None: all),
    sequences (`no_arr`) or strings (`no_str`) replaced by their type and length."""

    truncate_length: int | None = None
    no_arr: bool = False
    no_str: bool = False


def message_fields(msg: Any) -> list[tuple[str, tuple]]:
    """(name, type) of each field of `msg` in declaration order, as rclpy lists them."""
    return [(name, desc) for name, desc in registry().store.fielddefs[msg.__msgtype__][1] if name != EMPTY_MEMBER]


def message_to_plain(msg: Any, shown: Shown = Shown()) -> dict:
    """The message as nested dicts, lists and scalars (rosidl_runtime_py's message_to_ordereddict)."""
    return {name: _plain(desc, getattr(msg, name), shown) for name, desc in message_fields(msg)}


class MessageDumper(yaml.SafeDumper):
    """YAML as rosidl_runtime_py writes it: a message is a mapping of no set style, so it stays in block
    style even with flow_style (only lists, and messages within them, go to flow style)."""


MessageDumper.add_representer(dict, lambda dumper, fields: yaml.MappingNode(
    "tag:yaml.org,2002:map", [(dumper.represent_data(k), dumper.represent_data(v)) for k, v in fields.items()]))


def message_to_yaml(msg: Any, shown: Shown = Shown(), flow_style: bool = False) -> str:
    """The message as `ros2 topic echo` prints it (without the `---` line); ends with a newline."""
    return yaml.dump(message_to_plain(msg, shown), Dumper=MessageDumper, allow_unicode=True, width=sys.maxsize,
                     default_flow_style=flow_style)


def message_to_csv(msg: Any, shown: Shown = Shown()) -> str:
    """The message as `ros2 topic echo --csv` prints it: every value, nested ones in place, comma-separated."""
    return _csv_join(_csv(desc, getattr(msg, name), shown) for name, desc in message_fields(msg))


def _plain(desc: tuple, value: Any, shown: Shown) -> Any:
    kind, detail = desc
    if kind == Nodetype.BASE:
        if detail[0] in ("string", "wstring"):
            return _shown_string(value, shown)
        if detail[0] == "byte":
            return _cut(_as_bytes(value).decode("latin-1"), shown.truncate_length)
        return value.item() if isinstance(value, np.generic) else value
    if kind == Nodetype.NAME:
        return message_to_plain(value, shown)
    if shown.no_arr:
        return _array_summary(kind, detail, len(value))
    items = value.tolist() if isinstance(value, np.ndarray) else list(value)
    limit = shown.truncate_length
    if limit is not None and len(items) > limit:
        return [_plain(detail[0], item, shown) for item in items[:limit]] + ["..."]
    return [_plain(detail[0], item, shown) for item in items]


def _csv(desc: tuple, value: Any, shown: Shown) -> str:
    kind, detail = desc
    if kind == Nodetype.BASE:
        if detail[0] in ("string", "wstring"):
            return _shown_string(value, shown)
        return str(_cut(_as_bytes(value), shown.truncate_length) if detail[0] == "byte" else value)
    if kind == Nodetype.NAME:
        return message_to_csv(value, shown)
    if shown.no_arr:
        return _array_summary(kind, detail, len(value))
    # A fixed-size array's numbers stay numpy scalars: str() prints them as numpy does (float32 0.1 as 0.1).
    items = value.tolist() if kind == Nodetype.SEQUENCE and isinstance(value, np.ndarray) else list(value)
    limit = shown.truncate_length
    if limit is not None and len(items) > limit:
        return _csv_join([_csv(detail[0], item, shown) for item in items[:limit]] + ["..."])
    return _csv_join(_csv(detail[0], item, shown) for item in items)


def _csv_join(parts: Iterable[str]) -> str:
    """The values joined by commas as rosidl_runtime_py joins them: no comma follows an empty start
    (empty strings or sequences first are lost, as in ros2)."""
    text = ""
    for part in parts:
        text = f"{text},{part}" if text else part
    return text


def _as_bytes(value: Any) -> bytes:
    """A byte field as rclpy holds it; ours is a number, signed (int8) as rosbags packs it or not."""
    return bytes([int(value) & 0xFF])


def _shown_string(text: str, shown: Shown) -> str:
    return f"<string length: <{len(text)}>>" if shown.no_str else _cut(text, shown.truncate_length)


def _cut(text: str | bytes, limit: int | None) -> str | bytes:
    """`text` cut after `limit` characters (bytes: a byte field, as rclpy holds it), '...' marking the cut."""
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + ("..." if isinstance(text, str) else b"...")


def _array_summary(kind: Nodetype, detail: tuple, length: int) -> str:
    """What --no-arr shows instead of an array or sequence, with rosidl's type names."""
    (elem_kind, elem), size = detail
    name = elem if elem_kind == Nodetype.NAME else IDL_NAMES.get(elem[0], elem[0])
    if kind == Nodetype.ARRAY:
        return f"<array type: {name}[{size}]>"
    if size:
        return f"<sequence type: {name}[{size}], length: {length}>"
    return f"<sequence type: {name}, length: {length}>"


def rclpy_value(desc: tuple, value: Any) -> Any:
    """A field that is no message as rclpy holds it: what `topic echo --field` prints (and --filter sees)."""
    kind, detail = desc
    if kind == Nodetype.BASE:
        if detail[0] == "byte":
            return _as_bytes(value)
        return value.item() if isinstance(value, np.generic) else value
    (elem_kind, elem), _size = detail
    typecode = ARRAY_TYPECODES.get(elem[0]) if elem_kind == Nodetype.BASE else None
    if typecode and kind == Nodetype.SEQUENCE:
        return array.array(typecode, value.tolist())
    if typecode:
        return value  # a numpy array, as rclpy's fixed-size arrays are
    return [item if elem_kind == Nodetype.NAME else rclpy_value((elem_kind, elem), item) for item in value]
