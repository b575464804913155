"""Navigation for the Go2 (issue 15), without ROS: the action vocabulary and its grammar, the 2D
world and its camera (the simulator), and the expert that teaches the VLM."""

from .actions import (
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
