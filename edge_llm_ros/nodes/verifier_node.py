"""verifier_node: the server half of edge-cloud decoding with early exits (EE Algorithm 2).

Subscribes `draft` (DraftTree) and `prune` (PruneInfo, `release` ends a request); verifies each
draft with core's EarlyExitVerifier on one worker thread (the target is shared, so drafts are
verified one at a time) and puts every outcome on an OutcomeSendQueue, which a sender thread
drains onto `verify` (VerifyResult): early outcomes as each exit is reached (most confident first
while the link is busy), the final one last. A draft that cannot be verified is answered by a
final VerifyResult whose `error` names the DraftTree field at fault; the request is not touched
and every other request goes on.

Fleet safety: drafts of requests being served go first (core's DraftInbox); new requests and
unknown ids wait in a small lane of `max_pending`, and beyond it are refused at once as busy.
At most `max_requests` requests are served; a live one is never evicted, a newcomer beyond that
is refused with an error starting "busy:". A request that verified no round for `idle_timeout_s`
(its robot vanished without a release) is ended, so refused, finished and abandoned requests
leave no state behind.

Requests belong to their sender (nodes/ownership.py): round 0 binds a request to the publisher of
its DraftTree and to the prune publisher it names (`prune_gid`). Drafts and PruneInfos for a live
request from any other publisher are dropped unanswered (an answer would end the owner's request),
counted ("foreign messages refused" in the status) and logged, throttled.

A DraftTree may ask for final outcomes only (`early_exits` false: plain edge-cloud SD), for cloud
autoregressive decoding (`cloud_tokens`: each generated token is one round, queued behind other
requests' drafts so a long answer never holds them up), or be speculative (sent ahead by the
robot; verified if the previous round committed its `assumed_ids`, dropped silently otherwise).

Navigation (`nav_adapter` set): the verifier also serves task "nav", a navigator_node's decisions
over edge-cloud: the target with the navigation adapter's LoRA merged, conditioned per request on
the image features its round 0 carries, and constrained to the action grammar (nav).
`nav_vlm` (a local Qwen2-VL / Qwen2.5-VL checkpoint) makes that checkpoint the target instead,
conditioned on the resized frame round 0 carries (nav/qwen_vl.py; the robot's navigator
holds its draft, `vlm_draft`); its early exits are `exits` if given, else none.

`~/profile` (srv/Profile) measures the target here, now: milliseconds per row count over a cached
prefix, on the verify thread between two drafts (the bench's simulator takes the server's speed
from it, as the pipeline's from stage_node's).

Lifecycle (nodes/managed.py): configure loads the target and its exits and starts the verify
thread, activate serves, deactivate answers every new draft with a VerifyResult whose error starts
"inactive:" (the robot's request ends with it), cleanup frees the model. With `autostart` (the
default) it goes to active by itself.

Parameters: VerifierParams below, all read-only (a change needs a restart).
"""

from __future__ import annotations

import dataclasses
import threading

from edge_llm_ros import runtime as rt
from edge_llm_ros.errors import Status
from edge_llm_ros.nodes import diagnostics as diag
from edge_llm_ros.nodes.common import MatchGate, nav_adapter_param, run_node, stamp
from edge_llm_ros.nodes.managed import ManagedNode, QwenFrameParams
from edge_llm_ros.nodes.ownership import Owner, Owners
from edge_llm_ros.nodes.parameters import param
from edge_llm_ros.nodes.wire import from_message, to_message
from edge_llm_ros.runtime.throttle import flood_note

PROFILE_TIMEOUT_S = 120.0  # a profile waits behind the drafts already queued


@dataclasses.dataclass(frozen=True)
class VerifierParams(QwenFrameParams):
    model: str = param("", "the target: a .gguf file or an HF folder ('' = SmolLM2's GGUF)")
    exits: str = param("", "the trained exits ('' = the shipped ones for the target)")
    exit_layers: str = param("", "comma-separated exit layers to use, e.g. 16,24 ('' = every exit in exits)")
    min_confidence: float = param(0.0, "EE Eq. 4 threshold for sending an early outcome", low=0.0, high=1.0)
    max_requests: int = param(8, "requests verified at once; more drafts are refused as busy", low=1, high=1024)
    max_pending: int = param(64, "drafts waiting for the verifier", low=1, high=65536)
    idle_timeout_s: float = param(30.0, "seconds after which an idle request's cache is freed", low=0.001)
    threads: int = param(0, "torch intra-op threads (0 = every core it may run on)", low=0, high=1024)
    nav_adapter: str = param("", "also serve navigation decisions (task nav) with this adapter: 'shipped' (SmolLM2's, "
                                 "edge-llm-ros train nav) or a folder; '' = text only")
    nav_vlm: str = param("", "serve navigation decisions (task nav) with this local Qwen2-VL / Qwen2.5-VL checkpoint "
                             "as the target instead (needs the vlm extra); '' = the model above")

    def __post_init__(self) -> None:
        self.layers()
        if self.nav_vlm and self.nav_adapter:
            raise ValueError("parameter 'nav_adapter': nav_vlm serves task nav with a Qwen VLM; give one of the two")

    def layers(self) -> list[int] | None:
        try:
            return [int(v) for v in self.exit_layers.split(",") if v.strip()] or None
        except ValueError:
            raise ValueError(f"parameter 'exit_layers' takes comma-separated layer numbers, "
                             f"got {self.exit_layers!r}") from None


class VerifierNode(ManagedNode):
    def __init__(self) -> None:
        from edge_llm_ros.core.edge_cloud import OutcomeSendQueue

        super().__init__("verifier_node", VerifierParams)
        self.verifier = self.inbox = self.verify_worker = None  # while configured
        self.dropped_speculative = self.refused_busy = self.rejected = 0
        self.VerifyResult = rt.message("edge_llm_ros/msg/VerifyResult")
        self.verify_pub = rt.shaped(self, self.create_publisher(self.VerifyResult, "verify", 100))
        self.verify_gate = MatchGate(self, self.verify_pub)  # a robot that just started gets its outcomes
        self.create_subscription(rt.message("edge_llm_ros/msg/DraftTree"), "draft", self.on_draft, 100)
        self.create_subscription(rt.message("edge_llm_ros/msg/PruneInfo"), "prune", self.on_prune, 100)
        self.create_service(rt.service("edge_llm_ros/srv/Profile"), "~/profile", self.on_profile)
        self.outbox = OutcomeSendQueue()  # in every state: a draft to an inactive verifier is answered
        self.stopping = threading.Event()
        idle_timeout_s = self.params.idle_timeout_s
        self.create_timer(max(1.0, idle_timeout_s / 4), lambda: self.put(("expire", None), live=True))
        self.send_worker = threading.Thread(target=self.send_loop, daemon=True, name="send")
        self.send_worker.start()
        self.owners = Owners(self.get_logger())  # live request id -> the publishers that opened it
        self.busy, self.foreign = diag.Increase(), diag.Increase()  # refusals since the last status
        self.diagnostics = diag.Updater(self, hardware_id=f"{self.get_fully_qualified_name()} (verifier)")
        self.diagnostics.add("verifier", self.diagnose)

    def diagnose(self, status: diag.Status) -> None:
        """ERROR when configure failed; WARN while not active or after busy or foreign refusals in the
        last period; the robots' requests served and queued, and the robots listening."""
        verifier, inbox = self.verifier, self.inbox
        busy = self.busy.since_last(self.refused_busy)
        foreign = self.foreign.since_last(self.owners.refused)
        served = verifier.served() if verifier is not None else 0
        status.summary(diag.OK, f"verifying {served} request(s)" if self.active else self.lifecycle_state.label)
        self.lifecycle_status(status, "drafts are refused")
        if busy:
            status.merge(diag.WARN, f"{busy} busy refusal(s) in the last {self.diagnostics.period:g} s")
        if foreign:
            status.merge(diag.WARN, f"{foreign} message(s) from publishers that do not own their request refused "
                                    f"in the last {self.diagnostics.period:g} s")
        for key, value in (("lifecycle state", self.lifecycle_state.label), ("requests served", served),
                           ("queued", len(inbox) if inbox is not None else 0),
                           ("robots listening on verify", self.count_subscribers("verify")),
                           ("busy refusals in the last period", busy), ("busy refusals in all", self.refused_busy),
                           ("refused while not active", self.rejected),
                           ("speculative drafts dropped", self.dropped_speculative),
                           ("foreign messages refused", self.owners.refused)):
            status.add(key, value)

    def load(self) -> str:
        import torch

        from edge_llm_ros.core.drafts.exits import load_exits
        from edge_llm_ros.core.edge_cloud import DraftInbox, EarlyExitVerifier
        from edge_llm_ros.core.engine.decoding import eos_ids
        from edge_llm_ros.core.engine.models import load_model

        p = self.params
        if p.threads:
            torch.set_num_threads(p.threads)
        if p.nav_vlm:  # a Qwen VLM is the target, serving task nav; its exits only if trained for it
            from edge_llm_ros.nav.navigator import NAV_TASK, nav_task
            from edge_llm_ros.nav.qwen_vl import QwenVL

            vlm, target, _ = QwenVL.load(p.nav_vlm, size=p.qwen_size)
            exits = load_exits(target, p.exits) if p.exits else None
            tasks = {NAV_TASK: nav_task(vlm, target)}
        else:
            target = load_model(p.model or None)
            exits = load_exits(target, p.exits or None)
            tasks = self.tasks(target)
        self.verifier = EarlyExitVerifier(target, exits, layers=p.layers() if exits else None,
                                          min_confidence=p.min_confidence,
                                          max_requests=p.max_requests, eos_ids=eos_ids(target), tasks=tasks)
        if tasks:
            self.get_logger().info(f"warmed up the tasks' models in {self.verifier.warm_up():.2f} s")
        self.inbox = DraftInbox(max_new=p.max_pending, max_live=max(64, 8 * p.max_requests))
        self.stopping.clear()
        self.verify_worker = threading.Thread(target=self.verify_loop, args=(self.inbox,), daemon=True,
                                              name="verify")
        self.verify_worker.start()
        draft, verify = self.resolve_topic_name("draft"), self.resolve_topic_name("verify")
        return (f"verifying {draft} -> {verify} with exits at layers {list(self.verifier.exit_layers)} "
                f"of {len(target.layer_ids)}" + (f"; tasks: {', '.join(tasks)}" if tasks else ""))

    def tasks(self, target) -> dict:
        """The tasks served besides plain text: nav with `nav_adapter` (checked against the target)."""
        from edge_llm_ros.nav.navigator import NAV_TASK, nav_exits, nav_task

        adapter = nav_adapter_param(self.params.nav_adapter, target)
        return {} if adapter is None else {NAV_TASK: nav_task(adapter, target, exits=nav_exits(adapter, target))}

    def unload(self) -> None:
        """Stop the verify thread (the draft being verified finishes first) and drop the model."""
        self.stopping.set()
        if self.inbox is not None:
            self.inbox.close()
        if self.verify_worker is not None:
            self.verify_worker.join(timeout=10)
        self.verifier = self.inbox = self.verify_worker = None
        self.owners.clear()

    def put(self, work, live: bool) -> bool:
        """Queue work for the verify thread; False if its lane is full (or nothing is loaded)."""
        inbox = self.inbox
        return inbox is not None and inbox.put(work, live=live)

    def serving(self, request_id: str) -> bool:
        verifier = self.verifier
        return verifier is not None and verifier.active(request_id)

    # -- callbacks: hand over, nothing else ------------------------------------------------------

    def on_draft(self, msg, info: dict) -> None:
        """Queue a message (checked by the worker) with its publisher's gid; drop it if its request
        belongs to another publisher; refuse it at once if the node is not active, or as busy if its
        lane is full."""
        from edge_llm_ros.core.edge_cloud import VerifyOutcome

        sender = info["publisher_gid"]
        if not self.owners.sends(msg.request_id, sender, "draft"):
            return
        if refusal := self.refusal():
            self.rejected += 1
            self.log_rejection(f"draft {msg.request_id[:64]!r} refused: {refusal}", self.rejected)
            self.outbox.put(VerifyOutcome.rejection(msg.request_id, msg.round, refusal, Status.INACTIVE))
            return
        live = self.serving(msg.request_id)
        if not self.put(("draft", (msg, sender)), live=live):
            self.refuse_busy(msg, "new requests" if not live else "live requests")

    def on_prune(self, msg, info: dict) -> None:
        """A release from the publisher its request named ends it (other PruneInfos are the stages')."""
        if not self.owners.prunes(msg.request_id, info["publisher_gid"], "release" if msg.release else "prune"):
            return
        if msg.release and self.serving(msg.request_id):
            self.put(("release", msg.request_id), live=True)

    def on_profile(self, request, response):
        """Milliseconds the target takes for each count of rows in `token_counts` (default 1, 2, 4, 8)
        after `prefix_len` cached rows (default 240), measured on the verify thread between two drafts."""
        from concurrent.futures import Future

        import torch

        counts = [int(n) for n in request.token_counts] or [1, 2, 4, 8]
        prefix = int(request.prefix_len) or 240
        response.success = False
        if refusal := self.refusal():
            response.message = refusal
            return response
        if any(n < 1 or n > 512 for n in counts):
            response.message = f"token_counts must be 1..512, got {counts}"
            return response
        measured: Future = Future()
        if not self.put(("profile", (counts, prefix, 1 if request.quick else 3, measured)), live=True):
            response.message = "busy: the verifier's queue is full; retry later"
            return response
        try:
            ms = measured.result(timeout=PROFILE_TIMEOUT_S)
        except Exception as exc:  # a timeout, or the measurement failed
            response.message = f"profile failed: {exc!r}"
            return response
        response.success = True
        layers = len(self.verifier.target.layer_ids)
        response.device = f"verifier_node: the target's {layers} layers, {torch.get_num_threads()} thread(s)"
        response.message = f"measured {len(counts)} row counts over {prefix} cached rows"
        response.token_counts = counts
        response.latency_ms = [ms[n] for n in counts]
        return response

    # -- the worker threads ------------------------------------------------------------------------

    def verify_loop(self, inbox) -> None:
        while True:
            work = inbox.get()
            if work is None or self.stopping.is_set():
                return
            kind, item = work
            if kind == "release":
                self.end(item)
            elif kind == "profile":
                self.profile(*item)
            elif kind == "expire":
                for request_id in self.verifier.expire_idle(self.params.idle_timeout_s):
                    self.get_logger().warning(f"request {request_id!r} idle for over {self.params.idle_timeout_s:g} s "
                                              "(its robot sent no release): ended")
                    self.outbox.forget(request_id)
                    self.owners.end(request_id)
            else:
                self.verify(*item)

    def log_rejection(self, line: str, count: int) -> None:
        """Log the ``count``-th refusal of a kind as runtime.throttle says: a flood of bad drafts
        is answered one by one but cannot flood the log."""
        note = flood_note(count)
        if note is not None:
            self.get_logger().warning(line + note)

    def refuse_busy(self, msg, lane: str) -> None:
        from edge_llm_ros.core.edge_cloud import VerifyOutcome

        self.refused_busy += 1
        self.log_rejection(f"busy: the queue of {lane} is full; draft {msg.request_id[:64]!r} refused",
                           self.refused_busy)
        self.outbox.put(VerifyOutcome.rejection(msg.request_id, msg.round, f"busy: the verifier's queue of {lane} "
                                                "is full; retry later", Status.BUSY))

    def verify(self, msg, sender: bytes | None) -> None:
        """One DraftTree message from publisher ``sender``, or a DraftRequest the verifier made itself
        (cloud decoding; no sender). Round 0 binds the request to its sender (before any outcome
        leaves, so nobody else can know the id yet); a draft queued before that, from another
        publisher, is dropped here."""
        from edge_llm_ros.core.edge_cloud import (
            DraftError,
            DraftRequest,
            RequestLimitError,
            SpeculationMissed,
            VerifyOutcome,
        )

        if isinstance(msg, DraftRequest) and not self.verifier.active(msg.request_id):
            return  # a cloud request released (or expired) meanwhile
        if sender is not None and not self.owners.sends(msg.request_id, sender, "draft"):
            return
        try:
            draft = msg if isinstance(msg, DraftRequest) else from_message(DraftRequest, msg)  # DraftError if bad
            opening = not self.verifier.active(draft.request_id)
            outcomes = self.verifier.verify(draft)  # round 0 starts the request here, before any outcome
            if opening and sender is not None and self.verifier.active(draft.request_id):
                self.owners.bind(draft.request_id, Owner(sender, bytes(msg.prune_gid)))
            for outcome in outcomes:
                self.outbox.put(outcome)
            follow = self.verifier.follow_up(draft.request_id)
            if follow is not None:
                self.put(("draft", (follow, None)), live=True)  # behind the drafts already waiting
        except SpeculationMissed as exc:
            self.dropped_speculative += 1
            self.get_logger().debug(f"dropped a speculative draft: {exc}")
        except RequestLimitError as exc:
            self.refused_busy += 1
            self.log_rejection(f"draft {msg.request_id[:64]!r} round {msg.round} refused: {exc}", self.refused_busy)
            self.outbox.put(VerifyOutcome.rejection(msg.request_id, msg.round, exc))
        except (DraftError, ValueError, TypeError) as exc:
            self.rejected += 1
            self.log_rejection(f"draft {msg.request_id[:64]!r} round {msg.round} rejected: {str(exc)[:300]}",
                               self.rejected)
            self.outbox.put(VerifyOutcome.rejection(msg.request_id, msg.round, exc, Status.INVALID))
        except Exception as exc:  # the verifier keeps serving other requests
            if self.stopping.is_set():
                return
            self.get_logger().error(f"draft {msg.request_id[:64]!r} round {msg.round} failed: {exc!r}")
            self.end(msg.request_id)
            self.outbox.put(VerifyOutcome.rejection(msg.request_id, msg.round, f"verifier failed: {exc!r}",
                                                    Status.FAILED))

    def profile(self, counts: list[int], prefix: int, repeats: int, measured) -> None:
        from edge_llm_ros.core.planning.device_profile import row_costs

        try:
            measured.set_result(row_costs(self.verifier.target, counts, repeats, prefix=prefix))
        except Exception as exc:  # answered as a failure; verifying goes on
            measured.set_exception(exc)

    def end(self, request_id: str) -> None:
        self.verifier.end(request_id)
        self.outbox.forget(request_id)
        self.owners.end(request_id)

    def send_loop(self) -> None:
        while True:
            outcome = self.outbox.get()
            if outcome is None:
                return
            self.verify_gate.wait()
            self.verify_pub.publish(stamp(self, to_message(self.VerifyResult, outcome)))

    def destroy_node(self) -> None:
        super().destroy_node()  # unloads first (the draft being verified finishes)
        self.outbox.close()
        self.send_worker.join(timeout=5)


def main(args: list[str] | None = None) -> int:
    return run_node(VerifierNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
