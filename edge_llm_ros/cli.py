"""`edge-llm-ros`: the command line, one verb at a time.

    edge-llm-ros generate|bench|train|plan|export ...   the engine (edge_llm_ros.tools; see --help of each)
    edge-llm-ros top|plot ...                           watch the nodes live; plot a recorded bag's stats
    edge-llm-ros security create|check|list|policy ...  keystores from SROS2 policies (secured links)
    edge-llm-ros demo                                   the pipeline, from one instruction (edge_llm_ros.demo)
    edge-llm-ros launch|topic|node|service|lifecycle|action|interface|bag ...
                                                        shaped like `ros2` (edge_llm_ros.runtime.cli)

A verb's module is imported only when it runs (the engine's torch is heavy, the runtime's Zenoh
is not needed to generate).
"""

from __future__ import annotations

import importlib
import sys

TOOL_VERBS = ("generate", "bench", "train", "plan", "export", "top", "plot", "security")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = argv[0] if argv else None
    if verb in TOOL_VERBS:
        return importlib.import_module(f"edge_llm_ros.tools.{verb}").main(argv[1:])
    if verb == "demo":
        from edge_llm_ros.demo import main as demo_main

        return demo_main(argv[1:])
    from edge_llm_ros.runtime.cli import main as runtime_main

    return runtime_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
