"""Shared fixtures: a real Zenoh router on a free port, this process as a node host on the embedded
backend or under rclpy, and the sourced ROS 2 environment (loopback only, enforced)."""

from __future__ import annotations

import os
import random
import subprocess
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from support import REPO, Proc, python_module, wait_until

# `make test` runs the suite in a shell with ROS 2 sourced, which would select rclpy for this
# process and every child; tests choose the backend themselves (the `host` fixture).
os.environ.setdefault("EDGE_LLM_BACKEND", "zenoh")
ROS2_INSTALL = REPO / "build" / "ros2" / "install"


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


def check_loopback_only(env: dict) -> None:
    """Fail unless DDS in ``env`` stays on this machine: discovery range LOCALHOST and a Fast DDS
    profile (the default participant profile) with no builtin transports, UDP only through
    127.0.0.1, every locator and initial peer 127.0.0.1, no multicast."""
    problems = []
    if env.get("ROS_AUTOMATIC_DISCOVERY_RANGE") != "LOCALHOST":
        problems.append(f"ROS_AUTOMATIC_DISCOVERY_RANGE is {env.get('ROS_AUTOMATIC_DISCOVERY_RANGE')!r}, not LOCALHOST")
    if env.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp") != "rmw_fastrtps_cpp":
        problems.append(f"RMW_IMPLEMENTATION is {env['RMW_IMPLEMENTATION']!r}: the loopback profile is Fast DDS's")
    if any(peer.strip() not in ("", "127.0.0.1", "localhost") for peer in env.get("ROS_STATIC_PEERS", "").split(";")):
        problems.append(f"ROS_STATIC_PEERS names other hosts: {env['ROS_STATIC_PEERS']!r}")
    profile = Path(env.get("FASTRTPS_DEFAULT_PROFILES_FILE", ""))
    if not profile.is_file():
        problems.append(f"FASTRTPS_DEFAULT_PROFILES_FILE is not a file: {str(profile)!r}")
    else:
        root = ET.parse(profile).getroot()
        tags = {el.tag.split("}")[-1]: el for el in root.iter()}
        texts = lambda tag: [el.text.strip() for el in root.iter() if el.tag.split("}")[-1] == tag and el.text]
        participants = [el for el in root.iter() if el.tag.endswith("participant") and el.get("is_default_profile") == "true"]
        if not participants:
            problems.append(f"{profile}: no default participant profile")
        if texts("useBuiltinTransports") != ["false"]:
            problems.append(f"{profile}: builtin transports are not off")
        if any(addr != "127.0.0.1" for addr in texts("address")) or not texts("address"):
            problems.append(f"{profile}: an address other than 127.0.0.1: {texts('address')}")
        if any("ulticast" in tag for tag in tags):
            problems.append(f"{profile}: a multicast setting")
        for desc in (el for el in root.iter() if el.tag.endswith("transport_descriptor")):
            kind = next((c.text for c in desc if c.tag.endswith("type")), "")
            white = [c for c in desc.iter() if c.tag.endswith("interfaceWhiteList")]
            if kind.startswith("UDP") and not white:
                problems.append(f"{profile}: a {kind} transport without an interface whitelist")
    if problems:
        pytest.fail("refusing to run DDS off loopback: " + "; ".join(problems))


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
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    check_loopback_only(env)
    yield env
    subprocess.run(["ros2", "daemon", "stop"], env=env, capture_output=True, timeout=30)


@pytest.fixture(scope="session")
def rclpy_host(ros2_env):
    """This process as a node host under rclpy, on a ROS domain of its own."""
    from hosts import RclpyHost

    host = RclpyHost(domain_id=random.randint(100, 200))
    yield host
    host.close()


@pytest.fixture(scope="session")
def embedded_host(rt_session):
    from hosts import EmbeddedHost

    return EmbeddedHost(rt_session)

