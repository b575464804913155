"""Shared fixtures: a real Zenoh router on a free port, this process as a node host on the embedded
backend or under rclpy, and the sourced ROS 2 environment (loopback only, enforced). The suite's
rules: a callback that raises on a shared spin thread fails its own test (callback_errors); under
CI nothing skips; a fixture's declared setup budget (support.setup_budget) is added to the timeout
of every test that uses it."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time


def _pin_parallel_worker() -> None:
    """In the parallel pass (pytest-xdist, `make test`'s `-n 2`) each worker, and every process it
    starts, runs on its own share of the cores. A node's "every core" (threads 0: torch's and
    llama.cpp's threads, core.drafts.loading.usable_cores) is then that share. Unpinned, a node with
    a thread per core beside the other worker's made ggml's threads wait for each other by spinning:
    test_serve_node's fifty goals took 193 s against 24-29 s in runs where its neighbour was idle,
    the demo 120 s against 16 s alone. Before anything imports torch, which sizes its pool from the
    affinity."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker[2:]) % count::count])


_pin_parallel_worker()

import pytest
from callback_errors import SUITE as CALLBACK_ERRORS
from support import DOMAINS_DRAWN, REPO, Proc, check_loopback_only, in_ci, python_module, ros_domain, wait_until

# `make test` runs the suite in a shell with ROS 2 sourced, which would select rclpy for this
# process and every child; tests choose the backend themselves (the `host` fixture).
os.environ.setdefault("EDGE_LLM_BACKEND", "zenoh")
# The launch_pytest plugin imports `launch`, whose logging makes every logger created after it
# non-propagating (launch.logging.LaunchLogger), out of reach of caplog, which pytest 8 attaches to
# the root logger only. This package's loggers, created after this line, propagate as usual.
logging.setLoggerClass(logging.Logger)
ROS2_INSTALL = REPO / "build" / "ros2" / "install"


PROC_TAIL_LINES = 40  # of each running node process, in a failing test's report
TEST_STARTED = pytest.StashKey[float]()  # time.monotonic() as the test's setup began


def pytest_configure(config):
    config.pluginmanager.register(CALLBACK_ERRORS, "callback_errors")  # the shared spin threads' (rt_session, hosts)


def pytest_collection_modifyitems(config, items):
    """A test's timeout (pytest-timeout's, which covers setup and teardown) is its own (its
    `timeout` marker, else pyproject.toml's default) plus the setup budget of every fixture it uses
    (support.setup_budget): a long fixture is paid for by whichever test sets it up first."""
    default = float(getattr(config, "_env_timeout", None) or 0)  # pytest-timeout's, from ini, env or --timeout
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        budgets = defs and [getattr(d[-1].func, "setup_budget_s", 0.0)
                            for name in item.fixturenames if (d := defs.name2fixturedefs.get(name))]
        if not budgets or not sum(budgets):
            continue
        marker = item.get_closest_marker("timeout")
        kwargs = {k: v for k, v in (marker.kwargs if marker else {}).items() if k != "timeout"}
        item.add_marker(pytest.mark.timeout(declared_timeout(item, default) + sum(budgets), **kwargs), append=False)
    items[:] = longest_files_first(items, default)


def declared_timeout(item, default: float) -> float:
    """A test's own timeout: its `timeout` marker's, else pytest-timeout's default."""
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return default
    return float(marker.args[0] if marker.args else marker.kwargs.get("timeout", default))


def longest_files_first(items: list, default: float) -> list:
    """The test files in the order of the time their tests declare beyond the default timeout
    (most first; the rest as collected), each file's tests in their order. `make test`'s parallel
    pass hands whole files to its two workers in this order (--no-loadscope-reorder; xdist's own
    order, most tests first, left the few long ones to the end: in a fresh-clone run the replay test ran
    alone for its last two minutes while the other worker idled)."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = sorted(files.values(), key=lambda tests: -sum(max(0.0, declared_timeout(t, default) - default)
                                                             for t in tests))
    return [item for tests in ordered for item in tests]


def failed_under_ci(report) -> None:
    """Under CI (support.in_ci) a skipped report becomes a failure that gives the skip's reason."""
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome, report.longrepr = "failed", f"skipped under CI=true, where nothing may skip: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    failed_under_ci(outcome.get_result())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[TEST_STARTED] = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report ends with the last lines of every node process still running or
    stopped during the test (CI keeps no other record of what draft_node or verifier_node logged)."""
    outcome = yield
    report = outcome.get_result()
    failed_under_ci(report)
    if report.failed:
        since = item.stash.get(TEST_STARTED, 0.0)
        stopped = [proc for at, proc in Proc.stopped if at >= since]
        for proc in [*Proc.running, *stopped]:
            name = " ".join(str(a) for a in proc.popen.args[1:4])
            report.sections.append((f"last lines of {name} (pid {proc.popen.pid})", proc.tail(PROC_TAIL_LINES)))


@pytest.fixture(scope="session")
def references():
    """Independent greedy references (test/references.py: llama.cpp's own and transformers' own
    decoding of the same weights), computed in this process and cached for the session."""
    import references as refs

    yield refs
    refs.close()


@pytest.fixture(scope="session")
def router_endpoint():
    """A Zenoh router on a free loopback port for the whole test session; exported to children."""
    from edge_llm_ros.runtime.router import ENDPOINT_ENV, free_endpoint, router_reachable

    endpoint = free_endpoint()
    proc = Proc(python_module("edge_llm_ros.runtime.router", "--listen", endpoint))
    wait_until(lambda: router_reachable(endpoint), 20, f"router at {endpoint}")
    os.environ[ENDPOINT_ENV] = endpoint
    yield endpoint
    proc.stop()


@pytest.fixture(scope="session")
def rt_session(router_endpoint):
    """This test process as a node host on the embedded backend."""
    from edge_llm_ros.runtime import embedded

    embedded.init(args=[], install_signal_handlers=False)
    ctx = embedded.get_context()
    stop = threading.Event()

    def running() -> bool:
        return not stop.is_set() and ctx.ok()

    thread = threading.Thread(target=CALLBACK_ERRORS.spin, args=(lambda: embedded.spin_once(0.1, ctx), running),
                              daemon=True, name="embedded-spin")
    thread.start()
    yield embedded
    stop.set()
    thread.join(5)
    embedded.shutdown()


@pytest.fixture(scope="session")
def ros2_env():
    """This process's environment, which must be a sourced ROS 2 with this package's colcon install
    (`make test` runs the suite so; `make ros2` builds it). Under CI a missing one fails the test;
    elsewhere the test is skipped with what to run. Loopback only is checked, never assumed."""
    env = dict(os.environ)
    missing = [what for what, ok in (
        ("ROS 2 (source .venv/ros2_setup.sh)", env.get("ROS_DISTRO")),
        ("this package's install (make ros2; source build/ros2/install/local_setup.bash)",
         str(ROS2_INSTALL / "edge_llm_ros") in env.get("AMENT_PREFIX_PATH", "").split(os.pathsep)),
    ) if not ok]
    if missing:
        message = "ROS 2 tests need " + " and ".join(missing) + "; `make test` does both"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    check_loopback_only(env)
    yield env
    # `ros2 topic`, `ros2 action` ... start a daemon on their domain and leave it running: stop the
    # one on this environment's domain and on every domain the tests drew
    for domain in [env.get("ROS_DOMAIN_ID"), *map(str, sorted(DOMAINS_DRAWN))]:
        daemon_env = env if domain is None else {**env, "ROS_DOMAIN_ID": domain}
        subprocess.run(["ros2", "daemon", "stop"], env=daemon_env, capture_output=True, timeout=30)


@pytest.fixture(scope="session")
def rclpy_host(ros2_env):
    """This process as a node host under rclpy, on a ROS domain of its own."""
    from hosts import RclpyHost

    host = RclpyHost(domain_id=ros_domain())
    yield host
    host.close()


@pytest.fixture(scope="session")
def embedded_host(rt_session):
    from hosts import EmbeddedHost

    return EmbeddedHost(rt_session)

