"""The `remote` backend (nodes/backends/remote.py) against a real OpenAI-compatible server:
llama-cpp-python's own (`python -m llama_cpp.server`, its `server` extra) on SmolLM2's GGUF, started
by the test. Through the launched pipeline (`edge-llm-ros launch pipeline backend:=remote
remote_url:=...` on the embedded runtime, `ros2 launch edge_llm_ros pipeline.launch.py ...` under
rclpy) a greedy goal's text equals llama.cpp's own greedy answer (llama_cpp.Llama's chat completion
at temperature 0, in this process), and so does the instruction topic's stream. A mode the backend
does not serve is refused as INVALID; a server that cannot be reached is a one-line error at start.
The server-sent events, finish reasons and request bodies are checked without a server.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import urllib.request

import pytest
from hosts import BACKENDS, host_for, start_launch, stop_launch
from support import Followed, Proc, setup_budget, wait_until

from edge_llm_ros import errors
from edge_llm_ros.client import LLMClient

PROMPTS = ("Name one thing a robot needs to see.", "Write a short poem about the sea.")
MAX_NEW_TOKENS = 32
N_CTX = 1024


# -- without a server ------------------------------------------------------------------------------


def sse(*payloads: str) -> io.BytesIO:
    return io.BytesIO("".join(f": keep-alive\n\ndata: {p}\n\n" for p in payloads).encode())


def test_events_are_the_streams_json_payloads_until_done():
    from edge_llm_ros.nodes.backends.remote import events

    stream = sse('{"choices": [{"delta": {"content": "Hi"}}]}', '{"choices": []}', "[DONE]", '{"late": 1}')
    assert list(events(stream, "x")) == [{"choices": [{"delta": {"content": "Hi"}}]}, {"choices": []}]


def test_an_error_event_fails_the_request():
    from edge_llm_ros.errors import Failed
    from edge_llm_ros.nodes.backends.remote import events

    with pytest.raises(Failed, match="out of memory"):
        list(events(sse('{"error": {"message": "out of memory"}}'), "x"))


def test_finish_reasons_and_the_request_body():
    from edge_llm_ros.nodes.backends import Request
    from edge_llm_ros.nodes.backends.remote import completion, finish_reason

    greedy = completion("m", Request("r", "hi", "ar", {"max_new_tokens": 5, "temperature": 0.0, "top_k": 3,
                                                       "seed": 7}), 64, chat=True)
    assert greedy == {"model": "m", "stream": True, "max_tokens": 5, "temperature": 0.0, "repeat_penalty": 1.0, "seed": 7,
                      "messages": [{"role": "user", "content": "hi"}]}
    sampled = completion("m", Request("r", "hi", "ar", {"temperature": 0.7, "top_p": 0.9, "top_k": 40,
                                                        "stop_strings": ("\n",)}), 64, chat=False)
    assert sampled == {"model": "m", "stream": True, "max_tokens": 64, "temperature": 0.7, "repeat_penalty": 1.0,
                       "top_p": 0.9,
                       "top_k": 40, "stop": ["\n"], "prompt": "hi"}
    assert [finish_reason(r, greedy) for r in ("length", "stop", None)] == ["length", "eos", ""]
    assert finish_reason("stop", sampled) == "stop"


# -- a real server -----------------------------------------------------------------------------------


def gguf() -> str:
    from edge_llm_ros.core.engine.models import default_model_path

    return str(default_model_path())


@pytest.fixture(scope="module")
@setup_budget(122)
def llama_server():
    """llama-cpp-python's OpenAI-compatible server on SmolLM2's GGUF, on a free loopback port: its /v1 URL."""
    from edge_llm_ros.runtime.router import free_endpoint

    port = int(free_endpoint().rsplit(":", 1)[1])
    url = f"http://127.0.0.1:{port}/v1"
    proc = Proc([sys.executable, "-m", "llama_cpp.server", "--model", gguf(), "--host", "127.0.0.1", "--port",
                 str(port), "--n_threads", "1", "--n_ctx", str(N_CTX)])

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
                return response.status == 200
        except OSError:
            assert proc.popen.poll() is None, proc.output
            return False

    try:
        wait_until(up, 120, f"llama_cpp.server at {url}", interval=0.2)
        yield url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def reference():
    """reference(prompt): llama.cpp's own greedy chat answer (llama_cpp.Llama, temperature 0)."""
    from llama_cpp import Llama

    llm = Llama(model_path=gguf(), n_ctx=N_CTX, n_threads=1, verbose=False)
    done: dict = {}

    def answer(prompt: str) -> str:
        if prompt not in done:
            out = llm.create_chat_completion(messages=[{"role": "user", "content": prompt}], temperature=0.0,
                                             max_tokens=MAX_NEW_TOKENS)
            done[prompt] = out["choices"][0]["message"]["content"]
        return done[prompt]

    yield answer
    llm.close()


def start_pipeline(host, router_endpoint: str, url: str) -> Proc:
    """pipeline.launch.py with the remote backend, on the host's runtime."""
    return start_launch(host, router_endpoint, "pipeline", "backend:=remote", f"remote_url:={url}",
                        f"max_new_tokens:={MAX_NEW_TOKENS}", "calibrate:=never")


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.timeout(660)
def test_the_launched_pipeline_answers_with_llama_cpps_greedy_text(request, backend, router_endpoint, llama_server,
                                                                    reference):
    if backend == "rclpy":
        request.getfixturevalue("ros2_env")  # a sourced ROS 2 and this package's install, loopback only
    host = host_for(request, backend)
    launch = start_pipeline(host, router_endpoint, llama_server)
    probe = host.Node("remote_probe", namespace="edge_llm")
    llm = LLMClient("/edge_llm", node=probe, timeout=120.0)
    try:
        launch.wait_for_line(f"ar on {gguf()} at {llama_server}", 120)
        llm.wait_until_ready(60)
        for prompt in PROMPTS:
            sent = Followed(llm.stream(prompt, max_new_tokens=MAX_NEW_TOKENS))
            result = sent.wait(120)
            assert result.status == errors.Status.OK and result.text == reference(prompt), prompt
            assert result.finish_reason in ("eos", "length")
            assert sent.streamed()[1] == result.text  # the streamed text
        with pytest.raises(errors.Invalid) as refused:
            llm.generate(PROMPTS[0], mode="sd", timeout=30)
        assert "sd runs on local | edge_cloud, not remote" in refused.value.result.finish_reason

        chunks, done = [], threading.Event()

        def on_chunk(msg) -> None:
            chunks.append(msg)
            if msg.done:
                done.set()

        probe.create_subscription(host.message("edge_llm_ros/msg/TokenChunk"), "response", on_chunk, 100)
        instruction = probe.create_publisher(host.message("std_msgs/msg/String"), "instruction", 10)
        wait_until(lambda: probe.count_subscribers("/edge_llm/instruction") >= 1
                   and probe.count_publishers("/edge_llm/response") >= 1, 30, "serve_node's instruction topic")
        wait_until(lambda: (instruction.publish(host.message("std_msgs/msg/String")(data=PROMPTS[1])) or
                            done.wait(5)), 120, "the instruction's last chunk")
        answer = [c for c in chunks if c.request_id == chunks[-1].request_id]
        assert answer[-1].status.code == 0 and answer[-1].finish_reason in ("eos", "length")
        assert "".join(c.text for c in answer) == reference(PROMPTS[1])
    finally:
        llm.close()
        probe.destroy_node()
        stop_launch(launch)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_server_that_cannot_be_reached_is_a_one_line_error_at_start(router_endpoint):
    """No server at the URL: serve_node's configure fails, the process exits 2 with one error line."""
    node = subprocess.run([sys.executable, "-m", "edge_llm_ros.nodes.serve_node", "--ros-args", "-p", "backend:=remote",
                           "-p", "remote_url:=http://127.0.0.1:9/v1", "-p", "timeout_s:=5.0"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "EDGE_LLM_BACKEND": "zenoh"})
    assert node.returncode == 2, node.stderr
    errors = [line for line in node.stderr.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and "cannot reach http://127.0.0.1:9/v1/models" in errors[0], node.stderr
    bad = subprocess.run([sys.executable, "-m", "edge_llm_ros.nodes.serve_node", "--ros-args", "-p", "backend:=remote",
                          "-p", "remote_url:=ftp://x"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "EDGE_LLM_BACKEND": "zenoh"})
    assert bad.returncode == 2 and "parameter 'remote_url' must start with http:// or https://" in bad.stderr, bad.stderr
