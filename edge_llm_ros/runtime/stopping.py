"""Long work that a shutdown signal ends at once, on either backend.

SIGINT and SIGTERM shut a node's context down (rclpy's way, and the embedded backend's): spin
returns and the node cleans up. Work that does not wait in the executor (loading a model,
calibrating the device, measuring for a service request) never looks at the context, so a node
doing it went on until it was done: planner_node ignored SIGTERM for its whole calibration (10-30 s
on 2 cores) until the launcher's SIGKILL. Such work runs as a stoppable call instead:

    record = rt.stoppable(calibrate, model)   # a shutdown signal raises Stopped in calibrate

How Stopped gets there, in whichever thread the call runs:

- The signal handler (main thread) raises it at once when the main thread is in a stoppable call
  (a node's start-up in run_node, every callback of the embedded executor and of rclpy's
  single-threaded one), and starts a stopper thread.
- The stopper hands Stopped to every other thread in a stoppable call (a MultiThreadedExecutor's
  worker running a lifecycle transition under rclpy) with CPython's PyThreadState_SetAsyncExc.
- Once per thread: a second Stopped could cut short the cleanup the first one started (a
  ``finally`` that frees llama.cpp handles, freed twice later: a segfault). Only where Python had
  to drop it, raised inside a ctypes callback (llama.cpp's log callback) from which it cannot
  propagate, is it handed over again (within REDELIVER_S), and the drop is not printed.
- A stoppable call made after the signal raises Stopped at once.

A thread is in a stoppable call while the frame of :func:`_call` is on its stack, which the stopper
reads (sys._current_frames) under a lock that a call takes on its way out: Stopped is never handed
to a thread that has left the call. It is raised at the thread's next bytecode: a C call in
progress (one llama_decode, one torch op, llama.cpp mapping a file) finishes first, and a thread
blocked on a lock or an Event is not woken, so a stoppable call holds computation, not waiting.

Stopped is a KeyboardInterrupt, so ``except Exception`` on its way (a transition's error handling,
rclpy's lifecycle wrapper) lets it through, and run_node ends the node cleanly when it arrives.
Outside stoppable calls a signal only shuts the context down, as before, so a second Ctrl-C cannot
break a node's cleanup. The backends' signal handlers call :func:`signalled`.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from typing import Any, Callable, TypeVar

REDELIVER_S = 0.1  # how soon a Stopped that Python had to drop is handed over again

T = TypeVar("T")


class Stopped(KeyboardInterrupt):
    """A shutdown signal (SIGINT, SIGTERM) ended a stoppable call."""


_stopping = False  # a shutdown signal arrived
_leaving = threading.Lock()  # held by the stopper while it hands Stopped over, and by a call on its way out
_stopper: threading.Thread | None = None
_handed: set[int] = set()  # threads Stopped was raised in or handed to
_dropped: set[int] = set()  # threads where Python dropped it (a ctypes callback): handed over again


def stopping() -> bool:
    """True once a shutdown signal arrived."""
    return _stopping


def stoppable(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, which a shutdown signal ends with :class:`Stopped` (module docstring)."""
    if _stopping:
        raise Stopped()
    return _call(fn, args, kwargs)


def _call(fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
    """Its frame on a thread's stack marks the thread as in a stoppable call."""
    try:
        return fn(*args, **kwargs)
    finally:
        with _leaving:  # not while the stopper hands Stopped over: it found this frame on the stack
            pass
        _set_async_exc(threading.get_ident(), None)  # one handed over and not raised yet: dropped


def signalled(frame: Any = None) -> None:
    """The backends' SIGINT/SIGTERM handler (main thread, after shutting its context down), ``frame``
    the handler's: Stopped here if the main thread is in a stoppable call (once); the stopper started."""
    global _stopper, _stopping
    _stopping = True
    main = threading.get_ident()
    raise_here = frame is not None and main not in _handed and _in_call(frame)
    if raise_here:
        _handed.add(main)  # before the stopper starts: it hands Stopped to each thread once
    if _stopper is None:
        sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)
        _stopper = threading.Thread(target=_stop_calls, daemon=True, name="stopper")
        _stopper.start()
    if raise_here:
        raise Stopped()


def _stop_calls() -> None:
    """The stopper: Stopped to each thread in a stoppable call once, again where Python dropped it."""
    while True:
        with _leaving:
            _hand_over()
        time.sleep(REDELIVER_S)


def _hand_over() -> None:
    """Stopped to each thread in a stoppable call that has not had it, or had it dropped (under _leaving)."""
    for tid, frame in sys._current_frames().items():
        if (tid not in _handed or tid in _dropped) and _in_call(frame):
            _handed.add(tid)
            _dropped.discard(tid)
            _set_async_exc(tid, Stopped)


def _in_call(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code is _call.__code__:
            return True
        frame = frame.f_back
    return False


def _quiet_unraisable(previous: Callable[[Any], object]) -> Callable[[Any], object]:
    """sys.unraisablehook that notes a dropped Stopped for the stopper to hand over again, quietly,
    and hands anything else to ``previous``. It runs in the thread that dropped it."""
    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, Stopped):
            _dropped.add(threading.get_ident())
            return
        previous(unraisable)

    return hook


def _set_async_exc(tid: int, exc: type[BaseException] | None) -> None:
    """Have thread ``tid`` raise ``exc`` at its next bytecode; None drops one not raised yet."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(exc) if exc else None)
