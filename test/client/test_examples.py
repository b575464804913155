"""The scripts in examples/ run as a user runs them, each a process of its own on the embedded runtime:

- generate.py against `edge-llm-ros launch pipeline` (serve_node: SmolLM2, ar on llama.cpp, no
  calibration): ready once serve_node is active, then the answer `edge-llm-ros generate` gives for
  the prompt (llama.cpp's greedy text), once whole and once streamed;
- navigate.py against the stand-in navigator (fake_navigator.py) in /edge_llm: the episode's line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from fake_navigator import FakeNavigator
from support import REPO, Proc, python_path

PROMPT = "Name one thing a robot needs to see."


def example(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": python_path(), "EDGE_LLM_BACKEND": "zenoh"}
    return subprocess.run([sys.executable, str(REPO / "examples" / name), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


@pytest.mark.slow  # serve_node with SmolLM2 as a process
@pytest.mark.timeout(480)  # the example's 400 s
def test_generate_example_answers_through_the_launched_pipeline(router_endpoint, tmp_path, references):
    launch = Proc([sys.executable, "-m", "edge_llm_ros.runtime.cli", "launch", "pipeline", "calibrate:=never",
                   "engine:=llama.cpp", "mode:=ar", "--router", router_endpoint],
                  env={"EDGE_LLM_ROS_PLAN": str(tmp_path / "plan.json"), "EDGE_LLM_BACKEND": "zenoh"})
    try:
        expected = references.Greedy("llama.cpp").text(PROMPT, 32)  # llama.cpp's own greedy decoding
        done = example("generate.py", PROMPT, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:] + launch.output[-3000:]
        lines = done.stdout.split("\n")
        assert lines[0] == "ready: /edge_llm/serve_node"
        whole, figures = "\n".join(lines[1:]).split("\n[", 1)
        assert whole == expected
        tokens = re.match(r"(\d+) tokens, ([\d.]+) tokens/s\]\n", figures)
        assert tokens and 0 < int(tokens[1]) <= 32 and float(tokens[2]) > 0, figures
        assert figures[tokens.end():] == expected + "\n"  # streamed: the same answer
    finally:
        launch.stop()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_navigate_example_prints_the_episode(rt_session, embedded_host):
    fake = FakeNavigator(embedded_host, "/edge_llm")
    fake.activate()
    try:
        done = example("navigate.py", "go to the red chair", timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout == "stop after 3 actions; waited 1.2 s for decisions, first motion after 0.5 s\n"
    finally:
        fake.close()
