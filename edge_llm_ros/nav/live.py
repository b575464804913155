"""The navigator's episodes on a real clock: what navigator_node runs between its callbacks and
its model.

Contract: :class:`LiveEpisodes` drives nav/episode.EpisodeController (the policy, the same class
bench --scenario nav drives in simulated time) with ``clock()`` (time.monotonic on the robot) and
a worker thread that computes the decisions, and tells an :class:`Outputs` what to publish. Every
method is thread-safe: a node calls them from its callbacks. Knows nothing about ROS (nodes/
navigator_node.py translates messages).

- `instruction(text)`: a new instruction starts an episode once the navigator is set and active
  (`set_navigator`, `set_active`) and replaces a running one ("replaced"); an empty one ends it
  and stops the robot. Episodes are numbered by instruction; episode n's actions carry request id
  ``nav-n``.
- `frame(image, stamp)`: the newest frame (arrived now; ``stamp`` on the odometry's clock);
  `bad_frame(error)`: a malformed one, which stops the robot, and no decision uses an older frame.
  `odometry(stamp, pose)`; `bridge_state(status)`: the bridge's state line.
- After every event the controller says whether a decision starts, and the worker decides; a
  decision of an episode that ended meanwhile is dropped. A decision that raises ends its episode
  ("navigator failed") and stops the robot with the error.
- When an episode ends, its summary (the `~/episode` JSON: episode, instruction, outcome, actions,
  overlap, waiting_s, waited_rounds, first_motion_s, dropped) goes to `Outputs.summary`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from edge_llm_ros.nav.episode import Drop, Effect, End, EpisodeController, Frame, HandOver, PolicyConfig, bridge_event
from edge_llm_ros.nav.overlap import PoseHistory
from edge_llm_ros.nav.world import Pose


class Outputs(Protocol):
    """What a driver publishes (navigator_node: NavActions, `~/episode`, its log)."""

    def action(self, request_id: str, handed: HandOver, age_s: float) -> None: ...

    def stop(self, request_id: str, reason: str) -> None: ...

    def summary(self, summary: dict) -> None: ...

    def log(self, level: str, line: str) -> None: ...  # level: info | warning | error


class LiveEpisodes:
    """See the module docstring."""

    def __init__(self, config: PolicyConfig, outputs: Outputs, clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.out, self.clock = config, outputs, clock
        self.lock = threading.Condition()
        self.navigator: Any = None  # decide(image, instruction) -> a Decision
        self.active = False
        self.poses = PoseHistory()
        self.bridge_idle = True
        self.bridge_status = ""  # the bridge's last state line ('idle|moving|estop: <event>')
        self.last_outcome = ""  # how the last episode ended
        self.newest: Frame | None = None
        self.number, self.instruction_text = 0, ""  # the last instruction and its episode number
        self.control: EpisodeController | None = None  # the running episode's
        self.job: tuple[int, Frame] | None = None  # a decision to start: episode number, frame
        self.busy = False  # the worker is deciding
        self.started = self.done = 0  # decisions the worker began and finished
        self.warned_odometry = self.stopping = False
        self.worker = threading.Thread(target=self._work, daemon=True, name="navigator")
        self.worker.start()

    # -- events ----------------------------------------------------------------------------------

    def set_navigator(self, navigator: Any) -> None:
        with self.lock:
            self.navigator = navigator
            if navigator is None:
                self._end("node stopped", "navigator unloaded")
            self._begin()

    def set_active(self, active: bool) -> None:
        with self.lock:
            self.active = active
            self._begin()

    def instruction(self, text: str) -> None:
        with self.lock:
            self._end("replaced")
            self.number, self.instruction_text = self.number + 1, text.strip()
            if self.instruction_text:
                self.out.log("info", f"episode {self.number}: {self.instruction_text!r}")
                self._begin()
            else:
                self.out.stop("", "instruction cleared")

    def frame(self, image: Any, stamp: float, header: Any = None) -> None:
        with self.lock:
            self.newest = Frame(self.clock(), stamp, image, header)
            if self.control is not None:
                self.control.frame(self.newest)
            self._poll()

    def bad_frame(self, error: str) -> None:
        """A malformed frame: logged, the robot stops, and no decision uses an older frame."""
        self.out.log("error", f"rejected a frame: {error}; stopping")
        with self.lock:
            self.newest = None
            if self.control is not None:
                self.control.frame(None)
        self.out.stop("", error)

    def odometry(self, stamp: float, pose: Pose) -> None:
        with self.lock:
            self.poses.add(stamp, pose)  # the controller reads the same history
            self._poll()

    def bridge_state(self, status: str) -> None:
        idle, takes = bridge_event(status)
        with self.lock:
            self.bridge_idle, self.bridge_status = idle, status
            if self.control is not None:
                self._apply(self.control.bridge(self.clock(), idle, takes))
            self._poll()

    def close(self) -> None:
        with self.lock:
            self.stopping = True
            self._end("node stopped")
            self.lock.notify_all()
        self.worker.join(timeout=5.0)

    # -- the episode --------------------------------------------------------------------------------

    @property
    def request_id(self) -> str:
        return f"nav-{self.number}"

    def _begin(self) -> None:
        """(Under the lock.) Start the instruction's episode if none runs and the navigator can."""
        if self.control is not None or not self.instruction_text or self.navigator is None or not self.active:
            return
        self.control = EpisodeController(self.config, self.clock(), self.bridge_idle, self.poses)
        self.control.frame(self.newest)
        self._poll()

    def _poll(self) -> None:
        """(Under the lock.) Hand the worker the next decision if the controller starts one now."""
        if self.control is None or self.busy or self.job is not None:
            return
        frame = self.control.next_decision(self.clock())
        if frame is not None:
            self.job = (self.number, frame)
            self.lock.notify_all()

    def _apply(self, effects: list[Effect]) -> None:
        """(Under the lock.) Publish what the controller decided."""
        for effect in effects:
            if isinstance(effect, HandOver):
                self.out.action(self.request_id, effect, self.clock() - effect.frame.taken_at)
            elif isinstance(effect, Drop):
                self._log_drop(effect)
            elif isinstance(effect, End):
                self._close_episode(effect)

    def _log_drop(self, drop: Drop) -> None:
        if drop.reason == "stale":
            self.out.log("warning", f"{self.request_id}: {drop.note}; dropped: if decisions take that long here, "
                                    "raise max_frame_age_s on the navigator and the bridge")
        elif drop.reason == "no odometry":
            if not self.warned_odometry:
                self.warned_odometry = True
                self.out.log("warning", f"overlap: {drop.note}; dropping such decisions and deciding "
                                        "stop-and-go until odometry arrives")
        else:
            self.out.log("info", f"{self.request_id}: {drop.note}; deciding again")

    def _end(self, outcome: str, stop: str = "") -> None:
        """(Under the lock.) End the running episode from outside the policy."""
        if self.control is not None:
            end = self.control.end(outcome, stop)
            if end is not None:
                self._close_episode(end)
        self.control, self.job = None, None

    def _close_episode(self, end: End) -> None:
        """(Under the lock.) Publish the ended episode's stop (if due) and summary."""
        control = self.control
        assert control is not None
        if end.stop:
            self.out.stop(self.request_id, end.stop)
        policy = control.summary()
        summary = {"episode": self.number, "instruction": self.instruction_text, "outcome": end.outcome,
                   "actions": policy["actions"], "overlap": self.config.overlap, "waiting_s": policy["waiting_s"],
                   "waited_rounds": policy["waited_rounds"], "first_motion_s": policy["first_motion_s"],
                   "dropped": policy["dropped"]}
        w = control.waiting
        self.out.log("info", f"episode {self.number} {end.outcome} after {policy['actions']} action(s): waited "
                             f"{w.total_s:.2f} s for decisions ({w.waited_rounds} of {w.rounds} rounds), first motion "
                             f"after {policy['first_motion_s']} s")
        self.out.summary(summary)
        self.control, self.instruction_text, self.last_outcome = None, "", end.outcome

    def snapshot(self) -> dict:
        """What an operator asks (navigator_node's diagnostics): the episode, its frame, the bridge."""
        with self.lock:
            return {"episode": self.number, "running": self.control is not None, "instruction": self.instruction_text,
                    "last outcome": self.last_outcome, "decisions": self.done, "deciding": self.busy,
                    "frame age s": self.clock() - self.newest.taken_at if self.newest is not None else None,
                    "bridge": self.bridge_status, "navigator loaded": self.navigator is not None}

    # -- the worker thread --------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self.lock:
                while not self.stopping and self.job is None:
                    self.lock.wait(0.5)
                if self.stopping or self.job is None:
                    return
                (number, frame), self.job = self.job, None
                self.busy, navigator, instruction = True, self.navigator, self.instruction_text
                self.started += 1
                self.lock.notify_all()
            try:
                decision, error = navigator.decide(frame.image, instruction), None
            except Exception as exc:  # never leave the robot moving on a failure
                decision, error = None, exc
            with self.lock:
                self.busy = False
                self.done += 1
                if number == self.number and self.control is not None:
                    if error is not None:
                        self.out.log("error", f"episode {number}: {error!r}; stopping")
                        self._end("navigator failed", f"navigator failed: {error}")
                    else:
                        self._apply(self.control.decided(self.clock(), frame, decision))
                self._poll()
                self.lock.notify_all()
