"""VerifierLink (nodes/edge_link.py), the robot's end of the edge-cloud link, over a scripted wire to
an in-process verifier on tiny random models: round 0 is resent until the verifier answers anything
(a verifier that has just started may not have matched the robot's writer), and the output stays the
target's greedy one (transformers' own generate on the same weights) whether the first copy is lost
or arrives late beside the resent one.
Through processes: test_edge_cloud_nodes (a killed verifier, then a new one, serves the next goal)."""

from __future__ import annotations

import queue
import threading

import pytest
from references import hf_greedy

from edge_llm_ros import runtime as rt
from edge_llm_ros.core.drafts.exits import build_exits
from edge_llm_ros.core.edge_cloud import DraftRequest, EarlyExitDrafter, EarlyExitVerifier, VerifyOutcome
from edge_llm_ros.core.engine.config import GenerationConfig
from edge_llm_ros.core.engine.drafters import ModelDrafter
from edge_llm_ros.core.engine.models import tiny_llama
from edge_llm_ros.nodes.edge_link import VerifierLink
from edge_llm_ros.nodes.wire import from_message, to_message

PROMPT = [1, 2, 3, 4, 5]
CONFIG = GenerationConfig(mode="sd", gamma=4, max_new_tokens=16)


class Logger:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, line: str) -> None:
        self.lines.append(line)

    warning = error = info


class Clock:
    def now(self):
        return self

    def to_msg(self):
        return rt.message("builtin_interfaces/msg/Time")(sec=1, nanosec=0)


class Publisher:
    def __init__(self, wire: "Wire", topic: str) -> None:
        self.wire, self.topic_name = wire, topic
        self.gid = topic.encode()[-16:].rjust(16, b"\0")  # what runtime.publisher_gid reads on the embedded backend

    def publish(self, msg) -> None:
        if self.topic_name == "/edge_llm/draft":
            self.wire.on_draft(msg)

    def get_subscription_count(self) -> int:
        return 1


class Wire:
    """The node VerifierLink sees. Drafts go to a verifier thread; its outcomes come back through the
    link's `verify` callback. ``first``: what happens to the first draft: "lose" it, "hold" it until
    the next one (then both arrive, in order), or "deliver" it."""

    def __init__(self, verifier: EarlyExitVerifier, first: str) -> None:
        self.verifier, self.first, self.logger = verifier, first, Logger()
        self.drafts: list[DraftRequest] = []  # every draft off the wire, as the verifier got it
        self.held = None
        self.callback = None
        self.errors: list[Exception] = []
        self.arrived: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    # -- what VerifierLink calls --------------------------------------------------------------------
    def create_publisher(self, msg_type, topic: str, depth: int) -> Publisher:
        return Publisher(self, self.resolve_topic_name(topic))

    def create_subscription(self, msg_type, topic: str, callback, depth: int) -> None:
        assert topic == "verify"
        self.callback = callback

    def resolve_topic_name(self, topic: str) -> str:
        return topic if topic.startswith("/") else f"/edge_llm/{topic}"

    def count_subscribers(self, topic: str) -> int:
        return 1

    def get_logger(self) -> Logger:
        return self.logger

    def get_clock(self) -> Clock:
        return Clock()

    # -- the verifier's side -------------------------------------------------------------------------
    def on_draft(self, msg) -> None:
        count = len(self.drafts) + (self.held is not None)
        if count == 0 and self.first == "lose":
            self.drafts.append(None)  # sent, never arrived
            return
        if count == 0 and self.first == "hold":
            self.held = msg
            return
        if self.held is not None:
            self.arrived.put(self.held)
            self.held = None
        self.arrived.put(msg)

    def serve(self) -> None:
        VerifyResult = rt.message("edge_llm_ros/msg/VerifyResult")
        while (msg := self.arrived.get()) is not None:
            draft = from_message(DraftRequest, msg)
            self.drafts.append(draft)
            try:
                outcomes = list(self.verifier.verify(draft))
            except Exception as exc:  # none expected; the robot is answered as verifier_node answers
                self.errors.append(exc)
                outcomes = [VerifyOutcome.rejection(draft.request_id, draft.round, exc)]
            for outcome in outcomes:
                self.callback(to_message(VerifyResult, outcome))

    def close(self) -> None:
        self.arrived.put(None)
        self.thread.join(10)


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(vocab_size=64, hidden_size=32, num_layers=4, max_context=128, seed=0)
    exits = build_exits(target, (1, 2), bottleneck=8)
    greedy = hf_greedy(target, PROMPT, CONFIG.max_new_tokens)
    return target, exits, greedy


@pytest.mark.parametrize("first", ["lose", "hold", "deliver"])
def test_round_0_is_resent_until_answered_and_the_output_stays_greedy(models, first):
    target, exits, greedy = models
    wire = Wire(EarlyExitVerifier(target, exits), first)
    link = VerifierLink(wire, timeout_s=30.0)
    link.drafter = EarlyExitDrafter(ModelDrafter(target.truncated(2)), seed=0)
    try:
        tokens = [t for step, _ in link.rounds("q", PROMPT, CONFIG) for t in step.tokens]
    finally:
        link.drafter.close()
        wire.close()
    assert not wire.errors and tokens == greedy
    resent = [line for line in wire.logger.lines if "no answer to round 0" in line]
    rounds_0 = [d for d in wire.drafts if d is None or d.round == 0]
    if first == "deliver":
        assert not resent and len(rounds_0) == 1
    else:  # one copy lost or late: the robot resent it; a late first copy was answered a second time
        assert len(resent) == 1 and "request q: no answer to round 0 within 1 s; resending it" in resent[0]
        assert len(rounds_0) >= 2 and all(d == rounds_0[-1] for d in rounds_0 if d is not None)
    assert "q" not in link.heard and "q" not in link.inboxes
