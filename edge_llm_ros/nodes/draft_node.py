"""draft_node: the robot half of edge-cloud decoding with early exits (EE Algorithm 1).

Holds the tokenizer and every request's state (core's EarlyExitDrafter). Each request publishes
one DraftTree per round on `draft` and waits for that round's final VerifyResult on `verify`;
early VerifyResults are handed to the drafter at once, which pre-drafts the next round from them
on worker threads, so a final that confirms a hypothesis finds its next draft ready (`fsd`, EE
Algorithm 1) or, in `ee`, has already sent it: a pre-draft done before its round's final goes
to the verifier at once, marked speculative. `sd` / `tree` are plain edge-cloud speculative
decoding (final outcomes only); `ar` is cloud decoding (the verifier generates every token). Requests
come from the `generate` action (accepted text streamed as feedback; result text, token ids and
InferenceStats with τ, cache miss rate and the average exit layer of the hits) and from the
`instruction` topic (a TokenChunk stream on `response`, as echo_node does). When a request ends
a PruneInfo with `release` on `prune` frees its cache on the verifier; its stats go on `stats`.

If no final VerifyResult arrives within `timeout_s` (verifier gone, link down), the request
ends with an error (the goal is aborted, finish_reason "error: ..."); it never hangs. When no
verifier subscribes to `draft` any more (two checks a second apart) it ends within about two
seconds ("verifier gone"). At most `max_requests` requests run at once: a goal beyond that is
rejected when it is sent (busy), an instruction answered with an error chunk. A goal whose
fields are out of range (empty prompt, temperature not a finite number >= 0, top_p outside
[0, 1], seed below -1, an unknown mode) is aborted with the reason.

Sampled requests draft from the request's warps with top-k capped at `proposal_top_k`, the
proposal support each drafted token carries on the wire; the verifier's test stays exact.

Lifecycle (nodes/managed.py): configure loads the drafters and the tokenizer, activate serves,
deactivate ends new goals and instructions with an error starting "inactive:", cleanup frees the
drafters. With `autostart` (the default) it goes to active by itself.

Stage pipeline (issue 14): with `layers` set (every stage's decoder layers) the node is FlowSpec's
D0 in front of those stage_nodes (launch/stages.launch.py) instead of a verifier: modes `flowspec` (continuous
pipelined speculative decoding), `chunk_pp` (a draft tree sent through the stages in chunks of
`segment` rows back to back, verified once all are back: FlowSpec's baseline) and `ar` (the naive pipeline), greedy only, all lossless; the prompt enters in chunks of
`prefill_chunk` tokens back to back (Jupiter's pipelined prefill). See nodes/stage_client.py.

Parameters: DraftParams below, all read-only (a change needs a restart).

On llama.cpp the node loads the target's tokenizer only (no torch weights) and gives each of its
predraft_workers + 1 drafters a llama.cpp context of its own (llama.cpp releases the GIL, so the
pre-drafting threads run in parallel).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field

from edge_llm_ros import runtime as rt
from edge_llm_ros.errors import Inactive, RequestError, Status, status_of
from edge_llm_ros.nodes.common import goal_overrides, run_node, stamp
from edge_llm_ros.nodes.edge_link import VerifierLink
from edge_llm_ros.nodes.managed import ManagedNode, ManagedParams
from edge_llm_ros.nodes.parameters import param


def request_errors() -> tuple[type[Exception], ...]:
    """What ends one request with an error (the node goes on): no verifier, a rejected draft, a failed
    or gone stage, too many requests (RequestErrors), a bad prompt or goal (ValueError)."""
    return RequestError, ValueError


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
    drafts: object = None  # a pipeline request's drafter, timed (core.planning.costs.TimedDrafter): D0's draft cost


@dataclass(frozen=True)
class DraftParams(ManagedParams):
    draft: str = param("", "the draft: '' = the shipped trained draft; shallow:K, exit:K[:PATH], lookup or a "
                           "folder on torch; llama.cpp:PATH or a .gguf file on llama.cpp")
    draft_backend: str = param("auto", "where the draft runs; auto = the draft spec's, else the device plan's, "
                                       "else llama.cpp when llama-cpp-python is installed, else torch",
                               choices=("auto", "torch", "llama.cpp"))
    model: str = param("", "the target's tokenizer (and on torch the weights the draft shares); '' = SmolLM2")
    mode: str = param("ee", "decoding mode when a goal gives none: ee, fsd, sd, tree or ar")
    gamma: int = param(4, "tokens drafted per round", low=1, high=64)
    max_new_tokens: int = param(64, "answer length when a goal gives 0, and for instructions", low=1, high=1_000_000)
    timeout_s: float = param(10.0, "seconds to wait for a round's final VerifyResult before the request ends",
                             low=0.001)
    predraft_workers: int = param(1, "pre-drafting threads, a drafter each (one more drafter serves misses)",
                                  low=1, high=64)
    chat_template: bool = param(True, "apply the tokenizer's chat template to prompts")
    threads: int = param(0, "torch threads, or each llama.cpp drafter's (0 = the default)", low=0, high=1024)
    stats_period_s: float = param(1.0, "period of the aggregate InferenceStats on stats (0 = per request only)",
                                  low=0.0)
    max_requests: int = param(8, "requests at once; more goals are refused as busy", low=1, high=1024)
    proposal_top_k: int = param(64, "top-k of the proposal each drafted token carries (sampled requests)",
                                low=1, high=1_000_000)
    layers: str = param("", "a stage pipeline's decoder layers per stage, as launch/stages.launch.py takes them "
                            "(0-10,11-29): set, this node is D0 in front of those stage_nodes (modes flowspec | "
                            "chunk_pp | ar) instead of drafting for a verifier")
    segment: int = param(8, "stage pipeline: draft rows per segment (FlowSpec)", low=1, high=4096)
    in_flight: int = param(0, "stage pipeline: FlowSpec segments on their way at most (0 = one per stage)",
                           low=0, high=4096)
    prefill_chunk: int = param(0, "stage pipeline: prompt tokens per prefill chunk, sent back to back (0 = the "
                                  "whole prompt at once)", low=0, high=1_000_000)

    def __post_init__(self) -> None:
        from edge_llm_ros.core.edge_cloud import EDGE_MODES
        from edge_llm_ros.core.pipeline.schedulers import PIPELINE_MODES

        modes = PIPELINE_MODES if self.stages() else EDGE_MODES
        if self.mode not in modes:
            raise ValueError(f"parameter 'mode' must be one of {' | '.join(modes)}"
                             f"{' with layers (a stage pipeline)' if self.stages() else ''}, got {self.mode!r}")

    def stages(self) -> int:
        """How many stages `layers` gives (0: none, edge-cloud decoding)."""
        from edge_llm_ros.nodes.stage_node import layer_ranges

        return len(layer_ranges(self.layers))


class DraftNode(ManagedNode):
    def __init__(self) -> None:
        super().__init__("draft_node", DraftParams)
        p = self.params
        self.drafter = self.tokenizer = self.stage_drafter = None  # while configured
        self.slots = threading.BoundedSemaphore(p.max_requests)  # one per running goal or instruction
        self.recent: list[tuple[str, Finished]] = []  # (mode, request) ended since the last stats tick

        self.TokenChunk = rt.message("edge_llm_ros/msg/TokenChunk")
        self.Stats = rt.message("edge_llm_ros/msg/InferenceStats")
        self.Generate = rt.action("edge_llm_ros/action/Generate")
        self.RequestStatus = rt.message("edge_llm_ros/msg/RequestStatus")
        self.link = VerifierLink(self, p.timeout_s)  # draft -> verifier -> verify, and prune
        self.response_pub = self.create_publisher(self.TokenChunk, "response", 100)
        self.stats_pub = self.create_publisher(self.Stats, "stats", 10)
        self.create_subscription(rt.message("std_msgs/msg/String"), "instruction", self.on_instruction, 10)
        self.action_server = rt.ActionServer(self, self.Generate, "generate", self.execute,
                                             max_goals=p.max_requests, goal_callback=self.admit_goal,
                                             cancel_callback=lambda handle: rt.CancelResponse.ACCEPT)
        if p.stats_period_s > 0:
            self.create_timer(p.stats_period_s, self.publish_recent_stats)
        self.stages = None
        if p.stages():
            from edge_llm_ros.nodes.stage_client import StageClient

            self.stages = StageClient(self, p.stages(), p.timeout_s, self.link.inboxes, self.link.prune_pub)

    def load(self) -> str:
        import torch

        from edge_llm_ros.core.drafts.loading import LoadError, build_drafters, check_draft_spec, resolve_draft_backend
        from edge_llm_ros.core.edge_cloud import EarlyExitDrafter
        from edge_llm_ros.core.planning.device_plan import planned_draft_backend

        p = self.params
        if p.threads:
            torch.set_num_threads(p.threads)
        try:
            planned = (planned_draft_backend(p.model or None, warn=self.get_logger().warning)
                       if p.draft_backend == "auto" and not p.draft else None)
            backend, spec, why = resolve_draft_backend(p.draft_backend, p.draft or None, planned)
        except LoadError as exc:
            raise ValueError(f"parameter 'draft_backend': {exc}") from exc
        try:
            check_draft_spec(spec)
            # + one drafter for misses; on llama.cpp only the target's tokenizer is loaded, not its weights
            drafts, self.tokenizer = build_drafters(backend, spec, p.model or None, p.predraft_workers + 1,
                                                    p.threads or None)
        except LoadError as exc:
            raise ValueError(f"parameter 'draft': {exc}") from exc
        if self.stages is not None:
            self.stage_drafter = drafts[0].drafter
            return (f"D0 of a stage pipeline, drafting with {drafts[0].description} on {backend} ({why}), mode "
                    f"{p.mode}: {self.stages.describe()}")
        self.drafter = self.link.drafter = EarlyExitDrafter([d.drafter for d in drafts], seed=0, sender=self.link.send,
                                        workers=p.predraft_workers, max_requests=p.max_requests,
                                        proposal_top_k=p.proposal_top_k)
        return (f"drafting with {drafts[0].description}, draft backend {backend} ({why}), "
                f"{len(drafts)} drafters, mode {p.mode} (gamma {p.gamma}): "
                f"{self.resolve_topic_name('draft')} -> verifier -> {self.resolve_topic_name('verify')}")

    def unload(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        self.drafter = self.link.drafter = self.tokenizer = self.stage_drafter = None

    # -- callbacks ---------------------------------------------------------------------------------

    def admit_goal(self, goal) -> int:
        """Take a slot for the goal, or reject it at once: busy (max_requests running). Its fields
        are checked when it runs, so a bad one ends with the reason in its result."""
        if not self.slots.acquire(blocking=False):
            self.get_logger().warning(f"generate: goal rejected, busy (max_requests={self.params.max_requests} "
                                      "running)")
            return rt.GoalResponse.REJECT
        return rt.GoalResponse.ACCEPT

    def on_instruction(self, msg) -> None:
        if not self.slots.acquire(blocking=False):
            self.response_pub.publish(stamp(self, self.TokenChunk(
                request_id=uuid.uuid4().hex[:12], done=True, finish_reason="error",
                error=f"busy: max_requests={self.params.max_requests} running",
                status=self.RequestStatus(code=Status.BUSY))))
            return
        threading.Thread(target=self.answer, args=(msg.data,), daemon=True, name="instruction").start()

    # -- one request -------------------------------------------------------------------------------

    def config_for(self, goal=None):
        """(edge mode, GenerationConfig): the node's, with the goal's overrides; ValueError if the
        node is not active or the goal is bad."""
        from edge_llm_ros.core.edge_cloud import EDGE_MODES
        from edge_llm_ros.core.engine.config import preset
        from edge_llm_ros.core.pipeline.schedulers import PIPELINE_MODES

        if refusal := self.refusal():
            raise Inactive(refusal)
        p = self.params
        mode = (goal.mode if goal is not None else "") or p.mode
        modes = PIPELINE_MODES if self.stages is not None else EDGE_MODES
        if mode not in modes:
            raise ValueError(f"mode must be one of {' | '.join(modes)} (or empty: the node's {p.mode}), "
                             f"got {mode!r}")
        base = preset("ar" if self.stages is not None else EDGE_MODES[mode][0], gamma=p.gamma,
                      max_new_tokens=p.max_new_tokens)
        if goal is None:
            return mode, base
        if len(goal.images) or len(goal.choices):
            raise ValueError("images and choices are not supported by draft_node (text only)")
        config = base.with_overrides(**goal_overrides(goal, p.max_new_tokens))
        if self.stages is not None and not config.greedy:
            raise ValueError(f"the stage pipeline decodes greedily for now: send temperature 0, got {config.temperature}")
        return mode, config

    def prompt_ids(self, text: str) -> list[int]:
        from edge_llm_ros.core.engine.models import chat_prompt, encode

        return chat_prompt(self.tokenizer, text) if self.params.chat_template else encode(self.tokenizer, text)

    def stream(self, prompt: str, mode: str, config, finished: Finished):
        """Yield a Step per committed round; ``finished`` says how the request ended. Raises
        VerifierTimeout, DraftRejectedError or ValueError (bad prompt / outcome)."""
        from edge_llm_ros.core.edge_cloud import EDGE_MODES
        from edge_llm_ros.core.engine.detokenize import IncrementalDecoder

        if not prompt.strip():
            raise ValueError("prompt is empty")
        if self.stages is not None:
            yield from self.stream_stages(prompt, mode, config, finished)
            return
        if self.drafter is None:
            raise Inactive(self.refusal() or "not configured")
        rid, decoder = uuid.uuid4().hex[:12], IncrementalDecoder(self.tokenizer)
        _, early_exits, send_ahead = EDGE_MODES[mode]
        started, ended = time.monotonic(), []
        try:
            for step, final in self.link.rounds(rid, self.prompt_ids(prompt), config, stats_out=ended,
                                                early_exits=early_exits, send_ahead=send_ahead):
                if not finished.tokens:
                    finished.ttft_s = time.monotonic() - started
                finished.tokens += step.tokens
                text = "".join(decoder.push(t) for t in step.tokens)
                if step.finish_reason:
                    text += decoder.finish()
                    finished.reason = step.finish_reason
                yield Step(step.tokens, text, final.probs[: len(step.tokens)])
        finally:
            finished.stats = ended[0] if ended else None
            finished.wall_s = time.monotonic() - started
            self.end_request(rid, mode, config, finished)

    def stream_stages(self, prompt: str, mode: str, config, finished: Finished):
        """stream() through the stage pipeline: one Step per answer that commits tokens (outline: one
        per point)."""
        from edge_llm_ros.core.engine.decoding import eos_ids
        from edge_llm_ros.core.pipeline.schedulers import make_scheduler
        from edge_llm_ros.core.planning.costs import TimedDrafter

        if self.stage_drafter is None:
            raise Inactive(self.refusal() or "not configured")
        rid, started, p = uuid.uuid4().hex[:12], time.monotonic(), self.params
        eos = eos_ids(self, config)
        # D0's draft cost as it runs here (bench --scenario pipeline fits the simulator's to it): with one
        # thread, the CPU that thread spent, not the time a stage on the same core took from it
        drafter = finished.drafts = TimedDrafter(self.stage_drafter,
                                                 clock=time.thread_time if p.threads == 1 else time.perf_counter)

        def make(request_id, ids, max_new_tokens, mode=mode, **fork):
            return make_scheduler(mode, request_id, ids, drafter, max_new_tokens=max_new_tokens, eos=eos,
                                  segment=p.segment, in_flight=p.in_flight or p.stages(),
                                  prefill_chunk=p.prefill_chunk, **fork)

        try:
            if mode == "outline":
                yield from self.stream_outline(prompt, rid, make, config, finished, started)
            else:
                yield from self.stream_scheduler(make(rid, self.prompt_ids(prompt), config.max_new_tokens), finished,
                                                 started)
        finally:
            finished.wall_s = time.monotonic() - started
            self.end_request(rid, mode, config, finished)

    def stream_scheduler(self, scheduler, finished: Finished, started: float):
        """One request through the stages, a Step per answer that commits tokens."""
        from edge_llm_ros.core.engine.detokenize import IncrementalDecoder
        from edge_llm_ros.nodes.stage_client import scheduler_stats

        decoder = IncrementalDecoder(self.tokenizer)
        try:
            for tokens in self.stages.run(scheduler):
                if not finished.tokens:
                    finished.ttft_s = time.monotonic() - started
                finished.tokens += tokens
                text = "".join(decoder.push(t) for t in tokens)
                if scheduler.finished:
                    text += decoder.finish()
                    finished.reason = scheduler.finished
                yield Step(tokens, text, [])
        finally:
            finished.stats = scheduler_stats(scheduler)

    def stream_outline(self, prompt: str, rid: str, make, config, finished: Finished, started: float):
        """Outline decoding (core/pipeline/outline.py, NOT lossless): the outline with flowspec, then every point
        at once through the stages, streamed point by point in order; an outline of fewer than two
        points: the plain flowspec answer instead."""
        from edge_llm_ros.core.engine.decoding import eos_ids
        from edge_llm_ros.core.pipeline.outline import Outline
        from edge_llm_ros.nodes.stage_client import scheduler_stats

        def flowspec(request_id, ids, max_new_tokens, **fork):
            return make(request_id, ids, max_new_tokens, mode="flowspec", **fork)

        outline = Outline(rid, self.tokenizer, prompt, flowspec, point_tokens=config.max_new_tokens,
                          eos=eos_ids(self, config))
        first, forked = outline.first(), False
        try:
            for _ in self.stages.run_many([first], release_own=False):
                pass
            points = outline.expand()
            if not points:
                self.get_logger().info(f"outline {rid}: {len(outline.points)} point(s) in the outline "
                                       f"{outline.outline_text()[:160]!r}; answering plainly with flowspec")
                yield from self.stream_scheduler(flowspec(rid, self.prompt_ids(prompt), config.max_new_tokens),
                                                 finished, started)
                return
            forked, shown = True, 0
            for _ in self.stages.run_many(points, release=(first.request_id,)):
                while shown < len(points) and points[shown].finished:
                    yield self.outline_step(outline, shown, finished, started)
                    shown += 1
            while shown < len(points):
                yield self.outline_step(outline, shown, finished, started)
                shown += 1
            finished.reason = "length" if any(s.finished == "length" for s in points) else "eos"
            finished.stats = scheduler_stats(first)
        finally:
            if not forked:
                self.stages.release(first.request_id)

    def outline_step(self, outline, index: int, finished: Finished, started: float) -> Step:
        """Point ``index``'s expansion as one Step: its tokens (no end-of-answer), "N. text" and a newline."""
        point = outline.expansions[index]
        tokens = [t for t in point.generated if t not in outline.eos]
        if not finished.tokens:
            finished.ttft_s = time.monotonic() - started
        finished.tokens += tokens
        return Step(tokens, outline.point_text(index) + "\n", [])

    def execute(self, goal_handle):
        """The generate action: accepted text as feedback, then the result (frees the goal's slot)."""
        try:
            return self.run_goal(goal_handle)
        finally:
            self.slots.release()

    def run_goal(self, goal_handle):
        finished, text, Result = Finished(), "", self.Generate.Result
        mode, config = self.params.mode, None
        try:
            mode, config = self.config_for(goal_handle.request)
            with contextlib.closing(self.stream(goal_handle.request.prompt, mode, config, finished)) as steps:
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
            return Result(text=text, token_ids=finished.tokens, finish_reason=f"error: {exc}",
                          status=self.RequestStatus(code=status_of(exc)))
        if finished.reason == "cancelled":
            goal_handle.canceled()
        else:
            goal_handle.succeed()
        return Result(text=text, token_ids=finished.tokens, finish_reason=finished.reason,
                      status=self.RequestStatus(code=Status.CANCELLED if finished.reason == "cancelled" else Status.OK),
                      stats=self.stats_msg("", mode, [finished]))

    def answer(self, instruction: str) -> None:
        """The instruction topic: a TokenChunk stream on response, the last one done (frees its slot)."""
        try:
            self.answer_instruction(instruction)
        finally:
            self.slots.release()

    def answer_instruction(self, instruction: str) -> None:
        rid, round_, finished = uuid.uuid4().hex[:12], -1, Finished()
        try:
            mode, config = self.config_for()
            for round_, step in enumerate(self.stream(instruction, mode, config, finished)):
                done = bool(finished.reason)
                self.response_pub.publish(stamp(self, self.TokenChunk(
                    request_id=rid, round=round_, token_ids=step.tokens, text=step.text, probs=step.probs, done=done,
                    finish_reason=finished.reason)))
        except Exception as exc:  # every instruction gets its final chunk; the node goes on
            expected = isinstance(exc, request_errors())
            self.get_logger().error(f"instruction: {exc if expected else repr(exc)}")
            self.response_pub.publish(stamp(self, self.TokenChunk(
                request_id=rid, round=round_ + 1, done=True, finish_reason="error", error=str(exc) or repr(exc),
                status=self.RequestStatus(code=status_of(exc)))))

    # -- stats -------------------------------------------------------------------------------------

    def stats_msg(self, request_id: str, mode: str, requests: list[Finished]):
        """InferenceStats over ``requests`` (one: that request's; several: the aggregate, request_id '')."""
        from edge_llm_ros.core.engine.config import mean_tau

        done = [f for f in requests if f.stats is not None]
        rounds = [a for f in done for a in f.stats.accepted]
        tokens, wall = sum(len(f.tokens) for f in done), sum(f.wall_s for f in done)
        hits, misses = sum(f.stats.hits for f in done), sum(f.stats.misses for f in done)
        layers = [layer for f in done for layer in f.stats.hit_layers]
        drafted = self.params.gamma * len(rounds) if mode in ("sd", "fsd", "ee") else 0
        timed = [f.drafts.totals() for f in done if f.drafts is not None]
        weight = sum(len(f.tokens) for f in done) or 1
        return stamp(self, self.Stats(
            node_name=self.get_name(), request_id=request_id, mode=mode, tokens=tokens,
            tokens_per_s=tokens / wall if wall > 0 else 0.0,
            ttft_s=sum(f.ttft_s for f in done) / len(done) if done else 0.0,
            tau=mean_tau(rounds),
            acceptance_rate=sum(rounds) / drafted if drafted else 0.0,
            draft_time_s=sum(f.stats.critical_draft_s for f in done), verify_time_s=sum(f.stats.verify_s for f in done),
            cache_miss_rate=misses / (hits + misses) if hits + misses else 0.0,
            avg_exit_layer=sum(layers) / len(layers) if layers else 0.0, active_requests=len(self.link.inboxes),
            alt=sum(getattr(f.stats, "alt", 0.0) * len(f.tokens) for f in done) / weight,
            alr=sum(getattr(f.stats, "alr", 0.0) * len(f.tokens) for f in done) / weight,
            drafts=sum(t[0] for t in timed), draft_forwards=sum(t[1] for t in timed),
            draft_time_is_cpu=any(f.drafts.clock is time.thread_time for f in done if f.drafts is not None),
            ignored_results=sum(sum(f.stats.ignored.values()) for f in done)))

    def end_request(self, request_id: str, mode: str, config, finished: Finished) -> None:
        """Publish the request's stats; log what it ignored (stale, duplicate, invalid outcomes)."""
        if finished.stats is None:
            return
        drafts, forwards, seconds = finished.drafts.totals() if finished.drafts else (0, 0, 0.0)
        if finished.drafts:
            finished.stats.critical_draft_s = seconds  # InferenceStats.draft_time_s: D0's drafting
        self.stats_pub.publish(self.stats_msg(request_id, mode, [finished]))
        if self.stages is not None:  # the pipeline's own figures (FlowSpec §V-A), e.g. for bench --scenario pipeline
            clock = "CPU" if finished.drafts and finished.drafts.clock is time.thread_time else "wall"
            self.get_logger().info(f"request {request_id} ({mode}): {len(finished.tokens)} tokens, "
                                   f"ALT {finished.stats.alt:.4f}, ALR {finished.stats.alr:.4f}; "
                                   f"D0 drafted {drafts} times, {forwards} forwards, {seconds:.4f} s {clock}")
        if self.params.stats_period_s > 0:  # the timer drains it; without one nothing may pile up
            self.recent.append((mode, finished))
        ignored = finished.stats.ignored
        if ignored:
            self.get_logger().info(f"request {request_id}: ignored {sum(ignored.values())} VerifyResults ("
                                   + ", ".join(f"{k} {v}" for k, v in sorted(ignored.items())) + ")")

    def publish_recent_stats(self) -> None:
        """The timer: aggregate stats of the requests that ended since the last tick, per mode."""
        recent, self.recent = self.recent, []
        for mode in dict.fromkeys(m for m, _ in recent):
            self.stats_pub.publish(self.stats_msg("", mode, [f for m, f in recent if m == mode]))


def main(args: list[str] | None = None) -> int:
    return run_node(DraftNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
