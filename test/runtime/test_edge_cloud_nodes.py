"""Edge-cloud decoding with early exits through real processes: draft_node and verifier_node, each
its own process with SmolLM2, the shipped draft and exits, on the session's Zenoh router over the
emulated link of config/edge_cloud.yaml (25 ms one-way each way: 50 ms RTT, 100 Mbit/s).

The streamed text must be the target's plain greedy output (computed here with core generate_all,
mode ar); a verifier killed mid-run must make the goal abort with a clear error within timeout_s.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest

from support import REPO, Proc, cli, wait_until

PROMPTS = ("Describe how a robot should explore a new house.", "Write a short poem about the sea.")  # 32 tokens, no EOS
MAX_NEW_TOKENS = 32
TIMEOUT_S = 4.0  # draft_node's timeout_s in this test
PARAMS = str(REPO / "config" / "edge_cloud.yaml")
STATUS_SUCCEEDED, STATUS_ABORTED = 4, 6


def node_cmd(module: str, *params: str) -> list[str]:
    overrides = [arg for p in params for arg in ("-p", p)]
    return [sys.executable, "-m", f"edge_llm_ros.nodes.{module}", "--ros-args", "--params-file", PARAMS, *overrides]


@pytest.fixture(scope="module")
def reference():
    """The target's plain greedy output for PROMPTS (token ids and text), in this process."""
    import torch

    from edge_llm_ros.core import GenerationConfig, chat_prompt, generate_all, load_model

    torch.set_num_threads(1)
    target = load_model()
    out = {}
    for prompt in PROMPTS:
        tokens = generate_all(target, chat_prompt(target.tokenizer, prompt),
                              GenerationConfig(mode="ar", max_new_tokens=MAX_NEW_TOKENS)).tokens
        out[prompt] = (tokens, target.tokenizer.decode(tokens, skip_special_tokens=True,
                                                       clean_up_tokenization_spaces=False))
    return out


@pytest.fixture(scope="module")
def nodes(rt_session, router_endpoint):
    """verifier_node and draft_node as two processes; yields (verifier, draft, probe node, action client)."""
    from edge_llm_ros import runtime as rtf

    verifier = Proc(node_cmd("verifier_node"))
    draft = Proc(node_cmd("draft_node", f"max_new_tokens:={MAX_NEW_TOKENS}", f"timeout_s:={TIMEOUT_S}"))
    probe = rt_session.Node("edge_cloud_probe", namespace="edge_llm")
    client = rtf.ActionClient(probe, rtf.action("edge_llm_ros/action/Generate"), "generate")
    try:
        verifier.wait_for_line("emulated link on /edge_llm/verify: 25.0 ms one-way, 100.0 Mbit/s", 120)
        draft.wait_for_line("emulated link on /edge_llm/draft: 25.0 ms one-way, 100.0 Mbit/s", 120)
        verifier.wait_for_line("verifying /edge_llm/draft -> /edge_llm/verify", 180)
        draft.wait_for_line("drafting with", 180)
        wait_until(lambda: probe.count_subscribers("/edge_llm/draft") >= 1
                   and probe.count_subscribers("/edge_llm/verify") >= 1, 30, "draft and verify subscriptions")
        assert client.wait_for_server(30)
        yield verifier, draft, probe, client
    finally:
        client.destroy()
        probe.destroy_node()
        for proc in (draft, verifier):
            proc.stop()


def send(client, prompt: str, **goal):
    """Send a Generate goal; returns (goal handle, feedback list, first-feedback event)."""
    from edge_llm_ros import runtime as rtf

    Generate = rtf.action("edge_llm_ros/action/Generate")
    feedback, first = [], threading.Event()

    def on_feedback(msg) -> None:
        feedback.append(msg.feedback)
        first.set()

    handle = client.send_goal_async(Generate.Goal(prompt=prompt, **goal), on_feedback).result(30)
    assert handle.accepted
    return handle, feedback, first


def test_launch_file_lists_both_nodes_and_the_links(router_endpoint):
    shown = cli("launch", "edge_cloud", "-s", "--router", router_endpoint)
    assert shown.returncode == 0, shown.stderr
    assert "link_emulation.uplink.latency_ms:=25.0" in shown.stdout
    assert "link_emulation.downlink.latency_ms:=25.0" in shown.stdout
    assert "/edge_llm/draft_node" in shown.stdout and "/edge_llm/verifier_node" in shown.stdout


@pytest.mark.parametrize("module, param, named", [("draft_node", "mode:=llmcad", "'mode'"),
                                                  ("draft_node", "draft:=exit:x", "'draft'"),
                                                  ("verifier_node", "threads:=-1", "'threads'")])
def test_bad_parameter_is_one_line_and_exit_2(router_endpoint, module, param, named):
    proc = Proc(node_cmd(module, param))
    assert proc.wait(120) == 2, proc.output
    errors = [line for line in proc.lines if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], proc.output


def test_streamed_text_equals_target_greedy_over_50ms_rtt(nodes, reference):
    _, _, _, client = nodes
    for prompt in PROMPTS:
        tokens, text = reference[prompt]
        start = time.monotonic()
        handle, feedback, _ = send(client, prompt)
        response = handle.get_result_async().result(120)
        elapsed = time.monotonic() - start
        assert response.status == STATUS_SUCCEEDED, response.result.finish_reason
        result = response.result
        assert len(tokens) == MAX_NEW_TOKENS and list(result.token_ids) == tokens
        assert result.text == text
        wait_until(lambda: sum(len(f.token_ids) for f in feedback) >= len(tokens), 20, "every feedback message")
        assert [t for f in feedback for t in f.token_ids] == tokens
        assert "".join(f.text_delta for f in feedback) == text
        stats = result.stats
        assert stats.tokens == len(tokens) and stats.tau >= 1.0 and 0.0 <= stats.cache_miss_rate <= 1.0
        print(f"\n{prompt[:30]!r}: {len(tokens)} tokens in {elapsed:.2f} s, tau {stats.tau:.2f}, miss rate "
              f"{stats.cache_miss_rate:.2f}, avg exit of hits {stats.avg_exit_layer:.1f}")


def test_cli_send_goal_succeeds(nodes):
    result = cli("action", "send_goal", "/edge_llm/generate", "edge_llm_ros/action/Generate",
                 f"{{prompt: '{PROMPTS[1]}'}}", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Goal finished with status: SUCCEEDED" in result.stdout
    assert "mode: ee" in result.stdout


def test_malformed_draft_gets_an_error_naming_the_field(nodes):
    from edge_llm_ros import runtime as rtf

    _, _, probe, _ = nodes
    results, got = [], threading.Event()

    def on_verify(msg) -> None:
        if msg.request_id == "malformed-1":
            results.append(msg)
            got.set()

    sub = probe.create_subscription(rtf.message("edge_llm_ros/msg/VerifyResult"), "verify", on_verify, 10)
    pub = probe.create_publisher(rtf.message("edge_llm_ros/msg/DraftTree"), "draft", 10)
    try:
        wait_until(lambda: probe.count_publishers("/edge_llm/draft") >= 2, 20, "the probe's draft publisher")
        draft = rtf.message("edge_llm_ros/msg/DraftTree")(request_id="malformed-1", round=0, context_ids=[1, 2, 3],
                                                          prefix_len=3, token_ids=[5, 6], parents=[-1],
                                                          draft_probs=[0.5, 0.5])
        pub.publish(draft)
        assert got.wait(30), "no VerifyResult for a malformed draft"
        answer = results[0]
        assert answer.final and answer.error.startswith("parents: has 1 entries for 2 token_ids"), answer.error
    finally:
        sub.destroy()
        pub.destroy()


def test_instruction_streams_token_chunks_on_response(nodes, reference):
    from edge_llm_ros import runtime as rtf

    _, _, probe, _ = nodes
    chunks, done = [], threading.Event()

    def on_chunk(msg) -> None:
        chunks.append(msg)
        if msg.done:
            done.set()

    sub = probe.create_subscription(rtf.message("edge_llm_ros/msg/TokenChunk"), "response", on_chunk, 100)
    pub = probe.create_publisher(rtf.message("std_msgs/msg/String"), "instruction", 10)
    try:
        wait_until(lambda: probe.count_subscribers("/edge_llm/response") >= 1
                   and probe.count_publishers("/edge_llm/instruction") >= 1, 20, "response / instruction endpoints")
        pub.publish(rtf.message("std_msgs/msg/String")(data=PROMPTS[0]))
        assert done.wait(60), "no final TokenChunk"
        tokens, text = reference[PROMPTS[0]]
        assert [c.round for c in chunks] == list(range(len(chunks)))
        assert [t for c in chunks for t in c.token_ids] == tokens and "".join(c.text for c in chunks) == text
        assert chunks[-1].finish_reason == "length" and not chunks[-1].error
    finally:
        sub.destroy()
        pub.destroy()


def test_cancel_ends_the_goal_cancelled(nodes):
    _, _, _, client = nodes
    handle, _, first = send(client, "Write a long story about a robot that learns to cook.", max_new_tokens=400)
    assert first.wait(60), "no feedback before cancel"
    assert handle.cancel_goal_async().result(20).return_code == 0
    response = handle.get_result_async().result(30)
    assert response.status == 5 and response.result.finish_reason == "cancelled"  # CANCELED
    assert 0 < len(response.result.token_ids) < 400


def test_killed_verifier_aborts_the_goal_with_a_clear_error(nodes):
    verifier, draft, _, client = nodes
    handle, feedback, first = send(client, "Write a long story about a robot that learns to cook.",
                                   max_new_tokens=400)
    assert first.wait(60), "no feedback before the kill"
    verifier.popen.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    response = handle.get_result_async().result(TIMEOUT_S + 30)
    waited = time.monotonic() - killed
    assert response.status == STATUS_ABORTED
    reason = response.result.finish_reason
    assert reason.startswith("error: no final VerifyResult within timeout_s=4 s"), reason
    assert waited < TIMEOUT_S + 10, f"abort took {waited:.1f} s"
    assert 0 < len(response.result.token_ids) < 400  # what was committed before the kill is kept
    draft.wait_for_line("generate: no final VerifyResult", 10)
    assert draft.popen.poll() is None, "draft_node must survive a dead verifier"
