"""Bridge motion and safety without ROS (nav/motion.py), time injected: profiles cover their
distance within the velocity and acceleration limits and end at rest; limits clamp; the watchdog
stops a motion nobody refreshes; the e-stop latches until released; stale frames are refused;
invalid actions stop the robot."""

import math

import pytest

from edge_llm_ros.nav import ActionParseError, Magnitudes
from edge_llm_ros.nav.motion import (
    STOP,
    Command,
    EStop,
    Executor,
    MotionLimits,
    Setpoint,
    Watchdog,
    clamp_setpoint,
    plan_axis,
    resolve_motion,
    stale_reason,
    to_command,
)

PERIOD = 0.05
LIMITS = MotionLimits(max_linear_mps=0.5, max_angular_rps=1.0, max_linear_accel=1.0, max_angular_accel=2.0,
                      max_distance_m=2.0, max_angle_rad=math.pi, max_frame_age_s=1.0, watchdog_s=4.0)


def run(executor: Executor, start: float = 0.0, until: float = 30.0, period: float = PERIOD):
    """Tick from ``start`` every ``period`` until the executor sends a stop (included) or ``until``:
    [(time, setpoint)]."""
    sent, t = [], start
    while t < until:
        setpoint, _ = executor.tick(t)
        if setpoint is not None:
            sent.append((t, setpoint))
            if setpoint.stop:
                break
        t = round(t + period, 9)
    return sent


def moving(sent):
    return [s for _, s in sent if not s.stop]


def test_forward_half_a_metre_integrates_to_the_distance_within_limits_then_stops():
    ex = Executor(LIMITS, PERIOD)
    verdict = ex.command(Command(0.5, 0.0, 0.1, label="forward medium"), 0.0)
    assert verdict.accepted and ex.state == "moving" and "0.500 m" in verdict.note
    sent = run(ex)
    speeds = [s.vx for s in moving(sent)]
    assert sum(speeds) * PERIOD == pytest.approx(0.5, abs=1e-9)  # held for a period each (zero-order hold)
    assert max(speeds) == pytest.approx(0.5) and min(speeds) > 0
    steps = [abs(b - a) / PERIOD for a, b in zip([0.0, *speeds], speeds + [0.0])]
    assert max(steps) <= LIMITS.max_linear_accel + 1e-9
    assert sent[-1][1] == STOP and ex.state == "idle" and ex.status == "idle: motion done"
    assert sent[-1][0] == pytest.approx(1.5, abs=PERIOD)  # 0.5 s up, 0.5 s cruising 0.25 m, 0.5 s down
    assert run(ex, start=sent[-1][0] + PERIOD) == []  # idle: nothing more to send


def test_a_turn_follows_the_angular_limits_and_a_triangle_when_short():
    ex = Executor(LIMITS, PERIOD)
    ex.command(Command(0.0, -math.radians(15), 0.0, label="turn_right small"), 10.0)
    turns = [s.wz for s in moving(run(ex, start=10.0))]
    assert sum(turns) * PERIOD == pytest.approx(-math.radians(15), abs=1e-9)
    peak = math.sqrt(LIMITS.max_angular_accel * math.radians(15))  # never reaches max_angular_rps
    assert min(turns) == pytest.approx(-peak, rel=0.1) and -peak < min(turns) and max(turns) < 0


@pytest.mark.parametrize("distance, v0", [(0.5, 0.0), (1.5, 0.3), (0.05, 0.5), (-0.3, 0.4), (0.4, 0.8), (0.0, -0.5)])
def test_profiles_cover_the_distance_from_any_starting_velocity_and_end_at_rest(distance, v0):
    profile = plan_axis(distance, v0, 0.5, 1.0)
    assert profile.velocity(0.0) == pytest.approx(v0)
    end = profile.duration
    assert profile.velocity(end) == 0.0 and profile.velocity(end + 1) == 0.0
    expected = distance if distance else v0 * abs(v0) / 2.0  # zero distance: brake, never come back
    assert profile.position(end) == pytest.approx(expected, abs=1e-12)
    ts = [end * i / 400 for i in range(401)]
    vs = [profile.velocity(t) for t in ts]
    assert max(abs(v) for v in vs) <= max(0.5, abs(v0)) + 1e-12
    assert all(abs(b - a) <= 1.0 * (end / 400) + 1e-9 for a, b in zip(vs, vs[1:]))  # |a| <= 1 m/s^2


def test_a_new_command_mid_motion_starts_from_the_current_velocity():
    ex = Executor(LIMITS, PERIOD)
    ex.command(Command(1.0, 0.0, 0.0, label="forward large"), 0.0)
    before = [s.vx for _, s in run(ex, until=1.0)]
    ex.command(Command(-0.25, 0.0, 0.0, label="backward small"), 1.0)
    after = [s.vx for s in moving(run(ex, start=1.0))]
    assert before[-1] == pytest.approx(0.5) and after[0] == pytest.approx(0.5 - 1.0 * PERIOD / 2)  # no jump
    assert all(abs(b - a) <= LIMITS.max_linear_accel * PERIOD + 1e-9 for a, b in zip(before[-1:] + after, after))
    assert sum(after) * PERIOD == pytest.approx(-0.25, abs=1e-9)  # it brakes, then backs up what is left


def test_limits_clamp_the_command_and_every_setpoint():
    slow = MotionLimits(max_linear_mps=0.2, max_angular_rps=0.3, max_linear_accel=0.5, max_angular_accel=0.5,
                        max_distance_m=0.4, max_angle_rad=0.5, max_frame_age_s=1.0, watchdog_s=60.0)
    ex = Executor(slow, PERIOD)
    verdict = ex.command(Command(3.0, 0.0, 0.0, label="forward large"), 0.0)
    assert verdict.accepted and "0.400 m" in verdict.note and "clamped from 3.000 m" in verdict.note
    speeds = [s.vx for s in moving(run(ex))]
    assert max(speeds) == pytest.approx(0.2) and sum(speeds) * PERIOD == pytest.approx(0.4, abs=1e-9)
    ex.command(Command(0.0, -2.0, 0.0, label="turn_right large"), 100.0)
    turns = [s.wz for s in moving(run(ex, start=100.0, until=130.0))]
    assert min(turns) == pytest.approx(-0.3) and sum(turns) * PERIOD == pytest.approx(-0.5, abs=1e-9)
    assert clamp_setpoint(Setpoint(9.0, -9.0), slow) == Setpoint(0.2, -0.3)
    assert clamp_setpoint(STOP, slow) == STOP


def test_the_watchdog_stops_a_motion_no_fresh_command_refreshes():
    ex = Executor(MotionLimits(watchdog_s=0.6), PERIOD)
    ex.command(Command(2.0, 0.0, 0.0, label="forward large"), 0.0)  # 4.5 s of motion
    sent = run(ex)
    assert sent[-1][1] == STOP and sent[-1][0] == pytest.approx(0.65, abs=1e-9)  # first tick past 0.6 s
    assert ex.status.startswith("idle: watchdog: no fresh command for 0.65 s (limit 0.60 s)")
    assert sum(s.vx for s in moving(sent)) * PERIOD < 0.2
    # a fresh command before the deadline keeps it going
    ex.command(Command(2.0, 0.0, 0.0, label="forward large"), 10.0)
    assert run(ex, start=10.0, until=10.5)[-1][1] != STOP
    ex.command(Command(2.0, 0.0, 0.0, label="forward large"), 10.5)
    assert all(not s.stop for _, s in run(ex, start=10.5, until=11.0))


def test_watchdog_and_estop_alone():
    dog = Watchdog(1.0)
    assert dog.expired(0.0)  # never fed
    dog.feed(5.0)
    assert not dog.expired(6.0) and dog.expired(6.01) and dog.silence(7.0) == 2.0
    stop = EStop()
    assert stop.engage() and not stop.engage() and stop.latched
    assert stop.release() and not stop.release() and not stop.latched


def test_the_estop_latches_a_stop_until_released():
    ex = Executor(LIMITS, PERIOD)
    ex.command(Command(1.0, 0.0, 0.0, label="forward large"), 0.0)
    assert not run(ex, until=0.3)[-1][1].stop
    note = ex.set_estop(True)
    assert note.startswith("e-stop latched: stopped") and ex.status == f"estop: {note}" and ex.state == "estop"
    assert ex.tick(0.3)[0] == STOP and ex.tick(0.35) == (None, "")
    assert ex.set_estop(True) == "" and ex.tick(0.4)[0] == STOP  # again: stop again, no new note
    verdict = ex.command(Command(0.5, 0.0, 0.0, label="forward medium"), 1.0)
    assert not verdict.accepted and verdict.note == ("refused forward medium: e-stop latched (false on the e-stop "
                                                     "topic releases it)")
    assert ex.status.startswith("estop: refused forward medium") and ex.tick(1.0)[0] == STOP
    assert run(ex, start=1.05, until=3.0) == []  # nothing moves while latched
    assert ex.set_estop(False) == "e-stop released: stays stopped until the next command"
    assert ex.state == "idle" and ex.set_estop(False) == "" and run(ex, start=3.0, until=4.0) == []
    assert ex.command(Command(0.5, 0.0, 0.0, label="forward medium"), 4.0).accepted and ex.state == "moving"


@pytest.mark.parametrize("age, reason", [
    (1.5, "stale frame: 1.500 s old, limit 1.000 s"),
    (math.inf, "frame age unknown (no frame stamp)"),
    (-2.0, "frame stamped 2.000 s in the future (clocks disagree), limit 1.000 s"),
])
def test_stale_frames_are_refused_with_their_age_and_the_motion_goes_on(age, reason):
    assert stale_reason(age, 1.0) == reason and stale_reason(0.99, 1.0) == "" and stale_reason(-0.5, 1.0) == ""
    ex = Executor(LIMITS, PERIOD)
    ex.command(Command(1.0, 0.0, 0.0, label="forward large"), 0.0)
    verdict = ex.command(Command(-1.0, 0.0, age, label="backward large"), 0.5)
    assert not verdict.accepted and verdict.note == f"refused backward large: {reason}"
    assert ex.state == "moving" and ex.status == f"moving: refused backward large: {reason}"
    speeds = [s.vx for s in moving(run(ex, start=0.5))]
    assert min(speeds) > 0  # the refused one changed nothing
    idle = Executor(LIMITS, PERIOD)
    assert not idle.command(Command(0.5, 0.0, age), 0.0).accepted and idle.tick(0.0) == (None, "")


def test_invalid_actions_and_stop_stop_the_robot_even_from_stale_frames():
    ex = Executor(LIMITS, PERIOD)
    ex.command(Command(1.0, 0.0, 0.0, label="forward large"), 0.0)
    run(ex, until=0.5)
    verdict = ex.command(Command(valid=False, error="not 'reason: ...'", frame_age_s=99.0, label="stop"), 0.5)
    assert not verdict.accepted and verdict.note == "refused stop: invalid action, stopping: not 'reason: ...'"
    assert ex.tick(0.5)[0] == STOP and ex.state == "idle" and ex.tick(0.55) == (None, "")
    ex.command(Command(1.0, 0.0, 0.0, label="forward large"), 1.0)
    verdict = ex.command(Command(0.0, 0.0, 99.0, label="stop"), 1.2)
    assert verdict.accepted and verdict.note == "stop: stopping" and ex.tick(1.2)[0] == STOP


def test_nav_action_fields_become_commands():
    table = Magnitudes()
    assert resolve_motion("forward", "medium", 0.0, 0.0, table) == (0.5, 0.0)
    assert resolve_motion("turn_left", "large", 0.0, 0.0, table) == (0.0, pytest.approx(math.radians(60)))
    assert resolve_motion("backward", "", -0.7, 0.0, table) == (-0.7, 0.0)  # its own distance wins
    assert resolve_motion("stop", "", 3.0, 0.0, table) == (0.0, 0.0)
    for action, magnitude, distance, angle, match in [
        ("fly", "small", 0.0, 0.0, "action: expected one of"), ("forward", "huge", 0.0, 0.0, "magnitude"),
        ("forward", "", 0.0, 0.0, "magnitude"), ("forward", "small", -0.5, 0.0, "contradict"),
        ("turn_left", "small", 0.3, 0.2, "contradict"),
    ]:
        with pytest.raises(ActionParseError, match=match):
            resolve_motion(action, magnitude, distance, angle, table)
        command = to_command(action, magnitude, distance, angle, True, "", 0.0, table)
        assert not command.valid and command.error
    assert to_command("forward", "small", 0.0, 0.0, True, "", 0.2, table) == Command(0.25, 0.0, 0.2, True, "",
                                                                                     "forward small")
    assert to_command("stop", "", 0.0, 0.0, False, "", 0.0, table).error == "marked invalid, no reason given"
    assert not to_command("forward", "small", math.nan, 0.0, True, "", 0.0, table).valid


def test_bad_limits_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="watchdog_s must be a positive finite number, got 0"):
        MotionLimits(watchdog_s=0)
    with pytest.raises(ValueError, match="max_linear_mps"):
        MotionLimits(max_linear_mps=math.nan)
    with pytest.raises(ValueError, match="period_s"):
        Executor(LIMITS, 0.0)
