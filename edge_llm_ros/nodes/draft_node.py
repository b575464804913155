"""draft_node: the front door (nodes/front_door.py) under its robot name, the `edge_cloud` backend by
default: the robot half of edge-cloud decoding with early exits, a verifier_node verifying
(nodes/backends/edge_cloud.py). `backend:=pipeline` makes it D0 of a stage pipeline instead
(nodes/backends/pipeline.py, launch/stages.launch.py)."""

from __future__ import annotations

from edge_llm_ros.nodes.front_door import main_for


def main(args: list[str] | None = None) -> int:
    return main_for("draft_node", "edge_cloud", args)


if __name__ == "__main__":
    raise SystemExit(main())
