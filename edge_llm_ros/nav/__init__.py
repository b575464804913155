"""The Go2 navigation application (issue 15): a robot application beside the engine, not part of it.

The action vocabulary and its grammar (actions.py), the navigator's decision (navigator.py), its
episode policy (episode.py) and the two drivers of it (live.py on a real clock, simulated.py in
simulated time), the bridge's motions (motion.py), the 2D world, its camera and the
expert that teaches the VLM (world.py, camera.py, expert.py), the VLM adapter (vlm.py; trained by
vlm_training.py) and Qwen2-VL (qwen_vl.py). Imports core's inference parts, never ROS.
"""

from edge_llm_ros.nav.actions import (
    MAGNITUDES,
    STOP,
    VERBS,
    ActionParseError,
    Magnitudes,
    NavCommand,
    clean_reason,
    parse,
    parse_or_stop,
)

__all__ = ["MAGNITUDES", "STOP", "VERBS", "ActionParseError", "Magnitudes", "NavCommand", "clean_reason", "parse",
           "parse_or_stop"]
