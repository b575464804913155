"""The navigator's action vocabulary: what the VLM may answer, how an answer parses, and what motion
it means. One definition, shared by the simulator's expert (the teacher), the navigator's
constrained decoding, and the Go2 bridge.

An answer is a short reason, then one action (EE §4.4, after Cheng et al. 2024: mid-level actions
such as "move forward small/medium/large", with a reason for interpretability):

    reason: the red chair is ahead, slightly left
    action: turn_left small

Verbs: forward, backward, turn_left, turn_right (each with a magnitude: small, medium, large) and
stop (none). Magnitudes map to metres and degrees through `Magnitudes` (YAML-configurable). The
reason is lowercase words, digits, spaces, commas and hyphens, at most `REASON_CHARS` characters.
Text that does not parse becomes `stop`: the robot never moves on a misread answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

VERBS = ("forward", "backward", "turn_left", "turn_right", "stop")
MOVES = ("forward", "backward")
TURNS = ("turn_left", "turn_right")
MAGNITUDES = ("small", "medium", "large")
REASON_CHARS = 80
REASON_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 ,-"

REASON_PREFIX, ACTION_PREFIX = "reason: ", "action: "
# every action line's value: 'forward small' .. 'turn_right large', then 'stop'
ACTIONS = tuple(f"{verb} {m}" for verb in VERBS if verb != "stop" for m in MAGNITUDES) + ("stop",)


class AnswerAutomaton:
    """The grammar as a character automaton (core/engine/constraint.CharAutomaton), for constrained
    decoding and for :func:`parse`. States: ("prefix", i) after i characters of "reason: ";
    ("reason", n) after n reason characters; ("action", s) after the text s that follows the
    reason's newline, a prefix of one of the action lines."""

    start = ("prefix", 0)

    def __init__(self) -> None:
        self.lines = frozenset(ACTION_PREFIX + a for a in ACTIONS)
        self.prefixes = frozenset(line[:i] for line in self.lines for i in range(len(line) + 1))
        self.alphabet = frozenset(REASON_PREFIX + REASON_ALPHABET + "\n" + "".join(self.lines))

    def step(self, state, ch: str):
        phase, at = state
        if phase == "prefix":
            if REASON_PREFIX[at] != ch:
                return None
            return ("prefix", at + 1) if at + 1 < len(REASON_PREFIX) else ("reason", 0)
        if phase == "reason":
            if ch == "\n":
                return ("action", "") if at > 0 else None
            return ("reason", at + 1) if ch in REASON_ALPHABET and at < REASON_CHARS else None
        text = at + ch
        return ("action", text) if text in self.prefixes else None

    def accepting(self, state) -> bool:
        return state[0] == "action" and state[1] in self.lines


ANSWER = AnswerAutomaton()


class ActionParseError(ValueError):
    """The text is not an answer in the action grammar (the message says where it fails)."""


@dataclass(frozen=True)
class Magnitudes:
    """Metres per move magnitude and degrees per turn magnitude (ROS parameters / YAML)."""

    forward_m: dict[str, float] = field(default_factory=lambda: {"small": 0.25, "medium": 0.5, "large": 1.0})
    turn_deg: dict[str, float] = field(default_factory=lambda: {"small": 15.0, "medium": 30.0, "large": 60.0})

    def __post_init__(self) -> None:
        for name, table in (("forward_m", self.forward_m), ("turn_deg", self.turn_deg)):
            if sorted(table) != sorted(MAGNITUDES):
                raise ValueError(f"{name}: expected the magnitudes {list(MAGNITUDES)}, got {sorted(table)}")
            values = [table[m] for m in MAGNITUDES]
            if any(v <= 0 for v in values) or values != sorted(values):
                raise ValueError(f"{name}: values must be positive and grow small < medium < large, got {table}")


@dataclass(frozen=True)
class NavCommand:
    """One parsed answer. `magnitude` is '' for stop."""

    verb: str
    magnitude: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        if self.verb not in VERBS:
            raise ActionParseError(f"verb: expected one of {list(VERBS)}, got {self.verb!r}")
        if (self.verb == "stop") != (self.magnitude == ""):
            expected = "no magnitude" if self.verb == "stop" else f"one of {list(MAGNITUDES)}"
            raise ActionParseError(f"magnitude: {self.verb} takes {expected}, got {self.magnitude!r}")
        if self.magnitude and self.magnitude not in MAGNITUDES:
            raise ActionParseError(f"magnitude: expected one of {list(MAGNITUDES)}, got {self.magnitude!r}")

    @property
    def action(self) -> str:
        """'forward medium', 'stop': the action line's value."""
        return f"{self.verb} {self.magnitude}".strip()

    def text(self) -> str:
        """The answer as the model should write it (the grammar's canonical form)."""
        return f"reason: {self.reason}\naction: {self.action}"

    def motion(self, magnitudes: Magnitudes) -> tuple[float, float]:
        """(distance in metres, signed; angle in radians, positive to the left)."""
        if self.verb in MOVES:
            metres = magnitudes.forward_m[self.magnitude]
            return (metres if self.verb == "forward" else -metres), 0.0
        if self.verb in TURNS:
            radians = math.radians(magnitudes.turn_deg[self.magnitude])
            return 0.0, (radians if self.verb == "turn_left" else -radians)
        return 0.0, 0.0


STOP = NavCommand("stop", "", "no valid action")


def clean_reason(text: str) -> str:
    """A reason in the grammar's alphabet and length (lowercased, other characters dropped)."""
    kept = "".join(c for c in text.lower() if c in REASON_ALPHABET)
    return " ".join(kept.split())[:REASON_CHARS].strip() or "none"


def parse(text: str) -> NavCommand:
    """The answer in ``text`` (trailing whitespace aside), or ActionParseError saying why not."""
    body, state = text.rstrip(), ANSWER.start
    for ch in body:
        state = ANSWER.step(state, ch)
        if state is None:
            break
    if state is None or not ANSWER.accepting(state):
        head = text[:120].replace("\n", "\\n")
        raise ActionParseError(f"not 'reason: ...\\naction: <verb> [<magnitude>]' with verb in {list(VERBS)}: "
                               f"{head!r}")
    reason, action = body[len(REASON_PREFIX):].split("\n" + ACTION_PREFIX)
    verb, _, magnitude = action.partition(" ")
    return NavCommand(verb, magnitude, reason)


def parse_or_stop(text: str) -> tuple[NavCommand, str]:
    """(the answer, '') or (STOP, why the text did not parse): the robot stops on a misread answer."""
    try:
        return parse(text), ""
    except ActionParseError as exc:
        return STOP, str(exc)
