"""Exceptions raised by callbacks on the suite's shared spin threads (conftest.rt_session's embedded
spin thread, hosts.RclpyHost's executor), failing the test they belong to.

A shared spin thread serves the nodes of every test of a worker. Unguarded, the first callback that
raises ends it, and every later test of that worker waits for callbacks that never run. Spun through
``CallbackErrors.spin``, the thread records what a callback raised and spins on; as a pytest plugin
(conftest registers one), the same object ends each phase of a test (setup, call, teardown) by
raising the first exception recorded during it, with its traceback, so the test whose callback
raised fails with that exception and the next test of the worker runs as usual. An exception
recorded between two tests is raised in the next one's setup, saying so.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable

import pytest


class CallbackErrors:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []

    def record(self, exc: BaseException) -> None:
        with self._lock:
            self._errors.append(exc)
        print(f"shared spin thread: {exc!r} raised in a callback; spinning on", file=sys.stderr)

    def take(self) -> list[BaseException]:
        with self._lock:
            taken, self._errors = self._errors, []
        return taken

    def spin(self, spin_once: Callable[[], object], running: Callable[[], bool]) -> None:
        """Call ``spin_once()`` while ``running()``. What a callback raised through it is recorded
        (for the test running now) and the loop goes on; once ``running()`` is false it ends quietly."""
        while running():
            try:
                spin_once()
            except Exception as exc:  # noqa: BLE001 - raised again in the test it belongs to
                if not running():
                    return
                self.record(exc)

    def raise_recorded(self, phase: str) -> None:
        errors = self.take()
        if not errors:
            return
        first = errors[0]
        where = "before this test's setup ended (or after the previous test)" if phase == "setup" \
            else f"during this test's {phase}"
        first.add_note(f"raised in a callback on the shared spin thread {where}")
        for more in errors[1:]:
            first.add_note(f"and later: {more!r}")
        raise first

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        result = yield
        self.raise_recorded("setup")
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        result = yield
        self.raise_recorded("call")
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        result = yield
        self.raise_recorded("teardown")
        return result


SUITE = CallbackErrors()  # the suite's: conftest registers it as a plugin; its spin threads record into it
