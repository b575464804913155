"""draft_node: the robot half of edge-cloud decoding with early exits (EE Algorithm 1).

Holds the tokenizer and every request's state (core's EarlyExitDrafter). Each request publishes
one DraftTree per round on `draft` and waits for that round's final VerifyResult on `verify`;
early VerifyResults are handed to the drafter at once, which pre-drafts the next round from them
on worker threads, so a final that confirms a hypothesis finds its next draft ready. Requests
come from the `generate` action (accepted text streamed as feedback; result text, token ids and
InferenceStats with τ, cache miss rate and the average exit layer of the hits) and from the
`instruction` topic (a TokenChunk stream on `response`, as echo_node does). When a request ends
a PruneInfo with `release` on `prune` frees its cache on the verifier; its stats go on `stats`.

If no final VerifyResult arrives within `timeout_s` (verifier gone, link down), the request
ends with an error (the goal is aborted, finish_reason "error: ..."); it never hangs.

Parameters: draft ('' = the shipped trained draft; or shallow:K, exit:K[:PATH], lookup, PATH),
model ('' = SmolLM2: the tokenizer and the weights the draft shares), mode (sd | tree |
llmcad), gamma, max_new_tokens (when a goal says 0), timeout_s, predraft_workers (drafters,
one per pre-draft thread), chat_template (apply the tokenizer's chat template), threads.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import from_message, run_node, to_message


class VerifierTimeout(TimeoutError):
    """No final VerifyResult within timeout_s."""


def request_errors() -> tuple[type[Exception], ...]:
    """What ends one request with an error (the node goes on): no verifier, a rejected draft, a bad
    prompt or goal, too many requests."""
    from edge_llm_ros.core.edge_cloud import DraftRejectedError, RequestLimitError

    return VerifierTimeout, DraftRejectedError, RequestLimitError, ValueError


@dataclass
class Step:
    """One committed round of a request, as the node streams it."""

    tokens: list[int]
    text: str
    probs: list[float]


@dataclass
class Finished:
    """How a request ended: finish reason, the drafter's stats, timing."""

    reason: str = ""
    error: str = ""
    stats: object = None
    ttft_s: float = 0.0
    wall_s: float = 0.0
    tokens: list[int] = field(default_factory=list)


class DraftNode(rt.Node):
    def __init__(self) -> None:
        super().__init__("draft_node", namespace="edge_llm")
        import torch

        from edge_llm_ros.core import EarlyExitDrafter, load_model, preset
        from edge_llm_ros.tools.loading import ToolError, build_drafter, check_draft_spec

        spec = self.declare_parameter("draft", "").value or None
        model = self.declare_parameter("model", "").value
        self.mode = self.declare_parameter("mode", "sd").value
        gamma = self.declare_parameter("gamma", 4).value
        self.max_new_tokens = self.declare_parameter("max_new_tokens", 64).value
        self.timeout_s = float(self.declare_parameter("timeout_s", 10.0).value)
        workers = self.declare_parameter("predraft_workers", 1).value
        self.chat_template = self.declare_parameter("chat_template", True).value
        threads = self.declare_parameter("threads", 0).value
        if self.mode not in ("sd", "tree", "llmcad"):
            raise ValueError(f"parameter 'mode' must be sd, tree or llmcad (a drafting mode), got {self.mode!r}")
        for name, value, low in (("gamma", gamma, 1), ("max_new_tokens", self.max_new_tokens, 1),
                                 ("predraft_workers", workers, 1), ("threads", threads, 0)):
            if value < low:
                raise ValueError(f"parameter '{name}' must be >= {low}, got {value}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"parameter 'timeout_s' must be a finite number > 0, got {self.timeout_s}")
        if threads:
            torch.set_num_threads(threads)
        try:
            check_draft_spec(spec)
            target = load_model(model or None)
            drafts = [build_drafter(spec, target) for _ in range(workers)]
        except ToolError as exc:
            raise ValueError(f"parameter 'draft': {exc}") from exc
        self.tokenizer = target.tokenizer
        self.base_config = preset(self.mode, gamma=gamma)
        self.drafter = EarlyExitDrafter([d.drafter for d in drafts], seed=0)
        self.inboxes: dict[str, queue.Queue] = {}

        self.TokenChunk = rt.message("edge_llm_ros/msg/TokenChunk")
        self.DraftTree = rt.message("edge_llm_ros/msg/DraftTree")
        self.PruneInfo = rt.message("edge_llm_ros/msg/PruneInfo")
        self.Stats = rt.message("edge_llm_ros/msg/InferenceStats")
        self.Generate = rt.action("edge_llm_ros/action/Generate")
        self.draft_pub = rt.shaped(self, self.create_publisher(self.DraftTree, "draft", 100))
        self.prune_pub = rt.shaped(self, self.create_publisher(self.PruneInfo, "prune", 100))
        self.response_pub = self.create_publisher(self.TokenChunk, "response", 100)
        self.stats_pub = self.create_publisher(self.Stats, "stats", 10)
        self.create_subscription(rt.message("edge_llm_ros/msg/VerifyResult"), "verify", self.on_verify, 100)
        self.create_subscription(rt.message("std_msgs/msg/String"), "instruction", self.on_instruction, 10)
        self.action_server = rt.ActionServer(self, self.Generate, "generate", self.execute,
                                             cancel_callback=lambda handle: rt.CancelResponse.ACCEPT)
        self.get_logger().info(f"drafting with {drafts[0].description}, mode {self.mode} (gamma {gamma}): "
                               f"{self.resolve('draft')} -> verifier -> {self.resolve('verify')}")

    # -- callbacks ---------------------------------------------------------------------------------

    def on_verify(self, msg) -> None:
        """Early outcomes go to the drafter (pre-drafting), finals to their request's thread."""
        from edge_llm_ros.core import VerifyOutcome

        outcome = from_message(VerifyOutcome, msg)
        inbox = self.inboxes.get(outcome.request_id)
        if inbox is None:
            return  # another robot's request, or one that ended
        if outcome.final:
            inbox.put(outcome)
        else:
            self.drafter.on_early(outcome)

    def on_instruction(self, msg) -> None:
        threading.Thread(target=self.answer, args=(msg.data,), daemon=True, name="instruction").start()

    # -- one request -------------------------------------------------------------------------------

    def config_for(self, goal=None):
        """The request's GenerationConfig: the node's preset, the goal's overrides (ValueError if bad)."""
        if goal is None:
            return self.base_config.with_overrides(max_new_tokens=self.max_new_tokens)
        if len(goal.images) or len(goal.choices):
            raise ValueError("images and choices are not supported by draft_node (text only)")
        return self.base_config.with_overrides(
            mode=goal.mode or self.mode, max_new_tokens=goal.max_new_tokens or self.max_new_tokens,
            temperature=float(goal.temperature), top_k=int(goal.top_k),
            top_p=float(goal.top_p) if 0 < goal.top_p < 1 else 1.0,
            seed=None if goal.seed < 0 else int(goal.seed), stop_strings=tuple(goal.stop))

    def prompt_ids(self, text: str) -> list[int]:
        from edge_llm_ros.core import chat_prompt, encode

        return chat_prompt(self.tokenizer, text) if self.chat_template else encode(self.tokenizer, text)

    def stream(self, prompt: str, config, finished: Finished):
        """Yield a Step per committed round; ``finished`` says how the request ended. Raises
        VerifierTimeout, DraftRejectedError or ValueError (bad prompt / outcome)."""
        from edge_llm_ros.tools.generate import IncrementalDecoder

        rid, inbox, decoder = uuid.uuid4().hex[:12], queue.Queue(), IncrementalDecoder(self.tokenizer)
        started = time.monotonic()
        self.inboxes[rid] = inbox
        try:
            draft = self.drafter.start(rid, self.prompt_ids(prompt), config)
            while draft is not None:
                self.draft_pub.publish(to_message(self.DraftTree, draft))
                step, final = None, None
                while step is None:  # stale or duplicated finals are ignored by the drafter
                    try:
                        final = inbox.get(timeout=self.timeout_s)
                    except queue.Empty:
                        raise VerifierTimeout(f"no final VerifyResult for round {draft.round} within timeout_s="
                                              f"{self.timeout_s:g} s: is verifier_node running and subscribed to "
                                              f"{self.resolve('draft')}?") from None
                    step = self.drafter.on_final(final)
                if not finished.tokens:
                    finished.ttft_s = time.monotonic() - started
                finished.tokens += step.tokens
                text = "".join(decoder.push(t) for t in step.tokens)
                if step.draft is None:
                    text += decoder.finish()
                    finished.reason = step.finish_reason
                yield Step(step.tokens, text, final.probs[: len(step.tokens)])
                draft = step.draft
        finally:
            self.inboxes.pop(rid, None)
            finished.stats = self.drafter.end(rid)
            finished.wall_s = time.monotonic() - started
            self.prune_pub.publish(self.PruneInfo(request_id=rid, release=True))
            self.publish_stats(rid, config, finished)

    def execute(self, goal_handle):
        """The generate action: accepted text as feedback, then the result."""
        finished, text, Result = Finished(), "", self.Generate.Result
        try:
            config = self.config_for(goal_handle.request)
            with contextlib.closing(self.stream(goal_handle.request.prompt, config, finished)) as steps:
                for step in steps:
                    if goal_handle.is_cancel_requested:
                        finished.reason = "cancelled"
                        break
                    goal_handle.publish_feedback(self.Generate.Feedback(token_ids=step.tokens,
                                                                        text_delta=step.text, probs=step.probs))
                    text += step.text
        except request_errors() as exc:
            self.get_logger().error(f"generate: {exc}")
            goal_handle.abort()
            return Result(text=text, token_ids=finished.tokens, finish_reason=f"error: {exc}")
        if finished.reason == "cancelled":
            goal_handle.canceled()
        else:
            goal_handle.succeed()
        return Result(text=text, token_ids=finished.tokens, finish_reason=finished.reason,
                      stats=self.stats_msg("", config, finished))

    def answer(self, instruction: str) -> None:
        """The instruction topic: a TokenChunk stream on response, the last one done."""
        rid, round_, finished = uuid.uuid4().hex[:12], -1, Finished()
        try:
            for round_, step in enumerate(self.stream(instruction, self.config_for(), finished)):
                done = bool(finished.reason)
                self.response_pub.publish(self.TokenChunk(request_id=rid, round=round_, token_ids=step.tokens,
                                                          text=step.text, probs=step.probs, done=done,
                                                          finish_reason=finished.reason))
        except request_errors() as exc:
            self.get_logger().error(f"instruction: {exc}")
            self.response_pub.publish(self.TokenChunk(request_id=rid, round=round_ + 1, done=True,
                                                      finish_reason="error", error=str(exc)))

    # -- stats -------------------------------------------------------------------------------------

    def stats_msg(self, request_id: str, config, finished: Finished):
        s = finished.stats
        tokens = len(finished.tokens)
        drafted = config.gamma * s.rounds if config.mode == "sd" else 0
        return self.Stats(
            node_name=self.get_name(), request_id=request_id, mode=f"ee-{config.mode}", tokens=tokens,
            tokens_per_s=tokens / max(finished.wall_s, 1e-9), ttft_s=finished.ttft_s, tau=s.tau,
            acceptance_rate=sum(s.accepted) / drafted if drafted else 0.0, draft_time_s=s.critical_draft_s,
            cache_miss_rate=s.miss_rate, avg_exit_layer=s.mean_hit_layer, active_requests=len(self.inboxes))

    def publish_stats(self, request_id: str, config, finished: Finished) -> None:
        if finished.stats is not None:
            self.stats_pub.publish(self.stats_msg(request_id, config, finished))

    def destroy_node(self) -> None:
        self.drafter.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    return run_node(DraftNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
