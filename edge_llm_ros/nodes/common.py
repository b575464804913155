"""What every node's main() does: init, build, spin, shut down cleanly."""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

from edge_llm_ros import runtime as rt


def run_node(build: Callable[[], object], args: list[str] | None = None) -> int:
    """rclpy's usual main: init, make the node, spin until Ctrl-C / SIGTERM, clean up.

    A bad parameter or params file ends the process with a one-line error and
    exit code 2, as a CLI would.
    """
    try:
        rt.init(args=args)
        node = build()
    except (ValueError, OSError) as exc:  # ParamsError, ParameterError, InterfaceError are ValueErrors
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        rt.spin(node)
    except KeyboardInterrupt:
        pass
    finally:
        node.destroy_node()
        rt.shutdown()
    return 0


# -- core records <-> messages with the same field names ---------------------------------------------


def from_message(record_cls, msg):
    """The core dataclass ``record_cls`` from a message with the same fields (sequences as lists)."""
    return record_cls(**{f.name: _plain(getattr(msg, f.name)) for f in dataclasses.fields(record_cls)})


def to_message(msg_cls, record):
    """The message ``msg_cls`` from a core dataclass record with the same fields."""
    return msg_cls(**{f.name: getattr(record, f.name) for f in dataclasses.fields(record)})


def _plain(value):
    return value.tolist() if hasattr(value, "tolist") else list(value) if isinstance(value, (list, tuple)) else value
