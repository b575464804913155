"""The stage pipeline through real processes (issue 14): `edge-llm-ros launch stages` starts one
stage_node per layer range and draft_node as D0, on the embedded runtime.

- 2 and 3 stages with uneven splits: a Generate goal in every lossless mode (naive pipeline `ar`,
  `chunk_pp`, `flowspec`) returns exactly SmolLM2's greedy tokens (transformers' own generate on the
  same weights, in this process: test/references.py), with the prompt prefilled in chunks back to back.
- A stage dies: the goal running on it ends with an error naming that stage, within seconds, and
  the rest stays up; the launcher starts the stage again and the next goal succeeds.

Goals go through edge_llm_ros.client (readiness: every node lifecycle-active); D0's figures come
from the result's InferenceStats, as bench --scenario pipeline reads them.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest
from hosts import host_for
from support import Proc, cli, setup_budget, wait_until

from edge_llm_ros import errors
from edge_llm_ros.client import LLMClient

pytestmark = pytest.mark.slow  # real node processes with SmolLM2

PROMPT = "Give two tips for a robot that explores a house."
MAX_NEW_TOKENS = 24
SPLITS = {"2 stages": "0-10,11-29", "3 stages": "0-6,7-18,19-29"}


@pytest.fixture(scope="module")
def expected(references):
    """transformers' own greedy tokens for PROMPT on SmolLM2's weights (the reference)."""
    import torch

    torch.set_num_threads(1)
    return references.Greedy("torch").tokens(PROMPT, MAX_NEW_TOKENS)


@pytest.fixture(scope="module", params=list(SPLITS))
@setup_budget(120)
def deployment(request, router_endpoint):
    """The launch (stages + draft_node), a client of `generate` on a node of the host, the stage count."""
    host = host_for(request)
    layers = SPLITS[request.param]
    count = len(layers.split(","))
    launch = Proc([sys.executable, "-m", "edge_llm_ros.runtime.cli", "launch", "stages", f"layers:={layers}",
                   "prefill_chunk:=16", "timeout_s:=20.0", "--router", router_endpoint], env=host.child_env)
    probe = host.Node("stage_pipeline_probe", namespace="edge_llm")
    llm = LLMClient("/edge_llm", node=probe, timeout=120.0)
    try:
        for i in range(count):
            llm.wait_until_active(f"/edge_llm/stage_{i}", 180)
        assert llm.wait_until_ready(180) == "/edge_llm/draft_node"
        yield launch, llm, count
    finally:
        llm.close()
        probe.destroy_node()
        launch.stop()


def run_goal(llm, mode: str, timeout: float = 120):
    """A greedy goal, streamed: (its result, its chunks); a failing one raises (edge_llm_ros.errors)."""
    stream = llm.stream(PROMPT, mode=mode, max_new_tokens=MAX_NEW_TOKENS, timeout=timeout)
    chunks = list(stream)
    return stream.result(), chunks


def test_every_lossless_mode_through_the_stage_processes_equals_ar(deployment, expected):
    launch, llm, _ = deployment
    for mode in ("ar", "chunk_pp", "flowspec"):
        result, chunks = run_goal(llm, mode)
        assert result.token_ids == expected, mode
        assert [t for c in chunks for t in c.token_ids] == expected, mode
        s = result.stats
        assert s.mode == mode
        if mode == "flowspec":
            assert s.tau > 1.0 and s.alt > 1.0  # tokens per pipeline turn (ALT)
        # D0's drafting, as bench --scenario pipeline reads it: one torch thread (config/stages.yaml), so
        # that thread's CPU seconds
        assert s.draft_time_is_cpu
        if mode == "ar":
            assert (s.drafts, s.draft_forwards, s.draft_time_s) == (0, 0, 0.0)
        else:
            assert 0 < s.drafts <= s.draft_forwards and s.draft_time_s > 0
            assert s.alt > 0 and s.alr > 0  # FlowSpec §V-A: per pipeline turn, per verification round


@pytest.mark.parametrize("deployment", ["2 stages"], indirect=True)
@pytest.mark.timeout(360)
def test_a_dead_stage_fails_its_request_naming_it_and_rejoins_when_restarted(deployment, expected):
    launch, llm, count = deployment
    pid = int(re.findall(r"started stage_1 \(pid (\d+)\)", launch.output)[-1])
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(errors.PeerGone) as caught:
        run_goal(llm, "flowspec", timeout=60)
    reason = caught.value.result.finish_reason
    assert "stage 1 (/edge_llm/stage_1/in) gone" in reason, reason
    assert time.monotonic() - started < 15
    wait_until(lambda: len(re.findall(r"started stage_1 \(pid", launch.output)) == 2, 30, "stage_1 restarted")
    wait_until(lambda: launch.output.count("active: stage 1 of 2") == 2, 180, "stage_1 active again")
    result, _ = run_goal(llm, "flowspec")
    assert result.token_ids == expected


@pytest.mark.parametrize("deployment", ["2 stages"], indirect=True)
def test_a_stage_that_refuses_ends_the_goal_with_its_reason(deployment, expected):
    """A stage that is not active refuses the rows; D0 ends the goal with that refusal at once, its
    code the stage's (INACTIVE: the client raises Inactive)."""
    launch, llm, _ = deployment
    done = cli("lifecycle", "set", "/edge_llm/stage_1", "deactivate")
    assert done.returncode == 0, done.stderr
    try:
        started = time.monotonic()
        with pytest.raises(errors.Inactive) as caught:
            run_goal(llm, "flowspec", timeout=60)
        reason = caught.value.result.finish_reason
        assert "stage 1 (/edge_llm/stage_1): inactive: /edge_llm/stage_1 is inactive" in reason, reason
        assert time.monotonic() - started < 10  # the refusal, not timeout_s (20 s)
    finally:
        done = cli("lifecycle", "set", "/edge_llm/stage_1", "activate")
        assert done.returncode == 0, done.stderr
    result, _ = run_goal(llm, "chunk_pp")
    assert result.token_ids == expected


@pytest.mark.parametrize("deployment", ["2 stages"], indirect=True)
@pytest.mark.timeout(240)
def test_outline_mode_expands_its_points_at_once_and_says_it_is_not_lossless(deployment):
    """Outline decoding (not lossless): the outline, then every point through the stages at once from
    a fork of the outline's cache; the answer is its points in order, or, for an outline of fewer
    than two points, the plain flowspec answer."""
    launch, llm, _ = deployment
    prompt = "List four things a home robot should check every morning."
    result = llm.generate(prompt, mode="outline", max_new_tokens=24, timeout=180)
    assert result.stats.mode == "outline"
    lines = result.text.splitlines()
    if "answering plainly" in launch.output:
        assert not re.match(r"1\. ", result.text)
    else:
        assert len(lines) >= 2 and all(line.startswith(f"{i + 1}. ") for i, line in enumerate(lines)), lines
