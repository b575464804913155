"""The action grammar: canonical answers parse back, motions follow the magnitudes, anything else is
refused with a reason (and becomes stop)."""

import math

import pytest

from edge_llm_ros.nav import MAGNITUDES, STOP, VERBS, ActionParseError, Magnitudes, NavCommand, parse, parse_or_stop


@pytest.mark.parametrize("verb", VERBS)
def test_every_canonical_answer_parses_back(verb):
    for magnitude in ([""] if verb == "stop" else MAGNITUDES):
        command = NavCommand(verb, magnitude, "the red chair is ahead, 2 m")
        assert parse(command.text()) == command


def test_motions_follow_the_magnitudes():
    m = Magnitudes()
    assert NavCommand("forward", "large").motion(m) == (1.0, 0.0)
    assert NavCommand("backward", "small").motion(m) == (-0.25, 0.0)
    assert NavCommand("turn_left", "medium").motion(m) == (0.0, pytest.approx(math.radians(30)))
    assert NavCommand("turn_right", "small").motion(m) == (0.0, pytest.approx(-math.radians(15)))
    assert STOP.motion(m) == (0.0, 0.0)


@pytest.mark.parametrize("text", [
    "", "action: forward small", "reason: x\naction: fly small", "reason: x\naction: forward",
    "reason: x\naction: stop small", "reason: UPPER\naction: stop", "reason: x\naction: forward huge",
    "reason: " + "a" * 81 + "\naction: stop",
])
def test_anything_else_is_refused_and_becomes_stop(text):
    with pytest.raises(ActionParseError):
        parse(text)
    command, error = parse_or_stop(text)
    assert command == STOP and error


def test_magnitudes_must_cover_the_vocabulary_and_grow():
    with pytest.raises(ValueError, match="forward_m"):
        Magnitudes(forward_m={"small": 1.0, "medium": 0.5, "large": 2.0})
    with pytest.raises(ValueError, match="turn_deg"):
        Magnitudes(turn_deg={"small": 1.0})
