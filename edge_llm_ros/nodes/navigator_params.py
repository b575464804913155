"""navigator_node's parameters, and every combination of them it refuses.

Contract: :class:`NavigatorParams` is the node's configuration (nodes/parameters.py maps the ROS
parameters onto it once, at start). Each field is range-checked on its own; `__post_init__`
refuses every combination that cannot run with a one-line ValueError that names the parameter to
change, so the node exits at start (code 2) instead of failing at configure:

    mode        deployment robot: ar, sd, tree; edge_cloud: ar, sd, tree, fsd, ee (core.edge_cloud's
                EDGE_MODES); pipeline: ar, chunk_pp, flowspec (LOSSLESS_PIPELINE_MODES)
    vlm         a Qwen target runs here (robot) only: over edge_cloud the verifier's nav_vlm is the
                target, and a stage holds no vision tower (pipeline)
    vlm_draft   not over the pipeline; on the robot only beside vlm; needed by a Qwen target in
                every mode but ar
"""

from __future__ import annotations

import dataclasses

from edge_llm_ros.modes import served_by
from edge_llm_ros.nodes.managed import QwenFrameParams
from edge_llm_ros.nodes.parameters import param

# the decoding modes each deployment serves: the mode registry's for the backend that deployment uses
# (robot: the engine here), constrained to the navigator's grammar (test_navigator_params checks them)
DEPLOYMENT_MODES = {deployment: served_by(backend, navigator=True)
                    for deployment, backend in (("robot", "local"), ("edge_cloud", "edge_cloud"),
                                                ("pipeline", "pipeline"))}
MODES = tuple(dict.fromkeys(m for modes in DEPLOYMENT_MODES.values() for m in modes))


@dataclasses.dataclass(frozen=True)
class NavigatorParams(QwenFrameParams):
    adapter: str = param("", "navigation adapter folder ('' = the shipped one for SmolLM2: edge-llm-ros train nav)")
    draft: str = param("", "draft model folder for the speculative modes ('' = the shipped SmolLM2 draft)")
    mode: str = param("ar", "decoding mode (lossless under the grammar); fsd and ee: edge_cloud only; chunk_pp "
                            "and flowspec: pipeline only", choices=MODES)
    deployment: str = param("robot", "where the target runs: robot (this process), edge_cloud (a verifier_node "
                                     "serving task nav, over draft/verify) or pipeline (stage_nodes serving task "
                                     "nav, over stage_0/in ... stage_<stages>/in)",
                            choices=tuple(DEPLOYMENT_MODES))
    timeout_s: float = param(10.0, "edge_cloud and pipeline: seconds to wait for the next answer", low=0.001)
    stages: int = param(2, "pipeline: stage_nodes in the pipeline", low=1, high=1024)
    segment: int = param(8, "pipeline: draft rows a message (flowspec's segment, chunk_pp's chunk)", low=1,
                         high=4096)
    in_flight: int = param(0, "pipeline: segments on their way at most (0 = stages)", low=0, high=1024)
    prefill_chunk: int = param(0, "pipeline: prompt tokens a prefill message (0 = the whole prompt)", low=0)
    gamma: int = param(4, "drafted tokens per round (sd)", low=1, high=16)
    overlap: bool = param(True, "decide the next action while the robot executes the current one, carried "
                                 "over by /odom to the pose it starts from (false: stop-and-go)")
    max_actions: int = param(60, "an episode stops after this many actions", low=1)
    max_frame_age_s: float = param(1.0, "decide only from a frame at most this old (else wait for one)", low=0.01)
    threads: int = param(0, "torch intra-op threads (0 = every core it may run on)", low=0, high=1024)
    vlm: str = param("", "a local Qwen2-VL / Qwen2.5-VL checkpoint folder as the target ('' = SmolLM2 + the "
                         "navigation adapter); needs the vlm extra (qwen-vl-utils)")
    vlm_draft: str = param("", "the Qwen draft's checkpoint folder (same tokenizer as the target; '' = none, mode "
                               "ar only); over edge_cloud the only model here (the verifier's nav_vlm verifies)")

    def __post_init__(self) -> None:
        problem = self.mode_problem() or self.vlm_problem()
        if problem:
            raise ValueError(problem)

    def mode_problem(self) -> str:
        """'' when ``mode`` runs over ``deployment``; else the error."""
        served = DEPLOYMENT_MODES[self.deployment]
        if self.mode in served:
            return ""
        others = [d for d, modes in DEPLOYMENT_MODES.items() if self.mode in modes]
        return (f"parameter 'mode': deployment {self.deployment} decodes in {', '.join(served)}; {self.mode} needs "
                f"deployment {' or '.join(others)}")

    def vlm_problem(self) -> str:
        """'' when the Qwen parameters (vlm, vlm_draft) fit the deployment and mode; else the error."""
        if (self.vlm or self.vlm_draft) and self.deployment == "pipeline":
            name = "vlm" if self.vlm else "vlm_draft"
            return (f"parameter '{name}': a Qwen VLM runs with deployment robot or edge_cloud (a stage holds no "
                    "vision tower); got deployment pipeline")
        if self.vlm and self.deployment == "edge_cloud":
            return ("parameter 'vlm': over edge_cloud the target is the verifier's (its nav_vlm); give this robot "
                    "its draft as vlm_draft")
        if self.vlm_draft and not self.vlm and self.deployment == "robot":
            return ("parameter 'vlm_draft': a Qwen draft here needs its target here too: give vlm (or deployment "
                    "edge_cloud, the target on the verifier)")
        if self.vlm and self.mode != "ar" and not self.vlm_draft:
            return (f"parameter 'vlm_draft': mode {self.mode} drafts, and vlm has no draft: give vlm_draft (e.g. "
                    "Qwen2-VL-2B beside a 7B target) or mode ar")
        return ""

    @property
    def qwen(self) -> bool:
        """A Qwen VLM: the target here (vlm) or the draft of the verifier's (vlm_draft over edge_cloud)."""
        return bool(self.vlm or (self.vlm_draft and self.deployment == "edge_cloud"))
