"""The front door: what every Generate-serving node does, over a backend chosen by parameter.

One node class serves the `generate` action (text streamed as feedback, cancel, a result with text,
token ids, finish_reason, a RequestStatus code and InferenceStats) and `instruction`
(std_msgs/String) -> `response` (a TokenChunk stream whose last chunk has `done`, `finish_reason` and
`status`), publishes InferenceStats on `stats` (per request, and an aggregate every
`stats_period_s`), and admits at most `max_requests` running plus `max_pending` waiting requests:
beyond that a goal is rejected when it is sent (busy) and an instruction is answered at once with a
BUSY chunk. A goal whose client left (nothing subscribes to the action's feedback any more, two
checks `client_check_s` apart) is cancelled, freeing its slot.

The `backend` parameter picks what makes the tokens (nodes/backends/): `local` (the engine on this
device), `edge_cloud` (the robot half of EE, a verifier_node verifying), `pipeline` (D0 of a stage
pipeline) or `remote` (an OpenAI-compatible server). Each backend declares its own parameters; the
modes each serves are edge_llm_ros/modes.py's. serve_node and draft_node are this node under their
own names, with `local` and `edge_cloud` as their default backends.

Lifecycle (nodes/managed.py): configure loads the backend, activate serves, deactivate refuses new
requests with INACTIVE (running ones finish), cleanup frees the backend. With `autostart` (the
default) it goes to active by itself.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import time
import uuid

from edge_llm_ros import runtime as rt
from edge_llm_ros.errors import Inactive, Invalid, Status, status_of
from edge_llm_ros.modes import BACKENDS, check_mode
from edge_llm_ros.nodes import diagnostics as diag
from edge_llm_ros.nodes.backends import Diagnosed, End, Request, RequestStats
from edge_llm_ros.nodes.common import goal_overrides, run_node, stamp
from edge_llm_ros.nodes.managed import ManagedNode, ManagedParams
from edge_llm_ros.nodes.parameters import declare, on_change, param
from edge_llm_ros.runtime.throttle import flood_note

CANCEL_POLL_S = 0.1  # a running goal notices a cancel request within this
BACKEND_CLASSES = {  # imported when chosen: local loads torch, remote only urllib
    "local": "edge_llm_ros.nodes.backends.local:LocalBackend",
    "edge_cloud": "edge_llm_ros.nodes.backends.edge_cloud:EdgeCloudBackend",
    "pipeline": "edge_llm_ros.nodes.backends.pipeline:PipelineBackend",
    "remote": "edge_llm_ros.nodes.backends.remote:RemoteBackend",
}


@dataclasses.dataclass(frozen=True)
class BackendParams(ManagedParams):
    backend: str = param("local", "what makes the tokens: local (the engine here), edge_cloud (a verifier_node "
                                  "verifies this node's drafts), pipeline (stage_nodes run the target, this node is "
                                  "D0) or remote (an OpenAI-compatible server)", choices=BACKENDS)


@dataclasses.dataclass(frozen=True)
class FrontDoorParams:
    mode: str = param("", "decoding mode when a request gives none ('' = the backend's own; edge_llm_ros/modes.py "
                          "lists which modes each backend serves)")
    max_requests: int = param(16, "requests served at once", low=1, high=1024)
    max_pending: int = param(16, "requests waiting beyond max_requests; more are refused as busy", low=0, high=65536)
    max_new_tokens: int = param(128, "answer length when a goal gives 0, and for instructions", low=1,
                                high=1_000_000, dynamic=True)
    chat_template: bool = param(True, "apply the model's chat template to prompts")
    stats_period_s: float = param(1.0, "period of the aggregate InferenceStats on stats (0 = per request only)",
                                  low=0.0)
    client_check_s: float = param(1.0, "seconds between checks that a goal's client is still there", low=0.001,
                                  dynamic=True)


def backend_class(name: str) -> type:
    module, _, cls = BACKEND_CLASSES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


class FrontDoor(ManagedNode):
    def __init__(self, name: str = "serve_node", backend: str = "local") -> None:
        super().__init__(name, BackendParams, defaults={"backend": backend})
        cls = backend_class(self.params.backend)
        self.door = declare(self, FrontDoorParams, cls.door_defaults)
        if self.door.mode:
            check_mode(self.params.backend, self.door.mode, "parameter 'mode'")
        on_change(self, FrontDoorParams, self.on_params)
        self.slots = threading.BoundedSemaphore(self.door.max_requests + self.door.max_pending)
        self.counts = threading.Lock()
        self.running = 0
        self.refused: dict[str, int] = {}  # busy refusals by kind: a flood of one hides no other
        self.recent: list[RequestStats] = []  # requests ended since the last stats tick
        self.TokenChunk = rt.message("edge_llm_ros/msg/TokenChunk")
        self.Stats = rt.message("edge_llm_ros/msg/InferenceStats")
        self.RequestStatus = rt.message("edge_llm_ros/msg/RequestStatus")
        self.Generate = rt.action("edge_llm_ros/action/Generate")
        self.response_pub = self.create_publisher(self.TokenChunk, "response", 100)
        self.stats_pub = self.create_publisher(self.Stats, "stats", 10)
        self.backend = cls(self)  # declares its parameters, makes its endpoints
        self.create_subscription(rt.message("std_msgs/msg/String"), "instruction", self.on_instruction, 10)
        self.action_server = rt.ActionServer(self, self.Generate, "generate", self.execute,
                                             max_goals=self.door.max_requests + self.door.max_pending,
                                             goal_callback=self.admit_goal,
                                             cancel_callback=lambda handle: rt.CancelResponse.ACCEPT)
        from edge_llm_ros.runtime import graph

        self.feedback_topic = graph.action_names(self.resolve_topic_name("generate"))["feedback"]
        self.listeners_lock = threading.Lock()
        self.listeners, self.listeners_at = 0, -float("inf")
        if self.door.stats_period_s > 0:
            self.create_timer(self.door.stats_period_s, self.publish_recent_stats)
        self.ended = diag.Window()  # RequestStats of the requests ended in the last minute
        self.busy = diag.Increase()  # busy refusals since the last status
        self.diagnostics = diag.Updater(self, hardware_id=f"{self.get_fully_qualified_name()} ({self.params.backend})")
        self.diagnostics.add("requests", self.diagnose)

    def load(self) -> str:
        served = self.backend.load()
        return (f"{served}; {self.resolve_topic_name('instruction')} -> {self.resolve_topic_name('response')}, "
                f"action {self.resolve_topic_name('generate')}, {self.door.max_requests} running + "
                f"{self.door.max_pending} waiting at most")

    def unload(self) -> None:
        self.backend.unload()

    def on_params(self, door: FrontDoorParams) -> None:
        """`ros2 param set` changed a dynamic parameter: the next request uses it."""
        self.door = door
        self.get_logger().info(f"parameters: max_new_tokens {door.max_new_tokens}, "
                               f"client_check_s {door.client_check_s:g}")

    # -- admission ---------------------------------------------------------------------------------

    def admit_goal(self, goal) -> int:
        """Take a slot for the goal, or reject it at once (busy). Its fields are checked when it runs."""
        if not self.slots.acquire(blocking=False):
            self.note_busy("generate: goal rejected")
            return rt.GoalResponse.REJECT
        return rt.GoalResponse.ACCEPT

    def note_busy(self, what: str) -> str:
        """Log a busy refusal (a flood of one kind, ``what``, thinned as runtime.throttle says); the
        reason."""
        reason = (f"busy: {self.door.max_requests} running and {self.door.max_pending} waiting "
                  "(max_requests, max_pending)")
        with self.counts:
            self.refused[what] = self.refused.get(what, 0) + 1
            note = flood_note(self.refused[what])
        if note is not None:
            self.get_logger().warning(f"{what}, {reason}{note}")
        return reason

    def request_of(self, prompt: str, goal=None) -> Request:
        """The checked Request of a goal (None: an instruction): Inactive, or Invalid naming the field."""
        if refusal := self.refusal():
            raise Inactive(refusal)
        if not prompt.strip():
            raise Invalid("prompt is empty")
        mode = (goal.mode if goal is not None else "") or self.door.mode or self.backend.default_mode
        check_mode(self.params.backend, mode, "mode")
        if goal is None:
            return Request(uuid.uuid4().hex[:12], prompt, mode, {"max_new_tokens": self.door.max_new_tokens})
        if len(goal.images) or len(goal.choices):
            raise Invalid(f"images and choices are not supported by the {self.params.backend} backend (text only)")
        try:
            overrides = goal_overrides(goal, self.door.max_new_tokens)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        return Request(uuid.uuid4().hex[:12], prompt, mode, overrides)

    # -- the generate action -----------------------------------------------------------------------

    def execute(self, goal_handle):
        """The goal's slot is held until its result is sent."""
        try:
            return self.run_goal(goal_handle)
        finally:
            self.slots.release()

    def run_goal(self, goal_handle):
        """Feedback goes out from the backend's thread as chunks come; this thread watches for a cancel
        and for the client, every CANCEL_POLL_S and client_check_s."""
        Feedback, text, ended, over = self.Generate.Feedback, [], [], threading.Event()

        def listener(event) -> None:
            if isinstance(event, End):
                ended.append(event)
                over.set()
            elif event.token_ids or event.text:
                text.append(event.text)
                goal_handle.publish_feedback(Feedback(token_ids=event.token_ids, text_delta=event.text,
                                                      probs=event.probs))

        try:
            request = self.request_of(goal_handle.request.prompt, goal_handle.request)
            handle = self.start(request, listener)
        except Exception as exc:  # noqa: BLE001 - a refused request ends its goal, the node goes on
            self.get_logger().error(f"generate: {exc}")
            goal_handle.abort()
            return self.Generate.Result(finish_reason=f"error: {exc}",
                                        status=self.RequestStatus(code=status_of(exc)))
        if not self.watch(goal_handle, handle, over, request.request_id):  # the request ends with the node
            return self.Generate.Result(finish_reason="error: the node is shutting down",
                                        status=self.RequestStatus(code=Status.FAILED))
        end = ended[0]
        if end.finish_reason == "cancelled":
            goal_handle.canceled()
        elif end.status != Status.OK:
            goal_handle.abort()
            self.get_logger().error(f"generate: {end.error}")
        else:
            goal_handle.succeed()
        reason = f"error: {end.error}" if end.finish_reason == "error" else end.finish_reason
        return self.Generate.Result(text="".join(text), token_ids=end.token_ids, finish_reason=reason,
                                    status=self.RequestStatus(code=end.status),
                                    stats=self.stats_message([end.stats], request.request_id))

    def watch(self, goal_handle, handle, over: threading.Event, request_id: str) -> bool:
        """Until the request's End came (``over``): pass a cancel on, and cancel it once its client is gone.
        False when the node shuts down first: under rclpy the context, and so its publishers, are gone at
        the signal, before the node's cleanup ends the request."""
        absent, check_at = 0, time.monotonic() + self.door.client_check_s
        while not over.wait(CANCEL_POLL_S):
            if not rt.ok():
                handle.cancel()
                return False
            if goal_handle.is_cancel_requested:
                handle.cancel()
            if time.monotonic() >= check_at:
                check_at = time.monotonic() + self.door.client_check_s
                absent = absent + 1 if self.feedback_listeners() == 0 else 0
                if absent == 2:
                    self.get_logger().warning(f"generate: request {request_id}: client gone, cancelled")
                    handle.cancel()
        return True

    def feedback_listeners(self) -> int:
        """Subscribers to the action's feedback. One graph query answers every goal that checks within
        half a client_check_s (16 running goals: one query a period, not 16)."""
        with self.listeners_lock:
            now = time.monotonic()
            if now - self.listeners_at >= self.door.client_check_s / 2:
                self.listeners, self.listeners_at = self.count_subscribers(self.feedback_topic), now
            return self.listeners

    # -- instruction -> response -------------------------------------------------------------------

    def on_instruction(self, msg) -> None:
        """A TokenChunk per step on response, then a last one with done, finish_reason and status."""
        if not self.slots.acquire(blocking=False):
            reason = self.note_busy("instruction refused")
            self.publish_end(uuid.uuid4().hex[:12], 0, End("error", Status.BUSY, reason))
            return
        rounds = [0]
        request_id = ""

        def listener(event) -> None:
            if isinstance(event, End):
                try:
                    self.publish_end(request_id, rounds[0], event)
                finally:
                    self.slots.release()
                return
            self.publish_chunk(request_id, rounds[0], token_ids=event.token_ids, text=event.text, probs=event.probs)
            rounds[0] += 1

        try:
            request = self.request_of(msg.data)
            request_id = request.request_id
            self.start(request, listener)
        except Exception as exc:  # noqa: BLE001 - every instruction gets its last chunk; the node goes on
            self.get_logger().error(f"instruction: {exc}")
            self.publish_end(request_id or uuid.uuid4().hex[:12], 0, End.of(exc, [], RequestStats()))
            self.slots.release()

    def publish_end(self, request_id: str, round_: int, end: End) -> None:
        self.publish_chunk(request_id, round_, done=True, finish_reason=end.finish_reason, error=end.error,
                           status=self.RequestStatus(code=end.status))

    def publish_chunk(self, request_id: str, round_: int, **fields) -> None:
        self.response_pub.publish(stamp(self, self.TokenChunk(request_id=request_id, round=round_, **fields)))

    # -- every request -----------------------------------------------------------------------------

    def start(self, request: Request, listener):
        """Start ``request`` on the backend; its end is counted, its stats published and kept for the
        aggregate before ``listener`` hears it."""
        def counted(event) -> None:
            if isinstance(event, End):
                with self.counts:
                    self.running -= 1
                self.end_request(request.request_id, event)
            listener(event)

        with self.counts:
            self.running += 1
        try:
            return self.backend.start(request, counted)
        except BaseException:
            with self.counts:
                self.running -= 1
            raise

    def end_request(self, request_id: str, end: End) -> None:
        if not rt.ok():  # shutting down: nothing can be published any more
            return
        self.ended.add(end.stats)
        self.stats_pub.publish(self.stats_message([end.stats], request_id))
        if self.door.stats_period_s > 0:  # the timer drains it; without one nothing may pile up
            with self.counts:
                self.recent.append(end.stats)

    def publish_recent_stats(self) -> None:
        """The timer: aggregate stats of the requests that ended since the last tick, one per mode."""
        with self.counts:
            recent, self.recent = self.recent, []
        for mode in dict.fromkeys(s.mode for s in recent):
            self.stats_pub.publish(self.stats_message([s for s in recent if s.mode == mode]))

    def diagnose(self, status: diag.Status) -> None:
        """The front door's status (nodes/diagnostics.py): ERROR when configure failed or the backend
        says so (edge_cloud: no verifier), WARN while not active or after busy refusals in the
        last period; the request counts and the last minute's speed, TTFT and acceptance."""
        from edge_llm_ros.core.engine.config import mean_tau

        state = self.lifecycle_state.label
        with self.counts:
            running, busy = self.running, sum(self.refused.values())
        new_busy = self.busy.since_last(busy)
        status.summary(diag.OK, f"active: {self.summary.split(';')[0]}" if self.active else state)
        self.lifecycle_status(status, "requests are refused")
        if new_busy:
            status.merge(diag.WARN, f"{new_busy} busy refusal(s) in the last {self.diagnostics.period:g} s")
        ended = self.ended.recent()
        tokens, wall = sum(s.tokens for s in ended), sum(s.wall_s for s in ended)
        rounds = [a for s in ended for a in s.accepted]
        drafted = sum(s.drafted for s in ended)
        ttfts = [s.ttft_s for s in ended if s.tokens]
        for key, value in (("lifecycle state", state), ("backend", self.params.backend),
                           ("mode", self.door.mode or self.backend.default_mode),
                           ("running", min(running, self.door.max_requests)),
                           ("waiting", max(0, running - self.door.max_requests)),
                           ("busy refusals in the last period", new_busy), ("busy refusals in all", busy),
                           ("requests ended in the last 60 s", len(ended)),
                           ("tokens/s per request (last 60 s)", tokens / wall if wall > 0 else 0.0),
                           ("TTFT p50 s", diag.percentile(ttfts, 0.5)), ("TTFT p95 s", diag.percentile(ttfts, 0.95))):
            status.add(key, value)
        if rounds:  # a drafting mode ran
            status.add("tau (last 60 s)", mean_tau(rounds))
            status.add("acceptance (last 60 s)", sum(rounds) / drafted if drafted else 0.0)
        if isinstance(self.backend, Diagnosed) and self.loaded:
            self.backend.diagnose(status, ended)

    def stats_message(self, stats: list[RequestStats], request_id: str = ""):
        """InferenceStats of one request or, several, of their aggregate (request_id '')."""
        from edge_llm_ros.core.engine.config import mean_tau

        rounds = [a for s in stats for a in s.accepted]
        drafted = sum(s.drafted for s in stats)
        hits, misses = sum(s.hits for s in stats), sum(s.misses for s in stats)
        layers = [layer for s in stats for layer in s.hit_layers]
        tokens, wall = sum(s.tokens for s in stats), sum(s.wall_s for s in stats)
        weight = tokens or 1
        first = stats[0] if stats else RequestStats()
        return stamp(self, self.Stats(
            node_name=self.get_name(), request_id=request_id, mode=first.mode, backend=first.backend, tokens=tokens,
            tokens_per_s=tokens / wall if wall > 0 else 0.0,
            ttft_s=sum(s.ttft_s for s in stats) / len(stats) if stats else 0.0,
            tau=mean_tau(rounds), acceptance_rate=sum(rounds) / drafted if drafted else 0.0,
            draft_time_s=sum(s.draft_time_s for s in stats), verify_time_s=sum(s.verify_time_s for s in stats),
            cache_miss_rate=misses / (hits + misses) if hits + misses else 0.0,
            avg_exit_layer=sum(layers) / len(layers) if layers else 0.0, active_requests=self.running,
            alt=sum(s.alt * s.tokens for s in stats) / weight, alr=sum(s.alr * s.tokens for s in stats) / weight,
            drafts=sum(s.drafts for s in stats), draft_forwards=sum(s.draft_forwards for s in stats),
            draft_time_is_cpu=any(s.draft_time_is_cpu for s in stats),
            ignored_results=sum(s.ignored_results for s in stats)))


def main_for(name: str, backend: str, args: list[str] | None = None) -> int:
    """The front door as the executable ``name`` (serve_node, draft_node), ``backend`` its default."""
    return run_node(lambda: FrontDoor(name, backend), args)
