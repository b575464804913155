"""The `edge_cloud` backend: the robot half of edge-cloud decoding with early exits (EE Algorithm 1).

Holds the tokenizer and every request's state (core's EarlyExitDrafter). Each request publishes one
DraftTree per round on `draft` and waits for that round's final VerifyResult on `verify`
(nodes/edge_link.py); early VerifyResults go to the drafter at once, which pre-drafts the next
round from them on worker threads, so a final that confirms a hypothesis finds its next draft
ready (`fsd`, EE Algorithm 1) or, in `ee`, has already sent it. `sd` / `tree` are plain edge-cloud
speculative decoding (final outcomes only); `ar` is cloud decoding (the verifier generates every
token). When a request ends, a PruneInfo with `release` on `prune` frees its cache on the verifier.

A request never hangs: without a final VerifyResult within `timeout_s` it ends with TIMEOUT, and
once no verifier subscribes to `draft` any more (two checks a second apart) with PEER_GONE.
Sampled requests draft from the request's warps with top-k capped at `proposal_top_k`, the proposal
support each drafted token carries on the wire; the verifier's test stays exact. On llama.cpp only
the target's tokenizer is loaded (no torch weights) and each of the predraft_workers + 1 drafters
gets a llama.cpp context of its own (llama.cpp releases the GIL, so pre-drafting runs in parallel).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

from edge_llm_ros.errors import Inactive
from edge_llm_ros.nodes.backends import Chunk, Request, RequestStats, Worker
from edge_llm_ros.nodes.backends.draft_side import DraftSideParams, load_drafters, prompt_ids
from edge_llm_ros.nodes.diagnostics import ERROR, Status, percentile
from edge_llm_ros.nodes.edge_link import VerifierLink
from edge_llm_ros.nodes.parameters import declare, param


@dataclasses.dataclass(frozen=True)
class EdgeCloudParams(DraftSideParams):
    gamma: int = param(4, "tokens drafted per round", low=1, high=64)
    predraft_workers: int = param(1, "pre-drafting threads, a drafter each (one more drafter serves misses)",
                                  low=1, high=64)
    proposal_top_k: int = param(64, "top-k of the proposal each drafted token carries (sampled requests)",
                                low=1, high=1_000_000)


class EdgeCloudBackend:
    name = "edge_cloud"
    params = EdgeCloudParams
    door_defaults = {"max_requests": 8, "max_pending": 0, "max_new_tokens": 64}
    default_mode = "ee"

    def __init__(self, node) -> None:
        self.node = node
        self.p = declare(node, EdgeCloudParams)
        self.link = VerifierLink(node, self.p.timeout_s)  # draft -> verifier -> verify, and prune
        self.tokenizer = None  # while configured
        self.gate = threading.Semaphore(node.door.max_requests)

    def load(self) -> str:
        from edge_llm_ros.core.edge_cloud import EarlyExitDrafter

        p = self.p
        drafts, self.tokenizer, engine, why = load_drafters(self.node, p, p.predraft_workers + 1)
        self.link.drafter = EarlyExitDrafter([d.drafter for d in drafts], seed=0, sender=self.link.send,
                                             workers=p.predraft_workers, max_requests=self.node.door.max_requests,
                                             proposal_top_k=p.proposal_top_k)
        resolve = self.node.resolve_topic_name
        return (f"drafting with {drafts[0].description}, draft backend {engine} ({why}), {len(drafts)} drafters, "
                f"mode {self.node.door.mode or self.default_mode} (gamma {p.gamma}): {resolve('draft')} -> verifier "
                f"-> {resolve('verify')}")

    def unload(self) -> None:
        if self.link.drafter is not None:
            self.link.drafter.close()
        self.link.drafter = self.tokenizer = None

    def start(self, request: Request, listener) -> Worker:
        from edge_llm_ros.core.edge_cloud import EDGE_MODES
        from edge_llm_ros.core.engine.config import preset

        tokenizer = self.tokenizer
        if tokenizer is None:
            raise Inactive(self.node.refusal() or "not configured")
        config = preset(EDGE_MODES[request.mode][0], gamma=self.p.gamma,
                        max_new_tokens=self.node.door.max_new_tokens).with_overrides(**request.overrides)
        stats = RequestStats(mode=request.mode, backend="verifier")
        ids = prompt_ids(self.node, tokenizer, request.prompt)
        return Worker(request, self.steps(request, ids, config, tokenizer, stats), listener, stats, self.gate)

    def steps(self, request: Request, ids: list[int], config, tokenizer, stats: RequestStats):
        """One request's rounds as Chunks (the generator Worker drives); returns the finish reason."""
        from edge_llm_ros.core.edge_cloud import EDGE_MODES
        from edge_llm_ros.core.engine.detokenize import IncrementalDecoder

        decoder, reason, ended = IncrementalDecoder(tokenizer), "", []
        _, early_exits, send_ahead = EDGE_MODES[request.mode]
        rounds = self.link.rounds(request.request_id, ids, config, stats_out=ended, early_exits=early_exits,
                                  send_ahead=send_ahead)
        try:
            with contextlib.closing(rounds):
                for step, final in rounds:
                    text = "".join(decoder.push(t) for t in step.tokens)
                    if step.finish_reason:
                        text += decoder.finish()
                        reason = step.finish_reason
                    yield Chunk(list(step.tokens), text, list(final.probs[: len(step.tokens)]))
        finally:
            if ended:
                self.fill(stats, ended[0], request)
        return reason

    def diagnose(self, status: Status, ended: list[RequestStats]) -> None:
        """The link's part of the front door's status: ERROR while no verifier subscribes to `draft`, or
        after a request failed on the verifier (timeout, gone) until a final comes again (a killed
        verifier stays in DDS's graph until its lease ends);
        the last minute's draft-to-final times and the pre-draft cache's hit rate."""
        topic = self.node.resolve_topic_name("draft")
        verifiers = self.node.count_subscribers("draft")
        status.add("verifiers on draft", verifiers)
        failed_at, why = self.link.failed
        if verifiers == 0:
            status.merge(ERROR, f"no verifier: nothing subscribes to {topic}")
        elif failed_at > self.link.last_final_at:  # a request failed on it, and nothing came since
            status.merge(ERROR, f"the verifier is not answering: {why}")
        trips = self.link.round_trips.recent()
        status.add("draft-to-final p50 s (last 60 s)", percentile(trips, 0.5))
        status.add("draft-to-final p95 s (last 60 s)", percentile(trips, 0.95))
        hits, misses = sum(s.hits for s in ended), sum(s.misses for s in ended)
        status.add("pre-draft hit rate (last 60 s)", hits / (hits + misses) if hits + misses else 0.0)

    def fill(self, stats: RequestStats, edge, request: Request) -> None:
        """The drafter's EdgeCloudStats into the request's stats; what it ignored is logged."""
        stats.accepted = list(edge.accepted)
        stats.drafted = self.p.gamma * len(edge.accepted) if request.mode in ("sd", "fsd", "ee") else 0
        stats.hits, stats.misses, stats.hit_layers = edge.hits, edge.misses, list(edge.hit_layers)
        stats.draft_time_s, stats.verify_time_s = edge.critical_draft_s, edge.verify_s
        stats.ignored_results = sum(edge.ignored.values())
        if edge.ignored:
            self.node.get_logger().info(f"request {request.request_id}: ignored {stats.ignored_results} "
                                        "VerifyResults (" + ", ".join(f"{k} {v}" for k, v in sorted(edge.ignored.items()))
                                        + ")")
