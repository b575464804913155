"""What every node's main() does: init, build, spin, shut down cleanly."""

from __future__ import annotations

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
