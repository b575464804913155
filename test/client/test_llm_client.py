"""edge_llm_ros.client.LLMClient against a scripted Generate server (fake_llm.py) in this process,
on both runtimes: records, streaming, cancel, timeouts, typed errors from the result's status,
readiness from the lifecycle state, and one-line errors for bad input.

On the embedded backend the client owns its node (a context of its own); under rclpy it works on
a node of the test's rclpy host (attached), as a program with its own executor would use it.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time

import pytest
from fake_llm import FakeLLM
from hosts import BACKENDS, host_for
from support import REPO, python_path

from edge_llm_ros import errors
from edge_llm_ros.client import LLMClient, NoAnswer, ServerGone, Stats
from edge_llm_ros.client import llm as llm_module

_spaces = itertools.count()
# msg/RequestStatus.msg's codes, written out here, and the exception each must raise
FAILING = {1: errors.Busy, 2: errors.Inactive, 3: errors.Invalid, 4: errors.PeerTimeout, 5: errors.PeerGone,
           6: errors.Cancelled, 7: errors.Failed}


@pytest.fixture(params=BACKENDS)
def served(request):
    """(the fake server, a client of it) in a namespace of their own, on the backend named. The
    server's node is an active lifecycle node, as the package's servers are, so the client is ready
    as soon as get_state says so (a server that is no lifecycle node costs it DISCOVERY_S of looking
    for get_state: test_a_server_that_leaves_mid_request_is_server_gone has one)."""
    host = host_for(request, request.param)
    namespace = f"/client_test_{next(_spaces)}"
    node = lifecycle_node(host, namespace)
    node.trigger_configure()
    node.trigger_activate()
    server = FakeLLM(host, namespace, lifecycle_node=node)
    probe = host.Node("client_probe", namespace=namespace) if host.backend == "rclpy" else None
    client = LLMClient(namespace, node=probe, timeout=20.0, connect_timeout=20.0)
    try:
        client.wait_until_ready(30)
        yield server, client
    finally:
        client.close()
        if probe is not None:
            probe.destroy_node()
        server.close()


def test_generate_returns_the_answer_and_its_stats_as_plain_records(served):
    _, llm = served
    result = llm.generate("count 5", max_new_tokens=5)
    assert (result.text, result.token_ids, result.finish_reason) == ("t1 t2 t3 t4 t5", [1, 2, 3, 4, 5], "eos")
    assert result.status == errors.Status.OK
    s = result.stats
    assert (s.node_name, s.mode, s.backend, s.tokens, s.drafts, s.draft_forwards, s.ignored_results) == \
        ("fake_llm", "ar", "llama.cpp", 5, 3, 7, 2)
    assert (s.tokens_per_s, s.ttft_s, s.alt, s.alr, s.draft_time_s) == (12.5, 0.25, 1.5, 2.25, 0.5)
    assert s.draft_time_is_cpu is True and type(s.tokens) is int and type(s.alt) is float
    assert s.stamp == 1700000000.25  # the header's stamp


def test_stream_yields_chunks_that_add_up_to_the_result(served):
    _, llm = served
    sent = time.monotonic()
    request = llm.stream("count 6")
    chunks = list(request)
    assert sent < chunks[0].at <= chunks[-1].at <= time.monotonic() and sent < request.ended_at  # arrival times
    assert [c.token_ids for c in chunks] == [[1], [2], [3], [4], [5], [6]]
    assert all(c.probs == [0.5] and not c.filled for c in chunks)
    result = request.result()
    assert "".join(c.text for c in chunks) == result.text == "t1 t2 t3 t4 t5 t6"
    assert list(request) == []  # read already: nothing more comes


def test_feedback_that_never_comes_is_yielded_from_the_result(served, monkeypatch):
    monkeypatch.setattr(llm_module, "FEEDBACK_GRACE_S", 0.5)
    _, llm = served
    chunks = list(llm.stream("short 5 2"))
    assert [t for c in chunks for t in c.token_ids] == [1, 2, 3, 4, 5]
    assert "".join(c.text for c in chunks) == "t1 t2 t3 t4 t5"
    assert chunks[-1].token_ids == [3, 4, 5] and chunks[-1].probs == []
    assert chunks[-1].filled and not any(c.filled for c in chunks[:-1])


@pytest.mark.parametrize("code", sorted(FAILING))
def test_a_failing_status_raises_its_exception_with_the_result(served, code):
    _, llm = served
    with pytest.raises(FAILING[code]) as caught:
        llm.generate(f"status {code}")
    assert type(caught.value) is FAILING[code] and caught.value.status == code
    assert str(caught.value) == f"scripted {code}"
    assert caught.value.result.finish_reason == f"error: scripted {code}"


def test_a_goal_aborted_without_a_result_of_its_own_is_failed_not_an_answer(served):
    _, llm = served
    with pytest.raises(errors.Failed, match="the server aborted the goal without a result"):
        llm.generate("bare")


def test_a_rejected_goal_is_busy(served):
    _, llm = served
    with pytest.raises(errors.Busy, match="rejected the goal"):
        llm.generate("busy")
    assert llm.generate("count 1").token_ids == [1]  # the client goes on


def test_cancel_ends_the_request_as_cancelled_with_the_text_so_far(served):
    server, llm = served
    request = llm.stream("hold")
    stream = iter(request)
    assert next(stream).token_ids == [1]
    request.cancel()
    with pytest.raises(errors.Cancelled) as caught:
        list(stream)
    assert caught.value.result.text == "t1" and caught.value.result.token_ids == [1]
    assert server.cancelled == ["hold"]


def test_leaving_a_stream_early_cancels_the_goal(served):
    server, llm = served
    for chunk in llm.stream("hold"):
        assert chunk.token_ids == [1]
        break
    assert server.cancel_seen.wait(10), "the goal was not cancelled"


def test_no_answer_in_time_is_a_timeout_error_and_cancels_the_goal(served):
    server, llm = served
    started = time.monotonic()
    with pytest.raises(NoAnswer, match=r"no result for goal [0-9a-f]{32} of /client_test_\d+/generate within 0.5 s"):
        llm.generate("hold", timeout=0.5)
    assert time.monotonic() - started < 10
    assert issubclass(NoAnswer, TimeoutError)
    assert server.cancel_seen.wait(10), "the timed-out goal was not cancelled"


@pytest.mark.parametrize(("options", "message"), [
    ({"prompt": 42}, "prompt must be a string, got int"),
    ({"max_new_tokens": -1}, "max_new_tokens must be a whole number in [0, 4294967295], got -1"),
    ({"top_k": 1.5}, "top_k must be a whole number"),
    ({"top_p": "high"}, "top_p must be a number, got 'high'"),
    ({"temperature": None}, "temperature must be a number, got None"),
    ({"seed": 2**64}, "seed must be a whole number"),
    ({"stop": ["ok", 3]}, "stop must be a string or a list of strings"),
])
def test_bad_input_is_one_invalid_line_before_anything_is_sent(served, options, message):
    _, llm = served
    options = dict(options)  # the same dict is the other backend's parameter
    prompt = options.pop("prompt", "count 1")
    with pytest.raises(errors.Invalid) as caught:
        llm.generate(prompt, **options)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_no_server_is_no_answer_within_the_connect_timeout(rt_session):
    with LLMClient("/nobody_serves_here", connect_timeout=0.5) as llm:
        started = time.monotonic()
        with pytest.raises(NoAnswer, match="no action server /nobody_serves_here/generate within 0.5 s"):
            llm.generate("hello")
        with pytest.raises(NoAnswer, match="no action server /nobody_serves_here/generate within 0.3 s"):
            llm.wait_until_ready(0.3)
        assert time.monotonic() - started < 10


def test_a_server_that_leaves_mid_request_is_server_gone(rt_session, embedded_host):
    namespace = f"/client_test_{next(_spaces)}"
    server = FakeLLM(embedded_host, namespace)
    with LLMClient(namespace, node=embedded_host.Node("attached_probe", namespace=namespace)) as llm:
        llm.wait_until_ready(30)
        request = llm.stream("hold")
        stream = iter(request)
        assert next(stream).token_ids == [1]
        server.close()
        with pytest.raises(ServerGone, match="went away while goal") as caught:
            list(stream)
        assert isinstance(caught.value, errors.PeerGone)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ready_means_lifecycle_active(request, backend):
    host = host_for(request, backend)
    namespace = f"/client_test_{next(_spaces)}"
    node = lifecycle_node(host, namespace)
    server = FakeLLM(host, namespace, lifecycle_node=node)
    probe = host.Node("ready_probe", namespace=namespace) if backend == "rclpy" else None
    try:
        with LLMClient(namespace, node=probe) as llm:
            with pytest.raises(NoAnswer, match=rf"{namespace}/fake_llm is unconfigured, not active, after 1 s"):
                llm.wait_until_ready(1.0)
            node.trigger_configure()
            with pytest.raises(NoAnswer, match="is inactive, not active"):
                llm.wait_until_ready(1.0)
            node.trigger_activate()
            assert llm.wait_until_ready(30) == f"{namespace}/fake_llm"
    finally:
        if probe is not None:
            probe.destroy_node()
        server.close()


def lifecycle_node(host, namespace: str):
    if host.backend == "rclpy":
        from rclpy.lifecycle import LifecycleNode

        node = LifecycleNode("fake_llm", namespace=namespace, context=host.context)
        host.executor.add_node(node)
        return node
    from edge_llm_ros.runtime.lifecycle import LifecycleNode

    return LifecycleNode("fake_llm", namespace=namespace)


def test_stats_has_every_field_of_the_message_and_the_headers_stamp():
    text = (REPO / "msg" / "InferenceStats.msg").read_text()
    declared = [m[1] for line in text.splitlines() if (m := re.match(r"\s*[\w/]+(?:\[\])?\s+(\w+)", line))]
    assert declared[0] == "header"
    assert [f for f in Stats.__dataclass_fields__] == ["stamp", *declared[1:]]


OWN_NODE_SCRIPT = '''
import sys
from edge_llm_ros import runtime
from edge_llm_ros.client import LLMClient

with LLMClient(sys.argv[1]) as llm:
    print("runtime:", runtime.BACKEND, type(llm.node).__module__, flush=True)
    llm.wait_until_ready(60)
    print("generate:", llm.generate("count 3").text, flush=True)
    print("stream:", [c.token_ids for c in llm.stream("count 2")], flush=True)
'''


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_program_gets_a_node_of_its_own_on_the_runtime_the_environment_picks(request, backend, tmp_path):
    """A separate program (ROS 2 sourced or not, as the host's child environment says) with an
    LLMClient that owns its node and spinning thread."""
    host = host_for(request, backend)
    namespace = f"/client_test_{next(_spaces)}"
    server = FakeLLM(host, namespace)
    script = tmp_path / "own.py"
    script.write_text(OWN_NODE_SCRIPT)
    try:
        env = {**os.environ, "PYTHONPATH": python_path(), **host.child_env}
        done = subprocess.run([sys.executable, str(script), namespace], capture_output=True, text=True, timeout=120,
                              env=env, cwd=REPO)
        assert done.returncode == 0, done.stderr[-3000:]
        module = "rclpy.node" if backend == "rclpy" else "edge_llm_ros.runtime.embedded"
        assert done.stdout.splitlines() == [f"runtime: {backend} {module}", "generate: t1 t2 t3", "stream: [[1], [2]]"]
    finally:
        server.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_client_imports_without_ros_2():
    env = {k: v for k, v in os.environ.items() if k not in ("ROS_DISTRO", "EDGE_LLM_BACKEND")}
    code = "import sys, edge_llm_ros.client as c; print(c.LLMClient.__name__, 'rclpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["LLMClient", "False"]
