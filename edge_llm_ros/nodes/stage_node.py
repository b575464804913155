"""stage_node: one stage of the target split by decoder layers (issue 14; Jupiter, FlowSpec).

One process holds one contiguous range of the target's decoder layers (the first stage also the
token embedding, the last the final norm and LM head) and one KV cache per request: core's Stage.
It subscribes `stage_<index>/in` (HiddenStates: token ids into the first stage, hidden states
after it) and publishes what its layers make on `stage_<index + 1>/in`: hidden states for the
next stage, sent as `wire_dtype`; from the last stage, the target's output for the scheduler,
which reads `stage_<count>/in`: the greedy token of each row (`output: argmax`, int64 [rows],
8 bytes a row, all greedy verification needs) or the logits (`output: logits`, float32 [rows,
vocab]). An output keeps its rows' request id, round, prefix, positions and mask.

Rows run on one worker thread, in arrival order. A PruneInfo (`prune`) is applied at once,
between two runs, to the request's cache; rows still waiting are pruned as they are dequeued
(Stage.arrive), and rows pruned away entirely are dropped. A PruneInfo with `release` frees the
request's cache.

Requests belong to their sender (nodes/ownership.py): the first rows that make a request's cache
here bind it to their publisher (the client at stage 0, the previous stage after it) and to the
prune publisher they name (`prune_gid`, which this stage forwards with the request's output); a
fork takes its source's owner. Rows and PruneInfos for it from any other publisher are dropped
unanswered (an answer would end the owner's request), counted ("foreign messages refused" in the
status) and logged, throttled. A release ends the ownership with the cache.

Every message that cannot be served is answered on `verify` by a final VerifyResult whose `error`
names this stage and why, e.g. "stage 1 (/edge_llm/stage_1): shape: expected [3, 576] (rows,
width 576), got [3, 16]": a malformed message (the field at fault), rows that do not fit the
request's cache, a new request beyond `max_requests` (busy), a stage that is not active. The
node logs it and goes on serving.

Lifecycle (nodes/managed.py): configure checks the layer range against the model before any
weights are read, then loads only this stage's tensors (core.engine.partial.load_stage_model) and starts
the worker; deactivate refuses new rows with an error starting "inactive:"; cleanup frees the
weights and caches. With `autostart` (the default) it goes to active by itself.

Parameters: StageParams below, all read-only. `layers` gives this stage's range ("11-29", with
`index` and `count`) or every stage's ("0-10,11-29", this one's being the index-th), as
launch/stages.launch.py passes it to every stage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import threading
import time

from edge_llm_ros import runtime as rt
from edge_llm_ros.core.planning.partition import range_text
from edge_llm_ros.errors import Status
from edge_llm_ros.nodes.common import MatchGate, cpu_set, nav_adapter_param, pin_process, run_node, stamp
from edge_llm_ros.nodes.diagnostics import OK, WARN, Increase, Updater, Window, percentile
from edge_llm_ros.nodes.diagnostics import Status as Diagnostic
from edge_llm_ros.nodes.managed import ManagedNode, rss_mb
from edge_llm_ros.nodes.ownership import Owner, Owners, gid_field
from edge_llm_ros.nodes.stage_params import StageParams
from edge_llm_ros.runtime.throttle import flood_note

MAX_WAITING = 1024  # messages queued for the worker; more are refused as busy


class StageNode(ManagedNode):
    def __init__(self) -> None:
        super().__init__("stage_node", StageParams)
        p = self.params
        self.stage = self.inbox = self.worker = None  # while configured
        self.held: dict[str, list] = {}  # request id -> rows that overtook their prune, in arrival order
        self.lock = threading.Lock()  # the stage's caches: one run or one prune at a time
        self.stopping = threading.Event()
        self.refused = 0
        self.owners = Owners(self.get_logger())  # request id -> the publishers that opened it here
        self.refusals, self.foreign = Increase(), Increase()  # refusals since the last status
        self.hops, self.runs = Window(), Window()  # seconds: stamp -> arrival here; one message's run
        self.who = f"stage {p.index} ({self.get_fully_qualified_name()})"
        self.HiddenStates = rt.message("edge_llm_ros/msg/HiddenStates")
        self.VerifyResult = rt.message("edge_llm_ros/msg/VerifyResult")
        self.out_pub = rt.shaped(self, self.create_publisher(self.HiddenStates, f"stage_{p.index + 1}/in", 100))
        self.out_gate = MatchGate(self, self.out_pub)  # a next stage (or client) that just (re)started gets it
        self.verify_pub = rt.shaped(self, self.create_publisher(self.VerifyResult, "verify", 100))
        self.create_subscription(self.HiddenStates, f"stage_{p.index}/in", self.on_rows, 100)
        self.create_subscription(rt.message("edge_llm_ros/msg/PruneInfo"), "prune", self.on_prune, 100)
        self.create_service(rt.service("edge_llm_ros/srv/Profile"), "~/profile", self.on_profile)
        self.diagnostics = Updater(self, hardware_id=f"{self.get_fully_qualified_name()} (stage {p.index})")
        self.diagnostics.add("stage", self.diagnose)

    def load(self) -> str:
        from transformers import AutoConfig

        from edge_llm_ros.core.drafts.loading import set_threads
        from edge_llm_ros.core.engine.models import weights_folder
        from edge_llm_ros.core.engine.partial import load_stage_model
        from edge_llm_ros.core.pipeline.stages import Stage

        p = self.params
        folder = weights_folder(p.model or None)
        layers = p.own(AutoConfig.from_pretrained(str(folder)).num_hidden_layers)  # before any weights
        first, last = p.index == 0, p.index == p.stages() - 1
        set_threads(p.threads)
        if cores := cpu_set(p.cpus):
            if not cores <= os.sched_getaffinity(0):
                raise ValueError(f"parameter 'cpus' ({p.cpus}) names cores this process may not use "
                                 f"(it may use {sorted(os.sched_getaffinity(0))})")
            pin_process(cores)
        tokenizer = None
        if p.nav_adapter:  # the adapter checks it is this target's; the last stage's grammar spells its tokens
            from edge_llm_ros.core.engine.models import load_tokenizer

            tokenizer = load_tokenizer(p.model or None)
        model = load_stage_model(folder, layers, first=first, last=last, tokenizer=tokenizer)
        self.stage = Stage(model, layers, first=first, last=last, capacity=p.capacity, tasks=self.tasks(model))
        self.inbox = queue.Queue(MAX_WAITING)
        self.stopping.clear()
        self.worker = threading.Thread(target=self.work, args=(self.inbox,), daemon=True, name="stage")
        self.worker.start()
        held = ("embedding + " if first else "") + f"layers {range_text(layers)}" + (" + head" if last else "")
        sends = p.output if last else f"hidden states as {p.wire_dtype}"
        return (f"stage {p.index} of {p.stages()}: {held}, {rss_mb():.0f} MB resident; "
                f"{self.resolve_topic_name(f'stage_{p.index}/in')} -> "
                f"{self.resolve_topic_name(f'stage_{p.index + 1}/in')} ({sends})"
                + (f"; pinned to cores {p.cpus}" if cores else "")
                + (f"; tasks: {', '.join(self.stage.tasks)}" if self.stage.tasks else ""))

    def diagnose(self, status: Diagnostic) -> None:
        """ERROR when configure failed; WARN while not active or after refusals (answered, or of
        foreign messages) in the last period; the layer range, resident memory, caches held, and the
        last minute's hop latency (a message's stamp to its arrival here) and run time."""
        p, stage = self.params, self.stage
        refused = self.refusals.since_last(self.refused)
        foreign = self.foreign.since_last(self.owners.refused)
        status.summary(OK, f"stage {p.index} of {p.stages()}" + (f": layers {range_text(stage.layers)}"
                                                                 if stage is not None else ""))
        self.lifecycle_status(status, "rows are refused")
        if refused:
            status.merge(WARN, f"{refused} message(s) refused in the last {self.diagnostics.period:g} s")
        if foreign:
            status.merge(WARN, f"{foreign} message(s) from publishers that do not own their request refused in "
                               f"the last {self.diagnostics.period:g} s")
        hops, runs = self.hops.recent(), self.runs.recent()
        for key, value in (("lifecycle state", self.lifecycle_state.label), ("stage", f"{p.index} of {p.stages()}"),
                           ("layers", range_text(stage.layers) if stage is not None else p.layers),
                           ("resident MB", rss_mb()),
                           ("requests holding a cache", len(stage.caches) if stage is not None else 0),
                           ("waiting messages", self.inbox.qsize() if self.inbox is not None else 0),
                           ("refused in all", self.refused), ("foreign messages refused", self.owners.refused),
                           ("hop latency p50 s (last 60 s)", percentile(hops, 0.5)),
                           ("run time p50 s (last 60 s)", percentile(runs, 0.5))):
            status.add(key, value)

    def tasks(self, model) -> dict:
        """The tasks served besides plain text: nav with `nav_adapter` (nav/navigator.nav_stage_task)."""
        from edge_llm_ros.nav.navigator import NAV_TASK, nav_stage_task

        p = self.params
        adapter = nav_adapter_param(p.nav_adapter, model)
        if adapter is None:
            return {}
        return {NAV_TASK: nav_stage_task(adapter, model, first=p.index == 0, last=p.index == p.stages() - 1)}

    def unload(self) -> None:
        """Stop the worker (the rows being run finish first) and drop the weights and caches."""
        self.stopping.set()
        if self.inbox is not None:
            self.inbox.put(None)
        if self.worker is not None:
            self.worker.join(timeout=10)
        self.stage = self.inbox = self.worker = None
        self.owners.clear()

    # -- callbacks: hand over, nothing else ------------------------------------------------------

    def on_rows(self, msg, info: dict) -> None:
        """Queue the rows for the worker with their publisher's gid; drop them if their request belongs
        to another publisher; answer at once if the node is not active or the queue is full."""
        inbox, sender = self.inbox, info["publisher_gid"]
        if not self.owners.sends(msg.request_id, sender, "rows"):
            return
        sent = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        if sent:
            self.hops.add((self.get_clock().now().nanoseconds - sent) / 1e9)
        if refusal := self.refusal():
            self.answer(msg.request_id, msg.round, refusal, Status.INACTIVE)
            return
        try:
            inbox.put_nowait((msg, sender))
        except queue.Full:
            self.answer(msg.request_id, msg.round, f"busy: {MAX_WAITING} messages wait for this stage; retry later",
                        Status.BUSY)

    def on_prune(self, msg, info: dict) -> None:
        """Apply a prune or a release from the publisher its request named now, between two runs
        (rows still queued are pruned as they are dequeued); a fork only from the one its source
        named. In every configured state: it only frees cache."""
        from edge_llm_ros.core.pipeline.stages import Prune, StageError

        stage, sender = self.stage, info["publisher_gid"]
        what = "release" if msg.release else "fork" if msg.fork_from else "prune"
        if not self.owners.prunes(msg.request_id, sender, what):
            return
        if what == "fork" and not self.owners.prunes(str(msg.fork_from), sender, what):
            return
        if stage is None:
            return  # nothing is cached
        keep = tuple(int(k) for k in msg.keep)
        if list(keep) != sorted(set(keep)):
            self.answer(msg.request_id, msg.round, f"keep: round rows must be ascending, without repeats, got "
                                                   f"{list(keep)[:16]}")
            return
        with self.lock:
            try:
                if msg.release:
                    stage.release(msg.request_id)
                    self.held.pop(msg.request_id, None)
                    self.owners.end(msg.request_id)
                else:
                    stage.prune(Prune(msg.request_id, int(msg.round), int(msg.prefix_len), keep, int(msg.committed),
                                      str(msg.fork_from)))
                    source = self.owners.of(str(msg.fork_from)) if msg.fork_from else None
                    if source is not None:  # the fork is the source's robot's request too
                        self.owners.bind(msg.request_id, source)
            except StageError as exc:
                self.answer(msg.request_id, msg.round, f"prune: {exc}")
            if msg.request_id in self.held:  # rows that waited for this prune may run now
                with contextlib.suppress(queue.Full):
                    self.inbox.put_nowait(msg.request_id)

    def on_profile(self, request, response):
        """Measure this stage now (its layers, and the head at the last): latency_ms per row count in
        `token_counts` (default 1, 2, 4, 8, 16, 32, 64) over `prefix_len` cached rows (default 240).
        Runs between two requests' rows (it holds the stage's lock), so it delays them."""
        stage = self.stage
        counts = [int(n) for n in request.token_counts] or [1, 2, 4, 8, 16, 32, 64]
        if stage is None:
            response.success, response.message = False, self.refusal() or "not configured"
            return response
        if any(n < 1 or n > 4096 for n in counts):
            response.success, response.message = False, f"token_counts must be 1..4096, got {counts}"
            return response
        cached = int(request.prefix_len) or 240
        with self.lock:
            seconds = stage.measure(counts, cached, repeats=1 if request.quick else 3)
        import torch

        response.success = True
        response.device = f"{self.who}: {stage!r}, {torch.get_num_threads()} thread(s)"
        response.message = f"measured {len(counts)} row counts over {cached} cached rows"
        response.token_counts = counts
        response.latency_ms = [t * 1e3 for t in seconds]
        return response

    # -- the worker thread -----------------------------------------------------------------------

    def work(self, inbox) -> None:
        """Rows (with their publisher's gid) in arrival order; rows that overtook their prune (they
        travel apart) wait for it, and so do the request's later rows. A request id in the inbox: a
        prune for it came."""
        while (item := inbox.get()) is not None:
            if self.stopping.is_set():
                continue
            rid = item if isinstance(item, str) else item[0].request_id
            with self.lock:
                held = self.held.get(rid)
                if held is None and isinstance(item, str):
                    continue
                if held is None:
                    held = self.held[rid] = []
                if not isinstance(item, str):
                    held.append(item)
                while held and self.serve(held[0]):
                    held.pop(0)
                if not held:
                    self.held.pop(rid, None)

    def serve(self, item: tuple) -> bool:
        """Run one HiddenStates message's rows (``item``: it and its publisher's gid) and publish what
        comes out, or answer why not (under the lock); rows that made the request's cache bind it to
        their publisher, and rows queued before that from another publisher are dropped. False: the
        prune sent before them is not here yet; they wait."""
        from edge_llm_ros.core.pipeline.stages import StageError

        msg, sender = item
        if not self.owners.sends(msg.request_id, sender, "rows"):
            return True
        try:
            rows = self.rows_of(msg)
            if not self.stage.ready(rows):
                return False
            rows = self.stage.arrive(rows)
            if rows is None:
                self.get_logger().debug(f"request {msg.request_id[:64]!r} round {msg.round}: every row was "
                                        "pruned on the way here; dropped")
                return True
            if busy := self.busy(rows.request_id):
                self.answer(msg.request_id, msg.round, busy, Status.BUSY)
                return True
            started = time.monotonic()
            out = self.stage.run(rows)
            self.runs.add(time.monotonic() - started)
            self.owners.bind(msg.request_id, Owner(sender, bytes(msg.prune_gid)))  # kept if bound already
        except StageError as exc:  # a WireError's message starts with the field at fault
            self.answer(msg.request_id, msg.round, str(exc))
            return True
        except Exception as exc:  # the request's cache may be half-written: free it, serve the others
            if not self.stopping.is_set():
                self.stage.release(msg.request_id)
                self.owners.end(msg.request_id)
                self.answer(msg.request_id, msg.round, f"stage failed: {exc!r}; the request's cache is freed",
                        Status.FAILED)
            return True
        self.publish(rows, out, self.owners.of(msg.request_id).pruner)
        return True

    def rows_of(self, msg):
        """The message's rows (token ids into the first stage); WireError naming the field at fault."""
        from edge_llm_ros.nodes.wire import StageMessage, WireError

        message = StageMessage.from_msg(msg)
        if message.stage != self.params.index:
            raise WireError("stage", f"expected {self.params.index} (this stage), got {message.stage}")
        return message.to_rows(None if self.stage.first else self.stage.hidden_size)

    def busy(self, request_id: str) -> str:
        """'' if the request has a cache here or one more fits; else why it is refused."""
        held = self.stage.caches
        if request_id in held or len(held) < self.params.max_requests:
            return ""
        return (f"busy: {len(held)} requests hold a cache here (max_requests {self.params.max_requests}); "
                "release one or retry later")

    def publish(self, rows, out, pruner: bytes) -> None:
        """The rows' output on the next stage's topic: hidden states, or the last stage's argmax/logits,
        with the request's prune publisher (``pruner``) for the next stage to bind it to."""
        import torch

        from edge_llm_ros.core.pipeline.schedulers import greedy_choices
        from edge_llm_ros.nodes.wire import StageMessage

        p = self.params
        probs: list[float] = []
        if self.stage.last and p.output == "argmax":  # [T] int64, and the target's probability of each
            choices, probs = greedy_choices(out)
            out = torch.tensor(choices, dtype=torch.long)
        dtype = p.wire_dtype if not self.stage.last else "float32"
        message = StageMessage.from_rows(dataclasses.replace(rows, data=out, image=None), p.index + 1, dtype, probs)
        self.out_gate.wait()
        self.out_pub.publish(stamp(self, self.HiddenStates(**message.fields(), prune_gid=gid_field(pruner))))

    def answer(self, request_id: str, round: int, reason: str, status: int = Status.INVALID) -> None:
        """Refuse a message: an error line here and a final VerifyResult naming this stage, why, and the
        refusal's code (INVALID: rows or a prune this stage cannot apply; BUSY; INACTIVE; FAILED)."""
        error = f"{self.who}: {reason}"
        self.refused += 1
        note = flood_note(self.refused)
        if note is not None:
            self.get_logger().error(f"request {request_id[:64]!r} round {round}: {error}{note}")
        self.verify_pub.publish(stamp(self, self.VerifyResult(request_id=request_id, round=round, final=True,
                                                              next_token=-1, error=error, status=int(status))))


def main(args: list[str] | None = None) -> int:
    return run_node(StageNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
