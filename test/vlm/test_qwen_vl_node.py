"""navigator_node with a Qwen VLM named in its YAML (`vlm`, `vlm_draft`: local checkpoint folders),
as a real process on the embedded runtime: it says which VLM and backend it runs, and a frame
plus an instruction give a NavAction equal to the in-process navigator's answer for that frame;
over edge-cloud (the draft in navigator_node, the target in verifier_node's `nav_vlm`) the same
answer comes through both processes."""

from __future__ import annotations

import sys

import pytest
from hosts import host_for
from support import Proc, wait_until

pytestmark = [pytest.mark.vlm, pytest.mark.slow]
INSTRUCTION = "go to the red chair"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from edge_llm_ros.core.engine.vision_lm import save_tiny_vlm

    root = tmp_path_factory.mktemp("qwen2_vl")
    return save_tiny_vlm(root / "target", layers=2, seed=1), save_tiny_vlm(root / "draft", layers=1, seed=2)


class Operator:
    """A probe that shows the navigator world 3's start and sends the instruction."""

    def __init__(self, host) -> None:
        from edge_llm_ros.nav.camera import Camera
        from edge_llm_ros.nav.worldgen import generate

        self.probe = host.Node("qwen_navigator_probe")
        self.actions = []
        self.probe.create_subscription(host.message("edge_llm_ros/msg/NavAction"), "/edge_llm/nav_action",
                                       self.actions.append, 10)
        self.Image, self.String = host.message("sensor_msgs/msg/Image"), host.message("std_msgs/msg/String")
        self.camera = self.probe.create_publisher(self.Image, "/camera/image_raw", 10)
        self.instruction = self.probe.create_publisher(self.String, "/edge_llm/instruction", 10)
        world = generate(3)
        self.frame = Camera().render(world, world.start)

    def show_frame(self) -> None:
        from array import array

        h, w = self.frame.shape[:2]
        msg = self.Image(encoding="rgb8", width=w, height=h, step=w * 3, data=array("B", self.frame.tobytes()))
        msg.header.stamp = self.probe.get_clock().now().to_msg()
        self.camera.publish(msg)

    def decide(self, navigator: Proc, ready: str):
        line = navigator.wait_for_line(ready, 180)
        wait_until(lambda: self.probe.count_subscribers("/edge_llm/instruction") >= 1, 60, "the navigator")
        self.instruction.publish(self.String(data=INSTRUCTION))
        wait_until(lambda: self.show_frame() or any(a.raw_text for a in self.actions), 90, "a decision",
                   interval=0.2)
        return line, next(a for a in self.actions if a.raw_text)

    def one_device_answer(self, target: str):
        from edge_llm_ros.core.engine.config import GenerationConfig
        from edge_llm_ros.nav.navigator import MAX_ANSWER_TOKENS, Navigator
        from edge_llm_ros.nav.qwen_vl import QwenImageSize, QwenVL

        vlm, target_lm, _ = QwenVL.load(target, size=QwenImageSize(84, 112))
        config = GenerationConfig(mode="ar", max_new_tokens=MAX_ANSWER_TOKENS)
        return Navigator(vlm, target_lm, None, config).decide(self.frame, INSTRUCTION)


def yaml(path, node: str, **params) -> str:
    path.write_text(f"/**/{node}:\n  ros__parameters:\n"
                    + "".join(f"    {k}: {v}\n" for k, v in params.items()))
    return str(path)


def node(host, module: str, params: str, *args: str) -> Proc:
    return Proc([sys.executable, "-m", f"edge_llm_ros.nodes.{module}", "--ros-args", "--params-file", params, *args],
                env=host.child_env)


@pytest.mark.timeout(420)
def test_navigator_node_decides_with_the_qwen_vlm_its_yaml_names(request, router_endpoint, checkpoints, tmp_path):
    target, draft = checkpoints
    params = yaml(tmp_path / "navigator.yaml", "navigator", vlm=target, vlm_draft=draft, vlm_height=84,
                  vlm_width=112, mode="sd", gamma=3, overlap="false", max_frame_age_s=30.0)
    host = host_for(request)
    navigator = node(host, "navigator_node", params)
    operator = Operator(host)
    try:
        line, decided = operator.decide(navigator, "active: navigating with qwen2_vl")
        assert "qwen-vl-utils" in line and "mode sd" in line and "draft" in line, line
        want = operator.one_device_answer(target)
        assert decided.raw_text == want.text, (decided, want.text, navigator.output[-2000:])
        assert decided.action == want.command.verb and decided.valid == want.valid
    finally:
        operator.probe.destroy_node()
        navigator.stop()


@pytest.mark.timeout(660)
def test_over_edge_cloud_the_draft_here_and_the_target_on_the_verifier_give_the_same_answer(
        request, router_endpoint, checkpoints, tmp_path):
    target, draft = checkpoints
    size = dict(vlm_height=84, vlm_width=112)
    host = host_for(request)
    verifier = node(host, "verifier_node", yaml(tmp_path / "verifier.yaml", "verifier_node", nav_vlm=target, **size),
                    "-r", "__ns:=/edge_llm")
    navigator = node(host, "navigator_node", yaml(tmp_path / "navigator.yaml", "navigator", vlm_draft=draft,
                                                  deployment="edge_cloud", mode="sd", gamma=3, overlap="false",
                                                  max_frame_age_s=30.0, timeout_s=30.0, **size))
    operator = Operator(host)
    try:
        verifier.wait_for_line("tasks: nav", 180)
        wait_until(lambda: operator.probe.count_subscribers("/edge_llm/draft") >= 1, 60, "the verifier")
        line, decided = operator.decide(navigator, "active: navigating with qwen2_vl draft")
        assert "over edge-cloud" in line, line
        want = operator.one_device_answer(target)
        assert decided.raw_text == want.text, (decided, want.text, verifier.output[-2000:], navigator.output[-2000:])
        assert decided.confidence == pytest.approx(want.confidence, rel=1e-4)
    finally:
        operator.probe.destroy_node()
        navigator.stop()
        verifier.stop()
