"""Shared fixtures: a real Zenoh router on a free port, this process as a node host."""

from __future__ import annotations

import os
import threading

import pytest

from support import Proc, python_module, wait_until


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

    def spin():
        while not stop.is_set() and ctx.ok():
            embedded.spin_once(0.1, ctx)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    yield embedded
    stop.set()
    thread.join(5)
    embedded.shutdown()
