"""A callback that raises on a shared spin thread fails the test it belongs to with that exception,
and the thread serves the next test of the worker (callback_errors, as conftest wires it for the
embedded and rclpy spin threads): an inner pytest session with the same wiring, on a spin thread
that runs the callbacks queued to it."""

from __future__ import annotations

pytest_plugins = ("pytester",)

CONFTEST = '''
import queue
import threading

import pytest
from callback_errors import CallbackErrors

ERRORS = CallbackErrors()
CALLBACKS = queue.Queue()


def pytest_configure(config):
    config.pluginmanager.register(ERRORS, "callback_errors")


def spin_once():
    try:
        callback = CALLBACKS.get(timeout=0.1)
    except queue.Empty:
        return
    callback()


@pytest.fixture(scope="session")
def spin_thread():
    stop = threading.Event()
    thread = threading.Thread(target=ERRORS.spin, args=(spin_once, lambda: not stop.is_set()), daemon=True)
    thread.start()
    yield thread
    stop.set()
    thread.join(10)


@pytest.fixture
def run(spin_thread):
    """run(callback): the callback on the spin thread; returns once the thread is past it."""
    def on_the_thread(callback):
        past = threading.Event()
        CALLBACKS.put(callback)
        CALLBACKS.put(past.set)
        assert past.wait(10), "the spin thread did not get past the callback"
    return on_the_thread
'''

TESTS = '''
def test_first_its_callback_raises(run):
    def callback():
        raise ValueError("boom in a callback")
    run(callback)


def test_then_the_next_one_is_served(run, spin_thread):
    served = []
    run(lambda: served.append("yes"))
    assert served == ["yes"] and spin_thread.is_alive()
'''


def test_a_raising_callback_fails_its_test_with_that_exception_and_the_next_test_is_served(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the short summary is cut to the terminal's width (80 when piped)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:launch_ros", "-p", "no:launch_testing",
                                 "-rA")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_inner.py::test_first_its_callback_raises - ValueError: boom in a callback"])
    result.stdout.fnmatch_lines(["PASSED test_inner.py::test_then_the_next_one_is_served"])
    # the failure's report shows the callback's own frame and says where it was raised
    result.stdout.fnmatch_lines(["*raise ValueError(\"boom in a callback\")*",
                                 "*raised in a callback on the shared spin thread during this test's call*"])
