"""From a navigation decision to velocity setpoints, within limits and behind three safety gates.

Contract: plain numbers and injected time, nothing about ROS. A `Command` (signed distance along x
in metres, signed angle about z in radians, how old its camera frame is) becomes a `Motion`: one
acceleration-limited (trapezoidal) velocity profile per axis, started from the velocity the robot
is commanded at now, that covers the distance and the angle and ends at rest. The `Executor` holds
at most one motion and answers, at each control tick, the setpoint to send:

    command(cmd, now) -> Verdict        e-stop -> invalid? stop -> stop? stop -> stale? refuse -> clamp -> plan
    tick(now) -> (Setpoint | None, note) watchdog? stop -> motion done? stop -> mean velocity over the tick
    set_estop(engaged) -> note           latch: stop now, refuse every command until released

`now` is a monotonic clock in seconds; frame ages are measured by the caller on the clock that
stamped the frame. A stop is a halt sent to the robot at once (STOP), not a ramp: stopping must
never wait. A setpoint is the profile's mean velocity over the coming tick, so a robot that holds
each setpoint until the next (zero-order hold) covers the planned distance exactly when ticks are
regular, and to first order when they jitter.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from edge_llm_ros.nav.actions import ActionParseError, Magnitudes, NavCommand


@dataclass(frozen=True)
class MotionLimits:
    """What one decision may make the robot do (ROS parameters / YAML)."""

    max_linear_mps: float = 0.5        # |vx|
    max_angular_rps: float = 1.0       # |wz|
    max_linear_accel: float = 1.0      # |dvx/dt|, m/s^2
    max_angular_accel: float = 2.0     # |dwz/dt|, rad/s^2
    max_distance_m: float = 2.0        # one command's |distance| (longer ones are clamped)
    max_angle_rad: float = math.pi     # one command's |angle| (larger ones are clamped)
    max_frame_age_s: float = 1.0       # a command decided from an older frame is refused
    watchdog_s: float = 4.0            # no fresh command for this long: the motion stops

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value}")


@dataclass(frozen=True)
class Setpoint:
    """A velocity to send (vx m/s, wz rad/s), or a halt (`stop`)."""

    vx: float = 0.0
    wz: float = 0.0
    stop: bool = False


STOP = Setpoint(stop=True)


@dataclass(frozen=True)
class Command:
    """One decision, as the bridge receives it. `valid` False: the navigator could not read its
    model's answer (`error` says why) and the robot must stop."""

    distance_m: float = 0.0
    angle_rad: float = 0.0
    frame_age_s: float = 0.0
    valid: bool = True
    error: str = ""
    label: str = ""  # for logs: 'forward medium'


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    note: str  # what happened and why, for the log and the status topic


# -- one axis: a piecewise constant-acceleration profile --------------------------------------------


@dataclass(frozen=True)
class Segment:
    duration: float
    v0: float
    accel: float

    def velocity(self, t: float) -> float:
        return self.v0 + self.accel * t

    def position(self, t: float) -> float:
        return self.v0 * t + 0.5 * self.accel * t * t

    @property
    def length(self) -> float:
        return self.position(self.duration)


@dataclass(frozen=True)
class Profile:
    """Velocity and position over time from the profile's start (t = 0); at rest after `duration`."""

    segments: tuple[Segment, ...] = ()

    @property
    def duration(self) -> float:
        return sum(s.duration for s in self.segments)

    def _locate(self, t: float) -> tuple[float, Segment | None, float]:
        """(position at the start of the segment holding t, that segment or None past the end, t in it)."""
        if t >= self.duration:
            return sum(s.length for s in self.segments), None, 0.0
        start = 0.0
        for segment in self.segments[:-1]:
            if t < segment.duration:
                return start, segment, max(t, 0.0)
            start += segment.length
            t -= segment.duration
        return start, self.segments[-1], min(max(t, 0.0), self.segments[-1].duration)

    def velocity(self, t: float) -> float:
        _, segment, dt = self._locate(t)
        return segment.velocity(dt) if segment else 0.0

    def position(self, t: float) -> float:
        start, segment, dt = self._locate(t)
        return start + (segment.position(dt) if segment else 0.0)


def brake(v0: float, accel: float) -> Segment:
    """From v0 to rest at the largest allowed deceleration."""
    return Segment(abs(v0) / accel, v0, -math.copysign(accel, v0))


def trapezoid(distance: float, v0: float, vmax: float, accel: float) -> tuple[Segment, ...]:
    """Cover ``distance`` starting at v0 (same sign as distance, or 0, and able to stop in time),
    ending at rest, with |v| <= vmax and |a| <= accel.

    Peak speed u_p = min(vmax, sqrt(a*D + u0^2/2)): the ramp u0 -> u_p covers |u_p^2 - u0^2| / 2a,
    the fall u_p -> 0 covers u_p^2 / 2a, and the cruise at u_p the rest of D (none when the peak is
    the triangle's)."""
    sign, dist, u0 = math.copysign(1.0, distance), abs(distance), abs(v0)
    peak = min(vmax, math.sqrt(max(accel * dist + 0.5 * u0 * u0, 0.0)))
    if peak <= 0.0:
        return ()
    ramp = Segment(abs(peak - u0) / accel, sign * u0, sign * math.copysign(accel, peak - u0))
    fall = Segment(peak / accel, sign * peak, -sign * accel)
    cruise = max(dist - abs(ramp.length) - abs(fall.length), 0.0)
    return ramp, Segment(cruise / peak, sign * peak, 0.0), fall


def plan_axis(distance: float, v0: float, vmax: float, accel: float) -> Profile:
    """The profile that moves ``distance`` from now (commanded at v0) and ends at rest.

    Zero distance: brake to rest. Moving away from the target, or too fast to stop before it
    (u0^2 / 2a > D): brake first, then cover what is left from rest (coming back if it overshot)."""
    segments: list[Segment] = []
    if v0 != 0.0 and (distance == 0.0 or v0 * distance < 0 or v0 * v0 / (2 * accel) > abs(distance)):
        halt = brake(v0, accel)
        segments.append(halt)
        distance = distance - halt.length if distance != 0.0 else 0.0
        v0 = 0.0
    if distance != 0.0:
        segments.extend(trapezoid(distance, v0, vmax, accel))
    return Profile(tuple(s for s in segments if s.duration > 1e-12))  # rounding leaves 1e-17 s cruises


# -- both axes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Motion:
    linear: Profile
    angular: Profile
    start: float

    @property
    def end(self) -> float:
        return self.start + max(self.linear.duration, self.angular.duration)

    def done(self, now: float) -> bool:
        return now >= self.end

    def velocity(self, now: float) -> tuple[float, float]:
        t = now - self.start
        return self.linear.velocity(t), self.angular.velocity(t)

    def mean_velocity(self, now: float, period: float) -> tuple[float, float]:
        """The mean velocity over [now, now + period]: held for a period, it moves the profile's way."""
        t = now - self.start
        return ((self.linear.position(t + period) - self.linear.position(t)) / period,
                (self.angular.position(t + period) - self.angular.position(t)) / period)


def plan_motion(distance_m: float, angle_rad: float, velocity: tuple[float, float], limits: MotionLimits,
                now: float) -> Motion:
    vx, wz = velocity
    return Motion(plan_axis(distance_m, vx, limits.max_linear_mps, limits.max_linear_accel),
                  plan_axis(angle_rad, wz, limits.max_angular_rps, limits.max_angular_accel), now)


# -- gates -----------------------------------------------------------------------------------------


def clamp(value: float, limit: float) -> float:
    return max(-limit, min(limit, value))


def clamp_setpoint(setpoint: Setpoint, limits: MotionLimits) -> Setpoint:
    if setpoint.stop:
        return setpoint
    return Setpoint(clamp(setpoint.vx, limits.max_linear_mps), clamp(setpoint.wz, limits.max_angular_rps))


def stale_reason(frame_age_s: float, max_age_s: float) -> str:
    """'' when a frame ``frame_age_s`` old may be acted on; otherwise why not."""
    if not math.isfinite(frame_age_s):
        return "frame age unknown (no frame stamp)"
    if frame_age_s > max_age_s:
        return f"stale frame: {frame_age_s:.3f} s old, limit {max_age_s:.3f} s"
    if frame_age_s < -max_age_s:
        return f"frame stamped {-frame_age_s:.3f} s in the future (clocks disagree), limit {max_age_s:.3f} s"
    return ""


@dataclass
class Watchdog:
    """Expires when nothing fed it for longer than ``timeout_s``."""

    timeout_s: float
    last: float | None = None

    def feed(self, now: float) -> None:
        self.last = now

    def silence(self, now: float) -> float:
        return math.inf if self.last is None else now - self.last

    def expired(self, now: float) -> bool:
        return self.silence(now) > self.timeout_s


@dataclass
class EStop:
    """Latched stop: engaged until explicitly released."""

    latched: bool = False

    def engage(self) -> bool:
        """True when this engaged it (it was released)."""
        changed, self.latched = not self.latched, True
        return changed

    def release(self) -> bool:
        changed, self.latched = self.latched, False
        return changed


# -- NavAction fields -> Command -------------------------------------------------------------------


SIGNS = {"forward": (1, 0), "backward": (-1, 0), "turn_left": (0, 1), "turn_right": (0, -1)}  # (distance, angle)


def resolve_motion(action: str, magnitude: str, distance_m: float, angle_rad: float,
                   magnitudes: Magnitudes) -> tuple[float, float]:
    """(distance, angle) of an action: (0, 0) for stop; its own distance and angle when it gives
    them; else its magnitude's from the table. ActionParseError for an unknown verb or magnitude,
    or a distance and angle whose signs contradict the verb (a turn that moves, a forward that backs)."""
    if action == "stop":
        return 0.0, 0.0
    if action not in SIGNS:
        raise ActionParseError(f"action: expected one of {['stop', *SIGNS]}, got {action!r}")
    if distance_m == 0.0 and angle_rad == 0.0:
        return NavCommand(action, magnitude).motion(magnitudes)
    signs = (_sign(distance_m), _sign(angle_rad))
    if signs != SIGNS[action]:
        raise ActionParseError(f"{action} with distance {distance_m:g} m and angle {angle_rad:g} rad: "
                               f"the signs contradict the verb")
    return distance_m, angle_rad


def _sign(value: float) -> int:
    return 0 if value == 0.0 else 1 if value > 0 else -1


def to_command(action: str, magnitude: str, distance_m: float, angle_rad: float, valid: bool, error: str,
               frame_age_s: float, magnitudes: Magnitudes) -> Command:
    """The Command for a NavAction's fields; one that cannot be read becomes invalid (a stop)."""
    label = f"{action} {magnitude}".strip() or "(no action)"
    if not valid:
        return Command(0.0, 0.0, frame_age_s, False, error or "marked invalid, no reason given", label)
    if not (math.isfinite(distance_m) and math.isfinite(angle_rad)):
        return Command(0.0, 0.0, frame_age_s, False, f"distance {distance_m} m, angle {angle_rad} rad", label)
    try:
        distance_m, angle_rad = resolve_motion(action, magnitude, distance_m, angle_rad, magnitudes)
    except ActionParseError as exc:
        return Command(0.0, 0.0, frame_age_s, False, str(exc), label)
    return Command(distance_m, angle_rad, frame_age_s, True, "", label)


# -- the executor ----------------------------------------------------------------------------------


TAKES = " in {:.2f} s"  # how long a started motion takes, in its status line ('moving: ... rad in 2.50 s')
_TAKES = re.compile(r"^moving: .* rad in ([0-9]+\.[0-9]+) s")


def motion_seconds(status: str) -> float | None:
    """How long the motion a status line announces takes, from when it was published; None for a
    status that starts no motion."""
    match = _TAKES.match(status)
    return float(match.group(1)) if match else None


@dataclass
class Executor:
    """The bridge's state: at most one motion, the watchdog and the e-stop (see the module docstring)."""

    limits: MotionLimits
    period_s: float
    motion: Motion | None = None
    estop: EStop = field(default_factory=EStop)
    status: str = "idle: started"  # '<idle|moving|estop>: <last event>'
    # since start: 'refused' commands, motions 'clamped' to the limits, 'watchdog' stops (diagnostics)
    counts: dict[str, int] = field(default_factory=lambda: {"refused": 0, "clamped": 0, "watchdog": 0})
    watchdog: Watchdog = field(init=False)
    _stop_pending: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.period_s) and self.period_s > 0):
            raise ValueError(f"period_s must be a positive finite number, got {self.period_s}")
        self.watchdog = Watchdog(self.limits.watchdog_s)

    @property
    def state(self) -> str:
        return "estop" if self.estop.latched else "moving" if self.motion is not None else "idle"

    def _set(self, note: str) -> str:
        self.status = f"{self.state}: {note}"
        return note

    def _halt(self, note: str) -> str:
        self.motion, self._stop_pending = None, True
        return self._set(note)

    def command(self, cmd: Command, now: float) -> Verdict:
        verdict = self._command(cmd, now)
        if not verdict.accepted:
            self.counts["refused"] += 1
        return verdict

    def _command(self, cmd: Command, now: float) -> Verdict:
        if self.estop.latched:
            self._stop_pending = True
            return Verdict(False, self._set(f"refused {cmd.label}: e-stop latched (false on the e-stop topic "
                                            f"releases it)"))
        if not cmd.valid:
            return Verdict(False, self._halt(f"refused {cmd.label}: invalid action, stopping: {cmd.error}"))
        if cmd.distance_m == 0.0 and cmd.angle_rad == 0.0:
            self.watchdog.feed(now)
            return Verdict(True, self._halt(f"{cmd.label}: stopping"))
        stale = stale_reason(cmd.frame_age_s, self.limits.max_frame_age_s)
        if stale:
            return Verdict(False, self._set(f"refused {cmd.label}: {stale}"))
        return Verdict(True, self._start(cmd, now))

    def _start(self, cmd: Command, now: float) -> str:
        distance = clamp(cmd.distance_m, self.limits.max_distance_m)
        angle = clamp(cmd.angle_rad, self.limits.max_angle_rad)
        clamped = "" if (distance, angle) == (cmd.distance_m, cmd.angle_rad) else \
            f" (clamped from {cmd.distance_m:.3f} m, {cmd.angle_rad:.3f} rad)"
        self.counts["clamped"] += bool(clamped)
        velocity = self.motion.velocity(now) if self.motion is not None else (0.0, 0.0)
        self.motion = plan_motion(distance, angle, velocity, self.limits, now)
        self.watchdog.feed(now)
        return self._set(f"{cmd.label}: {distance:.3f} m, {angle:.3f} rad{TAKES.format(self.motion.end - now)}"
                         f"{clamped}")

    def set_estop(self, engaged: bool) -> str:
        """A note when the latch changed ('' when it did not). Engaged: stop at once (every time)."""
        if engaged:
            changed = self.estop.engage()
            note = self._halt("e-stop latched: stopped; commands are refused until it is released")
            return note if changed else ""
        if self.estop.release():
            return self._set("e-stop released: stays stopped until the next command")
        return ""

    def tick(self, now: float) -> tuple[Setpoint | None, str]:
        """The setpoint to send now (None: nothing to send) and a note when the motion ended."""
        note = ""
        if self.motion is not None:
            if self.watchdog.expired(now):
                self.counts["watchdog"] += 1
                note = self._halt(f"watchdog: no fresh command for {self.watchdog.silence(now):.2f} s "
                                  f"(limit {self.watchdog.timeout_s:.2f} s), stopping")
            elif self.motion.done(now):
                note = self._halt("motion done")
            else:
                # the mean over the coming tick, not v(now): held for a tick, the setpoints integrate to the plan
                setpoint = Setpoint(*self.motion.mean_velocity(now, self.period_s))
                return clamp_setpoint(setpoint, self.limits), ""
        if self._stop_pending:
            self._stop_pending = False
            return STOP, note
        return None, note
