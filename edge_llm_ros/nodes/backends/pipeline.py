"""The `pipeline` backend: FlowSpec's D0 in front of a stage pipeline (launch/stages.launch.py).

The stage_nodes hold the target's layers (`layers`: every stage's range); this node holds the draft
and the tokenizer and schedules each request (core/pipeline/schedulers.py) through the stages
(nodes/stage_client.py): `flowspec` (continuous pipelined speculative decoding), `chunk_pp` (a draft
tree sent through the stages in chunks of `segment` rows back to back, verified once all are back:
FlowSpec's baseline) and `ar` (the naive pipeline), greedy only, all lossless; the prompt enters in
chunks of `prefill_chunk` tokens back to back (Jupiter's pipelined prefill). `outline` (Jupiter §V-B,
core/pipeline/outline.py) is NOT lossless by design: an outline with flowspec, then every point
expanded at once through the stages, streamed point by point in order.

A stage that refuses a request, dies, or does not answer within `timeout_s` ends it with PEER_GONE or
TIMEOUT. Each request's figures travel in its InferenceStats: ALT and ALR (FlowSpec §V-A), and D0's
drafts, draft forwards and drafting seconds (one torch thread: its CPU time; the pipeline bench fits
the simulator's draft cost to them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

from edge_llm_ros.errors import Inactive, Invalid
from edge_llm_ros.nodes.backends import Chunk, Request, RequestStats, Worker
from edge_llm_ros.nodes.backends.draft_side import DraftSideParams, eos_of, load_drafters, prompt_ids
from edge_llm_ros.nodes.edge_link import VerifierLink
from edge_llm_ros.nodes.parameters import declare, param


@dataclasses.dataclass(frozen=True)
class PipelineParams(DraftSideParams):
    layers: str = param("0-10,11-29", "every stage's decoder layers, as launch/stages.launch.py takes them "
                                      "(0-10,11-29): one stage_node per range")
    segment: int = param(8, "draft rows per segment (FlowSpec)", low=1, high=4096)
    in_flight: int = param(0, "FlowSpec segments on their way at most (0 = one per stage)", low=0, high=4096)
    prefill_chunk: int = param(0, "prompt tokens per prefill chunk, sent back to back (0 = the whole prompt at "
                                  "once)", low=0, high=1_000_000)

    def stages(self) -> int:
        from edge_llm_ros.core.planning.partition import layer_ranges

        return len(layer_ranges(self.layers))


class PipelineBackend:
    name = "pipeline"
    params = PipelineParams
    door_defaults = {"max_requests": 8, "max_pending": 0, "max_new_tokens": 64}
    default_mode = "flowspec"

    def __init__(self, node) -> None:
        from edge_llm_ros.nodes.stage_client import StageClient

        self.node = node
        self.p = declare(node, PipelineParams)
        if not self.p.stages():
            raise ValueError(f"parameter 'layers' gives no stage: {self.p.layers!r}")
        self.link = VerifierLink(node, self.p.timeout_s)  # the stages' refusals come on `verify`; prunes on `prune`
        self.stages = StageClient(node, self.p.stages(), self.p.timeout_s, self.link.inboxes, self.link.prune_pub)
        self.drafter = self.tokenizer = None  # while configured
        self.gate = threading.Semaphore(node.door.max_requests)

    def load(self) -> str:
        drafts, self.tokenizer, engine, why = load_drafters(self.node, self.p, 1)
        self.drafter = drafts[0].drafter
        return (f"D0 of a stage pipeline, drafting with {drafts[0].description} on {engine} ({why}), mode "
                f"{self.node.door.mode or self.default_mode}: {self.stages.describe()}")

    def unload(self) -> None:
        self.drafter = self.tokenizer = None

    def start(self, request: Request, listener) -> Worker:
        from edge_llm_ros.core.engine.config import preset

        drafter, tokenizer = self.drafter, self.tokenizer
        if drafter is None:
            raise Inactive(self.node.refusal() or "not configured")
        config = preset("ar", max_new_tokens=self.node.door.max_new_tokens).with_overrides(**request.overrides)
        if not config.greedy:
            raise Invalid(f"the stage pipeline decodes greedily for now: send temperature 0, got {config.temperature}")
        stats = RequestStats(mode=request.mode, backend=f"{self.p.stages()} stages")
        return Worker(request, self.steps(request, config, drafter, tokenizer, stats), listener, stats, self.gate)

    def steps(self, request: Request, config, drafter, tokenizer, stats: RequestStats):
        """One request through the stages as Chunks (outline: one per point); returns the finish reason."""
        from edge_llm_ros.core.pipeline.schedulers import make_scheduler
        from edge_llm_ros.core.planning.costs import TimedDrafter

        p, eos = self.p, eos_of(tokenizer, config)
        # D0's draft cost as it runs here: with one thread, the CPU that thread spent, not the time a
        # stage on the same core took from it
        timed = TimedDrafter(drafter, clock=time.thread_time if p.threads == 1 else time.perf_counter)

        def make(request_id, ids, max_new_tokens, mode=request.mode, **fork):
            return make_scheduler(mode, request_id, ids, timed, max_new_tokens=max_new_tokens, eos=eos,
                                  segment=p.segment, in_flight=p.in_flight or p.stages(),
                                  prefill_chunk=p.prefill_chunk, **fork)

        try:
            if request.mode == "outline":
                reason = yield from self.outline(request, make, config, tokenizer, eos, stats)
            else:
                scheduler = make(request.request_id, prompt_ids(self.node, tokenizer, request.prompt),
                                 config.max_new_tokens)
                reason = yield from self.scheduled(scheduler, tokenizer, stats)
        finally:
            stats.drafts, stats.draft_forwards, stats.draft_time_s = timed.totals()
            stats.draft_time_is_cpu = timed.clock is time.thread_time
            self.node.get_logger().info(
                f"request {request.request_id} ({request.mode}): {stats.tokens} tokens, ALT {stats.alt:.4f}, ALR "
                f"{stats.alr:.4f}; D0 drafted {stats.drafts} times, {stats.draft_forwards} forwards, {stats.draft_time_s:.4f} s "
                f"{'CPU' if stats.draft_time_is_cpu else 'wall'}")
        return reason

    def scheduled(self, scheduler, tokenizer, stats: RequestStats):
        """One scheduler through the stages, a Chunk per answer that commits tokens."""
        from edge_llm_ros.core.engine.detokenize import IncrementalDecoder

        decoder = IncrementalDecoder(tokenizer)
        try:
            with contextlib.closing(self.stages.run(scheduler)) as answers:
                for tokens in answers:
                    text = "".join(decoder.push(t) for t in tokens)
                    if scheduler.finished:
                        text += decoder.finish()
                    stats.tokens += len(tokens)
                    yield Chunk(list(tokens), text)
        finally:
            turns(stats, scheduler)
        return scheduler.finished or "eos"

    def outline(self, request: Request, make, config, tokenizer, eos, stats: RequestStats):
        """Outline decoding: the outline with flowspec, then every point at once through the stages,
        streamed point by point in order; an outline of fewer than two points: the plain flowspec answer."""
        from edge_llm_ros.core.pipeline.outline import Outline

        def flowspec(request_id, ids, max_new_tokens, **fork):
            return make(request_id, ids, max_new_tokens, mode="flowspec", **fork)

        outline = Outline(request.request_id, tokenizer, request.prompt, flowspec, point_tokens=config.max_new_tokens,
                          eos=eos)
        first, forked = outline.first(), False
        try:
            for _ in self.stages.run_many([first], release_own=False):
                pass
            points = outline.expand()
            if not points:
                self.node.get_logger().info(f"outline {request.request_id}: {len(outline.points)} point(s) in the "
                                            f"outline {outline.outline_text()[:160]!r}; answering plainly")
                plain = flowspec(request.request_id, prompt_ids(self.node, tokenizer, request.prompt),
                                 config.max_new_tokens)
                return (yield from self.scheduled(plain, tokenizer, stats))
            forked, shown = True, 0
            for _ in self.stages.run_many(points, release=(first.request_id,)):
                while shown < len(points) and points[shown].finished:
                    yield point_chunk(outline, shown, stats)
                    shown += 1
            while shown < len(points):
                yield point_chunk(outline, shown, stats)
                shown += 1
            turns(stats, first)
            return "length" if any(s.finished == "length" for s in points) else "eos"
        finally:
            if not forked:
                self.stages.release(first.request_id)


def point_chunk(outline, index: int, stats: RequestStats) -> Chunk:
    """Point ``index``'s expansion: its tokens (no end-of-answer), "N. text" and a newline."""
    tokens = [t for t in outline.expansions[index].generated if t not in outline.eos]
    stats.tokens += len(tokens)
    return Chunk(tokens, outline.point_text(index) + "\n")


def turns(stats: RequestStats, scheduler) -> None:
    """The scheduler's pipeline turns into the stats: drafted tokens accepted per turn (tau = ALT), ALT, ALR."""
    stats.accepted = [n - 1 for n in scheduler.per_turn]
    stats.alt, stats.alr = scheduler.alt, scheduler.alr
