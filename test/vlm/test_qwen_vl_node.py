"""navigator_node with a Qwen VLM named in its YAML (`vlm`, `vlm_draft`: local checkpoint folders),
as a real process on the embedded runtime: it says which VLM and backend it runs, and a frame
plus an instruction give a NavAction equal to the in-process navigator's answer for that frame."""

from __future__ import annotations

import sys
import threading

import pytest

from hosts import host_for
from support import Proc, wait_until

pytestmark = [pytest.mark.vlm, pytest.mark.slow]
INSTRUCTION = "go to the red chair"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from edge_llm_ros.core.vision_lm import save_tiny_vlm

    root = tmp_path_factory.mktemp("qwen2_vl")
    return save_tiny_vlm(root / "target", layers=2, seed=1), save_tiny_vlm(root / "draft", layers=1, seed=2)


def test_navigator_node_decides_with_the_qwen_vlm_its_yaml_names(request, router_endpoint, checkpoints, tmp_path):
    from array import array

    from edge_llm_ros.core import GenerationConfig
    from edge_llm_ros.core.nav.camera import Camera
    from edge_llm_ros.core.nav.navigator import MAX_ANSWER_TOKENS, Navigator
    from edge_llm_ros.core.nav.qwen_vl import QwenImageSize, QwenVL
    from edge_llm_ros.core.nav.worldgen import generate

    target, draft = checkpoints
    params = tmp_path / "navigator.yaml"
    params.write_text("/**/navigator:\n  ros__parameters:\n"
                      f"    vlm: {target}\n    vlm_draft: {draft}\n    vlm_height: 84\n    vlm_width: 112\n"
                      "    mode: sd\n    gamma: 3\n    overlap: false\n    max_frame_age_s: 30.0\n")
    host = host_for(request)
    navigator = Proc([sys.executable, "-m", "edge_llm_ros.nodes.navigator_node", "--ros-args", "--params-file",
                      str(params)], env=host.child_env)
    probe = host.Node("qwen_navigator_probe")
    actions, seen = [], threading.Event()
    probe.create_subscription(host.message("edge_llm_ros/msg/NavAction"), "/edge_llm/nav_action",
                              lambda m: (actions.append(m), seen.set()), 10)
    Image, String = host.message("sensor_msgs/msg/Image"), host.message("std_msgs/msg/String")
    camera = probe.create_publisher(Image, "/camera/image_raw", 10)
    instruction = probe.create_publisher(String, "/edge_llm/instruction", 10)
    world = generate(3)
    frame = Camera().render(world, world.start)

    def show_frame() -> None:
        h, w = frame.shape[:2]
        msg = Image(encoding="rgb8", width=w, height=h, step=w * 3, data=array("B", frame.tobytes()))
        msg.header.stamp = probe.get_clock().now().to_msg()
        camera.publish(msg)

    try:
        line = navigator.wait_for_line("active: navigating with qwen2_vl", 180)
        assert "qwen-vl-utils" in line and "mode sd" in line and "draft" in line, line
        wait_until(lambda: probe.count_subscribers("/edge_llm/instruction") >= 1, 60, "the navigator")
        instruction.publish(String(data=INSTRUCTION))
        wait_until(lambda: show_frame() or any(a.raw_text for a in actions), 90, "a decision", interval=0.2)
        decided = next(a for a in actions if a.raw_text)

        vlm, target_lm, _ = QwenVL.load(target, size=QwenImageSize(84, 112))
        want = Navigator(vlm, target_lm, None, GenerationConfig(mode="ar", max_new_tokens=MAX_ANSWER_TOKENS)
                         ).decide(frame, INSTRUCTION)
        assert decided.raw_text == want.text, (decided, want.text, navigator.output[-2000:])
        assert decided.action == want.command.verb and decided.valid == want.valid
    finally:
        probe.destroy_node()
        navigator.stop()
