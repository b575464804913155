"""navigator_node's parameters: every combination of mode x deployment x vlm x vlm_draft either
builds or is refused with one line that names a parameter to change, the rule it breaks, and never a
bare KeyError at configure (issue 27: `deployment:=edge_cloud mode:=chunk_pp` did that, its checks
sat after a `return`).

The expected verdicts come from the rules as docs/navigation.md and the parameters' descriptions
state them, written here again (not read from the code under test); the modes each deployment
serves are checked against core's own registries."""

from __future__ import annotations

import itertools

import pytest
from support import Proc, python_module

from edge_llm_ros.nodes.navigator_node import NavigatorParams
from edge_llm_ros.nodes.navigator_params import DEPLOYMENT_MODES, MODES

ALL_MODES = ("ar", "sd", "tree", "fsd", "ee", "chunk_pp", "flowspec")
DEPLOYMENTS = ("robot", "edge_cloud", "pipeline")
SERVES = {"robot": {"ar", "sd", "tree"}, "edge_cloud": {"ar", "sd", "tree", "fsd", "ee"},
          "pipeline": {"ar", "chunk_pp", "flowspec"}}


def broken_rules(mode: str, deployment: str, vlm: str, vlm_draft: str) -> dict[str, str]:
    """{parameter: rule} of every rule the combination breaks (empty: it runs)."""
    broken = {}
    if mode not in SERVES[deployment]:
        broken["mode"] = "the deployment does not decode in that mode"
    if deployment == "pipeline" and vlm:
        broken["vlm"] = "a stage holds no vision tower"
    if deployment == "pipeline" and vlm_draft and not vlm:
        broken["vlm_draft"] = "a stage holds no vision tower"
    if deployment == "edge_cloud" and vlm:
        broken["vlm"] = "over edge_cloud the verifier's nav_vlm is the target"
    if deployment == "robot" and vlm_draft and not vlm:
        broken["vlm_draft"] = "a Qwen draft needs its target here"
    if vlm and mode != "ar" and not vlm_draft:
        broken["vlm_draft"] = "a drafting mode needs the Qwen draft"
    return broken


COMBINATIONS = list(itertools.product(ALL_MODES, DEPLOYMENTS, ("", "/m/Qwen2-VL-7B"), ("", "/m/Qwen2-VL-2B")))


@pytest.mark.parametrize("mode, deployment, vlm, vlm_draft", COMBINATIONS)
def test_every_combination_builds_or_is_refused_in_one_line_naming_a_parameter(mode, deployment, vlm, vlm_draft):
    broken = broken_rules(mode, deployment, vlm, vlm_draft)
    if not broken:
        params = NavigatorParams(mode=mode, deployment=deployment, vlm=vlm, vlm_draft=vlm_draft)
        assert params.qwen == bool(vlm or (vlm_draft and deployment == "edge_cloud"))
        return
    with pytest.raises(ValueError) as refused:
        NavigatorParams(mode=mode, deployment=deployment, vlm=vlm, vlm_draft=vlm_draft)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("parameter '"), message
    named = message.split("'")[1]
    assert named in broken, (message, broken)
    if named == "mode":
        assert f"deployment {deployment}" in message and mode in message, message


def test_the_issues_example_is_a_parameter_error():
    with pytest.raises(ValueError, match=r"^parameter 'mode': deployment edge_cloud decodes in ar, sd, tree, fsd, "
                                         r"ee; chunk_pp needs deployment pipeline$"):
        NavigatorParams(deployment="edge_cloud", mode="chunk_pp")
    with pytest.raises(ValueError, match=r"^parameter 'mode': deployment robot .*; fsd needs deployment edge_cloud$"):
        NavigatorParams(mode="fsd")


def test_the_modes_each_deployment_serves_are_the_engines():
    from edge_llm_ros.core.edge_cloud import EDGE_MODES
    from edge_llm_ros.core.engine.config import GenerationConfig
    from edge_llm_ros.core.pipeline.schedulers import LOSSLESS_PIPELINE_MODES

    assert {d: set(m) for d, m in DEPLOYMENT_MODES.items()} == SERVES
    assert set(DEPLOYMENT_MODES["edge_cloud"]) == set(EDGE_MODES)
    assert set(DEPLOYMENT_MODES["pipeline"]) == set(LOSSLESS_PIPELINE_MODES)
    for mode in DEPLOYMENT_MODES["robot"]:  # the robot's Navigator runs the engine's own modes
        assert GenerationConfig(mode=mode).mode == mode
    assert set(MODES) == set(ALL_MODES)


@pytest.mark.slow
def test_a_node_started_with_an_invalid_combination_exits_2_with_the_one_line(router_endpoint):
    proc = Proc(python_module("edge_llm_ros.nodes.navigator_node", "--ros-args", "-p", "deployment:=edge_cloud",
                              "-p", "mode:=chunk_pp"))
    assert proc.wait(60) == 2, proc.output
    lines = [line for line in proc.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "parameter 'mode': deployment edge_cloud decodes in" in lines[0], proc.output
    assert "KeyError" not in proc.output
