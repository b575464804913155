"""Where navigator_node's target runs: one class per value of its `deployment` parameter, and the
model family chosen once.

Contract: ``DEPLOYMENTS[params.deployment](node, params)`` is made in the node's constructor (it
opens the topics its transport needs, which exist in every lifecycle state); on configure,
`Deployment.load()` loads the models (:func:`load_models`), builds the deployment's Navigator
(nav/navigator.py), warms it up and says what it made; `unload()` frees what it made. A
deployment knows nothing about episodes: nav/live.py runs them over the Navigator it built.

    robot       Navigator: target and draft in this process
    edge_cloud  EdgeCloudNavigator: the draft here, the target on a verifier_node serving task nav,
                each decision's rounds over a VerifierLink (nodes/edge_link.py)
    pipeline    PipelineNavigator: the draft here (FlowSpec's D0), the target's layers on stage_nodes
                serving task nav, over a StageClient (nodes/stage_client.py)

The model family (:func:`load_models`): SmolLM2 + the navigation adapter (the shipped one or
`adapter`), or a Qwen VLM from local checkpoints (`vlm`, `vlm_draft`; nav/qwen_vl.py). A split
deployment holds only what its half needs: of SmolLM2 the draft and what it shares of the target
(embedding, head); of a Qwen pair the draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_llm_ros.nodes.edge_link import VerifierLink
from edge_llm_ros.nodes.navigator_params import NavigatorParams

WARM_UP_INSTRUCTION = "go to the red chair"


@dataclass
class NavModels:
    adapter: Any  # nav/vlm.NavAdapter or nav/qwen_vl.QwenVL: how a frame conditions the models
    target: Any  # the target here, or (a split deployment) what the draft shares of it
    draft: Any  # the draft (None: none loaded)
    described: str  # for the load log: which models


def load_models(p: NavigatorParams, target_here: bool) -> NavModels:
    """The models of the family the parameters name; ``target_here``: the whole target (robot)."""
    return qwen_models(p) if p.qwen else smollm2_models(p, target_here)


def smollm2_models(p: NavigatorParams, target_here: bool) -> NavModels:
    from edge_llm_ros.core.drafts.draft_models import load_draft
    from edge_llm_ros.core.drafts.loading import draft_home
    from edge_llm_ros.core.engine.models import load_model
    from edge_llm_ros.nav.vlm import NavAdapter

    # split deployments: only what the draft shares of the target (its embedding and head)
    target = load_model() if target_here else draft_home(None, p.draft or None)
    adapter = NavAdapter.load(p.adapter or None, target)
    draft = load_draft(target, p.draft or None).model if p.mode != "ar" or not target_here else None
    trained = adapter.training_info.get("action_accuracy")
    described = (f"SmolLM2 + adapter {p.adapter or 'shipped'}"
                 + (f" (held-out action accuracy {trained:.2f})" if trained is not None else ""))
    return NavModels(adapter, target, draft, described)


def qwen_models(p: NavigatorParams) -> NavModels:
    """A Qwen VLM from local checkpoints: target and draft here, or (edge_cloud) the draft only."""
    from edge_llm_ros.nav.qwen_vl import QwenVL

    if p.deployment == "edge_cloud":
        vlm, draft, _ = QwenVL.load(p.vlm_draft, size=p.qwen_size)
        kind = draft.hf.config.model_type
        return NavModels(vlm, draft, draft, f"{kind} draft {p.vlm_draft}, {vlm.describe()}")
    vlm, target, draft = QwenVL.load(p.vlm, p.vlm_draft or None, p.qwen_size)
    kind = target.hf.config.model_type
    return NavModels(vlm, target, draft, f"{kind} {p.vlm} (draft {p.vlm_draft or 'none'}), {vlm.describe()}")


def blank_frame():
    import numpy as np

    return np.zeros((96, 128, 3), np.uint8)


class Deployment:
    """A deployment of the navigator (see the module docstring)."""

    target_here = False  # whether the whole target runs in this process

    def __init__(self, node, params: NavigatorParams) -> None:
        self.node, self.params = node, params
        self.navigator: Any = None

    def load(self) -> tuple[Any, str]:
        """(the Navigator, a line saying what runs where), warmed up; ValueError/OSError if it cannot."""
        from edge_llm_ros.core.drafts.loading import set_threads
        from edge_llm_ros.core.engine.config import GenerationConfig
        from edge_llm_ros.nav.navigator import MAX_ANSWER_TOKENS

        p = self.params
        set_threads(p.threads)
        models = load_models(p, self.target_here)
        # split deployments set their own mode (the edge mode's drafting, the pipeline's): ar here
        config = GenerationConfig(mode=p.mode if self.target_here else "ar", max_new_tokens=MAX_ANSWER_TOKENS,
                                  gamma=p.gamma, tree_depth=p.gamma)
        self.navigator = self.build(models, config)
        seconds = self.warm_up()
        first = "decision" if self.target_here else "draft"
        self.node.get_logger().info(f"warmed up: a first {first} (a blank frame) in {seconds:.2f} s")
        return self.navigator, f"{models.described}, mode {p.mode} {self.where()}"

    def build(self, models: NavModels, config) -> Any:
        raise NotImplementedError

    def warm_up(self) -> float:
        """Torch's first passes are slow: one before a decision waits for them; seconds."""
        return self.navigator.warm_up(blank_frame(), WARM_UP_INSTRUCTION)

    def where(self) -> str:
        raise NotImplementedError

    def unload(self) -> None:
        self.navigator = None


class RobotDeployment(Deployment):
    target_here = True

    def build(self, models: NavModels, config) -> Any:
        from edge_llm_ros.nav.navigator import Navigator

        return Navigator(models.adapter, models.target, models.draft, config)

    def warm_up(self) -> float:
        self.navigator.grammar.warm()  # every mask of the answer grammar, before a decision waits for one
        return self.navigator.decide(blank_frame(), WARM_UP_INSTRUCTION).decide_s

    def where(self) -> str:
        return "on torch in this process"


class EdgeCloudDeployment(Deployment):
    def __init__(self, node, params: NavigatorParams) -> None:
        super().__init__(node, params)
        self.link = VerifierLink(node, params.timeout_s)

    def build(self, models: NavModels, config) -> Any:
        from edge_llm_ros.core.edge_cloud import EarlyExitDrafter
        from edge_llm_ros.core.engine.drafters import ModelDrafter
        from edge_llm_ros.nav.navigator import EdgeCloudNavigator

        # the shared drafter answers what a request without its own asks (tokenizer, window: cloud ar);
        # every speculative decision drafts with one conditioned on its frame
        self.link.drafter = EarlyExitDrafter([ModelDrafter(models.adapter.attach(models.draft, "draft"))], seed=0,
                                             sender=self.link.send, max_requests=2)
        return EdgeCloudNavigator(models.adapter, models.draft, self.link.rounds, self.params.mode, config)

    def where(self) -> str:
        return (f"over edge-cloud: the draft here, the target on the verifier serving task nav "
                f"({self.node.resolve_topic_name('draft')} -> {self.node.resolve_topic_name('verify')})")

    def unload(self) -> None:
        if self.link.drafter is not None:
            self.link.drafter.close()
            self.link.drafter = None
        super().unload()


class PipelineDeployment(Deployment):
    def __init__(self, node, params: NavigatorParams) -> None:
        from edge_llm_ros.nodes.stage_client import StageClient

        super().__init__(node, params)
        # the stages' refusals come on `verify` (the link's inboxes), and prunes go on `prune`
        self.link = VerifierLink(node, params.timeout_s)
        self.stages = StageClient(node, params.stages, params.timeout_s, self.link.inboxes, self.link.prune_pub)

    def build(self, models: NavModels, config) -> Any:
        from edge_llm_ros.nav.navigator import PipelineNavigator

        p = self.params
        return PipelineNavigator(models.adapter, models.draft, self.stages.run, p.mode, config, segment=p.segment,
                                 in_flight=p.in_flight or p.stages, prefill_chunk=p.prefill_chunk)

    def where(self) -> str:
        return (f"over a stage pipeline: the draft here (D0), SmolLM2 + the adapter in {self.params.stages} "
                f"stage(s) serving task nav ({self.stages.describe()})")


DEPLOYMENTS: dict[str, type[Deployment]] = {
    "robot": RobotDeployment,
    "edge_cloud": EdgeCloudDeployment,
    "pipeline": PipelineDeployment,
}
