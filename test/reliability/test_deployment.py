"""Issue 11's targets on the launched edge_cloud deployment: 0 crashes, 0 hangs and 0 live
requests lost under 10,000 fuzzed messages plus 30 concurrent goals; RSS growth under 50 MB after
the fuzz; every refused input answered with a clear error; after each fault (verifier_node,
draft_node, the Zenoh router killed mid-goal) the next goal returns the target's exact greedy
text (after the verifier's restart within 2 x its start time). The bench calls a goal exact by its
own reference (the engine's ar); the tests compare the tokens it reports with transformers' own
greedy generate on the same weights, computed here (test/references.py)."""

from __future__ import annotations

import pytest

from edge_llm_ros.errors import Status

pytestmark = [pytest.mark.slow, pytest.mark.serial]


@pytest.fixture(scope="module")
def independent(references):
    """is_greedy(output): a goal's reported output is OK and equals transformers' own greedy tokens."""
    greedy = references.Greedy("torch")

    def is_greedy(output: dict) -> bool:
        return output["status"] == Status.OK and output["tokens"] == greedy.tokens(output["prompt"], output["max_new_tokens"])

    return is_greedy


def test_the_bench_meets_every_target(reliability):
    report, _log, code, stderr = reliability
    assert code == 0, stderr[-3000:]
    assert report["scenario"] == "reliability" and report["messages"] >= 10_000
    assert report["crashes"] == 0 and report["hangs"] == 0 and report["live_requests_lost"] == 0


def test_a_goal_running_through_the_fuzz_is_exact(reliability, independent):
    fuzz = reliability[0]["fuzz"]
    assert fuzz["live_goal_exact"], fuzz["live_goal"]
    assert independent(fuzz["live_goal"]), fuzz["live_goal"]


def test_every_refused_draft_is_answered_naming_its_field(reliability):
    fuzz = reliability[0]["fuzz"]
    assert fuzz["owed_answers"] > 2000 and fuzz["unanswered"] == 0
    assert fuzz["wrong_errors"] == {}


def test_every_instruction_gets_its_final_chunk(reliability):
    fuzz = reliability[0]["fuzz"]
    assert fuzz["instructions"] > 1000 and fuzz["instruction_answers"] >= fuzz["instructions"]


def test_memory_stays_bounded(reliability):
    report = reliability[0]
    assert report["rss_growth_mb"] < 50, (report["rss_before_mb"], report["rss_after_mb"])


def test_malformed_bytes_are_dropped_with_an_error_naming_topic_and_type(reliability):
    log = reliability[1]
    assert "dropped a malformed message on /edge_llm/draft (type edge_llm_ros/msg/DraftTree" in log
    assert "dropped a malformed message on /edge_llm/verify (type edge_llm_ros/msg/VerifyResult" in log
    assert "Traceback" not in log


def test_overload_refuses_the_extra_goals_as_busy_and_serves_the_rest_exactly(reliability, independent):
    overload = reliability[0]["overload"]
    assert overload["goals"] == 30 and overload["clients"] == 3
    assert overload["accepted"] == 8 and overload["refused_busy"] == 22  # draft_node's max_requests
    assert overload["exact"] == overload["accepted"] and overload["hangs"] == 0, overload["failed"]
    assert len(overload["outputs"]) == overload["accepted"]
    assert all(independent(goal) for goal in overload["outputs"]), overload["outputs"]
    assert "generate: goal rejected, busy: 8 running and 0 waiting (max_requests, max_pending)" in reliability[1]


@pytest.mark.parametrize("peer", ["verifier_node", "draft_node", "zenoh_router"])
def test_a_killed_peer_ends_the_goal_and_the_deployment_recovers(reliability, independent, peer):
    report = reliability[0]
    fault = report["faults"][peer]
    assert fault["goal_in_flight"]["ended"], fault
    assert fault["recovery_s"] is not None, fault["last"]
    assert independent(fault["last"]), fault["last"]  # the goal that counted as recovered
    assert f"process {peer} died (exit code -9)" in reliability[1]
    if peer == "zenoh_router":
        assert "zenoh router at tcp/127.0.0.1:" in reliability[1] and "is gone; starting a new one" in reliability[1]
    else:
        assert f"process {peer} died (exit code -9); respawning in 1 s" in reliability[1]
    if peer == "verifier_node":  # the target; the robot side noticed at once, not after timeout_s
        assert fault["recovery_s"] <= 2 * report["start_s"][peer], (fault, report["start_s"])
        assert fault["goal_in_flight"]["reason"].startswith("error: verifier gone"), fault
    if peer == "draft_node":
        assert "went away while goal" in fault["goal_in_flight"]["error"], fault
