"""Waiting for an action goal from the client side, the same way on both backends.

An rclpy Future never blocks (``result()`` returns None until it is done; only the executor that
spins its node completes it); the embedded backend's waits with a timeout. Code that must run on
either waits the way both allow: a done callback sets an Event, and the caller waits on that with
a deadline (:func:`wait_for`). On top of it, a goal's life as a client sees it:

    handle = send_goal(client, goal, on_feedback, timeout=10)     # NoAnswer if nobody takes it
    response = wait_result(client, handle, timeout=300, stop=ctrl_c)  # .status, .result

:func:`wait_result` never hangs: it ends with the response, with :class:`NoAnswer` when the
deadline passes, or with :class:`~edge_llm_ros.runtime.actions.ServerGoneError` when the action
server leaves the graph while the goal runs (the embedded backend also fails the result's future
so; under rclpy it never would). Setting ``stop`` cancels the goal and goes on waiting for its
result. :class:`ServerWatch` is that presence check for callers with a wait loop of their own
(edge_llm_ros.client's streams). `edge-llm-ros action send_goal` and edge_llm_ros.client share
this code.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from edge_llm_ros.runtime.actions import ServerGoneError

SLICE_S = 0.1  # how often a wait looks at its deadline, its stop event and the server
ABSENT_S = 1.0  # an action server missing from the graph this long has gone away
CANCEL_TIMEOUT_S = 10.0


class NoAnswer(TimeoutError):
    """Nothing answered within the caller's timeout: no server took the goal, or no result came."""


def done_event(future: Any) -> threading.Event:
    """An Event set when ``future`` (either backend's) is done."""
    event = threading.Event()
    future.add_done_callback(lambda _: event.set())
    if future.done():
        event.set()
    return event


def wait_for(future: Any, timeout: float | None, what: str) -> Any:
    """``future``'s result (raising its failure), waiting up to ``timeout`` seconds (None: as long as
    it takes); NoAnswer naming ``what`` when it is not done by then."""
    if not done_event(future).wait(timeout):
        raise NoAnswer(f"no answer to {what} within {timeout:g} s")
    failure = future.exception()
    if failure is not None:
        raise failure
    return future.result()


def action_name(client: Any) -> str:
    """The action's name as its client knows it (either backend's ActionClient)."""
    return str(getattr(client, "name", None) or getattr(client, "_action_name", "the action"))


class ServerWatch:
    """Raises ServerGoneError from :meth:`check` once ``client``'s server has been missing from the
    graph for ``absent_s`` (one look a SLICE_S or less apart is enough: the graph is cached)."""

    def __init__(self, client: Any, absent_s: float = ABSENT_S) -> None:
        self.client, self.absent_s = client, absent_s
        self.missing_since: float | None = None

    def check(self, goal: str = "") -> None:
        if self.client.server_is_ready():
            self.missing_since = None
            return
        now = time.monotonic()
        self.missing_since = self.missing_since or now
        if now - self.missing_since >= self.absent_s:
            raise ServerGoneError(f"action server {action_name(self.client)} went away while goal "
                                  f"{goal or '(unnamed)'} was running")


def goal_name(handle: Any) -> str:
    """A goal's id as hex (the embedded backend's bytes, or rclpy's unique_identifier_msgs/UUID)."""
    raw = getattr(handle.goal_id, "uuid", handle.goal_id)
    return bytes(bytearray(raw)).hex()


def send_goal(client: Any, goal: Any, feedback_callback: Callable | None = None,
              timeout: float = CANCEL_TIMEOUT_S) -> Any:
    """Send ``goal`` once a server is there; its goal handle (``accepted`` says whether the server took
    it). NoAnswer when no server appears, or none answers, within ``timeout``."""
    deadline = time.monotonic() + timeout
    while not client.wait_for_server(timeout_sec=min(SLICE_S * 5, max(deadline - time.monotonic(), 0.0))):
        if time.monotonic() >= deadline:
            raise NoAnswer(f"no action server {action_name(client)} within {timeout:g} s")
    future = client.send_goal_async(goal, feedback_callback)
    return wait_for(future, max(deadline - time.monotonic(), SLICE_S), f"a goal sent to {action_name(client)}")


def cancel_goal(handle: Any, timeout: float = CANCEL_TIMEOUT_S) -> Any:
    """Ask the server to cancel the goal; its CancelGoal response (NoAnswer if none in time)."""
    return wait_for(handle.cancel_goal_async(), timeout, f"the cancel of goal {goal_name(handle)}")


def wait_result(client: Any, handle: Any, timeout: float | None, stop: threading.Event | None = None,
                result_future: Any = None) -> Any:
    """The goal's GetResult response (``.status``, ``.result``). NoAnswer after ``timeout`` seconds (None:
    no limit), ServerGoneError when the server leaves first. ``stop`` set: the goal is cancelled (once
    per setting; the event is cleared) and the wait goes on for the result the cancel brings."""
    future = result_future if result_future is not None else handle.get_result_async()
    done, watch = done_event(future), ServerWatch(client)
    deadline = None if timeout is None else time.monotonic() + timeout
    name = goal_name(handle)
    while not done.wait(SLICE_S):
        if stop is not None and stop.is_set():
            stop.clear()
            cancel_goal(handle)
        watch.check(name)
        if deadline is not None and time.monotonic() >= deadline:
            raise NoAnswer(f"no result for goal {name} of {action_name(client)} within {timeout:g} s")
    failure = future.exception()
    if failure is not None:
        raise failure
    return future.result()


__all__ = ["NoAnswer", "ServerGoneError", "ServerWatch", "cancel_goal", "done_event", "goal_name", "send_goal",
           "wait_for", "wait_result"]
