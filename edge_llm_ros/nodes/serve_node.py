"""serve_node: the front door (nodes/front_door.py) under its pipeline name, the `local` backend by
default: the target the device plan names, served on this device to many clients at once
(nodes/backends/local.py). `backend:=remote remote_url:=http://HOST:PORT/v1` serves an
OpenAI-compatible server's answers through the same topic and action instead."""

from __future__ import annotations

from edge_llm_ros.nodes.front_door import main_for


def main(args: list[str] | None = None) -> int:
    return main_for("serve_node", "local", args)


if __name__ == "__main__":
    raise SystemExit(main())
