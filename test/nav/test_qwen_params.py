"""The Qwen VLM's parameters and its missing extra, refused with what to do (no qwen-vl-utils needed:
these run in the main venv; test/vlm runs the VLM itself)."""

import sys

import pytest

from edge_llm_ros.nodes.navigator_node import NavigatorParams
from edge_llm_ros.nodes.verifier_node import VerifierParams


@pytest.mark.parametrize("params, message", [
    (dict(vlm="/m/7b", deployment="pipeline"), "deployment robot or edge_cloud"),
    (dict(vlm_draft="/m/2b", deployment="pipeline", mode="flowspec"), "deployment robot or edge_cloud"),
    (dict(vlm="/m/7b", vlm_draft="/m/2b", deployment="edge_cloud", mode="sd"), "the verifier's \\(its nav_vlm\\)"),
    (dict(vlm="/m/7b", mode="sd"), "parameter 'vlm_draft': mode sd drafts"),
    (dict(vlm_draft="/m/2b", mode="sd"), "parameter 'vlm_draft': a Qwen draft here needs its target"),
])
def test_navigator_refuses_a_qwen_vlm_where_it_cannot_run(params, message):
    with pytest.raises(ValueError, match=message):
        NavigatorParams(**params)


def test_which_navigators_run_a_qwen_vlm():
    assert NavigatorParams(vlm="/m/7b").qwen and NavigatorParams(vlm="/m/7b", vlm_draft="/m/2b", mode="tree").qwen
    assert NavigatorParams(vlm_draft="/m/2b", deployment="edge_cloud", mode="sd").qwen
    assert not NavigatorParams().qwen and not NavigatorParams(deployment="edge_cloud").qwen


def test_verifier_serves_one_navigation_model():
    with pytest.raises(ValueError, match="parameter 'nav_adapter': nav_vlm serves task nav"):
        VerifierParams(nav_vlm="/m/7b", nav_adapter="shipped")


def test_without_the_vlm_extra_the_error_says_what_to_install(monkeypatch):
    from edge_llm_ros.nav.qwen_vl import QwenVL

    monkeypatch.setitem(sys.modules, "qwen_vl_utils", None)  # as where it is not installed
    with pytest.raises(ImportError, match=r"needs the vlm extra.*pip install -e '\.\[engine,vlm\]'.*make vlm"):
        QwenVL.load("/nowhere/Qwen2-VL-7B-Instruct")  # refused before any weights are read
