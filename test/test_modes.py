"""The mode registry (edge_llm_ros/modes.py) agrees with what each part implements, and refuses a
mode a backend does not serve in one line that says where it runs."""

import pytest

from edge_llm_ros.errors import Invalid
from edge_llm_ros.modes import MODES, check_mode, describe, served_by


def test_the_registry_lists_what_each_engine_implements():
    from edge_llm_ros.core.edge_cloud import EDGE_MODES
    from edge_llm_ros.core.engine.config import MODES as ENGINE_MODES
    from edge_llm_ros.core.pipeline.schedulers import LOSSLESS_PIPELINE_MODES, PIPELINE_MODES

    assert served_by("local") == ENGINE_MODES
    assert set(served_by("edge_cloud")) == set(EDGE_MODES)
    assert served_by("pipeline") == PIPELINE_MODES
    assert served_by("remote") == ("ar",)
    assert {m for m in served_by("pipeline") if MODES[m].lossless} == set(LOSSLESS_PIPELINE_MODES)


def test_only_outline_is_not_lossless_and_says_so():
    assert [m.name for m in MODES.values() if not m.lossless] == ["outline"]
    assert describe("outline").endswith("NOT lossless") and "lossless" not in describe("flowspec")


def test_navigator_deployments_run_the_constrained_modes():
    assert served_by("local", navigator=True) == ("ar", "sd", "tree")
    assert served_by("edge_cloud", navigator=True) == ("ar", "sd", "tree", "fsd", "ee")
    assert served_by("pipeline", navigator=True) == ("ar", "chunk_pp", "flowspec")


@pytest.mark.parametrize("backend,mode,says", [
    ("local", "warp", "parameter 'mode': unknown mode 'warp'; the local backend serves ar | sd | tree | llmcad"),
    ("remote", "sd", "parameter 'mode': sd runs on local | edge_cloud, not remote; the remote backend serves ar"),
    ("local", "flowspec", "parameter 'mode': flowspec runs on pipeline, not local;"),
])
def test_a_mode_a_backend_does_not_serve_is_one_line(backend, mode, says):
    with pytest.raises(Invalid) as refused:
        check_mode(backend, mode, "parameter 'mode'")
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)
    assert check_mode(backend, "ar") == "ar"
