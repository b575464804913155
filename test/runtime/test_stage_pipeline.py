"""The stage pipeline through real processes (issue 14): `edge-llm-ros launch stages` starts one
stage_node per layer range and draft_node as D0, on the embedded runtime.

- 2 and 3 stages with uneven splits: a Generate goal in every lossless mode (naive pipeline `ar`,
  `chunk_pp`, `flowspec`) returns exactly SmolLM2's greedy tokens (the engine's `ar` on the whole
  model), with the prompt prefilled in chunks back to back.
- A stage dies: the goal running on it ends with an error naming that stage, within seconds, and
  the rest stays up; the launcher starts the stage again and the next goal succeeds.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest
from hosts import host_for
from support import Proc, cli, wait_until

from edge_llm_ros.tools.pipeline_deployment import STATS_LINE

pytestmark = pytest.mark.slow  # real node processes with SmolLM2

PROMPT = "Give two tips for a robot that explores a house."
MAX_NEW_TOKENS = 24
SPLITS = {"2 stages": "0-10,11-29", "3 stages": "0-6,7-18,19-29"}
STATUS_SUCCEEDED, STATUS_ABORTED = 4, 6


@pytest.fixture(scope="module")
def expected():
    import torch

    from edge_llm_ros.core.engine.config import preset
    from edge_llm_ros.core.engine.decoding import generate_all
    from edge_llm_ros.core.engine.models import chat_prompt, load_model

    torch.set_num_threads(1)
    target = load_model()
    ids = chat_prompt(target.tokenizer, PROMPT)
    return generate_all(target, ids, preset("ar", max_new_tokens=MAX_NEW_TOKENS)).tokens


@pytest.fixture(scope="module", params=list(SPLITS))
def deployment(request, router_endpoint):
    """The launch (stages + draft_node), an action client on `generate`, the host."""
    host = host_for(request)
    layers = SPLITS[request.param]
    count = len(layers.split(","))
    launch = Proc([sys.executable, "-m", "edge_llm_ros.runtime.cli", "launch", "stages", f"layers:={layers}",
                   "prefill_chunk:=16", "timeout_s:=20.0", "--router", router_endpoint], env=host.child_env)
    probe = host.Node("stage_pipeline_probe", namespace="edge_llm")
    client = host.ActionClient(probe, host.action("edge_llm_ros/action/Generate"), "generate")
    try:
        for i in range(count):
            launch.wait_for_line(f"active: stage {i} of {count}", 180)
        launch.wait_for_line("active: D0 of a stage pipeline", 180)
        assert client.wait_for_server(30)
        yield launch, client, host, count
    finally:
        client.destroy()
        probe.destroy_node()
        launch.stop()


def run_goal(host, client, mode: str, timeout: float = 120):
    Generate = host.action("edge_llm_ros/action/Generate")
    feedback = []
    handle = client.send_goal_async(Generate.Goal(prompt=PROMPT, mode=mode, max_new_tokens=MAX_NEW_TOKENS),
                                    lambda msg: feedback.append(msg.feedback)).result(30)
    assert handle.accepted
    return handle.get_result_async().result(timeout), feedback


def test_every_lossless_mode_through_the_stage_processes_equals_ar(deployment, expected):
    launch, client, host, _ = deployment
    for mode in ("ar", "chunk_pp", "flowspec"):
        response, feedback = run_goal(host, client, mode)
        assert response.status == STATUS_SUCCEEDED, (mode, response.result.finish_reason)
        assert list(response.result.token_ids) == expected, mode
        # feedback is a topic, the result a service reply: the last feedback may land just after it
        wait_until(lambda: sum(len(f.token_ids) for f in feedback) >= len(expected), 10, f"{mode} feedback")
        assert [t for f in feedback for t in f.token_ids] == expected, mode
        assert response.result.stats.mode == mode
        if mode == "flowspec":
            assert response.result.stats.tau > 1.0  # tokens per pipeline turn (ALT)
        # draft_node's line about the request, as bench --scenario pipeline reads it: D0's drafting
        line = wait_until(lambda: [m for m in re.finditer(STATS_LINE, launch.output)
                                   if m.group(1) == mode and int(m.group(2)) == len(expected)][-1:], 10,
                          f"draft_node's line about its {mode} request")[0]
        drafts, forwards, seconds = int(line.group(5)), int(line.group(6)), float(line.group(7))
        assert line.group(8) == "CPU"  # config/stages.yaml: one torch thread, so that thread's CPU seconds
        if mode == "ar":
            assert (drafts, forwards, seconds) == (0, 0, 0.0) and response.result.stats.draft_time_s == 0
        else:
            assert 0 < drafts <= forwards and seconds > 0
            assert response.result.stats.draft_time_s == pytest.approx(seconds, abs=1e-4)


@pytest.mark.parametrize("deployment", ["2 stages"], indirect=True)
def test_a_dead_stage_fails_its_request_naming_it_and_rejoins_when_restarted(deployment, expected):
    launch, client, host, count = deployment
    pid = int(re.findall(r"started stage_1 \(pid (\d+)\)", launch.output)[-1])
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    response, _ = run_goal(host, client, "flowspec", timeout=60)
    assert response.status == STATUS_ABORTED
    assert "stage 1 (/edge_llm/stage_1/in) gone" in response.result.finish_reason, response.result.finish_reason
    assert time.monotonic() - started < 15
    wait_until(lambda: len(re.findall(r"started stage_1 \(pid", launch.output)) == 2, 30, "stage_1 restarted")
    wait_until(lambda: launch.output.count("active: stage 1 of 2") == 2, 180, "stage_1 active again")
    response, _ = run_goal(host, client, "flowspec")
    assert response.status == STATUS_SUCCEEDED, response.result.finish_reason
    assert list(response.result.token_ids) == expected


@pytest.mark.parametrize("deployment", ["2 stages"], indirect=True)
def test_a_stage_that_refuses_ends_the_goal_with_its_reason(deployment, expected):
    """A stage that is not active refuses the rows; D0 ends the goal with that refusal at once."""
    launch, client, host, _ = deployment
    done = cli("lifecycle", "set", "/edge_llm/stage_1", "deactivate")
    assert done.returncode == 0, done.stderr
    try:
        started = time.monotonic()
        response, _ = run_goal(host, client, "flowspec", timeout=60)
        assert response.status == STATUS_ABORTED
        assert "stage 1 (/edge_llm/stage_1): inactive: /edge_llm/stage_1 is inactive" in response.result.finish_reason, \
            response.result.finish_reason
        assert time.monotonic() - started < 10  # the refusal, not timeout_s (20 s)
    finally:
        done = cli("lifecycle", "set", "/edge_llm/stage_1", "activate")
        assert done.returncode == 0, done.stderr
    response, _ = run_goal(host, client, "chunk_pp")
    assert response.status == STATUS_SUCCEEDED and list(response.result.token_ids) == expected


@pytest.mark.parametrize("deployment", ["2 stages"], indirect=True)
def test_outline_mode_expands_its_points_at_once_and_says_it_is_not_lossless(deployment):
    """Outline decoding (not lossless): the outline, then every point through the stages at once from
    a fork of the outline's cache; the answer is its points in order, or, for an outline of fewer
    than two points, the plain flowspec answer."""
    launch, client, host, _ = deployment
    Generate = host.action("edge_llm_ros/action/Generate")
    prompt = "List four things a home robot should check every morning."
    handle = client.send_goal_async(Generate.Goal(prompt=prompt, mode="outline", max_new_tokens=24)).result(30)
    response = handle.get_result_async().result(180)
    assert response.status == STATUS_SUCCEEDED, (response.result.finish_reason, launch.output[-2000:])
    assert response.result.stats.mode == "outline"
    lines = response.result.text.splitlines()
    if "answering plainly" in launch.output:
        assert not re.match(r"1\. ", response.result.text)
    else:
        assert len(lines) >= 2 and all(line.startswith(f"{i + 1}. ") for i, line in enumerate(lines)), lines
