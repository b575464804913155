"""edge_llm_ros.client.NavigatorClient against a stand-in navigator in this process
(fake_navigator.py), on both runtimes."""

from __future__ import annotations

import itertools

import pytest
from fake_navigator import FakeNavigator
from hosts import BACKENDS, host_for
from support import wait_until

from edge_llm_ros import errors
from edge_llm_ros.client import Episode, NavigatorClient, NoAnswer

_spaces = itertools.count()


@pytest.fixture(params=BACKENDS)
def navigator(request):
    host = host_for(request, request.param)
    namespace = f"/nav_client_test_{next(_spaces)}"
    fake = FakeNavigator(host, namespace)
    probes = []

    def client() -> NavigatorClient:
        probe = host.Node(f"nav_probe_{len(probes)}", namespace=namespace) if host.backend == "rclpy" else None
        nav = NavigatorClient(namespace, node=probe)
        probes.append((nav, probe))
        return nav

    try:
        yield fake, client
    finally:
        for nav, probe in probes:
            nav.close()
            if probe is not None:
                probe.destroy_node()
        fake.close()


def test_navigate_returns_the_episode_summary_as_a_record(navigator):
    fake, client = navigator
    nav = client()
    with pytest.raises(NoAnswer, match="navigator is unconfigured, not active"):
        nav.wait_until_ready(1.0)
    fake.activate()
    nav.wait_until_ready(30)
    episode = nav.navigate("  go to the red chair ", timeout=30)
    assert episode == Episode(1, "go to the red chair", "stop", 3, True, 1.25, 2, 0.5, {"frames": 9})


def test_a_repeated_instruction_waits_for_its_new_episode_not_the_latched_one(navigator):
    fake, client = navigator
    fake.activate()
    first = client()
    first.wait_until_ready(30)
    assert first.navigate("explore", timeout=30).episode == 1
    fresh = client()  # hears episode 1's latched summary, of the same instruction
    fresh.wait_until_ready(30)
    assert fresh.navigate("explore", timeout=30).episode == 2
    wait_until(lambda: first.last_episode().episode == 2, 10, "the first client to hear episode 2")
    assert first.navigate("explore", timeout=30).episode == 3


def test_no_summary_in_time_is_no_answer_and_bad_input_is_invalid(navigator):
    fake, client = navigator
    fake.activate()
    nav = client()
    nav.wait_until_ready(30)
    with pytest.raises(NoAnswer, match=r"no episode summary for 'ignore' on /nav_client_test_\d+/navigator/episode "
                                       r"within 0.5 s"):
        nav.navigate("ignore", timeout=0.5)
    for bad in ("", "   ", None):
        with pytest.raises(errors.Invalid, match="instruction must be a non-empty string"):
            nav.navigate(bad)


def test_a_malformed_summary_is_kept_aside_and_the_episode_still_found(navigator):
    fake, client = navigator
    fake.activate()
    nav = client()
    nav.wait_until_ready(30)
    fake.publish("not json")
    fake.publish({"episode": 7})
    assert nav.navigate("dock", timeout=30).outcome == "stop"
    assert nav.malformed == ["episode summary is not JSON (Expecting value): 'not json'",
                             "episode summary lacks episode, instruction or outcome: '{\"episode\": 7}'"]
